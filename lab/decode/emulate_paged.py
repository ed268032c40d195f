"""Paged KV-cache decoding on the CPU (NumPy, float64): the layout, a plain reference and the kernel's algorithm.

The layout is vLLM's and flash_attn_with_kvcache's: k_pages, v_pages (num_pages, page_size, Hkv, D); key j
of sequence b is row j % page_size of page block_table[b, j // page_size]. q is (B, Hq, q_len, D), as in
lab.ops.decode. Query head h reads KV head h // (Hq // Hkv).

* ``page_cache`` cuts contiguous (B, Hkv, S, D) caches into pages behind a (shuffled) block table
  (``block_table``, ``to_pages``);
  ``gather_pages`` puts one sequence's pages back in order.
* ``reference_paged_decode``: gather, then softmax attention directly (the yardstick).
* ``emulate_paged_decode``: what decode v03 computes: split-K over the table's capacity in whole 64-key
  tiles, keys found through the table tile by tile, an online softmax per split with a per-row key limit,
  the LSE merge of lab.decode.splits, and the kernel's rules for bad tables.

Causal is bottom-right (FlashAttention's decode rule): token i of q_len sees keys [0, len - q_len + i]; a
token that sees no key gets 0 (and LSE -inf), as a sequence of length 0 does. lab.ops.attention's causal
is SDPA's top-left (query i sees keys j <= i), which for a decode step would hide almost the whole cache.

Bad tables, the kernel's rule: len = cache_seqlens[b] clamped to [0, max_pages * page_size]; a longer one
sets PAGE_E_SHORT, a page id outside [0, num_pages) among the first ceil(len / page_size) slots sets
PAGE_E_INDEX, and a flagged sequence's output is 0. Nothing else of the table is read.
"""
from __future__ import annotations

import math

import numpy as np

from .plan import ERROR_NAMES, PAGE_E_INDEX, PAGE_E_SHORT  # noqa: F401 (the flags lab.ops.decode raises on)
from .splits import BLOCK_N, chunk_partial, merge_partials, split_bounds, split_partials


def block_table(batch: int, seqlen: int, page_size: int, rng=None, spare_pages: int = 0):
    """(table (B, max_pages) int32, num_pages) for B sequences of up to `seqlen` keys: max_pages =
    ceil(seqlen / page_size), num_pages = B * max_pages + spare_pages (spares are never referenced). With
    `rng` (a numpy Generator) the pages are in a random order, as a serving engine's free list leaves them."""
    max_pages = -(-seqlen // page_size)
    num_pages = batch * max_pages + spare_pages
    order = rng.permutation(num_pages) if rng is not None else np.arange(num_pages)
    return order[:batch * max_pages].reshape(batch, max_pages).astype(np.int32), num_pages


def to_pages(cache, table, num_pages: int, page_size: int):
    """The contiguous cache (B, Hkv, S, D) written into pages (num_pages, page_size, Hkv, D) through `table`;
    keys past S in a sequence's last page, and pages no sequence uses, are zeros."""
    cache = np.asarray(cache)
    batch, heads, seqlen, dim = cache.shape
    max_pages = table.shape[1]
    padded = np.zeros((batch, heads, max_pages * page_size, dim), dtype=cache.dtype)
    padded[:, :, :seqlen] = cache
    pages = np.zeros((num_pages, page_size, heads, dim), dtype=cache.dtype)
    blocks = padded.reshape(batch, heads, max_pages, page_size, dim).transpose(0, 2, 3, 1, 4)
    pages[np.asarray(table).reshape(-1)] = blocks.reshape(batch * max_pages, page_size, heads, dim)
    return pages


def page_cache(k, v, page_size: int, rng=None, spare_pages: int = 0):
    """(k_pages, v_pages, table): contiguous k and v (B, Hkv, S, D) in pages behind one block table."""
    table, num_pages = block_table(k.shape[0], k.shape[2], page_size, rng, spare_pages)
    return to_pages(k, table, num_pages, page_size), to_pages(v, table, num_pages, page_size), table


def gather_pages(pages, table_row, length: int):
    """One sequence's first `length` keys in order, (Hkv, length, D)."""
    page_size = pages.shape[1]
    slots = -(-length // page_size)
    rows = np.asarray(pages)[np.asarray(table_row[:slots], dtype=np.int64)]  # (slots, page_size, Hkv, D)
    return rows.reshape(slots * page_size, *pages.shape[2:])[:length].transpose(1, 0, 2)


def sequence_status(table, seqlens, num_pages: int, page_size: int) -> tuple[list[int], list[int]]:
    """(clamped lengths, error bits) per sequence, by the kernel's rule (module docstring)."""
    table = np.asarray(table)
    capacity = table.shape[1] * page_size
    lengths, errors = [], []
    for b in range(table.shape[0]):
        asked = capacity if seqlens is None else int(seqlens[b])
        n = min(max(asked, 0), capacity)
        slots = table[b, :-(-n // page_size)]  # the slots of the first n keys: all the kernel reads
        bits = (PAGE_E_SHORT if asked > capacity else 0) | (PAGE_E_INDEX if ((slots < 0) | (slots >= num_pages)).any() else 0)
        lengths.append(0 if bits else n)
        errors.append(bits)
    return lengths, errors


def visible_keys(length: int, q_len: int, is_causal: bool) -> np.ndarray:
    """Keys each of the q_len tokens sees: length, or length - q_len + i + 1 (>= 0) bottom-right causal."""
    if not is_causal:
        return np.full(q_len, length)
    return np.clip(length - q_len + np.arange(q_len) + 1, 0, None)


def _softmax_rows(q, k, v, limits, scale):
    """float64 softmax(scale q k^T) v per row over its first limits[r] keys; no key: 0 and -inf."""
    out, lse = np.zeros((q.shape[0], v.shape[-1])), np.full(q.shape[0], -np.inf)
    for r, n in enumerate(limits):
        if n:
            s = scale * (k[:n] @ q[r])
            m = s.max()
            p = np.exp(s - m)
            out[r], lse[r] = p @ v[:n] / p.sum(), m + math.log(p.sum())
    return out, lse


def reference_paged_decode(q, k_pages, v_pages, table, seqlens, scale: float, is_causal: bool = False):
    """Gather each sequence's pages into order, then attention directly. Returns (out, lse, errors)."""
    q = np.asarray(q, dtype=np.float64)
    batch, heads_q, q_len, dim = q.shape
    heads_kv = k_pages.shape[2]
    group = heads_q // heads_kv
    lengths, errors = sequence_status(table, seqlens, k_pages.shape[0], k_pages.shape[1])
    out, lse = np.zeros(q.shape), np.full(q.shape[:3], -np.inf)
    for b, n in enumerate(lengths):
        k = gather_pages(k_pages, table[b], n).astype(np.float64)
        v = gather_pages(v_pages, table[b], n).astype(np.float64)
        limits = visible_keys(n, q_len, is_causal)
        for h in range(heads_q):
            out[b, h], lse[b, h] = _softmax_rows(q[b, h], k[h // group], v[h // group], limits, scale)
    return out, lse, errors


def emulate_paged_decode(q, k_pages, v_pages, table, seqlens, num_splits: int, scale: float,
                         is_causal: bool = False, block_n: int = BLOCK_N):
    """float64 emulation of decode_paged_v03. Returns (out, lse, errors, partial_lse).

    Splits are lab.decode.splits' bounds over the table's capacity (max_pages * page_size), clipped to each
    sequence's length, so a split may start or end inside a page and a tile may cross pages. Each split's
    keys are found through the table (page table_row[j // page_size], row j % page_size), then run as
    lab.decode.splits' online softmax with the per-row key limit of the causal mask.
    """
    q = np.asarray(q, dtype=np.float64)
    table = np.asarray(table)
    q_len = q.shape[2]
    heads_kv, page_size = k_pages.shape[2], k_pages.shape[1]
    group = q.shape[1] // heads_kv
    lengths, errors = sequence_status(table, seqlens, k_pages.shape[0], page_size)

    def partial(b, h_kv, rows, begin, end):
        keys = np.arange(begin, end)
        pages = table[b].astype(np.int64)[keys // page_size]
        k = k_pages[pages, keys % page_size, h_kv].astype(np.float64)
        v = v_pages[pages, keys % page_size, h_kv].astype(np.float64)
        limits = np.tile(visible_keys(lengths[b], q_len, is_causal), group)  # row = head in group * q_len + token
        return chunk_partial(rows, k, v, scale, block_n, limits, begin)

    partial_o, partial_lse = split_partials(q, heads_kv, lengths, split_bounds(table.shape[1] * page_size,
                                                                               num_splits, block_n), partial)
    out, lse = merge_partials(partial_o, partial_lse)
    return out, lse, errors, partial_lse
