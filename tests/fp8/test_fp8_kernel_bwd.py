"""The FP8 backward kernel's call on the CPU: the ctypes mirrors of AttnBwdParams and AttnBwdFp8Params against the
C compiler's layout, the workspaces, the launcher's error codes, attention_fp8_train's backward= choice (its
argument errors before the device check, which path runs where) and the autograd plumbing of the kernel path with
the kernel replaced by float64 math. The kernel itself on the GPU: tests/fp8/test_fp8_kernel_bwd_gpu.py."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from lab import paths, registry
from lab.check import reference_grads
from lab.fp8 import backward, emulate, emulate_bwd, kernel_bwd, quant
from tests.fp8 import fakes

COMPILER = shutil.which("g++") or shutil.which("c++") or shutil.which("nvcc")


def _layout_program(structs) -> str:
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "common/hopper/attn_bwd_fp8_params.h"',
             "int main() {"]
    for c_name, mirror in structs:
        lines.append(f'  printf("{c_name} sizeof %zu\\n", sizeof({c_name}));')
        for field, _ in mirror._fields_:
            lines.append(f'  printf("{c_name} {field} %zu\\n", offsetof({c_name}, {field}));')
    return "\n".join(lines + ["  return 0;", "}"]) + "\n"


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler (g++, c++ or nvcc) on PATH to read the C layout")
def test_ctypes_mirrors_match_the_c_headers(tmp_path):
    structs = (("AttnBwdParams", kernel_bwd.BwdParams), ("AttnBwdFp8Params", kernel_bwd.Fp8BwdParams))
    source = tmp_path / "layout.cpp"
    source.write_text(_layout_program(structs))
    binary = tmp_path / "layout"
    subprocess.run([COMPILER, "-I", str(paths.KERNELS), "-o", str(binary), str(source)], check=True,
                   capture_output=True, text=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout.split("\n")
    got = {tuple(line.split()[:2]): int(line.split()[2]) for line in printed if line}
    for c_name, mirror in structs:
        assert got[(c_name, "sizeof")] == ctypes.sizeof(mirror), c_name
        for field, _ in mirror._fields_:
            assert got[(c_name, field)] == getattr(mirror, field).offset, (c_name, field)
    # every C field is mirrored: the ctypes fields fill the struct up to its size, in the header's order
    assert [f for f, _ in kernel_bwd.Fp8BwdParams._fields_][-2:] == ["q_cols", "k_cols"]


def test_workspaces_pad_rows_and_columns():
    w = kernel_bwd.workspaces(2, 4, 2, 65, 300, 128, "cpu")
    assert w["qt"].shape == (2, 4, 128, 128) and w["kt"].shape == (2, 2, 128, 384) and w["dot"].shape == w["qt"].shape
    assert w["qt"].dtype == torch.float8_e4m3fn and (w["q_cols"], w["k_cols"]) == (128, 384)
    rows = 2 * 4 * 128
    assert w["delta"].numel() == w["lse_log2"].numel() == rows and w["dq_accum"].numel() == rows * 128
    assert w["lse_log2"].data_ptr() - w["delta"].data_ptr() == 4 * rows  # one buffer, 16-byte aligned parts
    assert all(w[k].data_ptr() % 16 == 0 for k in ("delta", "lse_log2", "dq_accum"))


def test_launcher_codes_become_clear_errors():
    kernel_bwd.check_rc(0)
    for rc, words in ((-1, "head dim"), (-3, "shape or layout"), (-4, "workspace"), (-5, "deterministic")):
        with pytest.raises(ValueError, match=words):
            kernel_bwd.check_rc(rc)
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        kernel_bwd.check_rc(700)


def test_the_kernel_row_and_the_rule_agree():
    for head_dim in (64, 128):
        assert kernel_bwd.unavailable(head_dim, (9, 0), False) is None
        assert registry.choose("bwd_fp8", {"head_dim": head_dim}).version == kernel_bwd.VERSION
    for head_dim, capability, deterministic, words in ((256, (9, 0), False, "head dim (64, 128) only"),
                                                       (128, (8, 0), False, "9.0 only, this GPU is 8.0"),
                                                       (128, (9, 0), True, "no deterministic mode")):
        assert words in kernel_bwd.unavailable(head_dim, capability, deterministic)
        with pytest.raises((ValueError, NotImplementedError)):
            registry.choose("bwd_fp8", {"head_dim": head_dim}, capability, deterministic)


@pytest.mark.parametrize("takes_kernel", [False, True])
@pytest.mark.parametrize("choice, head_dim, deterministic, path", [
    ("auto", 128, False, "fp8"), ("auto", 64, False, "fp8"), ("auto", 128, True, "bf16"), ("auto", 256, False, "bf16"),
    ("bf16", 128, False, "bf16"), ("fp8", 128, False, "fp8"), ("bf16", 64, True, "bf16")])
def test_backward_path(monkeypatch, takes_kernel, choice, head_dim, deterministic, path):
    monkeypatch.setattr(backward, "AUTO_TAKES_KERNEL", takes_kernel)
    if choice == "auto" and not takes_kernel:
        path = "bf16"  # "auto" stays on dequantise-then-bf16 until the kernel is measured faster
    assert backward.backward_path(head_dim, choice, (9, 0), deterministic) == path


@pytest.mark.parametrize("head_dim, deterministic, words", [(256, False, "head dim (64, 128) only"),
                                                           (128, True, "no deterministic mode")])
def test_fp8_where_the_kernel_cannot_run_is_an_error_never_a_fallback(head_dim, deterministic, words):
    with pytest.raises(NotImplementedError, match=r"backward='fp8'.*" + words.replace("(", r"\(").replace(")", r"\)")):
        backward.backward_path(head_dim, "fp8", (9, 0), deterministic)


Q = torch.randn(1, 4, 33, 128, requires_grad=True)


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((Q, Q, Q), {"backward": "FP8"}, ValueError, "backward must be one of"),
    ((Q, Q, Q), {"backward": None}, ValueError, "backward must be one of"),
    ((Q[..., :64], Q[..., :64], Q[..., :64]), {"backward": "fp8"}, ValueError, "CUDA device"),
    ((Q.repeat(1, 1, 1, 2),) * 3, {"backward": "fp8"}, NotImplementedError, "backward runs D in (64, 128)"),
    ((Q, Q, Q), {"_bug": "fp8_bwd_wrong", "backward": "bf16"}, ValueError, "_bug"),
    ((Q, Q, Q), {"backward": "fp8"}, ValueError, "CUDA device"),  # every other check passed: the device last
    ((Q[..., :64], Q[..., :64], Q[..., :64]), {"backward": "auto"}, ValueError, "CUDA device"),
])
def test_backward_argument_errors_come_before_the_device_check(args, kwargs, error, words):
    with pytest.raises(error) as info:
        backward.attention_fp8_train(*args, **kwargs)
    assert words in str(info.value)


def test_fp8_for_the_forward_alone_asks_nothing_of_the_kernel():
    x = torch.randn(1, 2, 9, 64)  # no gradient wanted: backward='fp8' at D 64 is no error
    with pytest.raises(ValueError, match="CUDA device"):
        backward.attention_fp8_train(x, x, x, backward="fp8")


def _fake_kernels(monkeypatch, ran: list):
    """op.run, the FP8 kernel and the bf16 backward by float64 math (the wrong build's dK scaled by a power of two),
    the device checks by no-ops. `ran` collects which backward ran."""
    def run(q8, k8, v8, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa, return_lse):
        q, k, v = (x.float() * d[..., None, None] for x, d in ((q8, q_descale), (k8, k_descale), (v8, v_descale)))
        out = emulate.reference(q, k, v, is_causal, scale)
        return out.to(torch.bfloat16), torch.zeros(q.shape[:3])

    def kernel(grad_out, q8, k8, v8, q_descale, k_descale, v_descale, out, lse, is_causal, scale, defines):
        ran.append(("fp8", defines))
        assert grad_out.dtype == torch.bfloat16 and q8.dtype == torch.float8_e4m3fn
        assert q_descale.shape == q8.shape[:2] and k_descale.shape == v_descale.shape == k8.shape[:2]
        q, k, v = (x.double() * d.double()[..., None, None] for x, d in ((q8, q_descale), (k8, k_descale),
                                                                          (v8, v_descale)))
        _, dq, dk, dv = reference_grads(q, k, v, grad_out, is_causal, scale)
        if defines == kernel_bwd.WRONG_BUILD:  # dK off by a power of two, as without its row multiplier
            dk = dk * 64
        return dq.to(torch.bfloat16), dk.to(torch.bfloat16), dv.to(torch.bfloat16)

    fakes.install(monkeypatch, run, kernel, lambda version: ran.append(("bf16", version)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("choice, bug, path, ok", [
    ("auto", None, "bf16", True), ("fp8", None, "fp8", True), ("bf16", None, "bf16", True),
    ("fp8", "fp8_bwd_wrong", "fp8", False), ("fp8", "no_k_descale", "fp8", False)])
def test_kernel_path_plumbing(monkeypatch, dtype, choice, bug, path, ok):
    ran = []
    _fake_kernels(monkeypatch, ran)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, 70, 128, generator=gen).to(dtype).requires_grad_() for H in (4, 2, 2))
    d_o = torch.randn(1, 4, 70, 128, generator=gen)
    out = backward.attention_fp8_train(q, k, v, is_causal=True, enable_gqa=True, backward=choice, _bug=bug)
    grads = torch.autograd.grad(out, (q, k, v), d_o.to(out.dtype))
    assert [r[0] for r in ran] == [path] and (ran[0][1] == kernel_bwd.WRONG_BUILD) == (bug == "fp8_bwd_wrong")
    assert [g.dtype for g in grads] == [dtype] * 3 and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    deq = [quant.quantize(x.detach(), "e4m3").dequantize(torch.float64) for x in (q, k, v)]
    _, *ref = reference_grads(*deq, d_o.to(torch.bfloat16), True)
    errors = emulate_bwd.errors([g.float() for g in grads], ref)
    assert all(e["rel_l2"] < 0.1 for e in errors.values()) == ok, errors  # the wrong builds fail the comparison


def test_deterministic_mode_runs_the_bf16_path_under_auto(monkeypatch):
    ran = []
    _fake_kernels(monkeypatch, ran)
    leaves = [torch.randn(1, 2, 40, 128).requires_grad_() for _ in range(3)]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.autograd.grad(backward.attention_fp8_train(*leaves), leaves, torch.randn(1, 2, 40, 128))
        with pytest.raises(NotImplementedError, match="no deterministic mode"):
            backward.attention_fp8_train(*leaves, backward="fp8")
    finally:
        torch.use_deterministic_algorithms(previous)
    assert [r[0] for r in ran] == ["bf16"]


def test_race_rows_carry_the_kernel_against_our_bf16_backward():
    from lab import bench
    from lab.fp8 import race_bwd
    timed = {"lab-fp8-kernel": bench.Timing(2.0, 1.9, 2.1, 20), "lab-fp8-train": bench.Timing(4.0, 3.9, 4.1, 20),
             "lab-bf16": bench.Timing(3.0, 2.9, 3.1, 20), "cudnn-fp8": "unsupported: no frontend",
             "quantise dO": bench.Timing(0.1, 0.1, 0.1, 20), "lab-fp8-kernel fwd+bwd": bench.Timing(3.0, 3, 3, 20),
             "lab-bf16 fwd+bwd": bench.Timing(4.5, 4.5, 4.5, 20)}
    rows = {r["impl"]: r for r in race_bwd.rows_of(timed, "d128-s4096", 2, 16, 4096, 128, False)}
    kernel = rows["lab-fp8-kernel"]
    assert kernel["speed_vs_lab-bf16"] == pytest.approx(1.5) and kernel["speed_vs_lab-fp8-train"] == pytest.approx(2.0)
    assert "bwd v22" in kernel["path"] and "speed_vs_cudnn-fp8" not in kernel and kernel["tflops"] > 0
    assert rows["lab-fp8-kernel fwd+bwd"]["speed_vs_lab-bf16 fwd+bwd"] == pytest.approx(1.5)
    train = rows["lab-fp8-train"]
    assert train["speed_vs_lab-bf16"] == pytest.approx(0.75) and "dequantise" in train["path"]
    assert rows["quantise dO"]["share_of_lab-fp8-kernel"] == pytest.approx(0.05)
    assert rows["cudnn-fp8"]["unsupported"] == "unsupported: no frontend"


@pytest.mark.parametrize("Sq, Sk", [(0, 5), (5, 0), (0, 0)])
def test_empty_sequences_give_zero_gradients_without_a_launch(monkeypatch, Sq, Sk):
    monkeypatch.setattr(kernel_bwd, "_function", lambda defines=None: pytest.fail("launched with nothing to do"))
    e4m3 = lambda *shape: torch.zeros(*shape).to(torch.float8_e4m3fn)  # noqa: E731
    q8, k8, v8 = e4m3(1, 4, Sq, 128), e4m3(1, 2, Sk, 128), e4m3(1, 2, Sk, 128)
    ones = torch.ones(1, 2)
    dq, dk, dv = kernel_bwd.backward(torch.randn(1, 4, Sq, 128), q8, k8, v8, torch.ones(1, 4), ones, ones,
                                     torch.zeros(1, 4, Sq, 128), torch.zeros(1, 4, Sq), True, 0.1)
    assert dq.shape == (1, 4, Sq, 128) and dk.shape == dv.shape == (1, 2, Sk, 128)
    assert all(g.dtype == torch.bfloat16 and not g.any() for g in (dq, dk, dv))
