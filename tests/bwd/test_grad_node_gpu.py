"""GPU tests of the eager gradient call's C++ autograd node (lab.backward.node, lab/binding.cpp's AttentionNode):
the default call that wants gradients takes the node, and its output, lse and gradients are bit-identical to
the Python route's (dQ outside deterministic mode within the rounding of its atomic race) (an explicit version= takes lab.backward.op.EagerAttention, with the same kernels), on
uneven lengths, GQA, causal and not, non-contiguous views, any finite scale, the lse's own gradient, both
dtypes and deterministic mode (read when the backward runs). Gradients are also judged against the float64
reference (lab.check.check_backward) on one case, so a node that ran the wrong kernel consistently would fail.

Marked `gpu`: skipped without CUDA. Run: .venv/bin/python -m pytest -q tests/bwd/test_grad_node_gpu.py
"""
from __future__ import annotations

import pytest
import torch

from lab import cases, check, ops
from lab.fwd.op import attention_version

pytestmark = pytest.mark.gpu

SHAPES = [  # B, Hq, Hkv, Sq, Sk, D, causal
    (1, 2, 2, 1, 1, 64, False), (2, 4, 4, 63, 63, 64, True), (2, 4, 2, 65, 1025, 128, False),
    (1, 8, 2, 1025, 1025, 128, True), (1, 2, 1, 4097, 4097, 64, True), (1, 2, 2, 1025, 63, 128, True),
]


def _inputs(B, Hq, Hkv, Sq, Sk, D, dtype, transposed=False):
    def make(H, S):
        if transposed:  # (B, S, H, D) storage seen as (B, H, S, D): strides not contiguous
            return torch.randn(B, S, H, D, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        return torch.randn(B, H, S, D, device="cuda", dtype=dtype).requires_grad_()
    return make(Hq, Sq), make(Hkv, Sk), make(Hkv, Sk)


def _both(q, k, v, causal, scale=None, lse_weight=0.0):
    """(out, lse, dq, dk, dv, node name) through the node and through the Python route."""
    explicit = attention_version(q, None, causal)
    answers = []
    dout = torch.randn_like(q)
    dlse = torch.randn(q.shape[:3], device="cuda") * lse_weight
    for version in (None, explicit):
        out, lse = ops.attention(q, k, v, causal, scale, enable_gqa=True, version=version, return_lse=True)
        grads = torch.autograd.grad((out, lse), (q, k, v), (dout, dlse))
        answers.append((out, lse, *grads, out.grad_fn.name()))
    return answers


def _same(a, b, deterministic=False):
    """out, lse, dK and dV bit for bit; dQ too in deterministic mode. Otherwise dQ's float32 partial sums land in
    whatever order the CTAs reach them (lab.backward.emulate's race), so two runs of one route differ by the
    rounding of that order: at most 2 ulps of the dtype, far inside any real error."""
    for x, y, what in zip(a[:5], b[:5], ("out", "lse", "dq", "dk", "dv")):
        if what == "dq" and not deterministic:
            bound = 2.0 ** -6 * y.float().abs() + 1e-5 * y.float().abs().max()
            assert ((x.float() - y.float()).abs() <= bound).all(), "dq differs beyond the atomic race's rounding"
            continue
        assert torch.equal(x, y), f"{what} differs between the node and the Python route"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_node_equals_the_python_route_bit_for_bit(shape, dtype):
    B, Hq, Hkv, Sq, Sk, D, causal = shape
    node, route = _both(*_inputs(B, Hq, Hkv, Sq, Sk, D, dtype), causal, lse_weight=0.5)
    assert "AttentionNode" in node[5] and "EagerAttention" in route[5]
    _same(node, route)


@pytest.mark.parametrize("scale", [0.0, -0.3, 0.5])
def test_non_contiguous_views_and_any_finite_scale(scale):
    node, route = _both(*_inputs(2, 4, 2, 129, 257, 128, torch.bfloat16, transposed=True), True, scale=scale)
    assert "AttentionNode" in node[5]
    _same(node, route)


def test_deterministic_mode_is_read_when_the_backward_runs():
    q, k, v = _inputs(1, 4, 2, 1025, 1025, 128, torch.bfloat16)
    out = ops.attention(q, k, v, True, enable_gqa=True)
    assert "AttentionNode" in out.grad_fn.name()
    dout = torch.randn_like(out)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        second = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        route_out = ops.attention(q, k, v, True, enable_gqa=True, version=attention_version(q, None, True))
        route = torch.autograd.grad(route_out, (q, k, v), dout)
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b, c in zip(first, second, route):  # every gradient, dQ included, bit for bit
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_nodes_gradients_against_the_float64_reference():
    """lab.check's yardstick (SDPA's own error in the dtype) on a bench-like case: the node's gradients pass."""
    case = cases.Case("node-gqa-causal", 2, 8, 2, 1025, 1025, 128, "bfloat16", True)

    def run(q, k, v, is_causal, scale, dout):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = ops.attention(q, k, v, is_causal, scale, enable_gqa=True)
        assert "AttentionNode" in out.grad_fn.name()
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), dout))

    results = check.check_backward(run, case, "lab.ops.attention (node)", trials=2, save=False)
    assert check.backward_passed(results), results


def test_gradients_only_for_the_inputs_that_want_them():
    q, k, v = _inputs(1, 2, 2, 65, 65, 64, torch.bfloat16)
    k.requires_grad_(False)
    v.requires_grad_(False)
    out = ops.attention(q, k, v, False)
    assert "AttentionNode" in out.grad_fn.name()
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    route = ops.attention(q, k, v, False, version=attention_version(q, None, False))
    (dq_route,) = torch.autograd.grad(route, (q,), torch.ones_like(route))
    assert torch.equal(dq, dq_route)  # one key block: no race in dQ
