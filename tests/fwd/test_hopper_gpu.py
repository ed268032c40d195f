"""GPU tests specific to the Hopper kernels (v05-v07, sm_90a): what lab.ops.attention picks on compute
capability 9.0 and that the pick is right through the public op, the build variants the version headers
report on, and the clear error a Hopper kernel gives on another GPU. Every `tests` case for every registered
version is in tests/product/test_gpu.py (registry-driven); this file covers what only the Hopper kernels have.

Marked `gpu` (skipped without CUDA); the Hopper-only tests skip on other GPUs.
"""
from __future__ import annotations

import pytest
import torch

from lab import bench, build, cases, check, ops

pytestmark = pytest.mark.gpu


def _hopper() -> bool:
    return tuple(torch.cuda.get_device_capability()) == (9, 0)


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    return session_dir


@pytest.mark.parametrize("D,Sq,causal", [(64, 65, False), (64, 4097, False), (64, 4097, True), (128, 1025, True),
                                         (128, 1025, False), (128, 63, True)])
def test_public_op_default_on_hopper_is_right(D, Sq, causal):
    if not _hopper():
        pytest.skip("the Hopper default applies on compute capability 9.0 only")
    case = cases.Case("hopper-default", 2, 4, 2, Sq, Sq + 3, D, "bfloat16", causal)
    q = torch.randn(case.B, case.Hq, case.Sq, D, device="cuda", dtype=torch.bfloat16)
    assert ops.attention_version(q, is_causal=causal) in ("v05", "v07")

    def run(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True))
    assert check.check_forward(run, case, "lab.ops.attention", trials=1).passed


@pytest.mark.parametrize("defines", [{"LAB_FWD_OVERLAP_PINGPONG": 1, "LAB_FWD_OVERLAP_D128_STAGES": 3, "LAB_FWD_OVERLAP_D128_BC": 128},
                                     {"LAB_FWD_OVERLAP_D128_BC": 128},
                                     {"LAB_FWD_OVERLAP_D64_POLY": 8},
                                     {"LAB_FWD_OVERLAP_D128_PERSIST": 1, "LAB_FWD_OVERLAP_D64_PERSIST": 1}])
def test_v07_variants_are_right(defines):
    if not _hopper():
        pytest.skip("sm_90a kernel")
    run = ops.fwd_writer("v07", defines)
    for case in [c for c in cases.tests_cases() if c.Sq > 1][:8]:
        assert check.check_forward(run, case, f"v07 {defines}", trials=1).passed, case.label


@pytest.mark.parametrize("version", ["v05", "v06", "v07"])
def test_any_finite_scale(version):
    if not _hopper():
        pytest.skip("sm_90a kernel")
    run = ops.fwd_writer(version)
    with bench.sdpa_backend("math"):  # SDPA's flash and cuDNN backends return NaN for scale <= 0
        for scale in (0.0, -0.35, 3.0):
            for case in cases.tests_cases()[4:8]:
                assert check.check_forward(run, case, version, scale=scale, trials=1).passed, (case.label, scale)


@pytest.mark.parametrize("version", ["v05", "v06", "v07"])
def test_clear_error_off_hopper(version):
    if _hopper():
        pytest.skip("checks the error on a GPU without sm_90a")
    q = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.float16)
    address = build.build_kernel(ops.FWD[version].source).address(ops.FWD[version].symbol)
    with pytest.raises(Exception, match="no kernel image"):  # cudaErrorNoKernelImageForDevice, named
        build.binding().attn_fwd(address, q, q, q, torch.empty_like(q), None, 0.125, False, None)


@pytest.mark.parametrize("D,Sq,Sk,causal", [(32, 65, 130, True), (32, 1025, 63, False), (80, 130, 2100, False),
                                            (96, 4097, 4097, True), (200, 257, 63, True), (136, 65, 1025, False),
                                            (160, 65, 2100, True)])
def test_a_narrow_call_is_the_padded_call_bit_for_bit(D, Sq, Sk, causal):
    """lab.fwd.head_dims.narrow: the width's kernel reading the unpadded tensors (TMA's zero fill) computes what it
    computes on the zero-padded copies, so output and LSE are equal bit for bit; unpadded() fails the call if it
    pads."""
    if not _hopper():
        pytest.skip("the narrow path runs on compute capability 9.0 only")
    from lab.fwd.narrow_gpu import padded_attention, unpadded

    q = torch.randn(2, 4, Sq, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, Sk, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    with torch.no_grad():
        with unpadded():
            out, lse = ops.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
        want, want_lse = padded_attention()(q, k, v, causal)()
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("D,dtype,shape,causal,through_lse", [
    (32, "bfloat16", (2, 4, 2, 65, 130), True, False), (80, "float16", (1, 6, 2, 1025, 63), False, False),
    (96, "bfloat16", (2, 4, 2, 130, 130), True, True), (56, "float16", (2, 4, 2, 65, 130), False, True)])
def test_a_narrow_gradient_is_the_padded_call_bit_for_bit(D, dtype, shape, causal, through_lse):
    """bwd v20 (lab.registry.NARROW_BWD): the gradients of a narrow call, read and written unpadded, equal the padded
    call's (S_k <= 256 here: dQ's atomics sum at most two key blocks, so their order cannot show)."""
    if not _hopper():
        pytest.skip("the narrow backward runs on compute capability 9.0 only")
    from lab.backward.narrow_gpu import same_as_padded

    assert same_as_padded(shape, D, dtype, causal, scale=-0.3 if through_lse else None, through_lse=through_lse)


def test_narrow_gradients_pass_the_checks_and_the_short_build_fails():
    """lab.backward.narrow_gpu's quick grid (float64 yardstick, padded path refused, the short-store build must fail,
    deterministic mode pads)."""
    if not _hopper():
        pytest.skip("the narrow backward runs on compute capability 9.0 only")
    from lab.backward.narrow_gpu import narrow_bwd_checks

    assert narrow_bwd_checks(quick=True) == 0
