"""The backward pass on CPU: the NumPy emulation of kernels/bwd/v01_mma.cu against the float64 reference
(tile order, D term, both dQ modes, the race), the autograd registration traced with fake tensors, the
FLOP convention, and lab.check.check_backward's pass rule (a wrong gradient, a NaN, an unwritten gradient
fail). GPU checks of the kernels themselves: tests/bwd/test_backward_gpu.py.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lab import backward, bench, check, ops, registry
from lab.backward import harness as backward_harness
from lab.cases import Case
from lab.masks import backward as masked
from lab.backward.emulate import backward_reference, flash_backward_emulated, relative_error

# (B, Hq, Hkv, Sq, Sk, D): uneven sizes, Sq != Sk both ways, GQA/MQA
SHAPES = [(1, 1, 1, 1, 1, 64), (2, 3, 3, 65, 63, 64), (1, 4, 2, 63, 130, 32), (1, 2, 1, 130, 65, 16),
          (2, 2, 2, 129, 129, 64)]


def _inputs(shape, seed=0, magnitude=1.0):
    B, Hq, Hkv, Sq, Sk, D = shape
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Sq, D)) * magnitude
    k = rng.standard_normal((B, Hkv, Sk, D)) * magnitude
    v = rng.standard_normal((B, Hkv, Sk, D))
    do = rng.standard_normal((B, Hq, Sq, D))
    return q, k, v, do


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [None, -0.3, 0.0])
def test_closed_form_reference_matches_torch_autograd(shape, causal, scale):
    q, k, v, do = _inputs(shape, seed=1)
    ours = backward_reference(q, k, v, do, causal, scale)
    t = [torch.from_numpy(x) for x in (q, k, v, do)]
    _, *theirs = check.reference_grads(*t, is_causal=causal, scale=scale)
    for a, b in zip(ours, theirs):
        assert np.allclose(a, b.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["atomic", "separate"])
def test_emulation_matches_reference(shape, causal, mode):
    for scale, magnitude in ((None, 1.0), (-0.3, 1.0), (0.0, 1.0), (None, 3.0)):
        q, k, v, do = _inputs(shape, seed=2, magnitude=magnitude)
        ref = backward_reference(q, k, v, do, causal, scale)
        got = flash_backward_emulated(q, k, v, do, causal, scale, block_m=32, block_n=64, dq_mode=mode)
        for name, a, b in zip("qkv", got, ref):
            assert a.dtype == np.float32 and np.isfinite(a).all()
            assert relative_error(a, b) < 2e-5, (name, scale, magnitude, relative_error(a, b))


def test_tile_sizes_do_not_change_the_result_beyond_float32():
    q, k, v, do = _inputs((1, 2, 1, 200, 150, 32), seed=3)
    ref = backward_reference(q, k, v, do, True)
    # (64, 128): the Hopper versions' tiles; (128, 128): bwd v13's at D = 64
    for bm, bn in ((16, 16), (64, 64), (32, 128), (64, 128), (128, 128), (256, 256)):
        for a, b in zip(flash_backward_emulated(q, k, v, do, True, block_m=bm, block_n=bn), ref):
            assert relative_error(a, b) < 2e-5


def test_forgetting_the_d_term_breaks_dq_and_dk_not_dv():
    q, k, v, do = _inputs((1, 2, 2, 65, 65, 64), seed=4)
    ref = backward_reference(q, k, v, do)
    dq, dk, dv = flash_backward_emulated(q, k, v, do, no_delta=True)
    assert relative_error(dq, ref[0]) > 0.05 and relative_error(dk, ref[1]) > 0.05
    assert relative_error(dv, ref[2]) < 2e-5  # dV = P^T dO has no D term


def test_the_race_atomic_dq_depends_on_cta_order_separate_does_not():
    """fp32 addition is not associative: the atomic dQ adds in whatever order the K/V CTAs finish, so two
    orders give different bits (same value to float32 precision); the separate pass has one fixed order."""
    q, k, v, do = _inputs((1, 2, 2, 64, 512, 64), seed=5)
    ctas = 2 * 512 // 64
    orders = [list(range(ctas)), list(reversed(range(ctas))), list(np.random.default_rng(0).permutation(ctas))]
    atomic = [flash_backward_emulated(q, k, v, do, dq_mode="atomic", cta_order=o)[0] for o in orders]
    separate = [flash_backward_emulated(q, k, v, do, dq_mode="separate", cta_order=o)[0] for o in orders]
    assert any(not np.array_equal(atomic[0], a) for a in atomic[1:])
    assert all(np.array_equal(separate[0], s) for s in separate[1:])
    assert relative_error(atomic[1], atomic[0]) < 1e-6
    # dK and dV never depend on the order: each CTA owns its key block
    dk = [flash_backward_emulated(q, k, v, do, cta_order=o)[1] for o in orders]
    assert all(np.array_equal(dk[0], x) for x in dk[1:])


def test_emulation_rejects_a_bad_mode():
    q, k, v, do = _inputs((1, 1, 1, 4, 4, 16))
    with pytest.raises(ValueError, match="dq_mode"):
        flash_backward_emulated(q, k, v, do, dq_mode="racy")


# ------------------------------------------------------------------ autograd registration (fake tensors)

def _fake_inputs(Hq=8, Hkv=2, Sq=33, Sk=70, D=64, dtype=torch.float16):
    q = torch.empty(2, Hq, Sq, D, dtype=dtype, requires_grad=True)
    k = torch.empty(2, Hkv, Sk, D, dtype=dtype, requires_grad=True)
    v = torch.empty(2, Hkv, Sk, D, dtype=dtype, requires_grad=True)
    return q, k, v


def test_autograd_is_registered_and_grads_have_the_inputs_shapes():
    with FakeTensorMode():
        q, k, v = _fake_inputs()
        out, lse = torch.ops.lab.attention(q, k, v, True, 0.125, "v04")
        assert "lab_attention" in type(out.grad_fn).__name__
        for use in ("out", "lse", "both"):  # lse alone: grad_out is None, filled with zeros by _backward
            out, lse = torch.ops.lab.attention(q, k, v, True, 0.125, "v04")
            loss = {"out": out.float().sum(), "lse": lse.sum(), "both": out.float().sum() + lse.sum()}[use]
            grads = torch.autograd.grad(loss, (q, k, v))
            assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
        assert all(g.dtype == torch.float16 for g in grads)


def test_forward_plus_backward_traces_into_one_graph_with_the_backward_op():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v, do):
        out, _ = torch.ops.lab.attention(q, k, v, False, 0.125, "v04")
        return torch.autograd.grad(out, (q, k, v), do)

    q, k, v = (torch.randn(1, 2, 5, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    graph = make_fx(step, tracing_mode="fake")(q, k, v, torch.randn(1, 2, 5, 64, dtype=torch.bfloat16))
    code = graph.code
    assert "lab.attention.default" in code and "lab.attention_backward.default" in code


def test_backward_op_fake_and_schema():
    schema = str(torch.ops.lab.attention_backward.default._schema)
    assert "Tensor? grad_lse" in schema and "bool deterministic" in schema
    with FakeTensorMode():
        q, k, v = _fake_inputs(dtype=torch.bfloat16)
        o, lse = torch.empty_like(q), torch.empty(2, 8, 33)
        dq, dk, dv = torch.ops.lab.attention_backward(o, q, k, v, o, lse, None, True, 0.1, True, "v01")
        assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_backward_version_selection():
    """With no version named, backward_version is registry.choose's (the defaults: tests/fixtures/defaults.json);
    a named version, the narrow dims' rules and the refusals are checked here."""
    hopper = (9, 0)
    for d in (64, 128, 192, 256):
        for capability in ((), (8, 0), hopper):
            for deterministic in (False, True):
                chosen = registry.choose("bwd", {"head_dim": d}, capability, deterministic)
                assert backward.backward_version(d, capability=capability, deterministic=deterministic) == chosen.version
                assert registry.kernel_of(chosen).head_dims.count(d) == 1
                if deterministic and d in registry.FAST_HEAD_DIMS:  # a kernel with the mode, never one that refuses it
                    assert chosen.version in registry.DETERMINISTIC_BWD
    assert backward.backward_version(64, "v17", capability=hopper, deterministic=True) == "v17"
    assert backward.backward_version(128, capability=(8, 0), deterministic=True) == "v01"
    assert backward.backward_version(256, capability=hopper, deterministic=True) == "v09"
    assert backward.backward_version(64, "v01", capability=hopper, deterministic=True) == "v01"
    with pytest.raises(ValueError, match="no deterministic mode"):
        backward.backward_version(64, "v14", capability=hopper, deterministic=True)
    assert backward.backward_version(64, "v02", capability=hopper) == "v02"  # named: that one (history included)
    with pytest.raises(ValueError, match="head dim 32"):
        backward.backward_version(32)
    # a narrow head dim (the forward ran unpadded) runs v20, on Hopper, outside deterministic mode, named or not
    assert backward.backward_version(80, capability=hopper) in registry.NARROW_BWD
    assert backward.backward_version(32, "v20", hopper) == "v20"
    with pytest.raises(NotImplementedError, match="unpadded"):
        backward.backward_version(96, capability=hopper, deterministic=True)
    with pytest.raises(ValueError, match="unpadded on"):
        backward.backward_version(96, "v14", capability=hopper)
    with pytest.raises(ValueError, match="9.0 only"):
        backward.backward_version(96, capability=(8, 0))
    with pytest.raises(ValueError, match="unknown"):
        backward.backward_version(64, "v99")


def test_ops_imports_the_registration():
    assert ops._backward is backward


# ------------------------------------------------------------------ FLOPs

def test_backward_flops_are_2_5x_the_forward_halved_for_causal():
    B, H, S, D = 2, 16, 4096, 128
    fwd = bench.attention_flops(B, H, S, S, D, False)
    assert backward_harness.flops(B, H, S, S, D, False, "bwd") == 2.5 * fwd == 10 * B * H * S * S * D
    assert backward_harness.flops(B, H, S, S, D, True, "bwd") == 5 * B * H * S * S * D
    assert backward_harness.flops(B, H, S, S, D, False, "fwd+bwd") == 3.5 * fwd
    with pytest.raises(KeyError):
        backward_harness.flops(B, H, S, S, D, False, "sideways")


def test_bench_backward_sweep_rejects_an_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        backward_harness.backward_sweep([], mode="bwd-only")


# ------------------------------------------------------------------ check_backward's rule, on CPU

CPU_CASE = Case("cpu-bwd", 1, 4, 2, 33, 47, 16, "bfloat16", True)


def _emulated_runner(no_delta=False, poison=None):
    def run(q, k, v, is_causal, scale, dout):
        f = lambda t: t.float().numpy()  # noqa: E731
        out = check.reference(q, k, v, is_causal, scale).to(q.dtype)
        grads = flash_backward_emulated(f(q), f(k), f(v), f(dout), is_causal, scale, block_m=16, block_n=16,
                                        no_delta=no_delta)
        grads = [torch.from_numpy(g).to(q.dtype) for g in grads]
        if poison is not None:
            grads[poison][..., -1, :] = float("nan")
        return (out, *grads)
    return run


def test_check_backward_passes_the_emulation_and_fails_wrong_gradients(session_dir):
    good = check.check_backward(_emulated_runner(), CPU_CASE, "emulated", trials=1, device=torch.device("cpu"),
                                include_forward=True)
    assert set(good) == {"out", "dq", "dk", "dv"} and check.backward_passed(good), {n: r for n, r in good.items()}
    bad = check.check_backward(_emulated_runner(no_delta=True), CPU_CASE, "no-delta", trials=1,
                               device=torch.device("cpu"))
    assert not bad["dq"].passed and not bad["dk"].passed and bad["dv"].passed
    unwritten = check.check_backward(_emulated_runner(poison=2), CPU_CASE, "nan-dv", trials=1,
                                     device=torch.device("cpu"), save=False)
    assert not unwritten["dv"].passed and unwritten["dv"].worst["nan"] > 0


def test_run_set_backward_modes(session_dir):
    for kind, count in (("backward", 3), ("fwd+bwd", 4)):
        results = check.run_set(_emulated_runner(), [CPU_CASE], "emulated", kind=kind, progress=False,
                                show_failures=0, trials=1, device=torch.device("cpu"), save=False)
        assert len(results) == count and all(r.passed for r in results)


def test_check_backward_scale_zero_and_negative_with_math_yardstick(session_dir):
    for scale in (0.0, -0.25):
        res = check.check_backward(_emulated_runner(), CPU_CASE, "emulated", trials=1, device=torch.device("cpu"),
                                   scale=scale, yardstick="math", save=False)
        assert check.backward_passed(res), scale


@pytest.mark.parametrize("scale", [-0.3, 0.0])
def test_sdpa_yardstick_rewrites_scale_le_0_exactly(scale):
    """The fused SDPA backends get scale <= 0 as (-q, |scale|) or 2^-100: the same gradients as the math backend."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 4, 9, 16, generator=gen, dtype=torch.float64) for _ in range(4))
    k, v = k[:, :2], v[:, :2]
    rewritten = check.sdpa_grads(q, k, v, do, True, scale, backend="default")
    direct = check.sdpa_grads(q, k, v, do, True, scale, backend="math")
    for a, b in zip(rewritten, direct):
        assert torch.allclose(a, b, atol=1e-12, rtol=1e-9)


def test_hbm_bytes_counts_the_minimum_traffic():
    from lab.backward.emulate import hbm_bytes

    b = hbm_bytes(1, 2, 1, 10, 20, 8)
    assert b["reads"] == 3 * 1 * 2 * 10 * 8 * 2 + 2 * 20 * 8 * 2 + 2 * 10 * 4
    assert b["writes"] == 2 * 10 * 8 * 2 + 2 * 20 * 8 * 2
    assert b["dq_accum_per_key_block"] == 2 * 10 * 8 * 4 and math.isfinite(b["reads"])


# ------------------------------------------------------------------ the binding's backward checks (CPU check build)



def _bwd_args(dtype=torch.float16):
    q, o, do = (torch.randn(2, 4, 33, 64).to(dtype) for _ in range(3))
    k, v = (torch.randn(2, 2, 40, 64).to(dtype) for _ in range(2))
    return {"q": q, "k": k, "v": v, "o": o, "lse": torch.randn(2, 4, 33), "dlse": None, "do": do, "scale": 0.125,
            "causal": True, "det": False}


def _call_bwd(bind, a):
    return bind.attn_bwd_call(0, a["q"], a["k"], a["v"], a["o"], a["lse"], a["dlse"], a["do"], a["scale"],
                              a["causal"], a["det"])


BAD_BWD = {
    "lse too short": ({"lse": torch.randn(2, 4, 32)}, r"^lse must have 264 elements"),
    "lse float16": ({"lse": torch.randn(2, 4, 33).half()}, r"^lse must be float32"),
    "grad_lse wrong size": ({"dlse": torch.randn(2, 4, 3)}, r"^grad_lse must have 264 elements"),
    "grad_out shape": ({"do": torch.randn(2, 4, 32, 64).half()}, r"^grad_out must have the query's shape"),
    "grad_out dtype": ({"do": torch.randn(2, 4, 33, 64).bfloat16()}, r"^grad_out has dtype"),
    "key heads": ({"k": torch.randn(2, 3, 40, 64).half(), "v": torch.randn(2, 3, 40, 64).half()},
                  r"^query heads \(4\) must be a multiple of key heads \(3\)"),
    "value shape": ({"v": torch.randn(2, 2, 41, 64).half()}, r"^key and value shapes differ"),
    "out shape": ({"o": torch.randn(2, 4, 34, 64).half()}, r"^out must have the query's shape"),
    "query 3-D": ({"q": torch.randn(4, 33, 64).half()}, r"^query must be 4-D"),
    "nan scale": ({"scale": float("nan")}, r"^scale must be a finite float32 value"),
    "float32 inputs": ({k: torch.randn(*_bwd_args()[k].shape) for k in ("q", "k", "v", "o", "do")},
                       r"^query dtype must be float16 or bfloat16"),
}


@pytest.mark.parametrize("what", sorted(BAD_BWD))
def test_backward_binding_names_the_bad_argument(cpu_binding, what):
    change, pattern = BAD_BWD[what]
    args = {**_bwd_args(), **change}
    with pytest.raises(RuntimeError, match=pattern):
        _call_bwd(cpu_binding, args)


def test_backward_binding_good_calls_return_gradients_of_the_inputs_shapes(cpu_binding):
    for det in (False, True):
        args = {**_bwd_args(torch.bfloat16), "det": det, "dlse": torch.randn(2, 4, 33)}
        dq, dk, dv = _call_bwd(cpu_binding, args)
        assert dq.shape == args["q"].shape and dk.shape == args["k"].shape and dv.shape == args["v"].shape
        assert dq.dtype == dk.dtype == torch.bfloat16
    args = _bwd_args()
    args["q"], args["o"], args["do"], args["lse"] = (t[:, :, :0] for t in (args["q"], args["o"], args["do"], args["lse"]))
    dq, dk, dv = _call_bwd(cpu_binding, args)  # no query rows: dK = dV = 0, nothing launched
    assert dq.numel() == 0 and not dk.any() and not dv.any()


def test_the_masked_backwards_row_pad_is_the_headers():
    # lab.masks.backward sizes the kernels' workspaces itself: a smaller pad than LAB_BWD_ROW_PAD would let the
    # last step's 128-row loads and dQ reductions (bwd v13) run past them
    header = (Path(__file__).resolve().parents[2] / "kernels/common/params.h").read_text()
    assert f"#define LAB_BWD_ROW_PAD {masked.ROW_PAD}\n" in header and masked.ROW_PAD == 128


def test_backward_fakes_give_gradients_the_layout_of_their_inputs():
    """Under torch.compile the backward ops' fakes say what the kernels return: dq, dk, dv in the layout of (B, S, H,
    D)-memory views (a model's projections), contiguous for contiguous inputs, for a view the kernels cannot write
    through (rows 68 elements apart: no multiple of 8) and for the masked call's padded head dims (cut back)."""
    def bshd(B, H, S, D, row=None):
        return torch.empty(B, S, H, row or D, dtype=torch.float16)[..., :D].transpose(1, 2)

    with FakeTensorMode():
        for D, row, strided in ((64, None, True), (64, 68, False), (96, None, False)):
            q, k, v = bshd(2, 4, 65, D, row), bshd(2, 2, 70, D, row), bshd(2, 2, 70, D, row)
            out, lse = torch.empty(2, 4, 65, D, dtype=torch.float16), torch.empty(2, 4, 65)
            grads = [torch.ops.lab.attention_masked_backward(out, q, k, v, out, lse, None, None, False, -1, 0, 0, 0.0,
                                                             0.125)[:3]]
            if D != 96:  # the dense backward op (D 96 runs narrow there, not padded)
                grads.append(torch.ops.lab.attention_backward(out, q, k, v, out, lse, None, True, 0.125, False, "v04"))
            for gs in grads:
                for g, t in zip(gs, (q, k, v)):
                    assert g.shape == t.shape
                    assert (g.stride() == t.stride()) if strided else g.is_contiguous(), (D, row, g.stride())
        flat = torch.empty(2, 4, 65, 64, dtype=torch.float16)
        g = torch.ops.lab.attention_backward(flat, flat, flat, flat, flat, torch.empty(2, 4, 65), None, False, 0.125,
                                             False, "v04")[0]
        assert g.is_contiguous()
