"""lab.ops.decode's split plan: how many KV splits a call gets (pure Python, memoised per shape), and the paged
kernels' error flags.

The chunking rule mirrors kernels/decode/v01_splitk.cu; the split heuristic is mirrored in C by
tools/gpu/decode_main.cu (`choose_num_splits` there): change them together. lab.decode.splits re-exports all of
it beside the CPU emulation of what the kernel computes with these splits.
"""
from __future__ import annotations

import functools

BLOCK_N = 64  # keys per tile in decode_splitk_v01 (SplitKConfig::kBlockN); chunks are whole tiles
MAX_SPLITS = 128
BLOCKS_PER_SM = 2  # v01 at D = 128 with <= 4 query rows per KV head: ~103-107 KB smem, two fit an H100 SM
# decode_splitk_v02 (tensor cores, lighter blocks): the same kernel could hold two blocks per SM, but planning
# one block per SM (half the splits, chunks twice as long) measured 5-11 % faster on the batch-1 GQA cells of
# bench-decode on an H200 (2026-11-21) and within +-3 % elsewhere. Pass it as choose_num_splits(..., blocks_per_sm=BLOCKS_PER_SM_V02), or use choose_num_splits_v02.
BLOCKS_PER_SM_V02 = 1
MIN_CHUNK = 2 * BLOCK_N  # a split shorter than two tiles leaves the double-buffered K/V stream idle
FULL_ENOUGH = 0.8  # batch * Hkv blocks filling this much of one wave need no split at all
EFFICIENCY_SLACK = 0.95  # take the fewest splits within 5% of the best wave efficiency


def split_chunk(seqlen_cache: int, num_splits: int, block_n: int = BLOCK_N) -> int:
    """Keys per split: ceil(seqlen_cache / num_splits) rounded up to a whole number of key tiles."""
    if num_splits < 1 or block_n < 1:
        raise ValueError("num_splits and block_n must be >= 1")
    per_split = -(-max(seqlen_cache, 0) // num_splits)
    return -(-per_split // block_n) * block_n


def nonempty_splits(seqlen_cache: int, num_splits: int, block_n: int = BLOCK_N) -> int:
    """How many of the splits hold at least one key of a full-length sequence (rounding can leave some empty).

    O(1): split s is non-empty iff s * chunk < seqlen_cache, so the count is ceil(seqlen_cache / chunk),
    at most num_splits. (It used to build the bounds list: O(num_splits) per call, and choose_num_splits
    called it for every candidate, once per decode call: host time on every decoding step.)
    """
    n = max(seqlen_cache, 0)
    if n == 0:
        return 0
    return min(num_splits, -(-n // split_chunk(n, num_splits, block_n)))


def wave_efficiency(blocks: int, num_sms: int, blocks_per_sm: int = BLOCKS_PER_SM) -> float:
    """Fraction of the launched waves' block slots that hold a block: blocks / (waves * slots)."""
    slots = num_sms * blocks_per_sm
    waves = -(-blocks // slots)
    return blocks / (waves * slots)


def choose_num_splits(batch: int, heads_kv: int, seqlen_k: int, num_sms: int, *, block_n: int = BLOCK_N,
                      max_splits: int = MAX_SPLITS, blocks_per_sm: int = BLOCKS_PER_SM,
                      min_chunk: int = MIN_CHUNK) -> int:
    """Number of KV splits for decode_splitk_v01: fill the GPU in whole waves with as few splits as possible.

    One block of the kernel handles one (batch, KV head, split); `blocks_per_sm` of them are resident per
    SM, so a wave is `num_sms * blocks_per_sm` blocks. The rule:

    1. If batch * heads_kv alone fills at least 80% of a wave, use 1 split (no combine pass at all).
    2. Candidates s run from 1 to min(max_splits, ceil(seqlen_k / min_chunk)): no split is shorter than
       `min_chunk` keys. A candidate is dropped if the chunk rounding leaves fewer than s splits non-empty
       (s = 33 for 32k keys gives chunks of 1024 keys and only 32 used splits: it is really s = 32).
    3. Wave efficiency of s is blocks / (waves * slots) with blocks = batch * heads_kv * s. Return the
       smallest s whose efficiency is within 5% of the best candidate's: more splits than that only add
       partial outputs to write and merge.

    Worked example, batch 1, Hkv 8, 32k keys, 132 SMs (H100 SXM), 2 blocks per SM: a wave is 264 blocks
    and 8 blocks fill 3% of it, so split. Up to 128 splits are allowed (32768 / 128 = 256 keys >= 128).
    The best efficiency is s = 32 or 64: 256 of 264 slots, 0.970 (s = 33, exactly one wave, is dropped
    by rule 2). The smallest s within 5% of 0.970 (>= 0.921) is s = 31: 248 blocks, efficiency 0.939,
    chunks of ceil(32768 / 31) = 1058 -> 1088 keys (17 tiles of 64); the last split holds the remaining
    128 keys [32640, 32768). s = 30 would give 240 blocks, 0.909: below the bar.

    >>> choose_num_splits(1, 8, 32768, 132)
    31
    >>> choose_num_splits(8, 32, 4096, 132)   # 256 blocks already fill 97% of a wave
    1
    """
    if min(batch, heads_kv, num_sms, blocks_per_sm, block_n) < 1 or seqlen_k < 1:
        return 1
    base = batch * heads_kv
    slots = num_sms * blocks_per_sm
    if base >= FULL_ENOUGH * slots:
        return 1
    upper = max(1, min(max_splits, -(-seqlen_k // max(min_chunk, 1)), -(-seqlen_k // block_n)))
    efficiency = {}
    for s in range(1, upper + 1):
        if nonempty_splits(seqlen_k, s, block_n) < s:
            continue
        efficiency[s] = wave_efficiency(base * s, num_sms, blocks_per_sm)
    best = max(efficiency.values())
    return min(s for s, e in efficiency.items() if e >= EFFICIENCY_SLACK * best)


def choose_num_splits_v02(batch: int, heads_kv: int, seqlen_k: int, num_sms: int) -> int:
    """Split count for decode_splitk_v02: choose_num_splits with one planned block per SM (BLOCKS_PER_SM_V02).

    >>> choose_num_splits_v02(1, 8, 32768, 132)   # 16 splits of 2048 keys: 128 blocks, one per SM
    16
    >>> choose_num_splits_v02(8, 32, 4096, 132)
    1
    """
    return choose_num_splits(batch, heads_kv, seqlen_k, num_sms, blocks_per_sm=BLOCKS_PER_SM_V02)


BLOCK_N_V04 = 16  # decode v04's key tile (kernels/decode/v04_pagerow.cu kTileKeys): one page id per tile
HEADS_V04 = 8  # KV heads of one v04 block
MIN_CHUNK_V04 = 256  # 16 tiles: the ring's prologue (2 tiles in flight) stays a small share of a split


def choose_num_splits_v04(batch: int, heads_kv: int, seqlen_k: int, num_sms: int) -> int:
    """Split count for decode v04, whose block reads 8 KV heads: choose_num_splits over batch x H_kv / 8 blocks
    with one block per SM (204 KiB of shared memory at D 128), 16-key tiles, splits of at least 256 keys, at
    most MAX_SPLITS, and one wave (a second wave's blocks would start when the first's end: a tail). A memory-bound block wants every SM, so the slack is 1 %, not 5 %.

    >>> choose_num_splits_v04(8, 8, 16384, 132)    # 8 blocks -> 16 splits: 128 blocks, one per SM
    16
    >>> choose_num_splits_v04(128, 8, 2048, 132)   # 128 blocks already fill 97 % of a wave
    1
    """
    blocks = batch * max(heads_kv // HEADS_V04, 1)
    if min(blocks, num_sms) < 1 or seqlen_k < 1:
        return 1
    slots = num_sms
    if blocks >= FULL_ENOUGH * slots:
        return 1
    upper = max(1, min(MAX_SPLITS, -(-seqlen_k // MIN_CHUNK_V04), slots // blocks))  # one wave: no tail
    efficiency = {s: wave_efficiency(blocks * s, num_sms, 1) for s in range(1, upper + 1)
                  if nonempty_splits(seqlen_k, s, BLOCK_N_V04) == s}
    best = max(efficiency.values())
    return min(s for s, e in efficiency.items() if e >= 0.99 * best)


RAGGED_CHUNK = 4096  # keys of the capacity per split, at least, in a paged call (ragged_splits)


def ragged_splits(splits: int, capacity: int) -> int:
    """A paged call's split count: the rule's, raised to one split per RAGGED_CHUNK keys of the table's capacity
    (at most MAX_SPLITS). Why: the plan sees shapes only (graph-safe), and a server's batch is ragged; with one split
    per sequence, a 16k-key sequence among ~1k-key ones is walked by its few blocks alone while the GPU idles.
    Measured on an H100 (graph replays, outputs/driver_logs/20261126-h100-paged-splitcap-0b5b149): a 64-sequence
    batch with lengths 23 to 16384 (median 893) went from 355 to 246 us; the uniform serving cells moved -1.0 to
    +0.2 % (2048-key chunks: up to +4.8 % at 1 x 131072). The contiguous call keeps its plan: the same cap cost it
    +4.7-4.9 % at 8 x 16384 and 1 x 131072.

    >>> ragged_splits(1, 16384), ragged_splits(16, 131072), ragged_splits(1, 2048)
    (4, 32, 1)
    """
    return max(splits, min(MAX_SPLITS, -(-max(capacity, 0) // RAGGED_CHUNK)))


@functools.lru_cache(maxsize=4096)
def split_plan(batch: int, heads_kv: int, seqlen_k: int, num_sms: int, version: str = "v01") -> int:
    """choose_num_splits (v01) or choose_num_splits_v02 (v02), memoised: what lab.ops.decode calls per step.

    A serving loop asks the same question every token (batch, KV heads, cache length and SM count rarely
    change between steps), so the answer is cached; a new shape costs one evaluation of at most
    MAX_SPLITS candidates, whatever the cache length.
    """
    if version == "v02":
        return choose_num_splits_v02(batch, heads_kv, seqlen_k, num_sms)
    if version == "v04":
        return choose_num_splits_v04(batch, heads_kv, seqlen_k, num_sms)
    return choose_num_splits(batch, heads_kv, seqlen_k, num_sms)


PAGE_E_INDEX = 1  # kernels/common/params.h LAB_PAGE_E_INDEX
PAGE_E_SHORT = 2  # LAB_PAGE_E_SHORT
ERROR_NAMES = {PAGE_E_INDEX: "a page index outside [0, num_pages)",
               PAGE_E_SHORT: "cache_seqlens longer than the block table (max_pages * page_size)"}
