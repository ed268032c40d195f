"""The FP8 backward kernel (bwd v22) on a GPU of compute capability 9.0: a few of lab.fp8.checks_bwd's kernel cells
pass against kernel_model, the deliberately wrong build (LAB_BWD_FP8_WRONG) fails, backward="auto" runs the kernel
at D 128, and the launcher's own refusals come back as clear errors."""
from __future__ import annotations

import pytest
import torch

from lab.fp8 import backward, checks_bwd, kernel_bwd

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def hopper(session_dir):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("bwd v22 is sm_90a (compute capability 9.0)")


def test_kernel_cells_pass_and_the_wrong_build_fails():
    names = ("fp8-s1", "fp8-s65-c", "fp8-s300-gqa4-c-head", "fp8-sq1000-sk65-c", "fp8-sq65-sk1000", "fp8-d64-s65",
             "fp8-d64-s300-gqa4-c-head", "fp8-d64-sq1000-sk65-c")
    rows = [checks_bwd.kernel_check(cell) for cell in checks_bwd.KERNEL_CELLS if cell[0] in names]
    assert len(rows) == len(names) and all(r["backward"] == "fp8" for r in rows)
    assert all(r["pass"] for r in rows), [checks_bwd.line(r) for r in rows]
    wrong = checks_bwd.wrong_build(backward="fp8")
    assert wrong["backward"] == "fp8" and not wrong["pass"], checks_bwd.line(wrong)


@pytest.mark.parametrize("takes_kernel, expected", [(False, []), (True, [128, 64])])
def test_auto_runs_the_kernel_only_where_it_is_chosen(monkeypatch, takes_kernel, expected):
    """AUTO_TAKES_KERNEL off (today's default): "auto" runs dequantise-then-bf16 everywhere; on: the kernel at D 128
    and 64."""
    calls = []
    real = kernel_bwd.backward
    monkeypatch.setattr(kernel_bwd, "backward", lambda *a, **kw: calls.append(a[1].shape[-1]) or real(*a, **kw))
    monkeypatch.setattr(backward, "AUTO_TAKES_KERNEL", takes_kernel)
    for D in (128, 64):
        leaves = [torch.randn(1, 2, 70, D, device="cuda", requires_grad=True) for _ in range(3)]
        grads = torch.autograd.grad(backward.attention_fp8_train(*leaves, is_causal=True), leaves,
                                    torch.randn(1, 2, 70, D, device="cuda", dtype=torch.bfloat16))
        assert all(g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads)
    assert calls == expected


def test_the_launcher_refuses_what_it_does_not_run():
    e4m3 = lambda *shape: torch.randn(*shape, device="cuda").to(torch.float8_e4m3fn)  # noqa: E731
    ones = torch.ones(1, 2, device="cuda")
    bf16 = torch.randn(1, 2, 64, 96, device="cuda", dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 64, device="cuda")
    with pytest.raises(ValueError, match="head dim not supported"):  # D 96: LAB_E_HEAD_DIM from the launcher
        kernel_bwd.backward(bf16, e4m3(1, 2, 64, 96), e4m3(1, 2, 64, 96), e4m3(1, 2, 64, 96), ones, ones, ones,
                            bf16, lse, False, 0.125)
