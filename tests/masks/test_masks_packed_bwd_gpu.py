"""The packed backward read in place (bwd v08 over cu_seqlens) beside the padded copies (the same loop over dense
buffers, lab.masks.varlen_bwd layout="padded"): dK and dV bit for bit where both run one config (each key block's
CTA runs the same steps on the same rows; the next sequence's rows that a tile reads past a sequence's end get
P = dS = 0), to float32 summation order at D 64 without softcap (128 queries a step in place), dQ and d sinks to
float32 reduction order; rows of no sequence zero with NaN-poisoned memory; a build that reads every sequence's keys
at the first one's rows differs; the dQ convert by workspace block (the default) gives the per-thread convert's dQ
to float32 reduction order and dK, dV bit for bit; a pre-pass that leaves dq_accum unzeroed is seen. Skipped without
CUDA."""
from __future__ import annotations

import pytest
import torch

from lab import check
from lab.masks import varlen_bwd

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _call(lens, Hq, Hkv, D, dtype, causal, window, cap, sink, stray=5, seed=0):
    torch.manual_seed(seed)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    tq = sum(lens) + stray
    q, out, dout = (torch.randn(tq, Hq, D, device="cuda", dtype=dtype) for _ in range(3))
    k, v = (torch.randn(tq, Hkv, D, device="cuda", dtype=dtype) for _ in range(2))
    lse = torch.randn(Hq, tq, device="cuda") + 3.0
    dlse = torch.randn(Hq, tq, device="cuda")
    sinks = torch.randn(Hq, device="cuda") if sink else None
    left, right = window if window is not None else (-1, 0 if causal else -1)
    args = (dout, q, k, v, out, lse, dlse, cu, cu, sinks, sink, max(lens), max(lens), left, right, cap, D ** -0.5)
    return args, sum(lens)


# uneven and empty sequences, GQA and MQA, D 64 and 128, bf16 and fp16, windows, softcap and sinks
CASES = [([1, 0, 63, 65, 200, 0, 130], 4, 2, 128, torch.bfloat16, True, None, 0.0, True),
         ([700, 1, 0, 1300, 129, 64], 4, 1, 64, torch.bfloat16, True, (100, 0), 30.0, False),
         ([257, 3, 511, 128], 6, 3, 128, torch.float16, False, (40, 70), 5.0, True),
         ([1025, 0, 300], 2, 2, 64, torch.float16, False, None, 0.0, False)]


def _run(args, layout, defines=None):
    check._poison_allocator(args[1], args[2], args[3])
    return varlen_bwd.launch(*args, layout=layout, defines=defines)


@pytest.mark.parametrize("lens,Hq,Hkv,D,dtype,causal,window,cap,sink", CASES)
def test_in_place_matches_the_padded_copies(lens, Hq, Hkv, D, dtype, causal, window, cap, sink):
    args, rows = _call(lens, Hq, Hkv, D, dtype, causal, window, cap, sink)
    dq, dk, dv, ds = _run(args, "packed")
    pq, pk, pv, ps = _run(args, "padded")
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
        assert (g[rows:] == 0).all()  # the stray rows
    if D == 64 and cap == 0.0:  # 128 queries a step in place, 64 in the padded path: float32 sums in another order
        torch.testing.assert_close(dk.float(), pk.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dv.float(), pv.float(), rtol=1e-2, atol=1e-2)
    else:
        assert torch.equal(dk, pk) and torch.equal(dv, pv)
    torch.testing.assert_close(dq.float(), pq.float(), rtol=1e-2, atol=1e-2)
    if sink:
        torch.testing.assert_close(ds, ps, rtol=1e-4, atol=1e-3)


def test_a_dropped_sequence_offset_is_seen():
    args, _ = _call([1, 0, 63, 65, 200, 0, 130], 4, 2, 128, torch.bfloat16, True, None, 0.0, False)
    _, dk, _, _ = _run(args, "packed")
    _, bad, _, _ = _run(args, "packed", {"LAB_BWD_PACKED_BUG_NO_OFFSET": 1})
    assert not torch.equal(dk, bad)


THREADS = {"LAB_BWD_PACKED_BLOCK_CONVERT": 0}  # the per-thread dQ convert


@pytest.mark.parametrize("lens,Hq,Hkv,D,dtype,causal,window,cap,sink", CASES)
def test_block_convert_matches_the_thread_convert(lens, Hq, Hkv, D, dtype, causal, window, cap, sink):
    args, rows = _call(lens, Hq, Hkv, D, dtype, causal, window, cap, sink, seed=1)
    dq, dk, dv, ds = _run(args, "packed", THREADS)
    bq, bk, bv, bs = _run(args, "packed")
    for g in (bq, bk, bv):
        assert torch.isfinite(g).all()
        assert (g[rows:] == 0).all()  # the stray rows
    assert torch.equal(dk, bk) and torch.equal(dv, bv)
    torch.testing.assert_close(bq.float(), dq.float(), rtol=1e-2, atol=1e-2)
    if sink:
        torch.testing.assert_close(bs, ds, rtol=1e-4, atol=1e-3)


def test_an_unzeroed_accumulator_is_seen():
    """The workspace filled with NaN before the launch: the default pre-pass zeroes every dq_accum row a sequence
    reads (dQ finite), the build that skips the zeroing passes the NaN to dQ."""
    lens = [1, 0, 63, 65, 200, 0, 130]
    args, _ = _call(lens, 4, 2, 128, torch.bfloat16, True, None, 0.0, False)
    good, _, _, _ = varlen_bwd.launch(*args, layout="packed", poison_workspace=True)
    bad, _, _, _ = varlen_bwd.launch(*args, layout="packed", defines={"LAB_BWD_PACKED_BUG_NO_ZERO": 1},
                                     poison_workspace=True)
    assert torch.isfinite(good).all() and not torch.isfinite(bad).all()


def test_layout_arguments():
    args, _ = _call([5, 7], 2, 2, 64, torch.bfloat16, True, None, 0.0, False)
    with pytest.raises(ValueError, match="layout must be"):
        varlen_bwd.launch(*args, layout="dense")
    narrow, _ = _call([5, 7], 2, 2, 32, torch.bfloat16, True, None, 0.0, False)
    with pytest.raises(ValueError, match="packed layout runs"):  # D 32: the in-place kernel takes 64 and 128 only
        varlen_bwd.launch(*narrow, layout="packed")
