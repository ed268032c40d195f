"""lab.ops.decode's paged and causal paths on CPU: argument checks (TypeError/ValueError naming the argument),
routing to decode v03, the split plan from shapes only, the fake implementation, the flags' error message.

Tensors "on CUDA" come from FakeTensorMode (as in tests/product/test_ops.py): validation runs in full, then the
registered fake kernel; nothing is built or launched.
"""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lab import ops, paths
from lab.decode import emulate_paged
from lab.decode import checks, paged_op
from lab.decode import op as decode_op

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield lambda *shape, dtype=BF16: torch.empty(*shape, dtype=dtype, device="cuda")


def _paged(fake, B=3, Hq=8, Hkv=2, q_len=4, num_pages=40, page_size=64, max_pages=10, D=128):
    q = fake(B, Hq, q_len, D)
    kc, vc = fake(num_pages, page_size, Hkv, D), fake(num_pages, page_size, Hkv, D)
    table = fake(B, max_pages, dtype=torch.int32)
    return q, kc, vc, table


def test_registry_and_op():
    assert ops.DECODE["v03"].source == "decode/v03_paged.cu" and ops.PAGED_DECODE == ("v03", "v04", "v05", "v06", "v07",
                                                                                       "v08")
    assert "lab::decode_paged" in str(torch.ops.lab.decode_paged.default._schema)


def test_paged_fake_shapes(fake):
    q, kc, vc, table = _paged(fake)
    seqlens = fake(3, dtype=torch.int32)
    out = ops.decode(q, kc, vc, seqlens, block_table=table, is_causal=True)
    assert out.shape == q.shape and out.dtype == BF16
    errors = fake(3, dtype=torch.int32)
    assert ops.decode(q, kc, vc, None, block_table=table, page_errors=errors).shape == q.shape
    out = torch.ops.lab.decode_paged(q, kc, vc, seqlens, table, errors, 0.1, 2, True, "v03")
    assert out.shape == q.shape
    k = fake(3, 2, 500, 128)  # contiguous causal (q_len > 1) runs v03 too, with no table and no flags
    assert torch.ops.lab.decode_paged(q, k, k, None, None, None, 0.1, 1, True, "v03").shape == q.shape
    assert ops.decode(q, k, k, is_causal=True).shape == q.shape


@pytest.mark.parametrize("change, error, pattern", [
    (lambda a, f: {"kc": f(40, 56, 2, 128), "vc": f(40, 56, 2, 128)}, ValueError, r"page_size \(key_cache.shape\[1\]\) must be a positive multiple of 16, got 56"),
    (lambda a, f: {"kc": f(40, 8, 2, 128), "vc": f(40, 8, 2, 128)}, ValueError, r"multiple of 16, got 8"),
    (lambda a, f: {"kc": f(0, 64, 2, 128), "vc": f(0, 64, 2, 128)}, ValueError, r"key_cache has no pages"),
    (lambda a, f: {"vc": f(40, 64, 2, 128, dtype=F16)}, TypeError, r"value_cache.dtype \(torch.float16\) must match query.dtype"),
    (lambda a, f: {"kc": f(40, 64, 2, 128, dtype=F16)}, TypeError, r"key_cache.dtype \(torch.float16\) must match"),
    (lambda a, f: {"vc": f(41, 64, 2, 128)}, ValueError, r"key_cache and value_cache shapes differ"),
    (lambda a, f: {"kc": f(40, 64, 3, 128), "vc": f(40, 64, 3, 128)}, ValueError, r"query heads \(8\) must be a multiple of key_cache heads \(3\)"),
    (lambda a, f: {"kc": f(40, 64, 2, 64), "vc": f(40, 64, 2, 64)}, ValueError, r"key_cache has head dim 64 but query has 128"),
    (lambda a, f: {"kc": f(40, 64, 256), "vc": f(40, 64, 256)}, ValueError, r"key_cache must be 4-D \(num_pages, page_size, H_kv, D\)"),
    (lambda a, f: {"table": f(3, 10, dtype=torch.int64)}, TypeError, r"block_table must be an int32 tensor"),
    (lambda a, f: {"table": [[0, 1]] * 3}, TypeError, r"block_table must be an int32 tensor"),
    (lambda a, f: {"table": f(2, 10, dtype=torch.int32)}, ValueError, r"block_table must have shape \(3, max_pages\), got \(2, 10\)"),
    (lambda a, f: {"table": f(30, dtype=torch.int32)}, ValueError, r"block_table must have shape \(3, max_pages\)"),
    (lambda a, f: {"table": f(3, 2**26, dtype=torch.int32)}, ValueError, r"overflows the kernel's int32 key offsets"),
    (lambda a, f: {"table": f(3, 0, dtype=torch.int32)}, ValueError, r"block_table must have at least one column"),
    (lambda a, f: {"errors": f(3, dtype=torch.int64)}, TypeError, r"page_errors must be an int32 tensor"),
    (lambda a, f: {"errors": f(4, dtype=torch.int32)}, ValueError, r"page_errors must be a contiguous \(3,\) tensor"),
    (lambda a, f: {"seqlens": f(3, dtype=torch.float32)}, TypeError, r"cache_seqlens must be an int32 or int64 tensor"),
    (lambda a, f: {"seqlens": f(4, dtype=torch.int32)}, ValueError, r"cache_seqlens must have shape \(3,\)"),
    (lambda a, f: {"q": f(3, 8, 17, 128)}, ValueError, r"query length must be 1..16 tokens"),
    (lambda a, f: {"causal": 1}, TypeError, r"is_causal must be a bool, got int"),
    (lambda a, f: {"version": "v02"}, ValueError, r"decode version 'v02' has no block table or causal mask"),
    (lambda a, f: {"version": "v09"}, ValueError, r"version='v09' is unknown"),
], ids=lambda x: x.__name__ if callable(x) else None)
def test_paged_bad_input(fake, change, error, pattern):
    q, kc, vc, table = _paged(fake)
    args = dict(q=q, kc=kc, vc=vc, table=table, seqlens=None, errors=None, causal=False, version=None)
    args.update(change(args, fake))
    with pytest.raises(error, match=pattern):
        ops.decode(args["q"], args["kc"], args["vc"], args["seqlens"], version=args["version"],
                   block_table=args["table"], is_causal=args["causal"], page_errors=args["errors"])


def test_paged_rejects_cpu_and_mixed_devices(fake):
    q, kc, vc, table = _paged(fake)
    with pytest.raises(ValueError, match=r"block_table is on cpu but query is on cuda"):
        ops.decode(q, kc, vc, block_table=torch.zeros(3, 10, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"query must be on a CUDA device"):
        ops.decode(torch.zeros(3, 8, 1, 128, dtype=BF16), torch.zeros(4, 16, 2, 128, dtype=BF16),
                   torch.zeros(4, 16, 2, 128, dtype=BF16), block_table=torch.zeros(3, 1, dtype=torch.int32))


def test_page_errors_need_a_block_table(fake):
    q, k = fake(3, 8, 2, 128), fake(3, 2, 100, 128)
    with pytest.raises(ValueError, match=r"page_errors goes with block_table"):
        ops.decode(q, k, k, page_errors=fake(3, dtype=torch.int32))


def test_split_plan_from_the_table_capacity(fake, monkeypatch):
    """The plan sees max_pages * page_size (shapes only: graph-safe), with v02's one-block-per-SM rule."""
    seen = []
    for glue in (decode_op, paged_op):  # the contiguous call's plan and the paged or causal call's
        monkeypatch.setattr(glue, "_num_splits", lambda n, batch, heads, seqlen, device, version: seen.append(
            (batch, heads, seqlen, version)) or 3)
    decode_op._decode_plans.clear()
    q, kc, vc, table = _paged(fake, max_pages=10, page_size=64)
    ops.decode(q, kc, vc, block_table=table)
    ops.decode(q, kc, vc, block_table=table)  # memoised: asked once
    assert seen == [(3, 2, 640, "v02")]
    ops.decode(q, fake(3, 2, 999, 128), fake(3, 2, 999, 128), is_causal=True)  # contiguous causal: S_cache
    assert seen[-1] == (3, 2, 999, "v02")
    ops.decode(q, fake(3, 2, 999, 128), fake(3, 2, 999, 128), version="v03")  # v03 unmasked: the same rule
    assert seen[-1] == (3, 2, 999, "v02")
    decode_op._decode_plans.clear()


def test_contiguous_causal_routing(fake, monkeypatch):
    """q_len > 1 causal -> the paged default (v07 at D 128, v08 at D 80, v03 at D 192); q_len 1 causal is the unmasked call (v01 /
    v02 / v07); no block table, no flags."""
    calls = []
    real = paged_op._v03_op
    monkeypatch.setattr(paged_op, "_v03_op", lambda *a: calls.append(a[-1]) or real(*a))
    k = fake(3, 2, 300, 128)
    ops.decode(fake(3, 8, 4, 128), k, k, is_causal=True)
    assert calls == ["v07"]
    ops.decode(fake(3, 8, 1, 128), k, k, is_causal=True)
    assert calls == ["v07"]  # unchanged: the plain path
    k80 = fake(3, 2, 300, 80)
    ops.decode(fake(3, 8, 4, 80), k80, k80, is_causal=True)
    assert calls == ["v07", "v08"]  # v07 takes D 64 / 128 only, v08 80 / 96
    k192 = fake(3, 2, 300, 192)
    ops.decode(fake(3, 8, 4, 192), k192, k192, is_causal=True)
    assert calls == ["v07", "v08", "v03"]


def test_page_error_message_names_sequences_and_reasons():
    ops.raise_page_errors(torch.zeros(4, dtype=torch.int32))  # all fine: no error
    flags = torch.tensor([0, emulate_paged.PAGE_E_INDEX, 0, emulate_paged.PAGE_E_SHORT | emulate_paged.PAGE_E_INDEX],
                         dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        ops.raise_page_errors(flags)
    text = str(info.value)
    assert "sequence(s) 1 (a page index outside [0, num_pages))" in text
    assert "3 (a page index outside [0, num_pages) and cache_seqlens longer than the block table" in text
    assert "page_errors" in text and "outputs are zero" in text


def test_emulation_flag_values_match_the_kernel_header():
    header = (paths.KERNELS / "common" / "params.h").read_text()
    assert f"#define LAB_PAGE_E_INDEX {emulate_paged.PAGE_E_INDEX}" in header
    assert f"#define LAB_PAGE_E_SHORT {emulate_paged.PAGE_E_SHORT}" in header


def test_torch_layout_and_reference_agree_with_the_emulation():
    """lab.decode.paged builds the pages in torch (on CPU here); the NumPy emulation of decode v03 on those pages
    equals lab.decode.paged's float64 reference on the contiguous cache, and SDPA's yardstick is close to it."""
    import numpy as np

    from lab import cases
    from lab.decode import paged

    for case in (cases.paged_tests_cases()[9], cases.paged_tests_cases()[-1]):  # page 16 causal fp16; page 256 bf16
        a = paged.paged_inputs(case, torch.Generator().manual_seed(0), "cpu")
        assert a["k_pages"].shape == (a["table"].numel() + paged.SPARE_PAGES, case.page_size, case.Hkv, case.D)
        ref = paged.reference(a["q"], a["k"], a["v"], case.lengths(), case.causal)
        out, _, errors, _ = emulate_paged.emulate_paged_decode(
            *(a[n].float().numpy() for n in ("q", "k_pages", "v_pages")), a["table"].numpy(), case.lengths(), 3,
            case.D ** -0.5, case.causal)
        assert errors == [0] * case.B and np.abs(out - ref.numpy()).max() < 1e-12
        assert (paged.yardstick(a["q"], a["k"], a["v"], case.lengths(), case.causal).double() - ref).abs().max() < 0.05


def test_expanded_or_transposed_tables_are_copied():
    table = torch.zeros(3, 10, dtype=torch.int32)
    assert decode_op._kernel_table(table) is table
    shared = torch.arange(10, dtype=torch.int32)[None].expand(3, 10)  # one row for every sequence: stride(0) == 0
    copied = decode_op._kernel_table(shared)
    assert copied.is_contiguous() and torch.equal(copied, shared)
    transposed = torch.zeros(10, 3, dtype=torch.int32).t()
    assert decode_op._kernel_table(transposed).stride() == (10, 1)
    assert decode_op._kernel_table(table[:, :4]) .stride() == (10, 1)  # a column slice is read in place


def test_paged_routing_by_kv_heads(fake, monkeypatch):
    """v07 at D 64 / 128 whatever H_kv, v04's full-wave cells included (v04 runs when named); naming v04 for H_kv 2
    is a ValueError that says why."""
    from lab import registry

    calls = []
    real = paged_op._v03_op
    monkeypatch.setattr(paged_op, "_v03_op", lambda *a: calls.append(a[-1]) or real(*a))
    decode_op._decode_plans.clear()
    monkeypatch.setattr(checks, "sm_count", lambda device: 132)
    q, kc, vc, table = _paged(fake, B=3, Hq=32, Hkv=8)
    ops.decode(q, kc, vc, block_table=table)  # 3 blocks of 8 heads: v04 would need splits
    q, kc, vc, table = _paged(fake, B=120, Hq=32, Hkv=16)
    ops.decode(q, kc, vc, block_table=table)  # 240 blocks of 8 heads: one wave with no split, v07 as well
    q2, kc2, vc2, table2 = _paged(fake)
    ops.decode(q2, kc2, vc2, block_table=table2)
    ops.decode(q2, kc2, vc2, block_table=table2, version="v05")  # on no default list, but a call may name it
    ops.decode(q, kc, vc, block_table=table, version="v04")
    assert calls == ["v07", "v07", "v07", "v05", "v04"] and "v05" not in registry.paged_versions(2)
    with pytest.raises(ValueError, match=r"'v04' needs H_kv to be a multiple of 8, got 2"):
        ops.decode(q2, kc2, vc2, block_table=table2, version="v04")
    decode_op._decode_plans.clear()


def test_contiguous_cache_names_heads_a_version_needs(fake):
    """v04 reads 8 KV heads a block: named on a contiguous cache of H_kv 2 it is a ValueError naming the versions
    that take H_kv 2, not the kernel's bare refusal at launch; H_kv 8 plans."""
    decode_op._decode_plans.clear()
    q = fake(3, 8, 1, 128)
    with pytest.raises(ValueError, match=r"'v04' needs H_kv to be a multiple of 8, got 2; use one of \['v01', 'v02'"):
        decode_op._decode_plan(q, fake(3, 2, 300, 128), "v04", 1)
    assert decode_op._decode_plan(fake(3, 16, 1, 128), fake(3, 8, 300, 128), "v04", 1) == ("v04", 1)
    decode_op._decode_plans.clear()


def test_serving_lengths_are_long_tailed_and_bounded():
    from lab.decode import paged

    lengths = paged.serving_lengths(64, 16384, seed=0)
    assert len(lengths) == 64 and min(lengths) >= 1 and max(lengths) == 16384
    assert sorted(lengths)[32] < 4096 < max(lengths)  # most sequences short, one long: the tail a server sees
    assert paged.serving_lengths(64, 16384, seed=0) == lengths  # seeded
