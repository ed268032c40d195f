"""lab/cases.py: the named case sets have the shapes the chapters rely on."""
from __future__ import annotations

import pytest

from lab import cases
from lab.cases import Case, DecodeCase


@pytest.fixture(scope="module")
def tests_set():
    return cases.tests_cases()


def test_tests_set_sizes(tests_set):
    lengths = {c.Sq for c in tests_set} | {c.Sk for c in tests_set}
    assert {1, 63, 65, 1025, 4097} <= lengths


def test_tests_set_has_sq_ne_sk_both_ways(tests_set):
    assert any(c.Sq < c.Sk for c in tests_set)
    assert any(c.Sq > c.Sk for c in tests_set)
    assert any(c.Sq == c.Sk for c in tests_set)


def test_tests_set_every_shape_in_both_dtypes_and_masks(tests_set):
    shapes = {(c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D) for c in tests_set}
    for shape in shapes:
        variants = {(c.dtype, c.causal) for c in tests_set if (c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D) == shape}
        assert variants == {("float16", False), ("float16", True), ("bfloat16", False), ("bfloat16", True)}, shape
    assert len(tests_set) == 4 * len(shapes)
    assert len({c.name for c in tests_set}) == len(tests_set)  # names are unique


def test_tests_set_gqa_mqa_and_head_dims(tests_set):
    assert any(c.Hkv < c.Hq and c.Hkv > 1 for c in tests_set)  # GQA
    assert any(c.Hkv == 1 and c.Hq > 1 for c in tests_set)  # MQA
    assert all(c.Hq % c.Hkv == 0 for c in tests_set)
    assert {c.D for c in tests_set} == {64, 128}
    assert any(c.B > 1 and c.B & (c.B - 1) for c in tests_set)  # a batch that is not a power of two
    only64 = cases.tests_cases(head_dims=(64,))
    assert {c.D for c in only64} == {64} and len(only64) == len(tests_set)


def test_bench_fwd_set():
    bench = cases.bench_fwd_cases()
    assert len(bench) == 16
    for c in bench:
        assert c.B * c.Sq == 32768 and c.Hq * c.D == 2048
        assert c.Sq == c.Sk and c.Hq == c.Hkv and c.dtype == "bfloat16"
    assert {c.D for c in bench} == {64, 128}
    assert {c.Sq for c in bench} == {512, 2048, 8192, 16384}
    assert sum(c.causal for c in bench) == 8
    assert len({c.name for c in bench}) == 16


def test_bench_decode_set_respects_kv_budget():
    bench = cases.bench_decode_cases()
    assert bench
    for c in bench:
        assert c.q_len == 1 and c.D == 128 and c.Hq == 32 and c.Hkv in (32, 8)
        assert cases.decode_kv_bytes(c) <= cases.DECODE_MAX_KV_BYTES
    assert {c.Hkv for c in bench} == {32, 8}
    # exactly the grid points over budget are left out
    grid = [(h, b, L) for h in (32, 8) for b in (1, 8, 64) for L in (4096, 16384, 32768, 65536)]
    kept = {(c.Hkv, c.B, c.kv_len) for c in bench}
    for h, b, L in grid:
        fits = 2 * b * L * h * 128 * 2 <= cases.DECODE_MAX_KV_BYTES
        assert ((h, b, L) in kept) == fits, (h, b, L)
    assert (32, 64, 65536) not in kept and (32, 1, 4096) in kept
    small = cases.bench_decode_cases(max_kv_bytes=2**30)
    assert small and all(cases.decode_kv_bytes(c) <= 2**30 for c in small) and len(small) < len(bench)


def test_decode_kv_bytes_and_lengths():
    full = DecodeCase("x", 2, 8, 2, 1, 100, 64)
    assert full.lengths() == [100, 100]
    assert cases.decode_kv_bytes(full) == 2 * 200 * 2 * 64 * 2
    mixed = DecodeCase("y", 3, 8, 2, 1, 100, 64, seqlens=(1, 50, 100))
    assert mixed.lengths() == [1, 50, 100]
    assert cases.decode_kv_bytes(mixed) == 2 * 151 * 2 * 64 * 2
    assert "mixed" in mixed.label and "kv100" in full.label


def test_decode_tests_set():
    dt = cases.decode_tests_cases()
    assert {c.dtype for c in dt} == {"float16", "bfloat16"}
    for c in dt:
        assert len(c.lengths()) == c.B and max(c.lengths()) == c.kv_len and min(c.lengths()) == 1
        assert 1 <= c.q_len <= 16 and c.Hq % c.Hkv == 0
    assert any(c.Hkv < c.Hq for c in dt) and any(c.q_len > 1 for c in dt)


def test_seed_set():
    seed = cases.seed_cases()
    assert len(seed) == 6
    assert all(c.D == 64 and c.dtype == "float16" and not c.causal and c.Sq == c.Sk for c in seed)
    assert [c.name for c in seed] == list(cases.SEED_ORIGIN_L4)
    assert {c.name: c.Sq for c in seed} == {n: v[0] for n, v in cases.SEED_ORIGIN_L4.items()}
    multi = next(c for c in seed if c.name == "Multi-head")
    assert multi.Hq == cases.SEED_MULTI_H and all(c.Hq == cases.SEED_H for c in seed if c is not multi)
    assert all(c.B == cases.SEED_B for c in seed)


def test_by_name():
    assert cases.by_name("tests") == cases.tests_cases()
    assert cases.by_name("seed") == cases.seed_cases()
    assert cases.by_name("bench-fwd", head_dims=(128,)) == cases.bench_fwd_cases(head_dims=(128,))
    assert cases.by_name("bench-decode") == cases.bench_decode_cases()
    assert cases.by_name("decode-tests") == cases.decode_tests_cases()
    with pytest.raises(ValueError, match="unknown case set 'bench'"):
        cases.by_name("bench")


def test_case_label_and_dict():
    c = Case("n", 2, 8, 2, 63, 1025, 128, "bfloat16", True)
    assert c.label == "B2 H8/2 Sq63 Sk1025 D128 bfloat16 causal"
    assert Case("m", 1, 4, 4, 1, 1, 64).label == "B1 H4 Sq1 Sk1 D64 float16"
    assert c.as_dict() == {"name": "n", "B": 2, "Hq": 8, "Hkv": 2, "Sq": 63, "Sk": 1025, "D": 128,
                           "dtype": "bfloat16", "causal": True}
