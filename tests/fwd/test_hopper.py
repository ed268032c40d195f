"""CPU tests for the Hopper forward kernels' Python side: default selection per device and the generated wgmma header."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from lab import op_common, ops, paths, registry
from lab.fwd import head_dims


def _query(head_dim: int, seqlen_q: int = 8192):
    return SimpleNamespace(shape=(1, 1, seqlen_q, head_dim), device=SimpleNamespace(type="cuda", index=0))


@pytest.mark.parametrize("capability,expected", [((9, 0), "hopper"), ((8, 0), "v04"), ((8, 9), "v04"), ((10, 0), "v04")])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_default_version_per_capability(monkeypatch, capability, expected, head_dim):
    monkeypatch.setattr(head_dims, "_capability", lambda device: capability)  # where the choice reads it
    chosen = ops.attention_version(_query(head_dim))
    if expected == "hopper":
        expected = "v07"
    assert chosen == expected
    assert ops.attention_version(_query(head_dim), "v04") == "v04"  # an explicit version always wins


@pytest.mark.parametrize("head_dim,seqlen_q,causal,expected", [
    (64, 1, False, "v05"), (64, 512, False, "v05"), (64, 513, False, "v07"), (64, 2048, True, "v05"), (64, 4096, True, "v05"), (64, 4097, True, "v07"),
    (128, 1, False, "v07"), (128, 16384, False, "v07"), (128, 1, True, "v07"), (128, 512, True, "v07")])
def test_hopper_choice_by_shape(monkeypatch, head_dim, seqlen_q, causal, expected):
    monkeypatch.setattr(head_dims, "_capability", lambda device: (9, 0))
    assert ops.attention_version(_query(head_dim, seqlen_q), is_causal=causal) == expected


def test_hopper_versions_are_registered_for_sm90_only():
    hopper = [name for name, k in ops.FWD.items() if k.capabilities]
    assert {"v05", "v06", "v07"} <= set(hopper)
    for name in hopper:
        assert ops.FWD[name].capabilities == ((9, 0),)
        assert (paths.KERNELS / ops.FWD[name].source).exists()
    assert set(registry.BEST_FWD_HOPPER) <= set(hopper)


def test_capability_is_cached(monkeypatch):
    calls = []
    monkeypatch.setattr(op_common, "_devices", {})
    monkeypatch.setattr(op_common.torch.cuda, "is_available", lambda: True)
    props = SimpleNamespace(major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(op_common.torch.cuda, "get_device_properties", lambda index: calls.append(index) or props)
    device = SimpleNamespace(type="cuda", index=3)
    assert op_common._capability(device) == (9, 0) and op_common._capability(device) == (9, 0)
    assert ops.sm_count(device) == 132
    assert calls == [3]  # one read serves the capability and the SM count


def test_generated_wgmma_header_is_current(tmp_path):
    out = tmp_path / "wgmma_ops.cuh"
    subprocess.run([sys.executable, str(paths.ROOT / "tools/codegen/hopper_gen_wgmma.py"), str(out)], check=True)
    assert out.read_text() == (paths.KERNELS / "common/hopper/wgmma_ops.cuh").read_text()
    fp8 = tmp_path / "wgmma_fp8_ops.cuh"
    subprocess.run([sys.executable, str(paths.ROOT / "tools/codegen/hopper_gen_wgmma.py"), "--fp8", str(fp8)],
                   check=True)
    assert fp8.read_text() == (paths.KERNELS / "common/hopper/wgmma_fp8_ops.cuh").read_text()
