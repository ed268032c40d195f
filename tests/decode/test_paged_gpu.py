"""GPU tests of decode v03 through lab.ops.decode: paged caches (shuffled tables, page sizes 16/64/256, GQA
1/4/8, q_len 1-8, causal and not, ragged lengths with 0 and 1) against the float64 reference (lab.decode.paged,
lab.check's rule), the contiguous causal path, bad tables (zeroed rows and flags; ValueError at a later call), and CUDA
graph replays with new lengths and tables. Marked `gpu`: skipped without CUDA (tests/conftest.py).

Not yet run on a GPU (written without GPU time, 2026-11-22). Run: .venv/bin/python -m pytest -q tests/decode/test_paged_gpu.py
Under compute-sanitizer: bash tools/gpu/sanitize_paged.sh
"""
from __future__ import annotations

import pytest
import torch

from lab import cases, check, ops, registry
from lab.decode import emulate_paged, paged
from lab.cases import PagedCase

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    return session_dir


# Every paged version in the registry, on the cases whose H_kv and head dim it takes (lab.registry.paged_versions;
# v08 runs D 80 / 96 only, so its cases are the head-dim tests'). A version asked for a head dim it lacks raises
# ValueError before any kernel runs (test_a_version_refuses_a_head_dim_it_lacks).
VERSIONED = [(v, c) for c in cases.paged_tests_cases() for v in registry.paged_versions(c.Hkv)
             if c.D in registry.DECODE[v].head_dims]


def _dim(version: str) -> int:
    """D of the cases below: 128, or the first head dim of a version without it (v08: 80)."""
    dims = registry.DECODE[version].head_dims
    return 128 if 128 in dims else dims[0]


@pytest.mark.parametrize("version,case", VERSIONED, ids=lambda x: x if isinstance(x, str) else x.name)
def test_paged_case(version, case):
    result = paged.check_paged(case, save=False, version=version)
    assert result.passed, repr(result)


def test_a_version_refuses_a_head_dim_it_lacks():
    narrow = next(v for v in registry.PAGED_DECODE if 128 not in registry.DECODE[v].head_dims)
    case = next(c for c in cases.paged_tests_cases() if c.D == 128)
    with pytest.raises(ValueError, match="head dim|head_dim|D ="):
        paged.check_paged(case, save=False, version=narrow, trials=1)


@pytest.mark.parametrize("num_splits", [1, 3, 64, ops.MAX_NUM_SPLITS])
@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("version", registry.PAGED_DECODE)
def test_paged_split_counts(num_splits, page_size, version):
    heads_kv = registry.PAGED_HEADS.get(version, 2)
    case = PagedCase(f"pg-splits-p{page_size}", 4, 4 * heads_kv, heads_kv, 4, 4097, _dim(version), "bfloat16",
                     (0, 1, 63, 4097), page_size, True)
    result = paged.check_paged(case, num_splits=num_splits, save=False, version=version)
    assert result.passed, (num_splits, repr(result))


@pytest.mark.parametrize("q_len", [2, 5, 16])
def test_contiguous_causal(q_len):
    """No block table, is_causal with q_len > 1: decode v03 on the contiguous cache, bottom-right."""
    case = PagedCase("contig-causal", 5, 8, 2, q_len, 300, 64, "float16", (0, 1, 3, 130, 300))
    a = paged.paged_inputs(case, torch.Generator().manual_seed(q_len), "cuda")
    out = ops.decode(a["q"], a["k"], a["v"], a["seqlens"], is_causal=True)
    ref = paged.reference(a["q"], a["k"], a["v"], case.lengths(), True)
    metrics = check.compare(out, ref, paged.yardstick(a["q"], a["k"], a["v"], case.lengths(), True))
    assert metrics["passed"], metrics


def _bad_table_inputs(seed=0, heads_kv=2, D=128):
    case = PagedCase("pg-bad", 6, 4 * heads_kv, heads_kv, 3, 512, D, "bfloat16", (512, 512, 100, 40, 513, 512), 16,
                     True)
    a = paged.paged_inputs(case, torch.Generator().manual_seed(seed), "cuda")
    table = a["table"].clone()
    num_pages = a["k_pages"].shape[0]
    table[1, 5] = num_pages           # one past the pool, inside sequence 1
    table[2, 0] = -7                  # negative
    table[3, 9] = 2**31 - 1           # out of range but past sequence 3's 40 keys (3 slots): never read
    a["seqlens"][4] = 32 * 16 + 1     # one key more than the 32-slot table holds
    return case, a, table


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("version", registry.PAGED_DECODE)
def test_out_of_range_tables_zero_the_rows_and_flag_them(num_splits, version):
    case, a, table = _bad_table_inputs(heads_kv=registry.PAGED_HEADS.get(version, 2), D=_dim(version))
    flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
    out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], None, num_splits, block_table=table,
                     is_causal=True, page_errors=flags, version=version)
    E, S = emulate_paged.PAGE_E_INDEX, emulate_paged.PAGE_E_SHORT
    assert flags.tolist() == [0, E, E, 0, S, 0]
    assert (out[[1, 2, 4]] == 0).all() and torch.isfinite(out).all()
    good = [0, 3, 5]
    lengths = [case.lengths()[b] for b in good]
    ref = paged.reference(a["q"][good], a["k"][good], a["v"][good], lengths, True)
    metrics = check.compare(out[good], ref, paged.yardstick(a["q"][good], a["k"][good], a["v"][good], lengths, True))
    assert metrics["passed"], metrics


def test_eager_call_without_page_errors_raises_naming_the_sequences():
    """Without page_errors the call returns at once (its flags read later, lab.decode.deferred): the flagged rows are
    zero, lab.ops.check_page_errors() raises naming them, and so does the next call once the GPU has run it; the
    flags equal those of the call with page_errors, and a long run of good calls keeps the queue bounded."""
    from lab import build

    case, a, table = _bad_table_inputs(1)
    pattern = r"sequence\(s\) 1 \(a page index outside .*2 \(.*4 \(cache_seqlens longer"
    ops.check_page_errors()
    out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=table, is_causal=True)
    with pytest.raises(ValueError, match=pattern):
        ops.check_page_errors()
    flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
    same = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=table, is_causal=True,
                      page_errors=flags)
    assert torch.equal(out, same) and flags.tolist() == [0, 1, 1, 0, 2, 0] and (out[[1, 2, 4]] == 0).all()
    ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=table, is_causal=True)  # one crossing
    torch.cuda.synchronize()
    good = (a["q"], a["k_pages"], a["v_pages"], a["seqlens"].clamp(max=512))
    with pytest.raises(ValueError, match=pattern):
        ops.decode(*good, block_table=a["table"])
    for _ in range(300):  # the host far ahead of the GPU: at most 64 calls' flags queued
        out = ops.decode(*good, block_table=a["table"])
    assert build.binding().module.page_flags_state()[0] <= 64
    ops.check_page_errors()
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("case", [PagedCase("pg-graph", 4, 8, 2, 4, 1000, 128, "bfloat16", (1000, 1, 0, 999), 64, True),
                                  PagedCase("pg-graph-p16", 3, 32, 8, 1, 4097, 128, "float16", (4097, 65, 300), 16)],
                         ids=lambda c: c.name)
def test_cuda_graph_replays_with_new_lengths_and_tables(case):
    """Captured once; replayed with new cache_seqlens and block_table contents (a reshuffled table over the
    same pool, then a bad one): every replay equals an eager call bit for bit, flags included, no host sync."""
    row = paged.graph_check(case, save=False)
    assert row["passed"], row["replays"]


@pytest.mark.parametrize("version", registry.PAGED_DECODE)
def test_a_kernel_that_ignores_the_table_fails(version):
    """The self-test: LAB_PAGED_BUG_IDENTITY reads slot i as page i; on a shuffled table it must fail."""
    case = cases.paged_tests_cases((_dim(version),))[2]  # H_kv 8: every paged version takes it
    assert not paged.check_paged(case, defines={"LAB_PAGED_BUG_IDENTITY": None}, save=False, version=version).passed
    assert paged.check_paged(case, save=False, version=version).passed


def test_direct_binding_checks():
    """The binding's own checks for a direct call (no lab.ops in front)."""
    from lab import build

    case = PagedCase("pg-direct", 2, 4, 2, 1, 64, 64, "float16", (), 16)
    a = paged.paged_inputs(case, torch.Generator().manual_seed(5), "cuda")
    call = build.binding().decode_paged_call
    address = ops.launcher(ops.DECODE, "v03")
    with pytest.raises(RuntimeError, match=r"page_size \(key_cache.size\(1\)\) must be a positive multiple of 16"):
        call(address, a["q"], a["k_pages"][:, :8], a["v_pages"][:, :8], None, a["table"], None, 0.1, 1, False)
    with pytest.raises(RuntimeError, match=r"block_table must be an int32 tensor"):
        call(address, a["q"], a["k_pages"], a["v_pages"], None, a["table"].long(), None, 0.1, 1, False)
    with pytest.raises(RuntimeError, match=r"page_errors needs a block_table"):
        call(address, a["q"], a["k"], a["v"], None, None, torch.zeros(2, dtype=torch.int32, device="cuda"), 0.1, 1, False)


def test_fast_path_equals_the_full_path_and_refusals_take_the_full_path():
    """The graph-safe call's one-crossing path (lab.decode.fast.paged, after one full call of the same shapes)
    gives the full path's output bit for bit; lengths that are not int32 still work (the full path converts
    them), and a bad flags buffer still raises the full path's TypeError."""
    case = PagedCase("pg-fast", 3, 32, 8, 1, 700, 128, "bfloat16", (700, 1, 300), 16)
    a = paged.paged_inputs(case, torch.Generator().manual_seed(7), "cuda")
    flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")

    def call(seqlens, errors):
        return ops.decode(a["q"], a["k_pages"], a["v_pages"], seqlens, block_table=a["table"], page_errors=errors)
    first = call(a["seqlens"], flags)  # full path: checks, then the plan is kept
    again = call(a["seqlens"], flags)  # one crossing
    assert torch.equal(first, again) and flags.tolist() == [0, 0, 0]
    assert torch.equal(call(a["seqlens"].long(), flags), first)
    with pytest.raises(TypeError, match="page_errors must be an int32"):
        call(a["seqlens"], flags.long())
