"""The ring's layout and its blocks: which positions each rank holds (contiguous, or zig-zag under a causal
mask), how a query chunk sees a key chunk, and the attention of one block (float64 math on the CPU, the lab's
forward on a GPU). lab.ring.attention (the forward) and lab.ring.backward both build on these.
"""
from __future__ import annotations

import torch

from .. import ops
from ..reference import attention_reference


# ------------------------------------------------------------------ layout

def chunk_bounds(seqlen: int, parts: int) -> list[tuple[int, int]]:
    """[begin, end) of `parts` near-equal chunks of [0, seqlen): boundaries at floor(i * seqlen / parts)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    cuts = [i * seqlen // parts for i in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def shard_chunks(seqlen: int, world: int, rank: int, is_causal: bool) -> list[tuple[int, int]]:
    """The [begin, end) position ranges rank holds: one contiguous range, or zig-zag chunks r and 2W-1-r."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    if not is_causal:
        return [chunk_bounds(seqlen, world)[rank]]
    chunks = chunk_bounds(seqlen, 2 * world)
    return [chunks[rank], chunks[2 * world - 1 - rank]]


def shard(x: torch.Tensor, world: int, rank: int, is_causal: bool) -> torch.Tensor:
    """Rank's shard of a full (B, H, S, D) tensor, its chunks concatenated along S."""
    return torch.cat([x[:, :, b:e] for b, e in shard_chunks(x.shape[2], world, rank, is_causal)], dim=2)


def unshard(shards: list[torch.Tensor], seqlen: int, is_causal: bool) -> torch.Tensor:
    """The full tensor back from every rank's shard (the inverse of shard)."""
    world = len(shards)
    parts = {}
    for rank, piece in enumerate(shards):
        offset = 0
        for b, e in shard_chunks(seqlen, world, rank, is_causal):
            parts[(b, e)] = piece[:, :, offset:offset + e - b]  # (b, e): empty chunks share a begin
            offset += e - b
    return torch.cat([parts[key] for key in sorted(parts)], dim=2)


# ------------------------------------------------------------------ local attention and the merge

def reference_attend(q, k, v, is_causal: bool):
    """lab.reference's float64 attention (out, lse) on torch tensors: the CPU runs and the tests."""
    out, lse = attention_reference(*(t.detach().cpu().numpy() for t in (q, k, v)), is_causal=is_causal)
    return torch.from_numpy(out).to(q.device), torch.from_numpy(lse).to(q.device)


def lab_attend(q, k, v, is_causal: bool):
    """lab.ops.attention with its LSE: the forward kernel each ring step runs on a GPU."""
    out, lse = ops.attention(q, k, v, is_causal=is_causal, enable_gqa=q.shape[1] != k.shape[1], return_lse=True)
    return out.float(), lse


def _visible(q_chunk: tuple, k_chunk: tuple, is_causal: bool) -> str | None:
    """How query chunk sees key chunk: 'full', 'causal' (the same chunk: its diagonal), or None (masked)."""
    if not is_causal or k_chunk[1] <= q_chunk[0]:
        return "full"
    if k_chunk == q_chunk:
        return "causal"
    return None  # every key after every query: zig-zag chunks never straddle, so there is no third case


def ring_place(q, group, seqlen: int | None, is_causal: bool) -> tuple[int, int, int, list[tuple[int, int]]]:
    """(world, rank, seqlen, this rank's query chunks) of a ring call: seqlen summed over the group when not
    given; a shard whose row count the layout does not give raises."""
    import torch.distributed as dist

    world, rank = dist.get_world_size(group), dist.get_rank(group)
    if seqlen is None:
        lengths = torch.tensor([q.shape[2]], device=q.device)
        dist.all_reduce(lengths, group=group)
        seqlen = int(lengths)
    q_chunks = shard_chunks(seqlen, world, rank, is_causal)
    if sum(e - b for b, e in q_chunks) != q.shape[2]:
        raise ValueError(f"rank {rank} holds {q.shape[2]} query rows but the layout gives it "
                         f"{sum(e - b for b, e in q_chunks)} of {seqlen}")
    return world, rank, seqlen, q_chunks
