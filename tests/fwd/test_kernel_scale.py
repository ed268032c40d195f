"""Any finite softmax scale (0, negative, huge: SDPA accepts them all), on CPU: the emulations against the float64 reference.

`order="mma"` is the arithmetic of the tensor-core forward kernels (running max over raw scores, scale
folded into exp2) with the rewrite of kernels/common/softmax.cuh (negated Q for scale < 0, FLT_MIN for 0);
the GPU side of the same cases is tests/product/test_gpu.py (test_forward_version_any_scale).
"""
from __future__ import annotations

import numpy as np
import pytest

from lab import emulate
from lab.decode import splits

SCALES = [-0.125, 0.0, 0.3, None]


def _qkv(B, Hq, Hkv, Sq, Sk, D, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, Sq, D)).astype(np.float32),
            rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32),
            rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32))


@pytest.mark.parametrize("order", ["fa1", "fa2", "mma"])
@pytest.mark.parametrize("scale", SCALES, ids=lambda s: f"scale{s}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_emulated_forward_matches_reference_for_any_scale(order, scale, causal):
    # ragged S_k (not a multiple of the 16-key tiles), GQA, a query block that ends inside a key tile
    q, k, v = _qkv(2, 4, 2, 37, 70, 32, seed=1)
    out, lse = emulate.flash_forward_emulated(q, k, v, causal, scale, block_m=16, block_n=16, order=order)
    ref_out, ref_lse = emulate.attention_reference(q, k, v, causal, scale)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(out, ref_out, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5, rtol=1e-6)


def test_scale_zero_is_the_mean_of_the_visible_values():
    q, k, v = _qkv(1, 2, 2, 20, 20, 16, seed=2)
    out, lse = emulate.flash_forward_emulated(q, k, v, True, 0.0, block_m=8, block_n=8, order="mma")
    counts = np.arange(1, 21)
    np.testing.assert_allclose(out, np.cumsum(v, axis=2) / counts[:, None], atol=1e-6)
    np.testing.assert_allclose(lse, np.broadcast_to(np.log(counts), lse.shape), atol=1e-6)


@pytest.mark.parametrize("scale, broken", [(-0.125, "wrong"), (0.0, "nan")])
def test_raw_max_without_the_rewrite_is_wrong_for_scale_at_most_zero(scale, broken):
    """What v02-v04 did before the fix: the max over raw scores is the wrong end of the row for a negative
    scale (exp2 of a positive offset, large errors or overflow) and -inf * 0 is NaN for a masked key."""
    q, k, v = _qkv(1, 2, 2, 40, 50, 32, seed=3)
    q, k, v = (x * 3 for x in (q, k, v))  # scores spread over hundreds: the wrong max overflows exp2
    out, _ = emulate._fa2_raw_max(q, k, v, True, scale, 16, 16, rewrite=False)
    ref, _ = emulate.attention_reference(q, k, v, True, scale)
    if broken == "nan":
        assert np.isnan(out).any()
    else:
        assert not (np.isfinite(out).all() and np.allclose(out, ref, atol=1e-3))
    fixed, _ = emulate._fa2_raw_max(q, k, v, True, scale, 16, 16, rewrite=True)
    np.testing.assert_allclose(fixed, ref, atol=1e-4)


def test_kernel_scale_rule():
    assert emulate.kernel_scale(0.3) == (0.3, False)
    assert emulate.kernel_scale(-0.125) == (0.125, True)
    factor, negate = emulate.kernel_scale(0.0)
    assert factor == np.finfo(np.float32).tiny and not negate
    assert np.float32(factor) > 0 and np.float32(factor * emulate.LOG2E) > 0  # a normal float32, never flushed


@pytest.mark.parametrize("scale", [-0.125, 0.0, 0.3])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_emulated_split_decode_matches_reference_for_any_scale(scale, num_splits):
    q, k, v = _qkv(3, 8, 2, 4, 300, 32, seed=4)
    seqlens = [0, 130, 300]
    out, lse, _, _ = splits.emulate_split_decode(q, k, v, seqlens, num_splits, scale)
    ref_out, ref_lse = splits.reference_decode(q, k, v, seqlens, scale)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref_out, atol=2e-5)
    np.testing.assert_allclose(lse[1:], ref_lse[1:], atol=2e-5)
    assert np.isneginf(lse[0]).all() and (out[0] == 0).all()
