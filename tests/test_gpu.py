"""GPU tests: the real kernels through lab.ops and lab.check. Every test is marked `gpu` and is skipped
automatically when torch sees no CUDA device (tests/conftest.py). Needs nvcc and a CUDA build of torch.

Run on a GPU machine: .venv/bin/python -m pytest -q tests/test_gpu.py
"""
from __future__ import annotations

import math

import pytest
import torch

from lab import cases, check, ops
from lab.cases import Case, DecodeCase
from wrong_kernels import (
    decode_correct, decode_ignores_seqlens, run_bshd_as_bhsd, run_missing_causal_mask, run_missing_scale,
    run_sdpa_fp32, run_unwritten_last_row,
)

pytestmark = pytest.mark.gpu

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    return session_dir


def _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=gen, device="cuda", dtype=DTYPES[dtype])  # noqa: E731
    return make(B, Hq, Sq, D), make(B, Hkv, Sk, D), make(B, Hkv, Sk, D)


def _assert_passes(out, q, k, v, causal=False, scale=None, seqlens=None):
    ref = check.reference(q, k, v, causal, scale, seqlens=seqlens)
    metrics = check.compare(out, ref, check.sdpa(q, k, v, causal, scale, seqlens=seqlens))
    assert metrics["passed"], metrics


# (B, Hq, Hkv, Sq, Sk, D, dtype, causal)
ATTENTION_CASES = {
    "v01": [(1, 2, 2, 65, 65, 64, "float16", False), (2, 4, 2, 63, 130, 128, "bfloat16", True),
            (1, 3, 3, 130, 63, 32, "float16", True), (2, 2, 1, 1, 257, 16, "bfloat16", False)],
    "v02": [(1, 2, 2, 65, 65, 64, "float16", False), (2, 4, 2, 63, 1025, 128, "bfloat16", True),
            (1, 3, 3, 1025, 65, 64, "bfloat16", True), (3, 8, 1, 1, 4097, 128, "float16", False)],
}


@pytest.mark.parametrize("version, shape", [(v, s) for v, shapes in ATTENTION_CASES.items() for s in shapes])
def test_attention_matches_sdpa(version, shape):
    B, Hq, Hkv, Sq, Sk, D, dtype, causal = shape
    q, k, v = _inputs(B, Hq, Hkv, Sq, Sk, D, dtype)
    out, lse = ops.attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv, version=version, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    _assert_passes(out, q, k, v, causal)
    # lse: natural log-sum-exp of the scaled scores of each row
    kk = k.double().repeat_interleave(Hq // Hkv, dim=1)
    scores = (q.double() @ kk.transpose(-1, -2)) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(~torch.ones(Sq, Sk, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    torch.testing.assert_close(lse.double(), torch.logsumexp(scores, dim=-1), atol=1e-3, rtol=1e-4)


def test_attention_custom_scale_and_strided_inputs():
    q, k, v = _inputs(2, 4, 4, 96, 96, 64, "float16")
    bshd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]  # (B, S, H, D) memory
    out = ops.attention(*bshd, scale=0.2, version="v02")
    _assert_passes(out, q, k, v, scale=0.2)


def test_attention_under_torch_compile():
    q, k, v = _inputs(1, 2, 2, 64, 64, 64, "bfloat16")
    compiled = torch.compile(lambda a, b, c: ops.attention(a, b, c, is_causal=True) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), ops.attention(q, k, v, is_causal=True) * 2)


@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_decode_matches_reference(num_splits):
    lengths = [1, 63, 65, 1025, 4097]
    q, k, v = _inputs(len(lengths), 32, 8, 1, 4097, 128, "bfloat16", seed=3)
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = ops.decode(q, k, v, cache_seqlens=seqlens, num_splits=num_splits)
    assert out.shape == q.shape
    _assert_passes(out, q, k, v, seqlens=lengths)


def test_decode_full_cache_and_q_len_16():
    q, k, v = _inputs(2, 8, 2, 16, 300, 64, "float16", seed=4)
    _assert_passes(ops.decode(q, k, v, num_splits=2), q, k, v)


def test_decode_rejects_lengths_beyond_the_cache():
    q, k, v = _inputs(2, 8, 2, 1, 64, 128, "float16")
    with pytest.raises(ValueError, match=r"cache_seqlens must lie in \[0, 64\]"):
        ops.decode(q, k, v, cache_seqlens=torch.tensor([10, 65], dtype=torch.int32, device="cuda"), num_splits=1)


def _tests_cases(count_per_d=2):
    small = [c for c in cases.tests_cases() if max(c.Sq, c.Sk) <= 1025]
    return small[::max(1, len(small) // (4 * count_per_d))]


@pytest.mark.parametrize("version", ["v01", "v02"])
@pytest.mark.parametrize("case", _tests_cases(), ids=lambda c: c.name)
def test_check_forward_of_kernels(version, case):
    if case.D not in ops.FWD[version].head_dims:
        pytest.skip(f"{version} has no head dim {case.D}")
    result = check.check_forward(ops.fwd_runner(version), case, version, device="cuda", save=False)
    assert result.passed, repr(result)


@pytest.mark.parametrize("case", cases.decode_tests_cases()[:4], ids=lambda c: c.name)
def test_check_decode_of_kernel(case):
    result = check.check_decode(ops.decode_runner("v01"), case, "decode-v01", device="cuda", save=False)
    assert result.passed, repr(result)


SELF_TEST = Case("gpu-self-test", 2, 4, 2, 130, 200, 64, "bfloat16", True)


@pytest.mark.parametrize("run", [run_bshd_as_bhsd, run_missing_scale, run_missing_causal_mask, run_unwritten_last_row],
                         ids=lambda f: f.__name__)
def test_wrong_kernels_fail_on_gpu(run):
    assert check.check_forward(run_sdpa_fp32, SELF_TEST, "good", device="cuda", save=False).passed
    assert not check.check_forward(run, SELF_TEST, run.__name__, device="cuda", save=False).passed


def test_wrong_decode_fails_on_gpu():
    case = DecodeCase("gpu-dec", 3, 8, 2, 1, 300, 128, "float16", (7, 150, 300))
    assert check.check_decode(decode_correct, case, "good", device="cuda", save=False).passed
    assert not check.check_decode(decode_ignores_seqlens, case, "bad", device="cuda", save=False).passed


def test_v01_bug_builds_are_caught():
    """kernels/README.md: LAB_BUG_NO_CAUSAL leaks future keys on diagonal tiles; LAB_BUG_LAYOUT ignores strides
    (visible with the harness's (B, S, H, D) layout)."""
    causal = Case("bug-causal", 1, 2, 2, 130, 130, 64, "float16", True)
    assert not check.check_forward(ops.fwd_runner("v01", {"LAB_BUG_NO_CAUSAL": None}), causal, "v01-nocausal",
                                   device="cuda", save=False).passed

    plain = Case("bug-layout", 2, 4, 4, 96, 96, 64, "bfloat16", False)
    assert check.check_forward(ops.fwd_runner("v01"), plain, "v01", device="cuda", save=False, layout="bshd").passed
    assert not check.check_forward(ops.fwd_runner("v01", {"LAB_BUG_LAYOUT": None}), plain, "v01-layout",
                                   device="cuda", save=False, layout="bshd").passed


@pytest.mark.parametrize("version", ["v01", "v02"])
def test_check_forward_bshd_layout(version):
    case = Case("bshd", 2, 6, 2, 130, 70, 64, "float16", True)
    assert check.check_forward(ops.fwd_runner(version), case, version, device="cuda", save=False, layout="bshd").passed
