"""The paged prefill (lab.masks.paged, fwd v11 with a block table) in NumPy: gather each sequence's keys from its
pages into packed rows, check the table as the kernel does, and run the masked kernel's emulation
(lab.masks.emulate.forward_varlen) on them. A bad sequence gets O = 0 and LSE = -inf (no sink) and its flag bits.

The CPU tests (tests/masks/test_paged_prefill.py) hold it against the float64 reference on the same gathered keys and
against a key-by-key float64 reading of the cache; ignore_table is the deliberately wrong reading (page j // page_size
of the cache itself, the table ignored), which a shuffled table must catch.
"""
from __future__ import annotations

import numpy as np

from ..decode.plan import PAGE_E_INDEX, PAGE_E_SHORT
from . import emulate
from .spec import Mask


def table_flags(cu_seqlens_k, block_table, page_size: int, num_pages: int) -> np.ndarray:
    """The kernel's paged_table_bits per sequence: PAGE_E_SHORT when its keys exceed max_pages * page_size, else
    PAGE_E_INDEX when a page holding one of its keys is outside [0, num_pages), else 0."""
    table = np.asarray(block_table)
    ck = [int(x) for x in cu_seqlens_k]
    flags = np.zeros(len(ck) - 1, np.int32)
    for b in range(len(ck) - 1):
        n = ck[b + 1] - ck[b]
        if n > table.shape[1] * page_size:
            flags[b] = PAGE_E_SHORT
        elif np.any((table[b, :-(-n // page_size)] < 0) | (table[b, :-(-n // page_size)] >= num_pages)):
            flags[b] = PAGE_E_INDEX
    return flags


def gather(key_cache, value_cache, cu_seqlens_k, block_table, flags=None, ignore_table: bool = False):
    """Packed (total_k, H_kv, D) keys and values of every good sequence (a flagged one gets none) and their
    cu_seqlens: key j of sequence b from row j % page_size of page block_table[b, j // page_size]."""
    kc, vc, table = np.asarray(key_cache), np.asarray(value_cache), np.asarray(block_table)
    page_size = kc.shape[1]
    ck = [int(x) for x in cu_seqlens_k]
    ks, vs, cu = [], [], [0]
    for b in range(len(ck) - 1):
        n = 0 if flags is not None and flags[b] else ck[b + 1] - ck[b]
        j = np.arange(n)
        pages = j // page_size if ignore_table else table[b, j // page_size]
        ks.append(kc[pages, j % page_size])
        vs.append(vc[pages, j % page_size])
        cu.append(cu[-1] + n)
    empty = np.zeros((0,) + kc.shape[2:], kc.dtype)
    return (np.concatenate(ks) if ks else empty), (np.concatenate(vs) if vs else empty), cu


def forward_varlen_paged(q, key_cache, value_cache, cu_seqlens_q, cu_seqlens_k, block_table, max_seqlen_q: int,
                         mask: Mask, scale=None, sinks=None, ignore_table: bool = False, **kw):
    """(out (total_q, H_q, D), lse (H_q, total_q), flags (B,)) as fwd v11's paged call gives them."""
    kc = np.asarray(key_cache)
    flags = table_flags(cu_seqlens_k, block_table, kc.shape[1], kc.shape[0])
    k, v, cu_k = gather(key_cache, value_cache, cu_seqlens_k, block_table, flags, ignore_table)
    out, lse = emulate.forward_varlen(q, k, v, cu_seqlens_q, cu_k, max_seqlen_q, mask, scale, sinks, **kw)
    cq = [int(x) for x in cu_seqlens_q]
    for b in np.nonzero(flags)[0]:  # no key and no sink: O = 0, LSE = -inf
        out[cq[b]:cq[b + 1]] = 0.0
        lse[:, cq[b]:cq[b + 1]] = -np.inf
    return out, lse, flags
