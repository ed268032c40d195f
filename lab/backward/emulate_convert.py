"""The dQ path of the Hopper backward v06 (kernels/bwd/v06_convert.cu), emulated in NumPy: no convert pass; the
last warp to add its partial into a 16-row slab of dq_accum converts that slab.

The kernel's CTAs (one per key block of B_c = 128 keys, KV head and batch; tile_work's order of query heads and
query blocks of B_r = 64 rows, causal from the query block of the CTA's first key) run in an arbitrary
interleaving. At each step every warp of each consumer warpgroup adds its 16 rows of dS K (D = 128: the
warpgroup's column half over all 128 keys; D = 64: all columns over the warpgroup's own 64 keys) and counts
itself on the slab's counter; the add that brings the count to ``slab_partials`` converts the slab. A count
that is wrong converts a slab before its last add arrives (a wrong dQ) or never (dQ stays poisoned): the
emulation checks the count against every interleaving it is given.
"""
from __future__ import annotations

import math

import numpy as np

from .emulate import _resolve_scale, _shapes, reference_ds

BR, BC = 64, 128  # the kernel's query rows per step and keys per CTA (kernels/common/hopper/attn_bwd_sm90.cuh)


def first_block(n0: int, n_mb: int, causal: bool, br: int = BR) -> int:
    """tile_work's first query block (of br rows) of the CTA whose first key is n0."""
    return min(n0 // br, n_mb) if causal else 0


def contributors(mb: int, seqlen_k: int, causal: bool) -> int:
    """The kernel's contributors(): key blocks whose CTA visits query block mb of a head."""
    n_kb = math.ceil(seqlen_k / BC)
    return min(n_kb, mb * BR // BC + 1) if causal else n_kb


def slab_partials(mb: int, seqlen_k: int, causal: bool, head_dim: int) -> int:
    """Partials one 16-row slab receives: a warp of each warpgroup that adds to it, per visiting CTA."""
    return contributors(mb, seqlen_k, causal) * (1 if head_dim == 128 else 2)


def emulate_convert(q, k, v, dout, is_causal=False, scale=None, seed=0, partials=slab_partials):
    """(dq, conversions): dQ as v06 writes it (NaN where no warp converted), and how often each slab was
    converted. seed: the CTAs' interleaving (each CTA's steps stay in order). partials: the count that decides
    the last add (the kernel's by default; a wrong one must show)."""
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    if head_dim not in (64, 128):
        raise ValueError(f"v06 runs D = 64 or 128, got {head_dim}")
    scale = _resolve_scale(scale, head_dim)
    _, ds, k64, _ = reference_ds(q, k, v, dout, is_causal, scale)
    group, n_mb = heads_q // heads_kv, math.ceil(seqlen_q / BR)
    accum = np.zeros((batch, heads_q, n_mb * BR, head_dim))
    count, conversions = {}, {}
    dq = np.full((batch, heads_q, seqlen_q, head_dim), np.nan)
    parts = [(wg, slice(64 * wg, 64 * wg + 64), slice(0, BC)) for wg in range(2)] if head_dim == 128 else \
        [(0, slice(0, 64), slice(64 * wg, 64 * wg + 64)) for wg in range(2)]  # (part, columns, keys of the block)

    def steps(b, hkv, nb):
        n0 = nb * BC
        for h in range(hkv * group, (hkv + 1) * group):
            for mb in range(first_block(n0, n_mb, is_causal), n_mb):
                yield b, h, mb, n0

    def add(b, h, mb, n0):
        keys = np.arange(n0, n0 + BC)
        for part, cols, kslice in parts:
            kk = keys[kslice]
            kk = kk[kk < seqlen_k]
            for warp in range(4):
                rows = np.arange(mb * BR + 16 * warp, mb * BR + 16 * warp + 16)
                live = rows[rows < seqlen_q]
                accum[b, h, live, cols] += ds[b, h][np.ix_(live, kk)] @ k64[b, h][kk, cols]
                slab = (b, h, mb, part, warp)
                count[slab] = count.get(slab, 0) + 1
                if count[slab] == partials(mb, seqlen_k, is_causal, head_dim):
                    conversions[slab] = conversions.get(slab, 0) + 1
                    dq[b, h, live, cols] = scale * accum[b, h, live, cols]

    ctas = [steps(b, hkv, nb) for b in range(batch) for hkv in range(heads_kv) for nb in range(math.ceil(seqlen_k / BC))]
    rng = np.random.default_rng(seed)
    while ctas:
        i = int(rng.integers(len(ctas)))
        step = next(ctas[i], None)
        if step is None:
            ctas.pop(i)
        else:
            add(*step)
    return dq, conversions
