"""Split-K decoding on the CPU: where the splits start, and what the kernel computes with them.

Pure Python and NumPy (no torch), so tests and GPU-less notebooks can import it. How many splits a call gets
is lab.decode.plan's (the product's part, re-exported here with its constants); the chunking rule and the merge
algebra mirror kernels/decode/v01_splitk.cu.

Layout is (B, H, S, D): q (B, Hq, q_len, D), k and v (B, Hkv, S_cache, D). Query head h reads KV head
h // (Hq // Hkv). Every query token sees the first seqlens[b] keys (no mask inside the cache).
"""
from __future__ import annotations

import math

import numpy as np

from ..reference import attention_reference
from .plan import (BLOCK_N, BLOCK_N_V04, BLOCKS_PER_SM, BLOCKS_PER_SM_V02, EFFICIENCY_SLACK, FULL_ENOUGH,  # noqa: F401
                   HEADS_V04, MAX_SPLITS, MIN_CHUNK, MIN_CHUNK_V04, RAGGED_CHUNK, choose_num_splits,
                   choose_num_splits_v02, choose_num_splits_v04, nonempty_splits, ragged_splits, split_chunk,
                   split_plan, wave_efficiency)


def split_bounds(seqlen_cache: int, num_splits: int, block_n: int = BLOCK_N) -> list[tuple[int, int]]:
    """[(begin, end)] of each split over keys [0, seqlen_cache); trailing splits may be empty (begin == end).

    Split s covers [s * chunk, min((s + 1) * chunk, seqlen_cache)). For a sequence shorter than the cache
    the kernel clips the same bounds to its own length: `split_bounds(len_b, ...)` is wrong for that, use
    `clip_bounds(split_bounds(seqlen_cache, ...), len_b)`.
    """
    chunk = split_chunk(seqlen_cache, num_splits, block_n)
    bounds = []
    for s in range(num_splits):
        begin = min(s * chunk, max(seqlen_cache, 0))
        bounds.append((begin, min(begin + chunk, max(seqlen_cache, 0))))
    return bounds


def clip_bounds(bounds: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """The same splits seen by a sequence of `length` keys: each clipped to [0, length), empty if past it."""
    return [(min(begin, length), min(end, length)) for begin, end in bounds]


def merge_partials(partial_o: np.ndarray, partial_lse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-split outputs by their log-sum-exp weights, as the combine kernel does.

    partial_o (..., num_splits, D) holds each split's normalised output, partial_lse (..., num_splits) its
    natural-log LSE (-inf for an empty split). Returns out (..., D) and lse (...). Rows whose splits are
    all empty get out = 0 and lse = -inf.
    """
    partial_o = np.asarray(partial_o, dtype=np.float64)
    partial_lse = np.asarray(partial_lse, dtype=np.float64)
    lse_max = partial_lse.max(axis=-1)
    empty = np.isneginf(lse_max)
    safe_max = np.where(empty, 0.0, lse_max)
    weights = np.exp(partial_lse - safe_max[..., None])  # exp(-inf) = 0 for empty splits
    w_sum = weights.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.einsum("...s,...sd->...d", weights, partial_o) / np.where(empty, 1.0, w_sum)[..., None]
        lse = np.where(empty, -np.inf, safe_max + np.log(np.where(empty, 1.0, w_sum)))
    out[empty] = 0.0
    return out, lse


def chunk_partial(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, block_n: int,
                   limits: np.ndarray | None = None, first_key: int = 0, lower: np.ndarray | None = None,
                   softcap: float = 0.0):
    """One split of one (b, KV head): online softmax over key tiles, like the kernels' main loop.

    q (R, D), k and v (n, D), the split's keys from key index first_key on. limits (R,), optional: row r
    sees only keys < limits[r] (decode v03's per-row causal limit); lower (R,), optional: and keys >= lower[r]
    (a window's first key). softcap > 0: scores softcap tanh(s / softcap) before the softmax. Returns (o, lse)
    with o (R, D) normalised and lse (R,) natural log; a row that sees no key gets zeros and -inf.
    """
    rows, dim = q.shape
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    acc = np.zeros((rows, dim))
    log2e = 1.0 / math.log(2.0)
    q2 = q * (scale * log2e)  # scores in log2 units, as the kernels fold scale * log2 e into the scores
    for start in range(0, k.shape[0], block_n):
        if softcap > 0:
            s = softcap * np.tanh((q @ k[start:start + block_n].T) * (scale / softcap)) * log2e
        else:
            s = q2 @ k[start:start + block_n].T
        keys = first_key + start + np.arange(s.shape[1])
        if limits is not None:
            s = np.where(keys[None, :] < limits[:, None], s, -np.inf)
        if lower is not None:
            s = np.where(keys[None, :] >= lower[:, None], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=1))
        m_use = np.where(np.isneginf(m_new), 0.0, m_new)  # a row with nothing visible yet: P = 0, not NaN
        p = np.exp2(s - m_use[:, None])
        alpha = np.exp2(m - m_use)  # first tile: exp2(-inf) = 0
        l = alpha * l + p.sum(axis=1)
        acc = alpha[:, None] * acc + p @ v[start:start + block_n]
        m = m_new
    seen = l > 0
    o = np.where(seen[:, None], acc / np.where(seen, l, 1.0)[:, None], 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(seen, (m + np.log2(np.where(seen, l, 1.0))) * math.log(2.0), -np.inf)
    return o, lse


def split_partials(q: np.ndarray, heads_kv: int, lengths: list[int], bounds: list[tuple[int, int]], partial):
    """Pass 1 of split-K decoding: partial(b, h_kv, rows, begin, end) -> (o, lse) for each sequence's
    splits (bounds clipped to its length) and KV head, whose rows are the group's query heads x q_len tokens
    (row = head-in-group * q_len + token). Returns partial_o (B, Hq, q_len, splits, D), partial_lse."""
    batch, heads_q, q_len, dim = q.shape
    if heads_q % heads_kv:
        raise ValueError("heads_q must be a multiple of heads_kv")
    group = heads_q // heads_kv
    partial_o = np.zeros((batch, heads_q, q_len, len(bounds), dim))
    partial_lse = np.full((batch, heads_q, q_len, len(bounds)), -np.inf)
    for b in range(batch):
        for h_kv in range(heads_kv):
            heads = slice(h_kv * group, (h_kv + 1) * group)
            rows = q[b, heads].reshape(group * q_len, dim)
            for s, (begin, end) in enumerate(clip_bounds(bounds, lengths[b])):
                o, lse = partial(b, h_kv, rows, begin, end)
                partial_o[b, heads, :, s] = o.reshape(group, q_len, dim)
                partial_lse[b, heads, :, s] = lse.reshape(group, q_len)
    return partial_o, partial_lse


def emulate_split_decode(q, k, v, seqlens, num_splits: int, scale: float, block_n: int = BLOCK_N):
    """float64 emulation of decode_splitk_v01: per-split partials, then the LSE merge.

    q (B, Hq, q_len, D); k, v (B, Hkv, S_cache, D); seqlens: B lengths or None (every sequence S_cache
    long), clipped to [0, S_cache] like the kernel. Returns out (B, Hq, q_len, D), lse (B, Hq, q_len),
    partial_o (B, Hq, q_len, num_splits, D), partial_lse (B, Hq, q_len, num_splits).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    batch, seqlen_cache = q.shape[0], k.shape[2]
    lengths = [seqlen_cache] * batch if seqlens is None else [min(max(int(n), 0), seqlen_cache) for n in seqlens]
    partial_o, partial_lse = split_partials(
        q, k.shape[1], lengths, split_bounds(seqlen_cache, num_splits, block_n),
        lambda b, h_kv, rows, begin, end: chunk_partial(rows, k[b, h_kv, begin:end], v[b, h_kv, begin:end],
                                                         scale, block_n))
    out, lse = merge_partials(partial_o, partial_lse)
    return out, lse, partial_o, partial_lse


def reference_decode(q, k, v, seqlens, scale: float):
    """Direct float64 softmax(q k^T * scale) v per (b, head) over the first seqlens[b] keys; no splitting.

    Length-0 sequences give out = 0 and lse = -inf (the convention of the kernel).
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    batch, heads_q, q_len, dim = q.shape
    seqlen_cache = k.shape[2]
    lengths = [seqlen_cache] * batch if seqlens is None else [min(max(int(n), 0), seqlen_cache) for n in seqlens]
    out = np.zeros((batch, heads_q, q_len, dim))
    lse = np.full((batch, heads_q, q_len), -np.inf)
    for b, n in enumerate(lengths):
        if n:  # the forward reference on this sequence's visible keys (no mask inside the cache)
            seq_out, seq_lse = attention_reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], scale=scale)
            out[b], lse[b] = seq_out[0], seq_lse[0]
    return out, lse
