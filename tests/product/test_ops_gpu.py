"""GPU tests of the public ops' call path (what a serving loop needs, and the edge sizes): CUDA-graph capture
with new cache_seqlens, no host synchronisation, clamped lengths, empty batches and caches.

Skipped without CUDA; the GPU run is committed under outputs/driver_logs/.
"""
from __future__ import annotations

import math

import pytest
import torch

from lab import cases, graphs, kernels, ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16 = torch.bfloat16


def _randn(*shape, dtype=BF16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


@pytest.mark.parametrize("case", cases.decode_tests_cases()[:4], ids=lambda c: c.name)
def test_decode_replays_from_a_cuda_graph_with_new_lengths(case):
    row = graphs.check_decode(case, trials=3, seed=7)
    assert row["passed"], row["trials"]


@pytest.mark.parametrize("case", cases.tests_cases()[1:4], ids=lambda c: c.name)
def test_attention_replays_from_a_cuda_graph(case):
    row = graphs.check_attention(case, trials=2, seed=3)
    assert row["passed"], row["trials"]


def test_decode_call_makes_no_host_sync():
    """A stream that is capturing raises on any synchronising call: the whole call path must pass."""
    q, k = _randn(2, 8, 1, 128), _randn(2, 2, 4096, 128)
    v, seqlens = torch.randn_like(k), torch.tensor([100, 4096], device="cuda", dtype=torch.int32)
    ops.decode(q, k, v, seqlens)  # build and load outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any implicit synchronisation raises
    try:
        out = ops.decode(q, k, v, seqlens)
        ops.attention(q, k[:, :, :64], v[:, :, :64], enable_gqa=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(out).all()


def test_decode_fast_path_equals_the_full_path_and_refusals_take_the_full_path():
    """The eager contiguous call's one-crossing path (lab.decode.fast.contiguous, after one full call of the same
    shapes) gives the full path's output bit for bit; int64 lengths still work (the full path converts them), and a
    bad scale or a strided last dim still raise the full path's errors."""
    q, k = _randn(3, 32, 1, 128), _randn(3, 8, 700, 128)
    v, seqlens = torch.randn_like(k), torch.tensor([700, 1, 300], device="cuda", dtype=torch.int32)
    first = ops.decode(q, k, v, seqlens)  # full path: checks, then the plan is kept
    assert ("decode", q.shape, k.shape, q.get_device(), None, None) in kernels.plans
    assert torch.equal(ops.decode(q, k, v, seqlens), first)  # one crossing
    assert torch.equal(ops.decode(q, k, v, seqlens, scale=1 / math.sqrt(128)), first)
    assert torch.equal(ops.decode(q, k, v, seqlens.long()), first)
    with pytest.raises(ValueError, match="overflows float32"):
        ops.decode(q, k, v, seqlens, scale=1e39)
    with pytest.raises(ValueError, match="contiguous last dimension"):
        ops.decode(q, k, torch.randn(3, 8, 700, 256, device="cuda", dtype=BF16)[..., ::2], seqlens)


def test_out_of_range_lengths_are_clamped():
    q, k = _randn(3, 4, 1, 64), _randn(3, 4, 200, 64)
    v = torch.randn_like(k)
    out = ops.decode(q, k, v, torch.tensor([-7, 200, 10_000], device="cuda", dtype=torch.int32))
    full = ops.decode(q, k, v)
    assert (out[0] == 0).all()  # a negative length attends to nothing
    torch.testing.assert_close(out[1:], full[1:], rtol=0, atol=0)  # past the cache: the whole cache


def test_empty_batch_and_empty_cache():
    k = _randn(0, 2, 64, 128)
    out = ops.decode(_randn(0, 8, 1, 128), k, k, torch.empty(0, device="cuda", dtype=torch.int32))
    assert out.shape == (0, 8, 1, 128)
    empty = _randn(2, 2, 0, 128)
    out = ops.decode(_randn(2, 8, 1, 128), empty, empty)
    assert out.shape == (2, 8, 1, 128) and (out == 0).all()


def test_scale_that_overflows_float32_is_rejected():
    q = _randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="overflows float32"):
        ops.attention(q, q, q, scale=1e39)
    with pytest.raises(ValueError, match="overflows float32"):
        ops.decode(q[:, :, :1], q, q, scale=-1e39)


def test_eager_path_and_custom_op_agree():
    """The eager fast path (no dispatcher) and the torch.library op run the same implementation."""
    q, k, v = _randn(2, 4, 100, 64), _randn(2, 2, 130, 64), _randn(2, 2, 130, 64)
    fast = ops.attention(q, k, v, is_causal=True, enable_gqa=True)
    name = ops.attention_version(q)
    via_op, _ = torch.ops.lab.attention(q, k, v, True, 0.125, name)
    torch.testing.assert_close(fast, via_op, rtol=0, atol=0)


@pytest.mark.parametrize("sq,sk", [(1, 1025), (63, 65), (65, 63), (1025, 4097), (4097, 1025), (7, 7)])
@pytest.mark.parametrize("heads,D", [((8, 8), 64), ((8, 2), 128)])
def test_lower_right_causal_against_float64_and_sdpa(sq, sk, heads, D):
    """causal_variant="lower_right" (lab.fwd.causal) against the float64 bottom-right reference: error at most 3x
    SDPA's own error with torch's causal_lower_right bias (plus 1e-3 of slack for fp rounding of tiny errors);
    rows that see no key are exactly 0 (SDPA gives NaN there); NaN never passes."""
    from torch.nn.attention.bias import causal_lower_right
    from tests.fwd.test_causal import lower_right_reference

    q = _randn(2, heads[0], sq, D)
    k, v = _randn(2, heads[1], sk, D), _randn(2, heads[1], sk, D)
    ours, lse = ops.attention(q, k, v, is_causal=True, enable_gqa=heads[0] != heads[1],
                              causal_variant="lower_right", return_lse=True)
    ref, ref_lse = lower_right_reference(q.cpu(), k.cpu(), v.cpu())
    ref, ref_lse = ref.cuda(), ref_lse.cuda()
    seen = ~torch.isneginf(ref_lse)
    assert not torch.isnan(ours).any() and torch.equal(torch.isneginf(lse), ~seen)
    assert torch.all(ours[~seen] == 0)
    kk, vv = (t.repeat_interleave(heads[0] // heads[1], dim=1) for t in (k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=causal_lower_right(sq, sk))
    err = (ours.double() - ref)[seen].abs().max().item()
    sdpa_err = (sdpa.double() - ref)[seen].abs().max().item()
    assert err <= 3 * sdpa_err + 1e-3, (err, sdpa_err)
    torch.testing.assert_close(lse[seen].double(), ref_lse[seen], atol=2e-2, rtol=0)


@pytest.mark.gpu
def test_the_eager_fast_paths_refuse_a_flag_that_is_not_a_bool():
    """The one-crossing calls hand their flags to the binding, whose C++ bool would take 1 as True; a flag of another
    type takes the full path instead, which refuses it as SDPA does."""
    q = torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 64, 128], device="cuda", dtype=torch.int32)
    packed = q.transpose(1, 2).reshape(128, 4, 64)
    calls = [(lambda: ops.attention(q, kv, kv, enable_gqa=1), "enable_gqa"),
             (lambda: ops.attention(q, q, q, return_lse=1), "return_lse"),
             (lambda: ops.attention(q, kv, kv, enable_gqa=1, window_size=(8, 0)), "enable_gqa"),
             (lambda: ops.attention(q, q, q, softcap=5.0, return_lse=1), "return_lse"),
             (lambda: ops.attention_varlen(packed, packed, packed, cu, cu, 64, 64, return_lse=1,
                                           check_cu_seqlens=False), "return_lse")]
    for call, flag in calls:
        with pytest.raises(TypeError, match=rf"{flag} must be a bool"):
            call()
    assert ops.attention(q, kv, kv, enable_gqa=True).shape == q.shape  # the flags as bools still run
