"""The backward pass of lab.ops.attention: autograd registration, the backward custom op, runners.

`lab.ops` imports this module at its end and calls register(), so `lab.ops.attention` is differentiable in query, key and value
without anyone importing it (this module imports nothing of lab.ops: no import cycle). The check and bench
adapters of the backward (runners, timed steps, the sweep, the training example) are in lab.backward.harness. The forward custom op `lab::attention` already returns (out, lse); autograd
saves q, k, v, out and the natural-log lse (never P) and calls `lab::attention_backward`, a custom op with
a fake implementation, so torch.compile(fullgraph=True) traces forward plus backward without a graph break.

Which kernel: on compute capability 9.0, the first of lab.registry.BEST_BWD_HOPPER (wgmma, TMA, warp-specialised;
kernels/bwd/README.md has the family, outputs/experiments/ what each version buys); elsewhere v01 (mma.sync; dQ by fp32 atomics). Head dims 192 and 256 (and every D from 129 up,
padded by lab.fwd.head_dims): v09 (mma.sync, FA2's wide-head tiling) on every GPU. When torch.are_deterministic_algorithms_enabled(),
v18 on compute capability 9.0 (v14 with dQ added in a fixed order: kernels/bwd/v17_ordered.cu, v18_signal.cu) and
v01's separate dQ pass elsewhere (kernels/bwd/v01_mma.cu says why it costs more); both are bit-identical across runs, where the
other versions' reduction order is not fixed.
"""
from __future__ import annotations

import torch

from .. import build
from ..kernels import launcher, resolve_version
from ..op_common import _capability, grad_like, register_autograd_once
from ..registry import (BEST_BWD, BEST_BWD_HOPPER, BWD, DETERMINISTIC_BWD, FAST_HEAD_DIMS,  # noqa: F401 (re-exported)
                        HOPPER_CAPABILITIES, NARROW_BWD, backward_preference, choose, narrow_backward_dim)

# The table and preference lists live in lab.registry (no torch: the drivers and sanitizer scripts read them).


def backward_version(head_dim: int, version=None, capability: tuple = (), deterministic: bool = False) -> str:
    """The backward kernel for this head dim on a GPU of `capability`: `version` checked, or the first of
    lab.registry.backward_preference that takes it. A narrow head dim (a forward that ran unpadded) gets
    NARROW_BWD's kernel, which has no deterministic mode."""
    if narrow_backward_dim(head_dim):
        width = 64 if head_dim < 64 else FAST_HEAD_DIMS[-1]  # the kernel width the narrow dim runs at
        name = resolve_version(version, BWD, width, NARROW_BWD)
        if name not in NARROW_BWD:
            raise ValueError(f"head dim {head_dim} runs unpadded on {NARROW_BWD} only, not on backward {name}")
        if deterministic:
            raise NotImplementedError(
                f"head dim {head_dim}: this forward ran unpadded with torch.use_deterministic_algorithms off, and the "
                f"unpadded backward ({name}) adds dQ by atomics, in no fixed order; enable the mode before the "
                f"forward (the call then pads to {width} and runs a deterministic kernel)")
        if tuple(capability) not in HOPPER_CAPABILITIES:
            raise ValueError(f"head dim {head_dim} unpadded: {name} runs on compute capability 9.0 only")
        return name
    if version is not None and deterministic and resolve_version(version, BWD, head_dim, ()) not in DETERMINISTIC_BWD:
        raise ValueError(f"backward {version} has no deterministic mode; deterministic versions: {DETERMINISTIC_BWD}")
    if version is None:
        return choose("bwd", {"head_dim": head_dim}, capability, deterministic).version
    return resolve_version(version, BWD, head_dim, backward_preference(capability, deterministic))


def _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version, defines=None):
    dq, dk, dv = build.binding().attn_bwd_call(launcher(BWD, version, defines), query, key, value, out, lse,
                                               grad_lse, grad_out, scale, is_causal, deterministic)
    return dq, dk, dv


def default_backward(grad_out, query, key, value, out, lse, grad_lse, is_causal: bool, scale: float, capability=None):
    """The backward kernel lab.ops would run (the head dim, the GPU, torch's deterministic mode) on (B, H, S, D)
    tensors, outside autograd: (dq, dk, dv) in the layout of query, key, value. lse and grad_lse: (B, H_q, S_q)
    float32. capability: the device's, when the caller has it already."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    capability = _capability(query.device) if capability is None else capability
    version = backward_version(query.shape[-1], capability=capability, deterministic=deterministic)
    return _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version)


@torch.library.custom_op("lab::attention_backward", mutates_args=())
def _attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None, is_causal: bool,
                           scale: float, deterministic: bool, version: str
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version)


@_attention_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, grad_lse, is_causal, scale, deterministic, version):
    return grad_like(query), grad_like(key), grad_like(value)


def _setup_context(ctx, inputs, output):
    query, key, value, is_causal, scale, _version = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse)
    ctx.is_causal, ctx.scale, ctx.eager = is_causal, scale, False
    ctx.set_materialize_grads(False)  # an unused lse gets no zero gradient tensor


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    if grad_lse is not None:
        grad_lse = grad_lse.contiguous()
    deterministic = torch.are_deterministic_algorithms_enabled()
    capability = _capability(query.device) if query.is_cuda else ()
    version = backward_version(query.shape[-1], capability=capability, deterministic=deterministic)
    # The eager autograd.Function below calls the implementation itself; a traced backward needs the op.
    run = _bwd_impl if ctx.eager else _attention_backward_op
    dq, dk, dv = run(grad_out, query, key, value, out, lse, grad_lse, ctx.is_causal, ctx.scale, deterministic,
                     version)
    return dq, dk, dv, None, None, None


class EagerAttention(torch.autograd.Function):
    """lab::attention's forward and backward for the eager calls that want gradients and leave the default call
    (an explicit version=, padded or lower-right calls); the default call runs as a C++ node (lab.backward.node).

    Why: in a cold timing (an L2 flush, then one backward) the host time is not hidden, and the torch.library
    path (register_autograd's wrapper, then the backward custom op's dispatch) costs several times what a
    torch.autograd.Function does (CPU box: ~210 us against ~85 us per torch.autograd.grad;
    outputs/driver_logs/20261125-h100-bwd-hopper/ shows the GPU work of the two paths is the same). torch.compile,
    export and fake tensors still see the custom ops, whose autograd is _backward too.
    """

    @staticmethod
    def forward(ctx, query, key, value, is_causal, scale, version, impl):
        out, lse = impl(query, key, value, is_causal, scale, version)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.is_causal, ctx.scale, ctx.eager = is_causal, scale, True
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        return _backward(ctx, grad_out, grad_lse) + (None,)


def register() -> None:
    """Make lab::attention differentiable; lab.ops calls this once it has defined the op (idempotent)."""
    register_autograd_once("lab::attention", _backward, _setup_context)
