"""The dQ path of the Hopper backward v15 (kernels/bwd/v15_lastconv.cu), emulated in NumPy: no convert pass; the
last CTA of each KV head converts its GQA group's dQ.

Each CTA (one per key block of B_c = 128 keys, KV head and batch) adds its partials of dS K into dq_accum step
by step, then counts itself on its KV head's counter; the CTA whose count brings it to the number of key blocks
converts the group's accumulator, enumerating float4s as the kernel's convert_group does and placing each as
convert_quad does (the accumulator order: per 64-row block, a warpgroup's part of 64 x kDqCols, thread wt's
rows g and g + 8 of warp wt / 32 at two columns). CTAs interleave step by step in any order. A count that is
wrong converts a head before its last partial (a wrong dQ) or never (dQ stays NaN); an enumeration that is
wrong misses or repeats float4s: the emulation shows both.
"""
from __future__ import annotations

import math

import numpy as np

from ..masks.backward import ROW_PAD  # LAB_BWD_ROW_PAD's mirror, pinned to the header by a test
from .emulate import _resolve_scale, _shapes, reference_ds
from .emulate_convert import BC, first_block


def step_rows(head_dim: int) -> int:
    """Queries per CTA step: 128 at D = 64 (bwd v13's m64n128), 64 at D = 128."""
    return 128 if head_dim == 64 else 64


def padded_rows(seqlen_q: int) -> int:
    return -(-seqlen_q // ROW_PAD) * ROW_PAD


def quad_place(idx: int, head_dim: int, heads_q: int, sq_pad: int):
    """convert_quad's (b, h, row, col) of float4 `idx` (it holds columns col, col + 1 of rows row and row + 8)."""
    quads = 64 * head_dim // 4
    block, inner = divmod(idx, quads)
    dq_cols = 64  # Cfg::kDqCols: D / 2 at D = 128 (split by columns), D at D = 64 (split by rows)
    part, rest = divmod(inner, 16 * dq_cols)
    r4, wt = divmod(rest, 128)
    warp, g, t = wt // 32, (wt % 32) // 4, wt % 4
    row = (block % (sq_pad // 64)) * 64 + warp * 16 + g
    col = part * dq_cols + 8 * r4 + 2 * t
    b, h = divmod(block // (sq_pad // 64), heads_q)
    return b, h, row, col


def group_quads(b: int, hkv: int, group: int, heads_q: int, seqlen_q: int, head_dim: int) -> list[int]:
    """The float4s convert_group reads for KV head hkv of batch b: each query head's 64-row blocks up to S_q."""
    quads = 64 * head_dim // 4
    per_head = math.ceil(seqlen_q / 64) * quads
    head_stride = padded_rows(seqlen_q) // 64 * quads
    first = (b * heads_q + hkv * group) * head_stride
    return [first + (i // per_head) * head_stride + i % per_head for i in range(group * per_head)]


def emulate_lastconv(q, k, v, dout, is_causal=False, scale=None, seed=0, last_count=None, enumerate_quads=group_quads):
    """(dq, conversions): dQ as v15 writes it (NaN where nothing converted) and how often each (b, h, row, col)
    float pair was written. seed: the CTAs' interleaving. last_count(n_kb): the old count that marks the last CTA
    (the kernel's n_kb - 1 by default); enumerate_quads: convert_group's enumeration (a wrong one must show)."""
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    if head_dim not in (64, 128):
        raise ValueError(f"v15 runs D = 64 or 128, got {head_dim}")
    scale = _resolve_scale(scale, head_dim)
    _, ds, k64, _ = reference_ds(q, k, v, dout, is_causal, scale)
    group, br = heads_q // heads_kv, step_rows(head_dim)
    n_mb, n_kb, sq_pad = math.ceil(seqlen_q / br), math.ceil(seqlen_k / BC), padded_rows(seqlen_q)
    last_count = last_count or (lambda n: n - 1)
    accum = np.zeros((batch, heads_q, sq_pad, head_dim))
    dq = np.full((batch, heads_q, seqlen_q, head_dim), np.nan)
    count, conversions = {}, {}

    def cta(b, hkv, nb):
        n0 = nb * BC
        keys = np.arange(n0, min(n0 + BC, seqlen_k))
        for h in range(hkv * group, (hkv + 1) * group):
            for mb in range(first_block(n0, n_mb, is_causal, br), n_mb):
                rows = np.arange(mb * br, min(mb * br + br, seqlen_q))
                accum[b, h, rows] += ds[b, h][np.ix_(rows, keys)] @ k64[b, h][keys]
                yield
        old = count.get((b, hkv), 0)
        count[(b, hkv)] = old + 1
        if old == last_count(n_kb):
            for idx in enumerate_quads(b, hkv, group, heads_q, seqlen_q, head_dim):
                qb, qh, row, col = quad_place(idx, head_dim, heads_q, sq_pad)
                for r in (row, row + 8):
                    if r < seqlen_q:
                        dq[qb, qh, r, col:col + 2] = scale * accum[qb, qh, r, col:col + 2]
                        conversions[(qb, qh, r, col)] = conversions.get((qb, qh, r, col), 0) + 1
        yield

    ctas = [cta(b, hkv, nb) for b in range(batch) for hkv in range(heads_kv) for nb in range(n_kb)]
    rng = np.random.default_rng(seed)
    while ctas:
        i = int(rng.integers(len(ctas)))
        if next(ctas[i], StopIteration) is StopIteration:
            ctas.pop(i)
    return dq, conversions


def block_stores(head_dim: int, dq_cols: int = 64):
    """bwd v16's convert_block on one 64-row block: [(row, col, the 8 float indices of the block it stores at
    columns col..col + 7)] as its 256 threads write them, the shuffles played per warp. Lanes t = 0..3 of a g
    hold float4 (r4 * 128 + wt) of their part; lane t = 0 gathers the four lanes' (x, y) (row g), t = 1 their
    (z, w) (row g + 8)."""
    quads, part_quads = 64 * head_dim // 4, 16 * dq_cols
    stores = []
    for j in range(quads // 256):
        for tid in range(256):
            lane, inn = tid % 32, j * 256 + tid
            t, g, warp = lane % 4, lane // 4, (tid % 128) // 32
            if t >= 2:
                continue
            sources = [j * 256 + (tid - lane) + (lane & ~3) + k for k in range(4)]  # the float4s of lanes 4g..4g+3
            floats = [4 * s + 2 * t + e for s in sources for e in (0, 1)]  # t = 0: (x, y); t = 1: (z, w)
            part, r4 = inn // part_quads, (inn % part_quads) // 128
            stores.append((warp * 16 + g + 8 * t, part * dq_cols + 8 * r4, floats))
    return stores
