"""CPU checks of lab/decode/splits.py: the split heuristic, the chunking rule and the float64 emulation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from lab.decode import plan, splits

H100_SMS = 132


# ---------------------------------------------------------------------------
# choose_num_splits
# ---------------------------------------------------------------------------
HEURISTIC_SHAPES = [
    # (batch, heads_kv, seqlen_k, num_sms)
    (1, 8, 32768, H100_SMS),
    (1, 32, 4096, H100_SMS),
    (1, 8, 4096, H100_SMS),
    (1, 8, 65536, H100_SMS),
    (8, 8, 16384, H100_SMS),
    (8, 32, 4096, H100_SMS),
    (64, 8, 65536, H100_SMS),
    (64, 32, 32768, H100_SMS),
    (3, 5, 1000, 108),
    (1, 1, 100, H100_SMS),
    (2, 4, 129, 114),
    (1, 1, 1, H100_SMS),
]


@pytest.mark.parametrize("batch,heads_kv,seqlen_k,num_sms", HEURISTIC_SHAPES)
def test_heuristic_properties(batch, heads_kv, seqlen_k, num_sms):
    s = splits.choose_num_splits(batch, heads_kv, seqlen_k, num_sms)
    assert 1 <= s <= splits.MAX_SPLITS
    # Never more splits than key tiles, and every split holds keys of a full-length sequence.
    assert s <= math.ceil(seqlen_k / splits.BLOCK_N)
    assert splits.nonempty_splits(seqlen_k, s) == s
    if s > 1:
        # No split shorter than the minimum chunk (counted before tile rounding).
        assert seqlen_k / s >= splits.MIN_CHUNK - 1e-9 or s <= math.ceil(seqlen_k / splits.MIN_CHUNK)
        # Splitting must have been worth it: the unsplit launch fills less than 80% of a wave ...
        slots = num_sms * splits.BLOCKS_PER_SM
        assert batch * heads_kv < 0.8 * slots
        # ... and the chosen launch fills its waves at least as well as no split.
        blocks = batch * heads_kv * s
        assert splits.wave_efficiency(blocks, num_sms) >= splits.wave_efficiency(batch * heads_kv, num_sms)


def test_heuristic_fills_waves_when_keys_allow():
    # Long sequences leave room for up to 128 splits: the chosen launch fills >= 90% of its waves.
    for batch, heads_kv in ((1, 8), (1, 32), (2, 8), (8, 8), (1, 1), (3, 7)):
        s = splits.choose_num_splits(batch, heads_kv, 65536, H100_SMS)
        blocks = batch * heads_kv * s
        if s == splits.MAX_SPLITS:  # capped: one KV head cannot fill 264 slots with 128 splits
            assert blocks < 0.9 * H100_SMS * splits.BLOCKS_PER_SM
            continue
        assert splits.wave_efficiency(blocks, H100_SMS) >= 0.9, (batch, heads_kv, s)
        assert blocks >= 0.9 * H100_SMS * splits.BLOCKS_PER_SM


def test_heuristic_single_split_for_big_batch_times_heads():
    for batch, heads_kv in ((8, 32), (64, 8), (64, 32), (27, 8)):
        for seqlen_k in (4096, 65536):
            assert splits.choose_num_splits(batch, heads_kv, seqlen_k, H100_SMS) == 1


def test_heuristic_respects_minimum_chunk_and_limits():
    # 4096 keys and a 1024-key minimum: at most 4 splits, whatever the wave would like.
    assert splits.choose_num_splits(1, 1, 4096, H100_SMS, min_chunk=1024) <= 4
    # A short sequence is never split below the minimum chunk.
    assert splits.choose_num_splits(1, 1, 100, H100_SMS) == 1
    assert splits.choose_num_splits(1, 8, 32768, H100_SMS, max_splits=4) <= 4
    # Degenerate inputs fall back to one split.
    assert splits.choose_num_splits(0, 8, 4096, H100_SMS) == 1
    assert splits.choose_num_splits(1, 8, 0, H100_SMS) == 1


def test_heuristic_worked_example():
    # The docstring's example: batch 1, Hkv 8, 32k keys on an H100.
    s = splits.choose_num_splits(1, 8, 32768, H100_SMS)
    assert s == 31
    assert splits.split_chunk(32768, s) == 1088
    assert splits.split_bounds(32768, s)[-1] == (32640, 32768)


def test_blocks_per_sm_is_a_parameter():
    # One resident block per SM halves the wave: fewer splits are needed to fill it.
    two = splits.choose_num_splits(1, 8, 32768, H100_SMS, blocks_per_sm=2)
    one = splits.choose_num_splits(1, 8, 32768, H100_SMS, blocks_per_sm=1)
    assert one < two
    assert splits.wave_efficiency(8 * one, H100_SMS, 1) >= 0.9


# ---------------------------------------------------------------------------
# split_bounds
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seqlen_cache", [0, 1, 63, 64, 65, 1025, 4097, 32768, 100003])
@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 31, 80, 128])
def test_split_bounds_partition_the_cache(seqlen_cache, num_splits):
    bounds = splits.split_bounds(seqlen_cache, num_splits)
    assert len(bounds) == num_splits
    chunk = splits.split_chunk(seqlen_cache, num_splits)
    assert chunk % splits.BLOCK_N == 0
    position = 0
    for s, (begin, end) in enumerate(bounds):
        assert begin <= end
        if end > begin:
            assert begin == position == s * chunk  # contiguous, in order, no overlap, tile aligned
            position = end
    assert position == seqlen_cache
    # Every key in exactly one split, also after clipping to a shorter sequence.
    for length in {0, 1, seqlen_cache // 3, max(seqlen_cache - 1, 0), seqlen_cache}:
        covered = np.zeros(seqlen_cache, dtype=int)
        for begin, end in splits.clip_bounds(bounds, length):
            covered[begin:end] += 1
        assert (covered[:length] == 1).all() and (covered[length:] == 0).all()


# ---------------------------------------------------------------------------
# emulate_split_decode against a direct float64 softmax
# ---------------------------------------------------------------------------
def _inputs(rng, batch, heads_q, heads_kv, q_len, seqlen_cache, dim):
    q = rng.standard_normal((batch, heads_q, q_len, dim))
    k = rng.standard_normal((batch, heads_kv, seqlen_cache, dim))
    v = rng.standard_normal((batch, heads_kv, seqlen_cache, dim))
    return q, k, v


EMULATION_CASES = [
    # (heads_q, heads_kv, q_len, dim, seqlens, seqlen_cache, num_splits)
    (4, 4, 1, 64, None, 300, 1),
    (4, 4, 1, 64, None, 300, 3),
    (32, 8, 1, 32, (1, 63, 65, 1025), 1025, 3),
    (6, 2, 4, 16, (1, 63, 65, 1025, 400), 1100, 7),
    (4, 1, 16, 16, (65, 0, 130), 200, 2),  # MQA, q_len 16, a length-0 sequence
    (2, 2, 3, 8, (5, 200), 640, 80),        # many splits: most empty for the short sequence
    (2, 1, 1, 8, (0, 0), 128, 4),            # every sequence empty
]


@pytest.mark.parametrize("heads_q,heads_kv,q_len,dim,seqlens,seqlen_cache,num_splits", EMULATION_CASES)
def test_emulation_matches_reference(heads_q, heads_kv, q_len, dim, seqlens, seqlen_cache, num_splits):
    rng = np.random.default_rng(1234 + num_splits)
    batch = len(seqlens) if seqlens else 2
    q, k, v = _inputs(rng, batch, heads_q, heads_kv, q_len, seqlen_cache, dim)
    scale = 1.0 / math.sqrt(dim)
    out, lse, partial_o, partial_lse = splits.emulate_split_decode(q, k, v, seqlens, num_splits, scale)
    ref_out, ref_lse = splits.reference_decode(q, k, v, seqlens, scale)
    assert out.shape == (batch, heads_q, q_len, dim) and lse.shape == (batch, heads_q, q_len)
    assert partial_o.shape == (batch, heads_q, q_len, num_splits, dim)
    assert partial_lse.shape == (batch, heads_q, q_len, num_splits)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert not np.isnan(partial_o).any() and not np.isnan(partial_lse).any()
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-12)
    finite = np.isfinite(ref_lse)
    assert (np.isfinite(lse) == finite).all()
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=0, atol=1e-12)

    # Empty splits: LSE -inf and a zero output, exactly what the kernel writes.
    lengths = seqlens if seqlens else [seqlen_cache] * batch
    bounds = splits.split_bounds(seqlen_cache, num_splits)
    for b, n in enumerate(lengths):
        for s, (begin, end) in enumerate(splits.clip_bounds(bounds, n)):
            if end == begin:
                assert np.isneginf(partial_lse[b, :, :, s]).all()
                assert (partial_o[b, :, :, s] == 0).all()
            else:
                assert np.isfinite(partial_lse[b, :, :, s]).all()
        if n == 0:
            assert (out[b] == 0).all() and np.isneginf(lse[b]).all()


def test_split_count_does_not_change_the_answer():
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, 3, 6, 2, 2, 1000, 16)
    seqlens = (999, 1, 640)
    outs = [splits.emulate_split_decode(q, k, v, seqlens, s, 0.25)[:2] for s in (1, 2, 5, 16, 128)]
    for out, lse in outs[1:]:
        np.testing.assert_allclose(out, outs[0][0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(lse, outs[0][1], rtol=0, atol=1e-12)


def test_merge_partials_algebra():
    # Two halves of one softmax merge into the whole; an all-empty row stays 0 / -inf without NaN.
    rng = np.random.default_rng(3)
    scores = rng.standard_normal(10) * 4
    values = rng.standard_normal((10, 5))
    parts_o, parts_lse = [], []
    for sl in (slice(0, 4), slice(4, 10), slice(10, 10)):
        s = scores[sl]
        if s.size == 0:
            parts_o.append(np.zeros(5))
            parts_lse.append(-np.inf)
            continue
        w = np.exp(s - s.max())
        parts_o.append(w @ values[sl] / w.sum())
        parts_lse.append(s.max() + np.log(w.sum()))
    partial_o = np.stack([np.stack(parts_o), np.zeros((3, 5))])          # row 1: all splits empty
    partial_lse = np.stack([np.array(parts_lse), np.full(3, -np.inf)])
    out, lse = splits.merge_partials(partial_o, partial_lse)
    w = np.exp(scores - scores.max())
    np.testing.assert_allclose(out[0], w @ values / w.sum(), atol=1e-12)
    np.testing.assert_allclose(lse[0], scores.max() + np.log(w.sum()), atol=1e-12)
    assert (out[1] == 0).all() and np.isneginf(lse[1])


def test_emulation_is_sensitive():
    # A wrong merge (plain average of the partials) must not pass the same comparison.
    rng = np.random.default_rng(11)
    q, k, v = _inputs(rng, 1, 2, 1, 1, 500, 16)
    _, _, partial_o, _ = splits.emulate_split_decode(q, k, v, (500,), 4, 0.25)
    ref_out, _ = splits.reference_decode(q, k, v, (500,), 0.25)
    assert np.abs(partial_o.mean(axis=3) - ref_out).max() > 1e-3


# ---------------------------------------------------------------- the per-call plan (O(1) host cost per step)

def _reference_choose(batch, heads_kv, seqlen_k, num_sms, blocks_per_sm=splits.BLOCKS_PER_SM):
    """The heuristic as first written: non-empty splits counted by building every candidate's bounds list."""
    if min(batch, heads_kv, num_sms) < 1 or seqlen_k < 1:
        return 1
    base, slots = batch * heads_kv, num_sms * blocks_per_sm
    if base >= splits.FULL_ENOUGH * slots:
        return 1
    upper = max(1, min(splits.MAX_SPLITS, -(-seqlen_k // splits.MIN_CHUNK), -(-seqlen_k // splits.BLOCK_N)))
    eff = {}
    for s in range(1, upper + 1):
        if sum(1 for b, e in splits.split_bounds(seqlen_k, s) if e > b) < s:
            continue
        eff[s] = splits.wave_efficiency(base * s, num_sms, blocks_per_sm)
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= splits.EFFICIENCY_SLACK * best)


@pytest.mark.parametrize("sms", [108, 132, 78])
def test_split_plan_matches_reference_heuristic(sms):
    for batch in (1, 2, 3, 8, 16, 64):
        for heads_kv in (1, 2, 8, 32):
            for seqlen in (1, 63, 64, 65, 127, 1000, 1025, 4096, 4097, 32768, 33000, 131072):
                want = _reference_choose(batch, heads_kv, seqlen, sms)
                assert splits.choose_num_splits(batch, heads_kv, seqlen, sms) == want
                assert splits.split_plan(batch, heads_kv, seqlen, sms, "v01") == want
                assert splits.split_plan(batch, heads_kv, seqlen, sms, "v02") == \
                    _reference_choose(batch, heads_kv, seqlen, sms, blocks_per_sm=splits.BLOCKS_PER_SM_V02)


def test_nonempty_splits_is_the_bounds_count():
    for seqlen in (0, 1, 63, 64, 65, 1025, 4097, 32768, 33000):
        for s in (1, 2, 3, 7, 31, 33, 64, 128):
            assert splits.nonempty_splits(seqlen, s) == sum(1 for b, e in splits.split_bounds(seqlen, s) if e > b)


def _count_work(monkeypatch):
    """Count the heuristic's unit step: one split_chunk per candidate examined (in lab.decode.plan, the heuristic's
    home; lab.decode.splits re-exports it)."""
    calls = {"n": 0}
    for name in ("split_chunk",):
        original = getattr(plan, name)

        def counted(*args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(plan, name, counted)
    return calls


def test_plan_cost_does_not_grow_with_cache_length(monkeypatch):
    calls = _count_work(monkeypatch)
    work = {}
    for seqlen in (2**14, 2**17, 2**20, 2**24):  # 16k keys and up all allow the full MAX_SPLITS candidates
        calls["n"] = 0
        splits.choose_num_splits(1, 8, seqlen, 132)
        work[seqlen] = calls["n"]
    assert len(set(work.values())) == 1, work  # the same count at 16k and at 16M keys
    assert work[2**24] <= splits.MAX_SPLITS  # bounded by the candidate count, not the length


def test_split_plan_is_memoised(monkeypatch):
    splits.split_plan.cache_clear()
    calls = _count_work(monkeypatch)
    first = splits.split_plan(1, 8, 131072, 132, "v02")
    evaluated = calls["n"]
    assert evaluated > 0
    for _ in range(100):  # a decode loop: the same shape every step
        assert splits.split_plan(1, 8, 131072, 132, "v02") == first
    assert calls["n"] == evaluated  # no evaluation after the first call
