"""bwd v17's fixed dQ order (kernels/bwd/v17_ordered.cu), played on the CPU.

Each CTA owns one key block of one head; before adding its dQ partial of a query row block it waits until a
counter for that row block equals the number of key blocks ahead of it in the order, then adds and counts. The
grid runs each head's key blocks last to first, and the order of the adds into a row block is that same
descending order. `play` dispatches the grid in order onto a number of SM slots, lets the CTAs run their steps
at random speeds, and returns the order in which the adds landed per row block, or raises Deadlock when no CTA
can move (a CTA waiting on one that is not resident, or a count that is never reached).
"""
from __future__ import annotations

import random


class Deadlock(RuntimeError):
    pass


def tile_of_cta(idx: int, n_kb: int) -> tuple[int, int]:
    """(head, key block) of CTA `idx`: head-major, each head's key blocks last to first (OrderedSteps)."""
    return idx // n_kb, n_kb - 1 - idx % n_kb


def row_blocks(kb: int, seqlen_q: int, causal: bool, block_q: int, block_k: int = 128) -> list[int]:
    """The first rows (m0) of the query row blocks key block kb adds into, in its step order (tile_work)."""
    n_mb = -(-seqlen_q // block_q)
    mb0 = min(kb * block_k // block_q, n_mb) if causal else 0
    return [mb * block_q for mb in range(mb0, n_mb)]


def ahead(kb: int, m0: int, n_kb: int, causal: bool, block_k: int = 128) -> int:
    """The count key block kb waits for before adding into row block m0: the blocks kb + 1 .. last that add there."""
    last = min(n_kb - 1, m0 // block_k) if causal else n_kb - 1
    return last - kb


def play(seqlen_q: int, seqlen_k: int, causal: bool, block_q: int, heads: int = 2, sms: int = 132,
         seed: int = 0, ahead_fn=ahead, block_k: int = 128) -> dict:
    """{(head, m0): [key blocks in the order their adds landed]}; Deadlock if the grid cannot finish."""
    rng = random.Random(seed)
    n_kb = -(-seqlen_k // block_k)
    ctas = [tile_of_cta(i, n_kb) for i in range(heads * n_kb)]
    steps = {c: row_blocks(c[1], seqlen_q, causal, block_q, block_k) for c in ctas}
    count, landed, pos = {}, {}, {}
    queue, resident = list(ctas), []
    while queue or resident:
        while queue and len(resident) < sms:
            resident.append(queue.pop(0))
            pos[resident[-1]] = 0
        ready = [c for c in resident if pos[c] == len(steps[c]) or
                 count.get((c[0], steps[c][pos[c]]), 0) == ahead_fn(c[1], steps[c][pos[c]], n_kb, causal, block_k)]
        if not ready:
            raise Deadlock(f"{len(resident)} resident CTAs all wait; {len(queue)} not started")
        c = rng.choice(ready)  # any ready CTA may move next: the order must not depend on which
        if pos[c] == len(steps[c]):
            resident.remove(c)
            continue
        key = (c[0], steps[c][pos[c]])
        count[key] = count.get(key, 0) + 1
        landed.setdefault(key, []).append(c[1])
        pos[c] += 1
    return landed
