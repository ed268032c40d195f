"""Which packed work tiles each CTA of fwd v11's persistent packed grid takes, in order: PackedOrder.locate of
kernels/common/hopper/attn_mask_packed_sm90.cuh written out in Python, so that coverage and balance can be counted
without a GPU (tests/masks/test_packed_order.py).

A unit is (sequence b, head h, r); its query tiles are n_b - 1 - r then r of the sequence's own n_b tiles (the
middle one once), units numbered head-major with half = ceil(num_m / 2) slots per head (num_m from the longest
sequence), CTA x takes units x, x + G, ... Under a causal mask with S_q = S_k, tile mb costs mb + 1 key tiles, so
every non-empty unit of a sequence costs n_b + 1. For sequences of one length the order is fwd v07's PAIR
(lab.fwd.work_order.pair_order) with (b, h) as its head.
"""
from __future__ import annotations


def units(lens_q: list[int], heads: int, br: int = 128) -> int:
    """The host's bound on the units (the grid is min(this, multiprocessors)): every sequence at the longest's."""
    num_m = -(-max(lens_q, default=0) // br)
    return len(lens_q) * heads * ((num_m + 1) // 2)


def packed_pair_order(lens_q: list[int], heads: int, grid: int, br: int = 128) -> list[list[tuple[int, int, int]]]:
    """Per CTA, its (b, h, mb) tiles in the order it runs them; grid: the kernel's min(units, multiprocessors).
    Units are numbered sequence by sequence (heads x ceil(n_b / 2) each, none empty); a CTA walks the sequences
    with a cursor as its unit index grows, so it reads each sequence's cu_seqlens once."""
    rounds = 2 * -(-units(lens_q, heads, br) // grid)
    order = [[] for _ in range(grid)]
    for x in range(grid):
        b, u0, span = 0, 0, heads * ((-(-lens_q[0] // br) + 1) // 2) if lens_q else 0
        for it in range(rounds):
            u = (it >> 1) * grid + x
            while b < len(lens_q) and u >= u0 + span:
                u0 += span
                b += 1
                span = heads * ((-(-lens_q[b] // br) + 1) // 2) if b < len(lens_q) else 0
            if b >= len(lens_q):
                break
            n_b = -(-lens_q[b] // br)
            h, r = divmod(u - u0, (n_b + 1) // 2)
            light = it & 1
            if light and r == n_b - 1 - r:
                continue
            order[x].append((b, h, r if light else n_b - 1 - r))
    return order


def causal_key_tiles(order: list[list[tuple[int, int, int]]]) -> list[int]:
    """Key tiles per CTA under a causal mask with S_q = S_k and B_r = B_c (tile mb costs mb + 1)."""
    return [sum(mb + 1 for _, _, mb in tiles) for tiles in order]
