"""The C++ autograd node of lab.ops.attention's eager gradient call (lab/binding.cpp's AttentionNode,
lab.backward.node), on CPU: the binding's check build (nothing launched), so what is tested is the node's
plumbing, not its numbers: which inputs get gradients of which shapes, the lse-only gradient, the
deterministic resolver read when the backward runs, and refusals that record no node. The numbers are the
kernels' (the same as the Python route's, bit for bit: tests/bwd/test_grad_node_gpu.py)."""
from __future__ import annotations

import pytest
import torch


FWD_LAUNCHER, BWD_LAUNCHER = 11, 22  # never called: the check build stops before launching


def _qkv(Hq=4, Hkv=2, S=33, Sk=40, D=64, dtype=torch.bfloat16, grads=(True, True, True)):
    q = torch.randn(2, Hq, S, D).to(dtype)
    k, v = (torch.randn(2, Hkv, Sk, D).to(dtype) for _ in range(2))
    return tuple(t.requires_grad_(g) for t, g in zip((q, k, v), grads))


def _call(bind, q, k, v, causal=True, gqa=True, scale=None):
    return bind.module.attn_auto_grad(FWD_LAUNCHER, BWD_LAUNCHER, q, k, v, causal, gqa, scale)


def test_the_node_records_and_returns_every_inputs_gradient(cpu_binding):
    q, k, v = _qkv()
    error, out, lse = _call(cpu_binding, q, k, v)
    assert error == "" and out.shape == q.shape and lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    assert "AttentionNode" in out.grad_fn.name() and out.grad_fn is lse.grad_fn
    assert out.requires_grad and lse.requires_grad
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16


def test_lse_alone_and_one_input_wanting_gradients(cpu_binding):
    q, k, v = _qkv(grads=(True, False, False))
    error, out, lse = _call(cpu_binding, q, k, v, causal=False)
    assert error == ""
    (dq,) = torch.autograd.grad(lse.sum(), (q,))  # grad_out absent: the node makes it zeros
    assert dq.shape == q.shape
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(out, (k,), torch.ones_like(out), allow_unused=False)


def test_deterministic_mode_asks_the_resolver_when_the_backward_runs(cpu_binding):
    asked = []
    cpu_binding.module.set_deterministic_resolver(lambda d: asked.append(d) or 0)
    q, k, v = _qkv(D=128)
    _, out, _ = _call(cpu_binding, q, k, v)
    torch.autograd.grad(out, (q,), torch.ones_like(out), retain_graph=True)
    assert asked == []  # not deterministic: the plan's launcher
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # turned on after the forward: the backward still sees it
    try:
        torch.autograd.grad(out, (q,), torch.ones_like(out), retain_graph=True)
        assert asked == [128]

        def refuse(d):
            raise ValueError(f"no deterministic kernel for head dim {d}")

        cpu_binding.module.set_deterministic_resolver(refuse)
        with pytest.raises(RuntimeError, match="no deterministic kernel for head dim 128"):
            torch.autograd.grad(out, (q,), torch.ones_like(out))
    finally:
        torch.use_deterministic_algorithms(previous)
        cpu_binding.module.set_deterministic_resolver(lambda d: 0)


def test_an_expanded_grad_out_is_read_not_refused(cpu_binding):
    q, k, v = _qkv()
    _, out, _ = _call(cpu_binding, q, k, v)
    (dq,) = torch.autograd.grad(out.sum(), (q,))  # grad_out arrives with stride 0 in every dim
    assert dq.shape == q.shape


@pytest.mark.parametrize("what, change, answer", [
    ("key heads without enable_gqa", dict(gqa=False), "refused"),
    ("a last dim with stride 2", dict(q=lambda q: torch.randn(2, 4, 33, 128).bfloat16()[..., ::2].requires_grad_()),
     "refused"),
    ("float32", dict(q=lambda q: q.detach().float().requires_grad_()), "key has dtype BFloat16 but query has Float"),
    ("nan scale", dict(scale=float("nan")), "scale must be a finite"),
])
def test_bad_calls_answer_and_record_no_node(cpu_binding, what, change, answer):
    q, k, v = _qkv()
    args = dict(causal=True, gqa=True, scale=None)
    args.update({key: value for key, value in change.items() if key != "q"})
    if "q" in change:
        q = change["q"](q)
    error, out, lse = _call(cpu_binding, q, k, v, **args)
    assert answer in error and out is None and lse is None


def test_the_plan_leaves_cpu_tensors_and_other_head_dims_to_the_python_route():
    from lab.backward import node

    assert node.NODE_HEAD_DIMS == (64, 128)
    q = torch.randn(1, 1, 4, 64)
    assert node.grad_plan(q, False, lambda *a: "v07") is None  # not a CUDA tensor
