"""masked v12 (the masked forward at D 192 / 256) on a GPU: a few cells of lab.masks.gpu_wide's grid against the
float64 reference, the wrong builds failing, the one-crossing path bit for bit the full path's at D 256, and the
padded head dims. Skipped without CUDA; off compute capability 9.0 the calls must raise NotImplementedError."""
from __future__ import annotations

import pytest
import torch

from lab import ops
from lab.masks import gpu, op as mop

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
BF16 = torch.bfloat16


def _hopper() -> bool:
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(autouse=True)
def records(tmp_path, monkeypatch):
    monkeypatch.setenv("LAB_SESSION_DIR", str(tmp_path))  # the checks' record rows stay out of the tree


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="masked v12 runs on compute capability 9.0")
@pytest.mark.parametrize("D", [256, 192])
@pytest.mark.parametrize("name,causal,window,cap,sink,sizes,lower_right", [
    ("gemma2", True, (4095, 0), 50.0, True, (1, 16, 8, 1000, 1000), False),
    ("sym", False, (100, 50), 0.0, False, (2, 4, 2, 65, 300), False),
    ("cross", True, (200, 0), 30.0, True, (1, 4, 2, 300, 1000), True),
    ("one", True, (1, 0), 0.0, False, (2, 4, 2, 1, 1), False),
])
def test_dense_cells(D, name, causal, window, cap, sink, sizes, lower_right):
    assert gpu.check_dense("v12", name, *sizes, D, BF16, causal, window, cap, sink, lower_right)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="masked v12 runs on compute capability 9.0")
@pytest.mark.parametrize("defines", [{"LAB_FWD_MASK_BUG_NO_WINDOW": 1}, {"LAB_FWD_MASK_WIDE_BUG_NO_EDGE": 1}])
def test_the_wrong_builds_fail(defines):
    # check_dense returns True when the outcome matches expect_fail: the wrong kernel's error is over the tolerance
    assert gpu.check_dense("v12", "wrong", 1, 4, 2, 1025, 1025, 256, BF16, True, (64, 0), 0.0, False,
                           defines=defines, expect_fail=True)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="masked v12 runs on compute capability 9.0")
def test_packed_cells():
    for D in (256, 192):
        assert gpu.check_varlen("v12", "packed", [0, 5, 1025, 63, 0, 300], [0, 5, 1025, 63, 7, 300], 16, 8, D, BF16,
                                True, (100, 0), 50.0, True)


def test_public_calls():
    q, k = torch.randn(1, 16, 257, 256, device="cuda", dtype=BF16), torch.randn(1, 8, 300, 256, device="cuda", dtype=BF16)
    sinks = torch.randn(16, device="cuda")
    args = dict(is_causal=True, enable_gqa=True, window_size=(64, 0), softcap=50.0, sinks=sinks, return_lse=True,
                causal_variant="lower_right")
    if not _hopper():
        with pytest.raises(NotImplementedError, match=r"head dim 256 runs on compute capability 9.0 only"):
            ops.attention(q, k, k, **args)
        return
    out, lse = ops.attention(q, k, k, **args)  # the one-crossing path
    full_out, full_lse = ops.attention(q, k, k, version="v12", **args)
    assert torch.equal(out, full_out) and torch.equal(lse, full_lse)
    assert gpu_wide_public() == 0


def gpu_wide_public() -> int:
    from lab.masks import gpu_wide
    return gpu_wide.public_wide()


def test_gradients_above_128_wait_for_a_masked_backward():
    from lab.registry import MASKED_BWD
    if not _hopper() or any(256 in row.head_dims for row in MASKED_BWD.values()):
        pytest.skip("a masked backward takes D 256 here (or no masked kernel runs at all)")
    q = torch.randn(1, 4, 65, 256, device="cuda", dtype=BF16, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"backward pass of window_size / softcap / sinks at head dim 256"):
        ops.attention(q, q, q, is_causal=True, softcap=50.0)
    with torch.no_grad():
        assert mop.attention_masked(q, q, q, True, None, False, None, False, "upper_left", None, 50.0, None).shape \
            == q.shape
