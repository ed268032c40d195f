"""Decode head dims 64, 80, 96, 128, 192, 256 on CPU: the registry's tuples, which version a call gets at each head
dim (contiguous and paged), the ValueError for any other, and the kernels compiled for sm_80 and sm_90a with every
head dim instantiated and no spills where the launcher runs them on Hopper. Correctness on the GPU:
chapters n7 and n11 (lab.check against float64 and SDPA's error).
"""
from __future__ import annotations

import re
import shutil

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lab import build, ops, paths, registry
from lab.decode import op as decode_op

BF16 = torch.bfloat16
NEW_DIMS = (80, 96, 192, 256)


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield lambda *shape, dtype=BF16: torch.empty(*shape, dtype=dtype, device="cuda")


def test_registry_head_dims():
    assert registry.DECODE_HEAD_DIMS == (64, 80, 96, 128, 192, 256)
    assert registry.DECODE["v02"].head_dims == registry.DECODE["v03"].head_dims == registry.DECODE_HEAD_DIMS
    assert registry.DECODE["v01"].head_dims == registry.DECODE["v04"].head_dims == (64, 128)
    # one query row per KV head as every other row count: v07 at 64 / 128, v08 at 80 / 96, v02 (rows padded to 16)
    # at 192 / 256
    # (the defaults themselves: tests/fixtures/defaults.json) each head dim gets a kernel that takes it, whatever H_kv
    for d in registry.DECODE_HEAD_DIMS:
        for heads_kv in (32, 8):
            version = registry.default_decode_version(32, heads_kv, 1, d)
            assert d in registry.DECODE[version].head_dims and version == _chosen(d)
    assert registry.default_for_row({"case": {"Hq": 16, "Hkv": 16, "q_len": 1, "D": 96}}) == _chosen(96)
    assert registry.default_for_row({"case": {"Hq": 16, "Hkv": 16, "q_len": 1}}) == _chosen(128)  # rows before D was read


def _chosen(head_dim: int, **shape) -> str:
    return registry.choose("decode", {"head_dim": head_dim, **shape}).version


@pytest.mark.parametrize("D", NEW_DIMS)
def test_contiguous_decode_takes_the_head_dim(fake, D):
    for Hq, Hkv in ((32, 32), (32, 8)):  # one row per KV head (v01's case) and GQA
        q, k = fake(2, Hq, 1, D), fake(2, Hkv, 300, D)
        assert ops.decode(q, k, k, num_splits=2).shape == q.shape
        assert decode_op._decode_plan(q, k, None, 2) == (_chosen(D), 2)
    with pytest.raises(ValueError, match=rf"head dim {D} is not supported by v01 \(supported: \[64, 128\]\)"):
        ops.decode(fake(2, 8, 1, D), fake(2, 8, 300, D), fake(2, 8, 300, D), num_splits=1, version="v01")


@pytest.mark.parametrize("D", NEW_DIMS)
def test_paged_decode_takes_the_head_dim(fake, D):
    q, kc = fake(3, 32, 1, D), fake(40, 16, 8, D)
    table, errors = fake(3, 10, dtype=torch.int32), fake(3, dtype=torch.int32)
    assert ops.decode(q, kc, kc, None, None, 1, block_table=table, page_errors=errors).shape == q.shape
    # v04 (8-head tiles) has no such D; v08 (v07's ring) takes 80 / 96
    assert decode_op._v03_plan(q, 8, 160, None, 1, True)[0] == _chosen(D, heads_kv=8, paged=True)
    with pytest.raises(ValueError, match=rf"head dim {D} is not supported by v04"):
        ops.decode(q, kc, kc, None, None, 1, block_table=table, page_errors=errors, version="v04")
    q4 = fake(3, 32, 4, D)  # causal speculative tokens on a contiguous cache: the paged default as well
    assert ops.decode(q4, fake(3, 8, 200, D), fake(3, 8, 200, D), is_causal=True, num_splits=1).shape == q4.shape


@pytest.mark.parametrize("D", (32, 72, 112, 160, 320))
def test_other_head_dims_raise(fake, D):
    with pytest.raises(ValueError, match=rf"head dim {D} is not supported by any kernel \(supported: "
                                         r"\[64, 80, 96, 128, 192, 256\]\)"):
        ops.decode(fake(1, 8, 1, D), fake(1, 2, 64, D), fake(1, 2, 64, D), num_splits=1)
    with pytest.raises(ValueError, match=rf"head dim {D} is not supported"):
        ops.decode(fake(1, 8, 1, D), fake(4, 16, 2, D), fake(4, 16, 2, D), block_table=fake(1, 4, dtype=torch.int32),
                   page_errors=fake(1, dtype=torch.int32), num_splits=1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_decode_kernels_compile_at_every_head_dim():
    """Every head dim is instantiated for sm_80 and sm_90a (the launchers dispatch on it); on sm_90a, where the
    lab runs them, no decode pass-1 kernel spills (D 256 keeps Q in shared memory for that; on sm_80 v02's D 256
    spills 12-16 bytes, which no GPU here measures)."""
    sources = [paths.KERNELS / "decode" / f for f in ("v02_mma.cu", "v03_paged.cu", "v05_bulkrow.cu", "v06_warpring.cu")]
    rows = build.compile_check(sources=sources)
    for arch in ("sm_80", "sm_90a"):
        for source in ("v02_mma", "v03_paged", "v05_bulkrow", "v06_warpring"):  # v05's sm_80 kernels are empty (sm_90 copies)
            dims = {int(re.search(r"<[^,]+, (\d+)", r["kernel"]).group(1)) for r in rows
                    if r["arch"] == arch and source in r["source"] and "partial_kernel" in r["kernel"]}
            assert dims == set(registry.DECODE_HEAD_DIMS), (arch, source, dims)
            combine = {r["kernel"] for r in rows if r["arch"] == arch and source in r["source"] and "combine" in r["kernel"]}
            assert len(combine) == 2 * len(registry.DECODE_HEAD_DIMS)  # fp16 and bf16 at each D
    spills = [(r["kernel"][-60:], r["spill_stores"]) for r in rows if r["arch"] == "sm_90a" and r["spill_stores"]]
    assert spills == []
