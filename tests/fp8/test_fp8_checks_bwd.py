"""lab.fp8.checks_bwd on the CPU with the kernels replaced: a kernel cell runs backward="fp8", records which
backward ran, holds it to kernel_model and reports the dequantise-then-bf16 path beside it; the wrong kernel build
fails the rule; the bf16 cells keep their own model. The checks on the GPU: tests/fp8/test_fp8_kernel_bwd_gpu.py."""
from __future__ import annotations

import json
import math

import pytest
import torch

from lab.fp8 import checks_bwd, emulate, emulate_bwd, kernel_bwd
from tests.fp8 import fakes


def _lse(q, k, causal, scale):
    s = (q.double() @ emulate._expand(k, q.shape[1]).double().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, dim=-1).float()


@pytest.fixture
def fake_kernels(monkeypatch):
    """The FP8 forward by float64 math, the FP8 backward kernel by its emulation (kernel_model; the wrong build's
    too), the bf16 backward by float64 autograd, the device check by a no-op; `ran` lists the backwards run."""
    ran = []

    def run(q8, k8, v8, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa, return_lse):
        q, k, v = (x.float() * d[..., None, None] for x, d in ((q8, q_descale), (k8, k_descale), (v8, v_descale)))
        scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        return emulate.reference(q, k, v, is_causal, scale).to(torch.bfloat16), _lse(q, k, is_causal, scale)

    def kernel(grad_out, q8, k8, v8, q_descale, k_descale, v_descale, out, lse, is_causal, scale, defines):
        ran.append("fp8-wrong" if defines == kernel_bwd.WRONG_BUILD else "fp8")
        grads = emulate_bwd.kernel_model(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, grad_out, is_causal,
                                         scale, wrong=defines == kernel_bwd.WRONG_BUILD)
        return tuple(g.to(torch.bfloat16) for g in grads)

    fakes.install(monkeypatch, run, kernel, lambda version: ran.append("bf16"))
    return ran


def test_a_kernel_cell_records_the_kernel_beside_the_bf16_path(fake_kernels, session_dir):
    cell = next(c for c in checks_bwd.KERNEL_CELLS if c[0] == "fp8-s65-c")
    row = checks_bwd.kernel_check(cell, device="cpu", lab_bf16=False)
    assert fake_kernels == ["fp8", "bf16"] and row["backward"] == "fp8" and row["backward_arg"] == "fp8"
    assert row["pass"] and row["model_kind"] == "emulate_bwd.kernel_model" and "bwd v22" in row["path"]
    assert set(row["dequantise_bf16"]) == {"dq", "dk", "dv"}
    assert row["error"]["dq"]["rel_l2"] > 5 * row["dequantise_bf16"]["dq"]["rel_l2"]  # e4m3 dS against bf16's
    saved = [json.loads(line) for line in (session_dir / "records.jsonl").read_text().splitlines()]
    assert saved[-1]["kind"] == "fp8-bwd-check" and saved[-1]["backward"] == "fp8"
    assert "[fp8]" in checks_bwd.line(row) and "dequantise_bf16" in checks_bwd.line(row)


def test_the_wrong_kernel_build_fails(fake_kernels, session_dir):
    row = checks_bwd.wrong_build(backward="fp8", device="cpu", lab_bf16=False)
    assert fake_kernels[0] == "fp8-wrong" and row["backward"] == "fp8" and not row["pass"]
    assert row["error"]["dk"]["rel_l2"] > 10 and row["error"]["dq"]["rel_l2"] < 0.1  # dK alone is wrong


def test_the_bf16_cells_keep_their_path_and_model(fake_kernels, session_dir):
    row = checks_bwd.check(*checks_bwd.CELLS[1], device="cpu", lab_bf16=False)
    assert fake_kernels == ["bf16"] and row["backward"] == "bf16" and "dequantise_bf16" not in row
    assert row["model_kind"].startswith("emulate_bwd.backward") and row["pass"]


@pytest.mark.parametrize("head_dim", [128, 64])
def test_kernel_cells_cover_the_brief_at_each_head_dim(head_dim):
    """Each head dim the kernel runs gets the uneven lengths both ways, causal and not, GQA 4, per-head descales and
    a V / dO of mean 1 at S 4097."""
    cells = [c for c in checks_bwd.KERNEL_CELLS if c[6] == head_dim]
    assert {c[6] for c in checks_bwd.KERNEL_CELLS} == {64, 128}
    seqs = {(c[4], c[5]) for c in cells}
    assert {(1, 1), (65, 65), (300, 300), (4097, 4097), (65, 1000), (1000, 65)} <= seqs
    assert {c[7] for c in cells} == {False, True} and any(c[2] == 4 * c[3] for c in cells)
    assert any(c[8] == "head" for c in cells) and any(c[9].get("mean") == 1.0 and c[4] == 4097 for c in cells)
    if head_dim == 128:
        assert (1000, 1000) in seqs and any(c[9].get("dtype") == torch.float16 for c in cells)


def test_kernel_rows_run_the_cells_then_the_wrong_build(fake_kernels, session_dir, monkeypatch):
    """The chapter's checks: each kernel cell, then the wrong build; a check that raises is a recorded row, a kernel
    cell's failing and the wrong build's without a verdict."""
    small = next(c for c in checks_bwd.KERNEL_CELLS if c[0] == "fp8-s65-c")
    monkeypatch.setattr(checks_bwd, "KERNEL_CELLS", (small, ("fp8-raises",) + small[1:]))
    real = checks_bwd.check

    def check(name, *args, **kw):
        if name == "fp8-raises":
            raise RuntimeError("boom")
        return real(name, *args, **kw)

    monkeypatch.setattr(checks_bwd, "check", check)
    rows = checks_bwd.kernel_rows(device="cpu", lab_bf16=False)
    assert [r["check"] for r in rows] == ["fp8-s65-c", "fp8-raises", checks_bwd.WRONG_FP8]
    assert rows[0]["pass"] and rows[1]["pass"] is False and "RuntimeError: boom" in rows[1]["error_raised"]
    assert rows[2]["pass"] is False and rows[2]["bug"] == "fp8_bwd_wrong"
    saved = [json.loads(line) for line in (session_dir / "records.jsonl").read_text().splitlines()]
    assert [r["check"] for r in saved if r["kind"] == "fp8-bwd-check"] == [r["check"] for r in rows]
    monkeypatch.setattr(checks_bwd, "wrong_build", lambda **options: 1 / 0)
    wrong = checks_bwd.kernel_rows(device="cpu", lab_bf16=False)[-1]
    assert wrong["pass"] is None and wrong["error_raised"].startswith("ZeroDivisionError")
