"""Which work tiles each CTA of a persistent causal forward kernel takes, in order: v07's two static orders,
written out in Python so the balance they give can be counted (and plotted) without a GPU.

A work tile is (bh, mb): query rows [mb * B_r, (mb + 1) * B_r) of batch-head bh. With a square causal mask and
B_r = B_c, tile mb costs mb + 1 key tiles, so a static round-robin is only as even as the order makes it.

- `snake_order`: the order v07 ran first (H200 d128-cells run 1, outputs/driver_logs/20261123-h200-d128-cells-run1-821ab82). Heads in groups whose K and V fit L2, longest
  tile first within a group, and CTA x takes tile it * G + x in round `it`, reversed every other round.
  Rounds that straddle two groups are not longest-first, so some CTAs draw two long tiles and others two
  short ones.
- `pair_order`: v07's PAIR (kernels/fwd/v07_overlap.cu, `work_at`). A unit is the two tiles num_m - 1 - u and u
  of one head, longest first, so every unit costs num_m + 1 key tiles; CTA x takes units x, x + G, ...
  (with an odd num_m the middle tile is a unit of its own).

Both functions mirror the kernel's integer arithmetic line by line; tests/fwd/test_work_order.py checks that
every tile is taken exactly once and how even the key tiles per CTA come out.
"""
from __future__ import annotations

L2_GROUP_MB = 16  # v07's LAB_FWD_OVERLAP_D128_L2_GROUP_MB: the snake's head groups at D = 128


def pair_order(num_m: int, num_bh: int, grid: int) -> list[list[tuple[int, int]]]:
    """Per CTA, its (bh, mb) tiles in the order it runs them under PAIR."""
    half = (num_m + 1) // 2
    num_units = num_bh * half
    rounds = 2 * -(-num_units // grid)
    order = [[] for _ in range(grid)]
    for x in range(grid):
        for it in range(rounds):
            u = (it >> 1) * grid + x
            r = u % half
            mb = r if it & 1 else num_m - 1 - r
            if u < num_units and not (it & 1 and mb == num_m - 1 - r):
                order[x].append((u // half, mb))
    return order


def snake_order(num_m: int, num_bh: int, grid: int, group: int) -> list[list[tuple[int, int]]]:
    """Per CTA, its (bh, mb) tiles under the snake over L2 head groups of `group` heads (v07's `locate`)."""
    total = num_m * num_bh
    rounds = -(-total // grid)
    order = [[] for _ in range(grid)]
    for x in range(grid):
        for it in range(rounds):
            w = it * grid + (grid - 1 - x if it & 1 else x)
            if w >= total:
                continue
            g, r = divmod(w, group * num_m)
            heads = min(group, num_bh - g * group)
            order[x].append((g * group + r % heads, num_m - 1 - r // heads))
    return order


def l2_group(seqlen_k: int, head_dim: int, group_mb: int, num_bh: int) -> int:
    """Heads per L2 group as v07 computes it: as many heads as fit group_mb MiB of 16-bit K and V."""
    fit = group_mb * (1 << 20) // max(seqlen_k * head_dim * 4, 1)
    return max(1, min(num_bh, fit))


def key_tiles_per_cta(order: list[list[tuple[int, int]]]) -> list[int]:
    """Key tiles each CTA computes (square causal, B_r = B_c: tile mb costs mb + 1)."""
    return [sum(mb + 1 for _, mb in tiles) for tiles in order]


def imbalance(order: list[list[tuple[int, int]]]) -> float:
    """The busiest CTA's key tiles over the mean: what a static schedule's tail costs at most."""
    costs = key_tiles_per_cta(order)
    return max(costs) / (sum(costs) / len(costs))


def consumer_tiles(seqlen_q: int, seqlen_k: int, m0: int, block_k: int, rows: int = 64, causal: bool = True) -> int:
    """fwd v10's consumer_tiles: the key tiles a consumer warpgroup of `rows` query rows from m0 runs. Causal: those
    before the first tile that starts at or past min(S_k, S_q, m0 + rows), the keys its rows see (top-left)."""
    kv_end = min(seqlen_k, min(seqlen_q, m0 + rows)) if causal else seqlen_k
    return -(-kv_end // block_k)


def consumer_tile_saving(seqlen: int, block_k: int, block_q: int = 128, rows: int = 64) -> float:
    """The share of consumer key tiles (S and P V of 64 rows against B_c keys) that fwd v10's causal grid no longer
    runs on a square causal call: each 128-row CTA loads the tiles its lower consumer needs, the upper one stops at
    its own (the tensor work the change removes; D = 192 at S = 512: 4 of 28)."""
    before = after = 0
    for m0 in range(0, seqlen, block_q):
        n = consumer_tiles(seqlen, seqlen, m0, block_k, block_q)
        before += 2 * n
        after += n + min(n, consumer_tiles(seqlen, seqlen, m0, block_k, rows))
    return 1 - after / before


def v10_snake(n_work: int, grid: int) -> list[list[int]]:
    """fwd v10's persistent order (snake_tile, LAB_FWD_WIDE_PERSIST): per CTA x, its work tiles; round i hands CTA x
    tile i * grid + x, or i * grid + grid - 1 - x in odd rounds, until the tiles run out."""
    order = []
    for x in range(grid):
        tiles, i = [], 0
        while (w := i * grid + (grid - 1 - x if i & 1 else x)) < n_work:
            tiles.append(w)
            i += 1
        order.append(tiles)
    return order
