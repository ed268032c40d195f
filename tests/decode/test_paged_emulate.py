"""lab/decode/emulate_paged.py on CPU: the paged layout, the plain reference against the contiguous cache, and the
emulation of decode v03 (split-K over pages, LSE merge, bottom-right causal, bad tables) against both.

Run: .venv/bin/python -m pytest -q tests/decode/test_paged_emulate.py
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lab.decode import emulate_paged as ep
from lab.decode import splits


def _inputs(seed, B, Hq, Hkv, q_len, S, D=16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((B, Hq, q_len, D)), rng.standard_normal((B, Hkv, S, D)),
            rng.standard_normal((B, Hkv, S, D)), rng)


def _direct(q, k, v, lengths, scale, causal):
    """Attention on the contiguous cache, written out without the module: the yardstick of the yardstick."""
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    out = np.zeros(q.shape)
    for b, h, t in itertools.product(range(B), range(Hq), range(T)):
        n = max(0, lengths[b] - T + t + 1) if causal else lengths[b]
        if n:
            s = scale * (k[b, h // group, :n] @ q[b, h, t])
            w = np.exp(s - s.max())
            out[b, h, t] = w @ v[b, h // group, :n] / w.sum()
    return out


def test_layout_round_trip_with_a_shuffled_table():
    q, k, v, rng = _inputs(0, 3, 4, 2, 1, 100, 8)
    kp, vp, table = ep.page_cache(k, v, 16, rng, spare_pages=5)
    assert kp.shape == (3 * 7 + 5, 16, 2, 8) and table.shape == (3, 7) and table.dtype == np.int32
    assert len(set(table.reshape(-1).tolist())) == 21 and table.max() < 26  # 21 of 26 pages used, once each
    assert not np.array_equal(table.reshape(-1), np.arange(21))  # shuffled
    for b in range(3):
        np.testing.assert_array_equal(ep.gather_pages(kp, table[b], 100), k[b])
        np.testing.assert_array_equal(ep.gather_pages(vp, table[b], 37), v[b, :, :37])
    assert ep.gather_pages(kp, table[0], 0).shape == (2, 0, 8)


def test_visible_keys_bottom_right():
    assert ep.visible_keys(10, 4, False).tolist() == [10] * 4
    assert ep.visible_keys(10, 4, True).tolist() == [7, 8, 9, 10]  # the last token sees the whole cache
    assert ep.visible_keys(2, 4, True).tolist() == [0, 0, 1, 2]    # a token with no key left sees nothing
    assert ep.visible_keys(0, 3, True).tolist() == [0, 0, 0]


@pytest.mark.parametrize("causal", [False, True])
def test_reference_equals_attention_on_the_contiguous_cache(causal):
    q, k, v, rng = _inputs(1, 5, 8, 2, 4, 130)
    lengths = [0, 1, 63, 65, 130]
    kp, vp, table = ep.page_cache(k, v, 64, rng)
    out, lse, errors = ep.reference_paged_decode(q, kp, vp, table, lengths, 0.25, causal)
    np.testing.assert_allclose(out, _direct(q, k, v, lengths, 0.25, causal), atol=1e-12)
    assert errors == [0] * 5
    assert np.isneginf(lse[0]).all() and (out[0] == 0).all()
    if not causal:  # and the split-K module's reference on the contiguous cache
        np.testing.assert_allclose(out, splits.reference_decode(q, k, v, lengths, 0.25)[0], atol=1e-12)


CASES = [  # (page size, Hq, Hkv, q_len, causal): GQA 1/4/8, q_len 1..8, page sizes 16/64/256
    (ps, Hkv * group, Hkv, q_len, causal)
    for ps, (group, Hkv), q_len, causal in itertools.product((16, 64, 256), ((1, 3), (4, 2), (8, 1)), (1, 3, 8),
                                                             (False, True))
]


@pytest.mark.parametrize("page_size, Hq, Hkv, q_len, causal", CASES,
                         ids=[f"p{c[0]}-g{c[1] // c[2]}-q{c[3]}{'-c' if c[4] else ''}" for c in CASES])
def test_emulation_matches_the_reference(page_size, Hq, Hkv, q_len, causal):
    S = 300
    q, k, v, rng = _inputs(page_size + Hq + q_len, 5, Hq, Hkv, q_len, S)
    lengths = [0, 1, 7, 257, 300]  # ragged: empty, one key, fewer keys than tokens, across page ends
    kp, vp, table = ep.page_cache(k, v, page_size, rng, spare_pages=2)
    ref, ref_lse, _ = ep.reference_paged_decode(q, kp, vp, table, lengths, 0.2, causal)
    np.testing.assert_allclose(ref, _direct(q, k, v, lengths, 0.2, causal), atol=1e-12)
    for num_splits in (1, 2, 5, 16):  # 16 splits of 64 keys over a 320- or 512-key capacity: empty splits too
        out, lse, errors, partial_lse = ep.emulate_paged_decode(q, kp, vp, table, lengths, num_splits, 0.2, causal)
        np.testing.assert_allclose(out, ref, atol=1e-12)
        np.testing.assert_allclose(np.where(np.isinf(lse), 0, lse), np.where(np.isinf(ref_lse), 0, ref_lse), atol=1e-12)
        assert (np.isneginf(lse) == np.isneginf(ref_lse)).all() and errors == [0] * 5
        assert partial_lse.shape == (5, Hq, q_len, num_splits)


def test_splits_cross_pages_and_start_inside_them():
    """Page 48 (a multiple of 16, not of 64): tiles of 64 keys cross page ends, splits start mid-page."""
    q, k, v, rng = _inputs(3, 2, 4, 1, 5, 500)
    kp, vp, table = ep.page_cache(k, v, 48, rng)
    capacity = table.shape[1] * 48
    assert capacity == 528 and any(begin % 48 for begin, _ in splits.split_bounds(capacity, 5))
    ref = _direct(q, k, v, [500, 333], 0.3, True)
    out, _, errors, _ = ep.emulate_paged_decode(q, kp, vp, table, [500, 333], 5, 0.3, True)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    assert errors == [0, 0]


def test_bad_tables_zero_the_sequence_and_flag_it():
    q, k, v, rng = _inputs(4, 5, 4, 2, 2, 128)
    kp, vp, table = ep.page_cache(k, v, 16, rng)
    num_pages = kp.shape[0]
    table = table.copy()
    table[1, 3] = num_pages        # past the last page, inside sequence 1's length
    table[2, 0] = -1               # negative
    table[3, 7] = 10**6            # out of range but past sequence 3's length (40 keys: slots 0-2): never read
    lengths = [128, 128, 5, 40, 129]  # sequence 4 asks for more keys than its 8 slots hold
    out, lse, errors, _ = ep.emulate_paged_decode(q, kp, vp, table, lengths, 3, 0.25, False)
    assert errors == [0, ep.PAGE_E_INDEX, ep.PAGE_E_INDEX, 0, ep.PAGE_E_SHORT]
    for b in (1, 2, 4):
        assert (out[b] == 0).all() and np.isneginf(lse[b]).all()
    np.testing.assert_allclose(out[[0, 3]], _direct(q[[0, 3]], k[[0, 3]], v[[0, 3]], [128, 40], 0.25, False), atol=1e-12)
    ref, _, ref_errors = ep.reference_paged_decode(q, kp, vp, table, lengths, 0.25, False)
    assert ref_errors == errors and np.allclose(ref, out, atol=1e-12)


def test_lengths_are_clamped_like_the_kernel():
    q, k, v, rng = _inputs(5, 2, 2, 2, 1, 64)
    kp, vp, table = ep.page_cache(k, v, 64, rng)
    lengths, errors = ep.sequence_status(table, [-5, 64], kp.shape[0], 64)
    assert lengths == [0, 64] and errors == [0, 0]  # negative: nothing to see, no error (lab.ops.decode's rule)
    lengths, errors = ep.sequence_status(table, None, kp.shape[0], 64)
    assert lengths == [64, 64] and errors == [0, 0]  # None: the table's capacity
    out, *_ = ep.emulate_paged_decode(q, kp, vp, table, None, 2, 1 / math.sqrt(16), False)
    np.testing.assert_allclose(out, _direct(q, k, v, [64, 64], 0.25, False), atol=1e-12)


@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_pagerow_algorithm(page_size, causal):
    """decode v04's algorithm: 16-key tiles (one page id each: a 16-key tile never crosses a page, even at page 48)
    and its own split plan (blocks of 8 KV heads, splits of >= 256 keys, one wave), emulated against the direct
    softmax; its plan over the n11 cells on a 132-SM GPU, each within a wave."""
    q, k, v, rng = _inputs(page_size + causal, 3, 32, 8, 3, 1100)
    kp, vp, table = ep.page_cache(k, v, page_size, rng, spare_pages=1)
    capacity = table.shape[1] * page_size
    lengths = [1100, 0, 517]
    assert all(begin % splits.BLOCK_N_V04 == 0 for begin, _ in splits.split_bounds(capacity, 7, splits.BLOCK_N_V04))
    assert all((begin + 16 * t) // page_size == (begin + 16 * t + 15) // page_size  # one page per tile
               for begin, _ in splits.split_bounds(capacity, 7, splits.BLOCK_N_V04) for t in range(8))
    ref = _direct(q, k, v, lengths, 0.2, causal)
    for num_splits in (1, 7, splits.choose_num_splits_v04(3, 8, capacity, 132)):
        out, _, errors, _ = ep.emulate_paged_decode(q, kp, vp, table, lengths, num_splits, 0.2, causal,
                                                    block_n=splits.BLOCK_N_V04)
        np.testing.assert_allclose(out, ref, atol=1e-12)
        assert errors == [0, 0, 0]
    plan = {(B, L): splits.choose_num_splits_v04(B, 8, L, 132) for B, L in
            ((64, 1024), (32, 4096), (8, 16384), (1, 131072), (128, 2048))}
    assert plan == {(64, 1024): 2, (32, 4096): 4, (8, 16384): 16, (1, 131072): 127, (128, 2048): 1}
    assert all(B * s <= 132 or s == 1 for (B, _), s in plan.items())


def test_ragged_split_plan():
    """A paged call's plan has at least one split per RAGGED_CHUNK keys of the capacity (lab.decode.splits.
    ragged_splits): a long-tailed batch's longest sequence spread over several splits, emulated against the direct
    softmax, with the short sequences' splits empty."""
    assert splits.ragged_splits(1, 16384) == 4 and splits.ragged_splits(16, 131072) == 32
    assert splits.ragged_splits(1, 2048) == 1 and splits.ragged_splits(5, 10 ** 9) == splits.MAX_SPLITS
    capacity = 3 * splits.RAGGED_CHUNK
    q, k, v, rng = _inputs(11, 4, 8, 2, 1, capacity)
    kp, vp, table = ep.page_cache(k, v, 64, rng)
    lengths = [capacity, 7, 300, 0]
    num_splits = splits.ragged_splits(splits.choose_num_splits_v02(4, 2, capacity, 132), capacity)
    assert num_splits >= 3 and all(end - begin <= splits.RAGGED_CHUNK for begin, end in splits.split_bounds(capacity, num_splits))
    out, _, errors, partial_lse = ep.emulate_paged_decode(q, kp, vp, table, lengths, num_splits, 0.25)
    np.testing.assert_allclose(out, _direct(q, k, v, lengths, 0.25, False), atol=1e-12)
    assert errors == [0] * 4 and np.isneginf(partial_lse[1, :, :, 1:]).all()  # 7 keys: the later splits are empty
