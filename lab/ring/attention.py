"""Context-parallel (ring) attention over torch.distributed: lab.ring.ring_attention.

Each rank holds one shard of the sequence, (B, H, S_local, D) like SDPA. K/V shards travel around the
ring (to rank + 1, from rank - 1) with `torch.distributed.batch_isend_irecv`; while the next shard is in
flight, the local queries attend to the shard already here, and every step's partial (out, lse) is merged
by log-sum-exp: the algebra of the split-K combine (lab.decode.splits.merge_partials), here in torch.

Layouts (`shard_chunks`):
- non-causal: contiguous shards, boundaries at floor(r * S / W), so any S works (uneven shards);
- causal: zig-zag. The sequence is cut into 2W chunks and rank r holds chunks r and 2W - 1 - r. Under a
  causal mask, contiguous shards give rank W - 1 about 2W - 1 times the work of rank 0; zig-zag pairs an
  early chunk with a late one, so every rank does the same work (up to one chunk of rounding), and every
  chunk pair is either fully visible, the causal diagonal (same chunk), or skipped: the forward kernel
  only ever runs full or top-left-causal blocks of equal length.

The local attention is a function attend(q, k, v, is_causal) -> (out, lse natural log, (B, H, S_q)):
lab.ops.attention(..., return_lse=True) on GPUs, reference_attend (float64 math) on the CPU, where CI runs
the whole algorithm over the gloo backend with world sizes 2-4 (tests/ring/test_dist.py).

The transport is lab.ring.comm: on a GPU each transfer is queued on a stream of its own, and the current
stream, which runs the forward kernel on the shard already here, waits for it only when the next step needs
its shard. A StepClock passed in records, per step, when the compute and the transfer started and ended
(CUDA events on a GPU, wall-clock on the CPU). `communicate=False` runs the same steps on stand-in shards with
no transfer (the compute-only time); `overlap=False` waits for each transfer before computing (the serial
time). init_process_group() keeps NVLink multicast off, as the GPU machines require.
"""
from __future__ import annotations

import math

import torch

from ..merge import lse_merge  # noqa: F401 (lab.ring.attention.lse_merge: the ring's merge)

from .backward import ring_attention_backward
from .blocks import (_visible, chunk_bounds, lab_attend, reference_attend, ring_place, shard,  # noqa: F401
                     shard_chunks, unshard)  # (re-exported: lab.ring.attention.shard and the rest, as before)
from .comm import MULTICAST_OFF, StepClock, comm_stream, init_process_group, multicast_off, transfer  # noqa: F401

# ------------------------------------------------------------------ the ring

def ring_step(q, q_chunks, k, v, k_chunks, is_causal, attend, acc):
    """Attend the local queries to one K/V shard and merge into acc[i] = (out, lse) per query chunk."""
    q_off = 0
    for i, qc in enumerate(q_chunks):
        qi = q[:, :, q_off:q_off + qc[1] - qc[0]]
        q_off += qc[1] - qc[0]
        k_off = 0
        for kc in k_chunks:
            n = kc[1] - kc[0]
            mode = _visible(qc, kc, is_causal)
            if mode is not None and n and qi.shape[2]:
                out, lse = attend(qi, k[:, :, k_off:k_off + n], v[:, :, k_off:k_off + n], mode == "causal")
                acc[i] = (out, lse) if acc[i] is None else lse_merge(*acc[i], out, lse)
            k_off += n
    return acc


def _rows(q, acc, q_chunks):
    """This rank's output rows from the merged partials; a chunk that saw no key (an empty chunk) is zeros."""
    dtype = next((a[0].dtype for a in acc if a is not None), q.dtype)
    parts = [a[0] if a is not None else q.new_zeros(q.shape[0], q.shape[1], e - b, q.shape[3], dtype=dtype)
             for a, (b, e) in zip(acc, q_chunks)]
    return torch.cat(parts, dim=2).to(q.dtype)


def _lse_rows(q, acc, q_chunks):
    """This rank's merged lse rows (natural log, (B, H, S_local)); a chunk that saw no key is -inf."""
    dtype = next((a[1].dtype for a in acc if a is not None), torch.float32)
    parts = [a[1] if a is not None else torch.full((q.shape[0], q.shape[1], e - b), -math.inf, dtype=dtype,
                                                   device=q.device)
             for a, (b, e) in zip(acc, q_chunks)]
    return torch.cat(parts, dim=2)


def ring_attention(q, k, v, is_causal: bool = False, group=None, attend=None, seqlen: int | None = None,
                   clock: StepClock | None = None, communicate: bool = True, overlap: bool = True):
    """Attention over a sequence sharded across the ranks of `group` (shard_chunks's layout).

    q (B, H, S_local, D), k and v (B, H_kv, S_local_k, D) are this rank's shards; seqlen is the full length
    (default: the sum of the shard lengths over the group). Returns this rank's rows of the output,
    differentiable in q, k and v (lab.ring.backward: K, V and the dK/dV accumulators go round the ring again).
    K/V circulate with batch_isend_irecv, each transfer started before the attention of the block already here
    (on a GPU: on comm_stream), so communication runs under compute. clock: a StepClock that records each step;
    communicate=False: compute only (stand-in shards); overlap=False: serial.
    """
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return RingAttention.apply(q, k, v, is_causal, group, attend, seqlen, clock, communicate, overlap)
    return ring_forward(q, k, v, is_causal, group, attend, seqlen, clock, communicate, overlap)[0]


class RingAttention(torch.autograd.Function):
    """ring_attention with gradients: saves the shards, the output rows and the merged lse (never P)."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal, group, attend, seqlen, clock, communicate, overlap):
        out, lse = ring_forward(q, k, v, is_causal, group, attend, seqlen, clock, communicate, overlap)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.group, ctx.seqlen = is_causal, group, seqlen
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_attention_backward(q, k, v, out, lse, dout.contiguous(), ctx.is_causal, ctx.group,
                                             ctx.seqlen)
        return dq, dk, dv, None, None, None, None, None, None, None


def ring_forward(q, k, v, is_causal: bool = False, group=None, attend=None, seqlen: int | None = None,
                 clock: StepClock | None = None, communicate: bool = True, overlap: bool = True):
    """ring_attention's steps: (this rank's output rows, their merged lse in natural log, float32 or wider)."""
    import torch.distributed as dist

    attend = attend or (lab_attend if q.is_cuda else reference_attend)
    world, rank, seqlen, q_chunks = ring_place(q, group, seqlen, is_causal)
    acc = [None] * len(q_chunks)
    kv = torch.stack([k, v])
    peers = tuple(dist.get_global_rank(group, r) if group else r for r in ((rank + 1) % world, (rank - 1) % world))
    stream = comm_stream(q.device) if q.is_cuda and communicate else None
    current = torch.cuda.current_stream() if q.is_cuda else None
    for step in range(world):
        owner = (rank - step) % world  # whose shard is here now
        pending = None
        if step < world - 1:  # the next shard to arrive is owner - 1's; uneven shards differ in length
            n_next = sum(e - b for b, e in shard_chunks(seqlen, world, (owner - 1) % world, is_causal))
            if stream is not None and (step == 0 or not overlap):  # the first send reads kv, made on this
                stream.wait_stream(current)  # stream; serial: no transfer starts before the last compute ends
            pending = transfer(kv, n_next, peers, group, step, clock, stream, communicate)
            if not overlap:
                pending.wait()
        if clock:
            clock.mark(step, "compute", "start", current)
        ring_step(q, q_chunks, kv[0], kv[1], shard_chunks(seqlen, world, owner, is_causal), is_causal, attend, acc)
        if clock:
            clock.mark(step, "compute", "end", current)
        if pending is not None:
            kv = pending.wait()
    return _rows(q, acc, q_chunks), _lse_rows(q, acc, q_chunks)


def emulate_ring(q, k, v, world: int, is_causal: bool, attend=reference_attend):
    """The same steps in one process: rank r's output rows, for every r (tests, and the CPU chapter)."""
    return emulate_ring_with_lse(q, k, v, world, is_causal, attend)[0]


def emulate_ring_with_lse(q, k, v, world: int, is_causal: bool, attend=reference_attend):
    """emulate_ring's output and merged lse (natural log, (B, H, S)), both in full-sequence order."""
    seqlen = q.shape[2]
    shards_kv = [(shard(k, world, r, is_causal), shard(v, world, r, is_causal)) for r in range(world)]
    outs, lses = [], []
    for rank in range(world):
        q_chunks = shard_chunks(seqlen, world, rank, is_causal)
        acc = [None] * len(q_chunks)
        qs = shard(q, world, rank, is_causal)
        for step in range(world):
            owner = (rank - step) % world
            ring_step(qs, q_chunks, *shards_kv[owner], shard_chunks(seqlen, world, owner, is_causal), is_causal,
                      attend, acc)
        outs.append(_rows(qs, acc, q_chunks))
        lses.append(_lse_rows(qs, acc, q_chunks).unsqueeze(-1))
    return unshard(outs, seqlen, is_causal), unshard(lses, seqlen, is_causal).squeeze(-1)


def causal_work(seqlen: int, world: int, zigzag: bool = True) -> list[int]:
    """Query-key pairs each rank computes under a causal mask: zig-zag against contiguous shards."""
    work = []
    for rank in range(world):
        chunks = shard_chunks(seqlen, world, rank, True) if zigzag else [chunk_bounds(seqlen, world)[rank]]
        work.append(sum((b + e + 1) * (e - b) // 2 for b, e in chunks))  # rows b..e-1 see b+1..e keys
    return work
