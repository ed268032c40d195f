"""The binding's own checks of a paged decode call (lab/binding.cpp decode_paged_call), on CPU: the real C++
source built with LAB_BINDING_CPU_CHECKS (tests/product/test_binding_checks.py's build, shared through its cache
folder), called directly with every bad argument; nothing is launched. The GPU build runs the same checks in
tests/decode/test_paged_gpu.py."""
from __future__ import annotations

import re

import pytest
import torch


F16 = torch.float16


def _args(B=3, Hq=8, Hkv=2, T=2, pages=20, page=16, max_pages=6, D=64):
    return dict(q=torch.randn(B, Hq, T, D, dtype=F16), k=torch.randn(pages, page, Hkv, D, dtype=F16),
                v=torch.randn(pages, page, Hkv, D, dtype=F16), lens=torch.full((B,), 40, dtype=torch.int32),
                table=torch.zeros(B, max_pages, dtype=torch.int32), errors=torch.zeros(B, dtype=torch.int32),
                scale=0.125, splits=2, causal=True)


def _call(binding, a):
    call = binding.decode_paged_call
    return call(0, a["q"], a["k"], a["v"], a["lens"], a["table"], a["errors"], a["scale"], a["splits"], a["causal"])


BAD = {
    "page size 8": (lambda a: {"k": a["k"][:, :8], "v": a["v"][:, :8]}, r"page_size \(key_cache.size\(1\)\) must be a positive multiple of 16, got 8"),
    "no pages": (lambda a: {"k": a["k"][:0], "v": a["v"][:0]}, r"key_cache has no pages"),
    "value dtype": (lambda a: {"v": a["v"].bfloat16()}, r"value_cache has dtype BFloat16 but query has Half"),
    "shapes differ": (lambda a: {"v": a["v"][:5]}, r"key_cache and value_cache shapes differ"),
    "3-D cache": (lambda a: {"k": a["k"][0], "v": a["v"][0]}, r"key_cache must be 4-D \(num_pages, page_size, H_kv, D\)"),
    "heads": (lambda a: {"k": torch.randn(20, 16, 3, 64, dtype=F16), "v": torch.randn(20, 16, 3, 64, dtype=F16)}, r"query heads \(8\) must be a multiple of key_cache heads \(3\)"),
    "head dim": (lambda a: {"k": torch.randn(20, 16, 2, 128, dtype=F16), "v": torch.randn(20, 16, 2, 128, dtype=F16)}, r"key_cache has head dim 128 but query has 64"),
    "table dtype": (lambda a: {"table": a["table"].long()}, r"block_table must be an int32 tensor of shape \(3, max_pages\)"),
    "table rows": (lambda a: {"table": a["table"][:2]}, r"block_table must be an int32 tensor of shape \(3, max_pages\)"),
    "table width 0": (lambda a: {"table": a["table"][:, :0]}, r"block_table must have at least one column"),
    "table overlap": (lambda a: {"table": a["table"][:1].expand(3, 6)}, r"block_table rows must be contiguous and must not overlap"),
    "table columns": (lambda a: {"table": torch.zeros(6, 3, dtype=torch.int32).t()}, r"block_table rows must be contiguous"),
    "errors dtype": (lambda a: {"errors": a["errors"].long()}, r"page_errors must be a contiguous int32 CUDA tensor of 3 elements"),
    "errors size": (lambda a: {"errors": torch.zeros(4, dtype=torch.int32)}, r"page_errors must be a contiguous int32"),
    "seqlens dtype": (lambda a: {"lens": a["lens"].long()}, r"cache_seqlens must be a contiguous int32 tensor of shape \(3,\)"),
    "num_splits": (lambda a: {"splits": 5000}, r"num_splits must be in \[1, 1024\], got 5000"),
    "scale": (lambda a: {"scale": float("inf")}, r"scale must be a finite float32 value"),
    "errors without table": (lambda a: {"table": None}, r"page_errors needs a block_table"),
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_bad_paged_call_is_named(cpu_binding, what):  # noqa: F811
    change, pattern = BAD[what]
    a = _args()
    a.update(change(a))
    with pytest.raises(RuntimeError, match=pattern):
        _call(cpu_binding, a)


def test_good_paged_calls_pass_every_check(cpu_binding):  # noqa: F811
    _call(cpu_binding, _args())
    a = _args()
    a["errors"] = None  # allocated by the binding
    out, errors = _call(cpu_binding, a)
    assert out.shape == a["q"].shape and errors.shape == (3,) and errors.dtype == torch.int32
    a = _args()
    a["table"], a["errors"] = None, None  # the contiguous cache, causal: v03's other path
    a["k"], a["v"] = torch.randn(3, 2, 100, 64, dtype=F16), torch.randn(3, 2, 100, 64, dtype=F16)
    out, errors = _call(cpu_binding, a)
    assert out.shape == a["q"].shape and errors is None


def test_no_query_rows_clear_the_flags(cpu_binding):  # noqa: F811
    a = _args(Hq=0)
    a["errors"] = torch.full((3,), 7, dtype=torch.int32)
    _call(cpu_binding, a)
    assert a["errors"].tolist() == [0, 0, 0]


# ------------------------------------------------------------------ the default call's entry (decode_paged_deferred)

def _deferred(binding, a):
    return binding.module.decode_paged_deferred(0, a["q"], a["k"], a["v"], a["lens"], a["table"], a["scale"],
                                                a["splits"], a["causal"])


@pytest.mark.parametrize("what", sorted(w for w in BAD if not w.startswith("errors")))
def test_bad_deferred_call_is_named_and_queues_nothing(cpu_binding, what):  # noqa: F811
    """lab.ops.decode's default paged call has decode_paged_call's checks and messages (its flags are a slot of
    the binding's queue, not an argument); a refused call leaves no slot queued."""
    change, pattern = BAD[what]
    a = _args()
    a.update(change(a))
    before = cpu_binding.module.page_flags_state()
    error, out, bad = _deferred(cpu_binding, a)
    assert re.search(pattern, error) and bad == []
    assert cpu_binding.module.page_flags_state()[0] == before[0]


def test_good_deferred_call_queues_one_slot(cpu_binding):  # noqa: F811
    module = cpu_binding.module
    module.page_flags_cpu_complete(-1)
    module.page_flags_check(True)
    error, out, bad = _deferred(cpu_binding, _args())
    assert error == "" and out.shape == _args()["q"].shape and bad == []
    assert module.page_flags_state()[0] == 1
    module.page_flags_cpu_complete(-1)
    assert module.page_flags_check(False) == ("", [], 0)
