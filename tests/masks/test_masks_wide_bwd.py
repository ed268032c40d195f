"""The masked backward's choice of kernel by head dim (lab.masks.backward.masked_bwd_version, lab.registry.choose):
bwd v21 at D 192 / 256 on compute capability 9.0, v08 at 64 / 128; NotImplementedError off Hopper, at a head dim no
kernel takes and in deterministic mode (no masked backward has a fixed dQ order); a named version that does not take
the head dim is a ValueError. No GPU needed (the capability is stood in for)."""
from __future__ import annotations

import pytest
import torch

from lab import registry
from lab.masks import backward


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(backward, "_capability", lambda device: (9, 0))


def test_choose_takes_v21_at_the_wide_head_dims():
    for d in (192, 256):
        assert registry.choose("bwd_masked", {"head_dim": d}, (9, 0)).version == "v21"
        with pytest.raises(NotImplementedError):
            registry.choose("bwd_masked", {"head_dim": d}, (8, 0))
    assert registry.choose("bwd_masked", {"head_dim": 128}, (9, 0)).version == "v08"


def test_version_by_head_dim(hopper):
    cpu = torch.device("cpu")
    assert backward.masked_bwd_version(cpu, head_dim=256) == "v21"
    assert backward.masked_bwd_version(cpu, head_dim=192) == "v21"
    assert backward.masked_bwd_version(cpu, head_dim=64) == "v08"
    assert backward.masked_bwd_version(cpu) == "v08"  # no head dim: the first that runs here
    with pytest.raises(NotImplementedError, match="head dim 200"):
        backward.masked_bwd_version(cpu, head_dim=200)
    with pytest.raises(ValueError, match="v08"):
        backward.masked_bwd_version(cpu, "v08", head_dim=256)
    with pytest.raises(ValueError, match="versions"):
        backward.masked_bwd_version(cpu, "v99")


def test_kernel_width_pads_up():
    assert [backward.kernel_width(d) for d in (8, 64, 100, 129, 192, 200, 256)] == [64, 64, 128, 192, 192, 256, 256]
    with pytest.raises(ValueError):
        backward.kernel_width(257)


def test_off_hopper_raises(monkeypatch):
    monkeypatch.setattr(backward, "_capability", lambda device: (8, 0))
    with pytest.raises(NotImplementedError, match="Hopper"):
        backward.masked_bwd_version(torch.device("cpu"), head_dim=256)


def test_deterministic_mode_raises(hopper):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for d in (128, 256):
            with pytest.raises(NotImplementedError, match="no deterministic mode"):
                backward.masked_bwd_version(torch.device("cpu"), head_dim=d)
    finally:
        torch.use_deterministic_algorithms(previous)


def test_transformers_adapter_falls_back_for_masked_training_in_deterministic_mode(monkeypatch):
    """The adapter names the reason and runs the eager formula instead of letting the masked backward raise."""
    from lab.integrations import transformers_masks

    monkeypatch.setattr(transformers_masks, "_capability", lambda device: (9, 0))
    q = torch.zeros(1, 4, 16, 256, requires_grad=True)
    assert transformers_masks.reason(q, q, q, None, 50.0, None, None, True) is None  # D 256 trains on v21
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert "deterministic" in transformers_masks.reason(q, q, q, None, 50.0, None, None, True)
        with torch.no_grad():
            assert transformers_masks.reason(q, q, q, None, 50.0, None, None, True) is None
    finally:
        torch.use_deterministic_algorithms(previous)
