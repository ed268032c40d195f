"""Training through the FP8 forward on the CPU: the backward emulation against float64 (and the ordering of the
operand formats the design note argues from), attention_fp8_train's argument errors (before the device check,
off Hopper), the forward-only op's refusal, and the autograd plumbing with the kernels replaced by float64 math.
The GPU checks themselves: lab.fp8.checks_bwd (GPU-only test at the end)."""
from __future__ import annotations

import math

import pytest
import torch

import lab.ops as ops
from lab.backward import op as bwd_op
from lab.check import reference_grads
from lab.fp8 import backward, emulate, emulate_bwd, op, quant


def draw(B=1, Hq=4, Hkv=2, S=96, D=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (quant.quantize(torch.randn(B, H, S, D, generator=gen), "e4m3").dequantize()
               for H in (Hq, Hkv, Hkv))
    return q, k, v, torch.randn(B, Hq, S, D, generator=gen)


def _lse(q, k, causal):
    s = (q.double() @ emulate._expand(k, q.shape[1]).double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_emulation_matches_float64(causal):
    q, k, v, d_o = draw()
    out, *ref = reference_grads(q, k, v, d_o, causal)
    got = emulate_bwd.backward(q, k, v, out, _lse(q, k, causal), d_o, causal)
    for name, e in emulate_bwd.errors(got, ref).items():
        assert e["rel_l2"] < 1e-5 and e["nan"] == 0, (name, e)


def test_reference_sums_gqa_groups():
    q, k, v, d_o = draw(Hq=4, Hkv=2)
    _, _, dk, dv = reference_grads(q, k, v, d_o)
    _, _, dk_full, dv_full = reference_grads(q, emulate._expand(k, 4), emulate._expand(v, 4), d_o)
    assert torch.allclose(dk, dk_full.view(1, 2, 2, *dk.shape[2:]).sum(2))
    assert torch.allclose(dv, dv_full.view(1, 2, 2, *dv.shape[2:]).sum(2))


def test_format_budget_orders_as_the_design_note_says():
    q, k, v, d_o = draw(Hq=2, Hkv=2, S=128, D=128)
    rows = {r["variant"]: r["error"] for r in emulate_bwd.budget(q, k, v, d_o, True)}
    rel = {name: max(e[g]["rel_l2"] for g in ("dq", "dk", "dv")) for name, e in rows.items()}
    assert rel["float32"] < 1e-5
    assert rel["bf16 (a 16-bit backward)"] < 1e-2
    assert rel["e4m3 dO, P, dS"] > 5 * rel["bf16 (a 16-bit backward)"]  # FP8 operands cost ~10x bf16's error
    assert rel["e5m2 dO, dS; e4m3 P"] > 1.3 * rel["e4m3 dO, P, dS"]  # e5m2's lost mantissa bit, amax-scaled
    dq_only_p = rows["e4m3 P, bf16 dO / dS"]["dq"]["rel_l2"]  # P enters dV alone
    assert dq_only_p == pytest.approx(rows["bf16 (a 16-bit backward)"]["dq"]["rel_l2"])


def test_the_rule_rejects_a_dropped_descale():
    q, k, v, d_o = draw()
    out, *ref = reference_grads(q, k, v, d_o, True)
    lse = _lse(q, k, True)
    kw = dict(do_format="bf16", p_format="bf16", ds_format="bf16")
    model = emulate_bwd.errors(emulate_bwd.backward(q, k, v, out, lse, d_o, True, **kw), ref)
    wrong = emulate_bwd.errors(emulate_bwd.backward(q, k, v, out, lse, d_o, True, descale_k=False, **kw), ref)
    assert not emulate.passes(wrong["dq"], model["dq"])
    assert emulate.passes(model["dq"], model["dq"])


Q = torch.randn(1, 4, 33, 128, requires_grad=True)
K = torch.randn(1, 2, 33, 128)


@pytest.mark.parametrize("args, kwargs, error, words", [
    ((Q.to(torch.float8_e4m3fn), K, K), {}, TypeError, "attention_fp8, forward only"),
    ((Q[0], K, K), {}, ValueError, "4-D"),
    ((Q, K, K[:, :, :7]), {"enable_gqa": True}, ValueError, "one shape"),
    ((Q[..., :96], K[..., :96], K[..., :96]), {"enable_gqa": True}, ValueError, "(64, 128, 256)"),
    ((Q, K, K), {}, ValueError, "enable_gqa=True"),
    ((Q, K, K), {"enable_gqa": True, "is_causal": 1}, TypeError, "is_causal"),
    ((Q, K, K), {"enable_gqa": True, "granularity": "row"}, ValueError, "granularity"),
    ((torch.randn(1, 4, 9, 256, requires_grad=True), torch.randn(1, 2, 9, 256), torch.randn(1, 2, 9, 256)),
     {"enable_gqa": True}, NotImplementedError, "(64, 128)"),
    ((Q, K, K), {"enable_gqa": True}, ValueError, "CUDA device"),  # every other check passed: the device last
])
def test_argument_errors_come_before_the_device_check(args, kwargs, error, words):
    with pytest.raises(error) as info:
        backward.attention_fp8_train(*args, **kwargs)
    assert words in str(info.value)


def test_d256_forward_alone_passes_the_checks():
    x = torch.randn(1, 2, 9, 256)
    with pytest.raises(ValueError, match="CUDA device"):  # not the head-dim refusal: no gradient is wanted
        backward.attention_fp8_train(x, x, x)


def test_off_hopper_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match="CUDA device"):
        backward._capability_check("cpu")
    with pytest.raises(NotImplementedError, match="compute capability 9.0 only, this GPU is 8.0"):
        backward._capability_check("cuda")


def test_the_forward_only_op_refuses_gradients():
    x = torch.randn(1, 2, 9, 64).to(torch.float8_e4m3fn).requires_grad_()
    with pytest.raises(RuntimeError, match="attention_fp8_train"):
        ops.attention_fp8(x, x, x)


def _fake_kernels(monkeypatch):
    """op.run and the bf16 backward replaced by float64 math on the CPU; the device checks by no-ops."""
    def run(q8, k8, v8, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa, return_lse):
        q, k, v = (x.float() * d[..., None, None] for x, d in ((q8, q_descale), (k8, k_descale), (v8, v_descale)))
        out = emulate.reference(q, k, v, is_causal, scale)
        return out.to(torch.bfloat16), _lse(q, k, is_causal).float()

    def bwd_impl(grad_out, q, k, v, out, lse, grad_lse, is_causal, scale, deterministic, version):
        assert version == "v14" and q.dtype == k.dtype == v.dtype == torch.bfloat16
        _, dq, dk, dv = reference_grads(q, k, v, grad_out, is_causal, scale)
        return dq.to(torch.bfloat16), dk.to(torch.bfloat16), dv.to(torch.bfloat16)

    monkeypatch.setattr(op, "run", lambda *a, **kw: run(*a, **kw))
    monkeypatch.setattr(bwd_op, "_bwd_impl", bwd_impl)
    monkeypatch.setattr(bwd_op, "backward_version", lambda head_dim, capability, deterministic: "v14")
    monkeypatch.setattr(backward, "_capability_check", lambda device: (9, 0))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bug", [None, "no_k_descale"])
def test_autograd_plumbing(monkeypatch, dtype, bug):
    _fake_kernels(monkeypatch)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, 40, 64, generator=gen).to(dtype).requires_grad_() for H in (4, 2, 2))
    d_o = torch.randn(1, 4, 40, 64, generator=gen)
    out = backward.attention_fp8_train(q, k, v, is_causal=True, enable_gqa=True, _bug=bug)
    grads = torch.autograd.grad(out, (q, k, v), d_o.to(out.dtype))
    assert [g.dtype for g in grads] == [dtype] * 3 and [g.shape for g in grads] == [q.shape, k.shape, v.shape]
    deq = [quant.quantize(x.detach(), "e4m3").dequantize(torch.float64) for x in (q, k, v)]
    _, *ref = reference_grads(*deq, d_o.to(torch.bfloat16), True)
    errors = emulate_bwd.errors([g.float() for g in grads], ref)
    ok = all(e["rel_l2"] < 2e-2 for e in errors.values())
    assert ok == (bug is None), errors  # the wrong build must fail the same comparison


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU of compute capability 9.0")
def test_gpu_checks_pass_and_the_wrong_build_fails():
    from lab.fp8 import checks_bwd
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("fwd v13 is sm_90a")
    cells = [c for c in checks_bwd.CELLS if c[0] in ("d128-s65-c", "d128-s300-gqa4", "d64-s1000-gqa2-c")]
    rows = [checks_bwd.check(*cell) for cell in cells]
    assert all(r["pass"] for r in rows), [checks_bwd.line(r) for r in rows]
    assert not checks_bwd.wrong_build()["pass"]


def test_cudnn_fp8_backward_peer_names_its_install_when_missing():
    try:
        import cudnn  # noqa: F401
        pytest.skip("cudnn is installed here")
    except ImportError:
        pass
    from lab.fp8 import peer_bwd
    x = quant.quantize(torch.randn(1, 1, 8, 64), "e4m3")
    with pytest.raises(ImportError, match="nvidia-cudnn-frontend"):
        peer_bwd.FP8Backward(x, x, x, torch.randn(1, 1, 8, 64))


def test_race_lines_name_the_path_and_ratios():
    from lab.fp8 import race_bwd
    row = {"case": "d128-s4096", "impl": "lab-fp8-train", "timing": {"median_ms": 2.0, "iqr_ms": 0.01, "n": 12},
           "tflops": 500.0, "speed_vs_lab-bf16": 0.97}
    assert race_bwd.line(row).split() == ["d128-s4096", "lab-fp8-train", "2.000", "ms", "(IQR", "0.010,", "n",
                                          "12)", "500", "TFLOP/s", "speed_vs_lab-bf16=0.970"]
    refused = {"case": "c", "impl": "cudnn-fp8", "unsupported": "unsupported: no GPU"}
    assert "unsupported: no GPU" in race_bwd.line(refused)
