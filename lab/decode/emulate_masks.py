"""Masked decoding on the CPU (NumPy, float64): a plain reference, and the masked kernels' algorithm.

The rule (lab.masks.spec, bottom-right as flash_attn_with_kvcache; lab.decode.masks): token i of q_len sits on key
diag = len - q_len + i and sees keys j of [0, len) with j >= diag - left (left >= 0) and j <= diag + right
(right >= 0; causal caps right at 0). softcap c > 0: s -> c * tanh(s / c) on the scaled score, before the mask. A
sink s_h (one logit per query head) joins the denominator: O = sum_j p_j v_j / (sum_j p_j + exp(s_h)), and a row
that sees no key gets O = 0 and LSE = s_h (-inf without a sink).

* ``reference_masked_decode``: the rule written out directly per row (the yardstick).
* ``emulate_masked_decode``: what decode v03 / v06-v08 compute with the masks: each sequence's splits start at the
  window's first key rounded down to a 64-key tile and the chunk covers the window's span (not the capacity), an
  online softmax per split over 64-key tiles with each row's key range [lo, hi), softcapped scores, then the
  LSE combine with the sink added once to its normaliser. ``sink_per_split=True`` is the wrong algorithm (the sink
  in every split's partial), which the checks must tell apart.

Caches are contiguous (B, Hkv, S, D); a paged cache goes through lab.decode.emulate_paged.gather_pages first
(``contiguous_cache``), whose addressing that module checks.
"""
from __future__ import annotations

import math

import numpy as np

from .emulate_paged import gather_pages, sequence_status
from .splits import BLOCK_N, chunk_partial, split_chunk

WINDOW_ALIGN = 64  # lab.decode.masks.WINDOW_ALIGN


def lengths_of(seqlens, batch: int, capacity: int) -> list[int]:
    """Each sequence's length, clamped to [0, capacity] as the kernels do (None: every sequence is full)."""
    return [capacity] * batch if seqlens is None else [min(max(int(n), 0), capacity) for n in seqlens]


def key_range(length: int, q_len: int, token: int, left: int, right: int, causal: bool) -> tuple[int, int]:
    """Keys [lo, hi) that token `token` of q_len sees in a sequence of `length` keys (hi <= lo: none)."""
    diag = length - q_len + token
    last = diag if causal else length - 1
    if right >= 0:
        last = min(last, diag + right)
    first = max(0, diag - left) if left >= 0 else 0
    return first, min(length, last + 1)


def _scores(q, k, scale: float, softcap: float):
    s = scale * (k @ q)
    return softcap * np.tanh(s / softcap) if softcap > 0 else s


def reference_masked_decode(q, k, v, seqlens, scale: float, is_causal: bool = False, left: int = -1,
                            right: int = -1, softcap: float = 0.0, sinks=None):
    """float64 masked decoding per row, directly. q (B, Hq, q_len, D), k and v (B, Hkv, S, D). Returns out, lse."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    batch, heads_q, q_len, dim = q.shape
    group = heads_q // k.shape[1]
    sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64)
    out, lse = np.zeros(q.shape), np.full(q.shape[:3], -np.inf)
    for b, n in enumerate(lengths_of(seqlens, batch, k.shape[2])):
        for h in range(heads_q):
            sink = -np.inf if sinks is None else sinks[h]
            for t in range(q_len):
                lo, hi = key_range(n, q_len, t, left, right, is_causal)
                s = _scores(q[b, h, t], k[b, h // group, lo:max(lo, hi)], scale, softcap)
                m = max(s.max(initial=-np.inf), sink)
                if m == -np.inf:
                    continue
                p = np.exp(s - m)
                denom = p.sum() + math.exp(sink - m)
                out[b, h, t] = p @ v[b, h // group, lo:max(lo, hi)] / denom
                lse[b, h, t] = m + math.log(denom)
    return out, lse


def combine(partial_o, partial_lse, sinks_row=None):
    """The split-K combine of one row's splits, (S, D) and (S,), with an optional sink in its normaliser."""
    m = max(partial_lse.max(initial=-np.inf), -np.inf if sinks_row is None else sinks_row)
    if m == -np.inf:
        return np.zeros(partial_o.shape[-1]), -np.inf
    w = np.exp(partial_lse - m)
    denom = w.sum() + (0.0 if sinks_row is None else math.exp(sinks_row - m))
    return w @ partial_o / denom, m + math.log(denom)


def _with_sink(o, lse, sink):
    """A partial (o, lse) with the sink in its own denominator: the wrong build's split."""
    m = max(lse, sink)
    if m == -np.inf:
        return o, lse
    denom = math.exp(lse - m) + math.exp(sink - m)
    return o * math.exp(lse - m) / denom, m + math.log(denom)


def emulate_masked_decode(q, k, v, seqlens, num_splits: int, scale: float, is_causal: bool = False, left: int = -1,
                          right: int = -1, softcap: float = 0.0, sinks=None, block_n: int = BLOCK_N,
                          sink_per_split: bool = False):
    """float64 emulation of the masked kernels' split-K decode (module docstring). Returns out, lse,
    (first_keys, chunk): each sequence's first split key and the chunk the plan used."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    batch, heads_q, q_len, dim = q.shape
    heads_kv, capacity = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    span = capacity if left < 0 else min(capacity, left + q_len + WINDOW_ALIGN - 1)
    chunk = split_chunk(span, num_splits, block_n)
    sinks = None if sinks is None else np.asarray(sinks, dtype=np.float64)
    out, lse = np.zeros(q.shape), np.full(q.shape[:3], -np.inf)
    firsts = []
    for b, n in enumerate(lengths_of(seqlens, batch, capacity)):
        first = max(0, n - q_len - left) // WINDOW_ALIGN * WINDOW_ALIGN if left >= 0 else 0
        firsts.append(first)
        tokens = np.tile(np.arange(q_len), group)  # row = head in group * q_len + token
        ranges = np.array([key_range(n, q_len, t, left, right, is_causal) for t in tokens])
        for h_kv in range(heads_kv):
            rows_q = q[b, h_kv * group:(h_kv + 1) * group].reshape(group * q_len, dim)
            parts_o = np.zeros((group * q_len, num_splits, dim))
            parts_lse = np.full((group * q_len, num_splits), -np.inf)
            for s in range(num_splits):
                begin = min(first + s * chunk, n)
                end = min(begin + chunk, n)
                parts_o[:, s], parts_lse[:, s] = chunk_partial(rows_q, k[b, h_kv, begin:end], v[b, h_kv, begin:end],
                                                               scale, block_n, ranges[:, 1], begin, ranges[:, 0],
                                                               softcap)
            for r in range(group * q_len):
                h, t = h_kv * group + r // q_len, r % q_len
                sink = None if sinks is None else sinks[h]
                if sink_per_split and sink is not None:
                    for s in range(num_splits):
                        parts_o[r, s], parts_lse[r, s] = _with_sink(parts_o[r, s], parts_lse[r, s], sink)
                    sink = None
                out[b, h, t], lse[b, h, t] = combine(parts_o[r], parts_lse[r], sink)
    return out, lse, (firsts, chunk)


def contiguous_cache(k_pages, v_pages, table, seqlens):
    """A paged cache (num_pages, page_size, Hkv, D) as contiguous (B, Hkv, capacity, D) k and v (keys past a
    sequence's length are zeros) and the lengths the kernel uses; a bad table's sequence gets length 0 (its
    output is zero, its flag set: lab.decode.emulate_paged.sequence_status)."""
    table = np.asarray(table)
    page_size = k_pages.shape[1]
    lengths, errors = sequence_status(table, seqlens, k_pages.shape[0], page_size)
    capacity = table.shape[1] * page_size
    shape = (table.shape[0], k_pages.shape[2], capacity, k_pages.shape[3])
    k, v = np.zeros(shape), np.zeros(shape)
    for b, n in enumerate(lengths):
        k[b, :, :n] = gather_pages(k_pages, table[b], n)
        v[b, :, :n] = gather_pages(v_pages, table[b], n)
    return k, v, lengths, errors
