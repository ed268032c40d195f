"""The backward pass of lab.ops.attention: autograd registration, the backward custom op, runners.

`lab.ops` imports this module at its end and calls register(), so `lab.ops.attention` is differentiable in query, key and value
without anyone importing it (this module imports nothing of lab.ops: no import cycle). The check and bench
adapters of the backward (runners, timed steps, the sweep, the training example) are in lab.backward.harness. The forward custom op `lab::attention` already returns (out, lse); autograd
saves q, k, v, out and the natural-log lse (never P) and calls `lab::attention_backward`, a custom op with
a fake implementation, so torch.compile(fullgraph=True) traces forward plus backward without a graph break.

dQ mode: fp32 atomics (the default, fewest FLOPs) or a separate dQ pass when
torch.are_deterministic_algorithms_enabled() (bit-identical across runs); kernels/bwd/v01_mma.cu says why.
"""
from __future__ import annotations

import torch

from .. import build
from ..kernels import Kernel, launcher, resolve_version

BWD = {
    "v01": Kernel("bwd/v01_mma.cu", "attn_bwd_v01", (64, 128)),
}
BEST_BWD = ("v01",)


def backward_version(head_dim: int, version=None) -> str:
    """The backward kernel for this head dim: `version` checked, or the first of BEST_BWD that takes it."""
    return resolve_version(version, BWD, head_dim, BEST_BWD)


def _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version, defines=None):
    dq, dk, dv = build.binding().attn_bwd_call(launcher(BWD, version, defines), query, key, value, out, lse,
                                               grad_lse, grad_out, scale, is_causal, deterministic)
    return dq, dk, dv


@torch.library.custom_op("lab::attention_backward", mutates_args=())
def _attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None, is_causal: bool,
                           scale: float, deterministic: bool, version: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version)


@_attention_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup_context(ctx, inputs, output):
    query, key, value, is_causal, scale, _version = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.set_materialize_grads(False)  # an unused lse gets no zero gradient tensor


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    if grad_lse is not None:
        grad_lse = grad_lse.contiguous()
    version = backward_version(query.shape[-1])
    dq, dk, dv = _attention_backward_op(grad_out, query, key, value, out, lse, grad_lse, ctx.is_causal, ctx.scale,
                                        torch.are_deterministic_algorithms_enabled(), version)
    return dq, dk, dv, None, None, None


_registered = False


def register() -> None:
    """Make lab::attention differentiable; lab.ops calls this once it has defined the op (idempotent)."""
    global _registered
    if not _registered:
        torch.library.register_autograd("lab::attention", _backward, setup_context=_setup_context)
        _registered = True
