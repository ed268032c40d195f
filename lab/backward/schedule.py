"""A CPU model of how the Hopper backward's CTAs fill the GPU, for predictions before a GPU run.

The dense backward launches one CTA per (key block, KV head, batch) at one CTA per SM; the hardware hands the CTAs
out in blockIdx order to whichever SM frees first. With equal CTAs the last wave runs part empty; with the causal
mask a head's key blocks shrink from the first to the last (key block j starts at the query block of its first
key), so whatever long blocks come last in the order set the end. ``makespan`` plays that dispatch with each CTA's
cost in steps (its query blocks, over the GQA group, plus a fixed prologue and epilogue), and ``loss`` is its excess
over the perfectly balanced time. The model knows nothing of memory: an order that moves work around changes
which CTAs share Q and dO in L2, which only a GPU run measures.
"""
from __future__ import annotations

import heapq

from .emulate_convert import first_block


def makespan(costs, sms: int = 132) -> float:
    """When the last CTA ends, CTAs dispatched in order to the first free SM (one CTA per SM)."""
    free = [0.0] * sms
    end = 0.0
    for cost in costs:
        start = heapq.heappop(free)
        end = max(end, start + cost)
        heapq.heappush(free, start + cost)
    return end


def loss(costs, sms: int = 132) -> float:
    """makespan over the balanced time (total work / SMs), minus 1."""
    return makespan(costs, sms) / (sum(costs) / sms) - 1.0


def tile_steps(tile: int, seqlen_q: int, seqlen_k: int, causal: bool, block_q: int, block_k: int = 128,
               group: int = 1) -> int:
    """Steps of tile `tile` in the kernels' numbering (key block fastest): query blocks from the one holding the
    block's first key (causal, top-left) or from 0, times the query heads of the group (tile_work)."""
    n_kb = -(-seqlen_k // block_k)
    n_mb = -(-seqlen_q // block_q)
    return group * (n_mb - first_block(tile % n_kb * block_k, n_mb, causal, block_q))


TAIL_BYTES = 24 << 20  # v14's kTailBytes: the reordered heads' Q and dO stay within about half the L2


def tail_heads(n_kb: int, n_heads: int, head_bytes: int = 0, sms: int = 132, waves: int = 2) -> int:
    """How many heads v14 reorders: enough for `waves` waves of CTAs, no more than whose Q and dO (`head_bytes`
    each, the GQA group's) fit in TAIL_BYTES."""
    fit = max(1, TAIL_BYTES // max(1, head_bytes))
    return min(n_heads, fit, -(-waves * sms // n_kb))


def tail_lpt_tile(idx: int, n_kb: int, n_heads: int, causal: bool, sms: int = 132, waves: int = 2,
                  head_bytes: int = 0) -> int:
    """bwd v14's blockIdx -> tile map (tail_tile, kernels/common/hopper/attn_bwd_tail.cuh): causal calls keep
    the head-major order except for the last heads that make up about `waves` waves of CTAs (tail_heads), whose
    tiles go key block by key block (every one of those heads' longest block, then their next), so the grid ends
    on short blocks. Non-causal: unchanged."""
    if not causal:
        return idx
    w = tail_heads(n_kb, n_heads, head_bytes, sms, waves)
    first = (n_heads - w) * n_kb
    if idx < first:
        return idx
    r = idx - first
    return (n_heads - w + r % w) * n_kb + r // w


def order_costs(order, seqlen_q: int, seqlen_k: int, causal: bool, block_q: int, fixed: float = 1.5, group: int = 1):
    """The cost of each CTA in dispatch order (tiles in `order`), a fixed prologue and epilogue included."""
    return [fixed + tile_steps(t, seqlen_q, seqlen_k, causal, block_q, group=group) for t in order]
