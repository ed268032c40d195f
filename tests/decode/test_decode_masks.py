"""lab.ops.decode's masks on CPU: the emulation of the masked kernels (lab/decode/emulate_masks.py: the window's
split plan, per-row key ranges, softcap, the sink in the combine) against the float64 reference and against the
masked forward's reference (lab.masks.reference, written independently); the wrong algorithm (the sink in every
split) must differ; the public op's argument checks come before the device check; the binding's own checks of the
masked call (the CPU check build).

Run: .venv/bin/python -m pytest -q tests/decode/test_decode_masks.py
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lab import ops
from lab.decode import emulate_masks as em
from lab.decode import emulate_paged as ep
from lab.decode import masks
from lab.decode.plan import split_chunk
from lab.masks import spec

SETS = [  # (B, Hq, Hkv, q_len, S, lengths, causal, left, right, softcap, sinks)
    (3, 8, 1, 1, 700, (700, 0, 1), False, 128, -1, 0.0, False),
    (4, 8, 2, 4, 900, (900, 1, 130, 451), True, 128, 0, 0.0, False),
    (3, 4, 2, 1, 400, (400, 17, 0), False, -1, -1, 50.0, False),
    (3, 4, 2, 4, 400, (400, 3, 0), True, -1, -1, 0.0, True),
    (4, 16, 2, 4, 1100, (1100, 0, 1, 97), True, 100, 0, 30.0, True),
    (2, 4, 4, 3, 300, (300, 65), False, 64, 2, 5.0, True),  # a right edge without causal
    (2, 4, 1, 2, 260, (260, 200), False, 0, 0, 0.0, True),  # a window of one key
]


def _draw(seed, B, Hq, Hkv, q_len, S, D=16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, q_len, D)), rng.standard_normal((B, Hkv, S, D)),
            rng.standard_normal((B, Hkv, S, D)), rng.standard_normal(Hq) * 2)


@pytest.mark.parametrize("splits", [1, 3, 8])
@pytest.mark.parametrize("args", SETS, ids=lambda a: f"q{a[3]}-w{a[7]},{a[8]}-c{a[9]}-s{int(a[10])}")
def test_emulation_matches_reference(args, splits):
    B, Hq, Hkv, q_len, S, lengths, causal, left, right, softcap, with_sinks = args
    q, k, v, sinks = _draw(splits, B, Hq, Hkv, q_len, S)
    sinks = sinks if with_sinks else None
    ref, ref_lse = em.reference_masked_decode(q, k, v, lengths, 0.3, causal, left, right, softcap, sinks)
    out, lse, (firsts, chunk) = em.emulate_masked_decode(q, k, v, lengths, splits, 0.3, causal, left, right, softcap,
                                                         sinks)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    np.testing.assert_allclose(lse[np.isfinite(lse)], ref_lse[np.isfinite(ref_lse)], atol=1e-12)
    # the plan covers the window only: splits from the window's first tile, a chunk over the span
    for n, first in zip(lengths, firsts):
        assert first % 64 == 0 and first <= max(0, n - q_len - left if left >= 0 else 0)
        assert first + splits * chunk >= n
    assert chunk == split_chunk(masks.window_span(S, q_len, left), splits)


def test_reference_matches_the_masked_forward_rule():
    """The decode reference agrees with lab.masks.spec's rule (bottom-right offset len - q_len), per token."""
    B, Hq, Hkv, q_len, S = 2, 4, 2, 4, 300
    q, k, v, sinks = _draw(5, B, Hq, Hkv, q_len, S)
    lengths = (300, 130)
    for causal, (left, right) in [(True, (50, 0)), (False, (20, 3)), (False, (-1, 7))]:
        mask = spec.make_mask(causal, (left, right), 0.0)
        ref, _ = em.reference_masked_decode(q, k, v, lengths, 0.25, causal, left, right, 0.0, sinks)
        for b, n in enumerate(lengths):
            seen = spec.visible(torch.arange(q_len), torch.arange(n), n, n - q_len, mask).numpy()
            for t in range(q_len):
                lo, hi = em.key_range(n, q_len, t, left, right, causal)
                assert np.array_equal(np.flatnonzero(seen[t]), np.arange(lo, max(lo, hi)))


def test_sink_per_split_is_wrong():
    """The wrong algorithm (sinks joining every split's partial) differs from the reference when a row has several
    splits: the GPU check's wrong build (LAB_DECODE_BUG_SINK_PER_SPLIT) is caught the same way."""
    q, k, v, sinks = _draw(1, 2, 4, 2, 1, 1000)
    sinks = sinks + 5.0  # a sink worth many keys, as a sliding window of 128 makes it (the GPU check's case)
    kw = dict(left=128, sinks=sinks)
    ref, _ = em.reference_masked_decode(q, k, v, (1000, 600), 0.3, **kw)
    right, _, _ = em.emulate_masked_decode(q, k, v, (1000, 600), 4, 0.3, **kw)
    wrong, _, _ = em.emulate_masked_decode(q, k, v, (1000, 600), 4, 0.3, sink_per_split=True, **kw)
    one, _, _ = em.emulate_masked_decode(q, k, v, (1000, 600), 1, 0.3, sink_per_split=True, **kw)
    assert np.abs(right - ref).max() < 1e-12 and np.abs(one - ref).max() < 1e-12
    assert np.abs(wrong - ref).max() > 0.03  # tens of times a bf16 decode's error


def test_paged_cache_gathers_to_the_same_answer():
    q, k, v, sinks = _draw(2, 3, 8, 2, 4, 500)
    rng = np.random.default_rng(0)
    kp, vp, table = ep.page_cache(k, v, 16, rng, spare_pages=2)
    lengths = (500, 0, 77)
    kc, vc, used, errors = em.contiguous_cache(kp, vp, table, lengths)
    assert errors == [0, 0, 0] and used == list(lengths)
    out, _, _ = em.emulate_masked_decode(q, kc, vc, used, 5, 0.2, True, 64, 0, 10.0, sinks)
    ref, _ = em.reference_masked_decode(q, k, v, lengths, 0.2, True, 64, 0, 10.0, sinks)
    np.testing.assert_allclose(out, ref, atol=1e-12)


def test_window_span_matches_the_kernel_rule():
    assert masks.window_span(16384, 1, 128) == 128 + 1 + 63
    assert masks.window_span(16384, 4, -1) == 16384
    assert masks.window_span(100, 4, 4096) == 100


def _cpu_args(Hq=8, Hkv=2, D=64):
    return (torch.randn(2, Hq, 1, D, dtype=torch.float16), torch.randn(2, Hkv, 64, D, dtype=torch.float16),
            torch.randn(2, Hkv, 64, D, dtype=torch.float16))


BAD = [
    (dict(window_size=(-2, 0)), ValueError, "window_size entries must be >= -1"),
    (dict(window_size=(3,)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=(1.5, 0)), TypeError, "window_size must be a pair of ints"),
    (dict(softcap=-1.0), ValueError, "softcap must be >= 0"),
    (dict(softcap=float("nan")), TypeError, "softcap must be a finite float"),
    (dict(sinks=torch.zeros(8, dtype=torch.float16)), TypeError, "sinks.dtype must be torch.float32"),
    (dict(sinks=torch.zeros(4)), ValueError, r"sinks must have shape \(H_q,\) = \(8,\)"),
    (dict(sinks=[0.0] * 8), TypeError, "sinks must be a torch.Tensor"),
    (dict(sinks=torch.zeros(8, device="meta")), ValueError, "sinks is on meta but query is on cpu"),
    (dict(window_size=(8, 0), version="v02"), ValueError, "decode version 'v02' has no window, softcap or sinks"),
    (dict(softcap=5.0, version="v01"), ValueError, "decode version 'v01' has no window, softcap or sinks"),
]


@pytest.mark.parametrize("kwargs,error,text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_mask_arguments_raise_before_the_device_check(kwargs, error, text):
    q, k, v = _cpu_args()
    with pytest.raises(error, match=text):
        ops.decode(q, k, v, **kwargs)


def test_a_masked_cpu_call_then_meets_the_device_check():
    q, k, v = _cpu_args()
    with pytest.raises(ValueError, match="CUDA"):
        ops.decode(q, k, v, window_size=(16, 0), softcap=2.0, sinks=torch.zeros(8))


def test_no_mask_is_the_plain_call():
    q, k, v = _cpu_args()
    assert masks.check(q, False, None, 0.0, None) is None
    assert masks.check(q, True, (-1, -1), 0.0, None) is None
    assert masks.check(q, True, (5, -1), 0.0, None) == spec.Mask(5, 0, 0.0)


def _binding_call(binding, q, k, v, **over):
    a = dict(left=-1, right=-1, softcap=0.0, sinks=None)
    a.update(over)
    return binding.module.decode_masked_call(0, q, k, v, None, None, None, 0.125, 1, False, a["left"], a["right"],
                                             a["softcap"], a["sinks"])


@pytest.mark.parametrize("over,text", [
    (dict(left=-3), r"window_size entries must be >= -1 \(-1: unbounded\), got \(-3, -1\)"),
    (dict(softcap=-0.5), "softcap must be a finite float >= 0"),
    (dict(sinks=torch.zeros(8, dtype=torch.float16)), r"sinks must be a contiguous float32 tensor of shape \(8,\)"),
    (dict(sinks=torch.zeros(16, 2)[:, 0]), r"sinks must be a contiguous float32 tensor of shape \(8,\)"),
])
def test_binding_refuses_bad_masks(cpu_binding, over, text):
    q, k, v = _cpu_args()
    error = _binding_call(cpu_binding, q, k, v, **over)[0]
    assert error and __import__("re").search(text, error), error


@pytest.mark.parametrize("case", [c for c in __import__("lab.decode.mask_checks", fromlist=["cases"]).cases((16,))
                                  if "p16" in c.name or c.name.startswith("all-q1")], ids=lambda c: c.name)
def test_gpu_checks_reference_is_the_emulations(case):
    """lab.decode.mask_checks' torch reference (what the GPU checks judge by) agrees with the float64 reference
    here, on the CPU, paged inputs included (the cache gathered back through the table)."""
    from lab.decode import mask_checks as mc

    a = mc.inputs(case, 0, device="cpu")
    scale = case.D ** -0.5
    ref = mc.masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], scale, torch.float64)
    left, right = case.window or (-1, -1)
    want, _ = em.reference_masked_decode(a["q"].double().numpy(), a["k"].double().numpy(), a["v"].double().numpy(),
                                         case.lengths, scale, case.causal, left, right, case.softcap,
                                         None if a["sinks"] is None else a["sinks"].double().numpy())
    np.testing.assert_allclose(ref.numpy(), want, atol=1e-12)
    eager = mc.masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], scale, torch.bfloat16)
    assert 0 < float((eager.double() - ref).abs().max()) < 0.1
    if not case.page_size:
        return
    kc, vc, used, errors = em.contiguous_cache(a["k_pages"].double().numpy(), a["v_pages"].double().numpy(),
                                               a["table"].numpy(), case.lengths)
    assert errors == [0] * case.B
    np.testing.assert_array_equal(kc[:, :, :case.S], np.where(
        np.arange(case.S)[None, None, :, None] < np.array(used)[:, None, None, None], a["k"].double().numpy(), 0))


def test_fast_path_keys_only_plain_argument_types():
    """The one-crossing masked call (lab.decode.fast.masked) keys its plan by the mask arguments exactly as passed;
    a list window, a bool softcap or a non-bool is_causal has no key and takes the full path (which checks it)."""
    from lab.decode import fast

    q, k, _ = _cpu_args()
    assert fast.masked_key(q, k, None, None, None, True, (128, 0), 0.0) is not None
    assert fast.masked_key(q, k, None, None, None, True, [128, 0], 0.0) is None
    assert fast.masked_key(q, k, None, None, None, True, None, True) is None
    assert fast.masked_key(q, k, None, None, None, 1, None, 5.0) is None
