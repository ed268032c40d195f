"""The ring's backward: gradients of lab.ring.ring_attention in q, k and v.

With the forward's merged LSE (natural log, global over the whole sequence) and its output O saved, the
gradient of attention splits over key blocks exactly (FlashAttention's backward, one block at a time):

    P_ij = exp(s_ij - LSE_i)          the global softmax weights, block by block
    Δ_i = rowsum(dO_i ∘ O_i)          from the final output, once per row
    dV_j += P_jᵀ dO,  dS = P (dP - Δ), dP = dO V_jᵀ,  dQ += scale dS K_j,  dK_j += scale dSᵀ Q

So each step runs the lab's backward kernel on (the local queries, the K/V block here) with the saved LSE and
O, and no correction is needed afterwards. With a block-local LSE instead (what a ring that forgot the forward's
merge would use), P is wrong by a per-row factor and so are all three gradients: `emulate_ring_backward(...,
block_lse=True)` is that deliberately wrong ring, which the checks must fail.

Transport: K and V travel around the ring as in the forward (to rank + 1, from rank - 1), and beside them the
dK/dV accumulator of the block: at step s rank r holds owner (r - s)'s K, V and the sum of the contributions of
ranks r - s .. r - 1 to its dK, dV. Each rank adds its own and passes the sum on; after the last step one more
exchange brings every rank its own block's total. The accumulator of a step is sent after that step's compute and
received during the next, under that step's compute (lab.ring.comm's streams on a GPU).
"""
from __future__ import annotations

import math

import torch

from ..backward.op import default_backward
from ..op_common import _scale
from .blocks import _visible, reference_attend, ring_place, shard, shard_chunks, unshard
from .comm import StepClock, comm_stream, transfer


def reference_attend_backward(q, k, v, out, dout, lse, is_causal: bool):
    """One block's (dq, dk, dv) in float64 from the global lse and output (GQA: dk, dv summed over groups)."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64, o64, do64 = (t.double() for t in (q, k, v, out, dout))
    kk, vv = k64.repeat_interleave(group, 1), v64.repeat_interleave(group, 1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = (q64 @ kk.transpose(-1, -2)) * scale
    p = torch.exp(s - lse.double()[..., None])
    if is_causal:  # top-left: the block is the causal diagonal of one chunk
        p = p.masked_fill(~torch.ones(p.shape[-2:], dtype=torch.bool, device=p.device).tril(), 0.0)
    delta = (do64 * o64).sum(-1, keepdim=True)
    ds = p * (do64 @ vv.transpose(-1, -2) - delta)
    dq = (ds @ kk) * scale
    dk = (ds.transpose(-1, -2) @ q64) * scale
    dv = p.transpose(-1, -2) @ do64
    fold = lambda t: t.unflatten(1, (k.shape[1], group)).sum(2)  # noqa: E731 (query heads back to KV heads)
    return dq, fold(dk), fold(dv)


def lab_attend_backward(q, k, v, out, dout, lse, is_causal: bool):
    """The lab's backward kernel on one block (the version lab.ops picks), fed the global lse and output."""
    # the kernel reads lse as one dense, 16-byte aligned float32 row per query; a query chunk's rows of a shard's
    # lse are neither (a strided view, or one that starts mid-buffer), q, k, v, out and dout it takes strided
    lse = lse.float()
    if not lse.is_contiguous() or lse.data_ptr() % 16:
        lse = lse.clone(memory_format=torch.contiguous_format)
    return default_backward(dout, q, k, v, out.to(q.dtype), lse, None, is_causal, _scale(None, q.shape[-1]))


def with_block_lse(attend, attend_backward):
    """The deliberately wrong block backward: each block's own lse (from `attend`) in place of the merged one."""
    def wrong(q, k, v, out, dout, lse, is_causal):
        return attend_backward(q, k, v, out, dout, attend(q, k, v, is_causal)[1], is_causal)
    return wrong


def backward_step(q, q_chunks, out, dout, lse, k, v, k_chunks, is_causal, attend_backward, dq, dkv):
    """One K/V block's contributions: into dq (this rank's rows) and dkv (the block's dK, dV), float32 or wider."""
    q_off = 0
    for qc in q_chunks:
        rows = slice(q_off, q_off + qc[1] - qc[0])
        q_off += qc[1] - qc[0]
        k_off = 0
        for kc in k_chunks:
            n = kc[1] - kc[0]
            mode = _visible(qc, kc, is_causal)
            if mode is not None and n and rows.stop > rows.start:
                keys = slice(k_off, k_off + n)
                got = attend_backward(q[:, :, rows], k[:, :, keys], v[:, :, keys], out[:, :, rows],
                                      dout[:, :, rows], lse[:, :, rows], mode == "causal")
                dq[:, :, rows] += got[0].to(dq.dtype)
                dkv[0][:, :, keys] += got[1].to(dkv.dtype)
                dkv[1][:, :, keys] += got[2].to(dkv.dtype)
            k_off += n


def ring_attention_backward(q, k, v, out, lse, dout, is_causal: bool, group=None, seqlen: int | None = None,
                            attend_backward=None, clock: StepClock | None = None, communicate: bool = True,
                            overlap: bool = True):
    """This rank's (dq, dk, dv) for its shards, given the forward's output rows and merged lse (natural log).
    communicate=False: the same steps with no transfer (stand-in blocks and accumulators: the compute-only time,
    its gradients meaningless); overlap=False: each transfer is waited for before the compute that follows."""
    import torch.distributed as dist

    attend_backward = attend_backward or (lab_attend_backward if q.is_cuda else reference_attend_backward)
    world, rank, seqlen, q_chunks = ring_place(q, group, seqlen, is_causal)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    length = lambda r: sum(e - b for b, e in shard_chunks(seqlen, world, r % world, is_causal))  # noqa: E731
    dq = torch.zeros(q.shape, dtype=acc_dtype, device=q.device)
    kv = torch.stack([k, v])
    peers = tuple(dist.get_global_rank(group, r) if group else r for r in ((rank + 1) % world, (rank - 1) % world))
    stream = comm_stream(q.device) if q.is_cuda and communicate else None
    current = torch.cuda.current_stream() if q.is_cuda else None
    incoming = None  # the dK/dV accumulator of the block here, from the ranks before this one
    for step in range(world):
        owner = (rank - step) % world
        pending = None
        if step < world - 1:
            if stream is not None and (step == 0 or not overlap):
                stream.wait_stream(current)
            pending = transfer(kv, length(owner - 1), peers, group, step, clock, stream, communicate)
            if not overlap:
                pending.wait()
        if clock:
            clock.mark(step, "compute", "start", current)
        dkv = torch.zeros((2, *k.shape[:2], length(owner), k.shape[3]), dtype=acc_dtype, device=q.device)
        backward_step(q, q_chunks, out, dout, lse, kv[0], kv[1], shard_chunks(seqlen, world, owner, is_causal),
                      is_causal, attend_backward, dq, dkv)
        if clock:
            clock.mark(step, "compute", "end", current)
        if incoming is not None:
            dkv += incoming.wait()
        if stream is not None:
            stream.wait_stream(current)  # the accumulator is sent once this step's adds are done
        incoming = transfer(dkv, length(owner - 1), peers, group, world + step, clock, stream, communicate)
        if not overlap:
            incoming.wait()
        if pending is not None:
            kv = pending.wait()
    own = incoming.wait()  # after the last step: this rank's block, summed over every rank
    return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype)


def emulate_ring_backward(q, k, v, dout, world: int, is_causal: bool, attend=reference_attend,
                          attend_backward=reference_attend_backward, block_lse: bool = False):
    """Every rank's steps in one process: the full (dq, dk, dv). block_lse=True is the deliberately wrong
    ring (each block's own lse in place of the merged one), which a gradient check must fail."""
    seqlen = q.shape[2]
    out, lse = attend(q, k, v, is_causal)  # what the forward ring gives (tests/ring/test_dist.py checks it equal)
    if block_lse:
        attend_backward = with_block_lse(attend, attend_backward)

    dq_parts, dkv_total = [], {}
    for rank in range(world):
        q_chunks = shard_chunks(seqlen, world, rank, is_causal)
        rows = [shard(t, world, rank, is_causal) for t in (q, out, dout)]
        lse_r = shard(lse.unsqueeze(-1), world, rank, is_causal).squeeze(-1)
        dq = torch.zeros(rows[0].shape, dtype=torch.float64)
        for owner in range(world):
            kb, vb = shard(k, world, owner, is_causal), shard(v, world, owner, is_causal)
            dkv = dkv_total.setdefault(owner, torch.zeros((2, *kb.shape), dtype=torch.float64))
            backward_step(rows[0], q_chunks, rows[1], rows[2], lse_r, kb, vb,
                          shard_chunks(seqlen, world, owner, is_causal), is_causal, attend_backward, dq, dkv)
        dq_parts.append(dq)
    dk = unshard([dkv_total[r][0] for r in range(world)], seqlen, is_causal)
    dv = unshard([dkv_total[r][1] for r in range(world)], seqlen, is_causal)
    return unshard(dq_parts, seqlen, is_causal), dk, dv
