"""The backward pass of lab.ops.attention's window_size / softcap / sinks: autograd of the custom op
`lab::attention_masked`, the backward custom op `lab::attention_masked_backward` and its launch.

The kernels (lab.registry.MASKED_BWD, compute capability 9.0: bwd v08 at D 64 / 128, v21 at D 192 / 256; a head
dim between pads up to the next, here for a direct launch and in lab.masks.op's forward for the public call, which
also carries D_v != D_qk) take MaskBwdParams
(kernels/common/hopper/attn_bwd_mask_sm90.cuh: AttnBwdParams, then the window, offset, softcap, sinks and the
sinks' gradient), packed here with one struct.pack and handed to the launcher's address, as lab.masks.op does for
the forward. Autograd saves q, k, v, out, the natural-log LSE (the sink's share included) and the sinks, never P.
d sinks is computed only when sinks.requires_grad. Packed (varlen) calls: lab.masks.varlen_bwd, on the same launch.
"""
from __future__ import annotations

import ctypes
import struct

import torch
import torch.nn.functional as F

from ..kernels import launcher
from ..op_common import _capability, _readable, grad_like, register_autograd_once, run_packed_launcher
from ..registry import BEST_MASKED_BWD, MASKED_BWD

# Masked backward versions that add dQ in a fixed order (a deterministic mode): none, v08 and v21 add it by
# reductions in whatever order the CTAs reach them.
DETERMINISTIC_MASKED_BWD: tuple = ()

_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1}
# AttnBwdParams (q, k, v, o, dout, lse, dlse, dq, dk, dv, delta, lse_log2, dq_accum; eight strides of 3; batch,
# heads_q, heads_kv, seqlen_q, seqlen_k, head_dim; scale; causal, dtype, deterministic), then window_left,
# window_right, diag_offset, softcap, sinks, dsinks, seqlens, then cu_seqlens_q, cu_seqlens_k, total_q, total_k
# (packed tensors read in place: lab.masks.varlen_bwd): no padding anywhere (the C side asserts the sizes).
PARAMS = struct.Struct("<13Q24q6if3i3if3Q2Q2i")
assert PARAMS.size == 400
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_calls: dict = {}
ROW_PAD = 128  # LAB_BWD_ROW_PAD (kernels/common/params.h)


def masked_bwd_version(device, version=None, head_dim: int | None = None) -> str:
    """The masked backward kernel for a device and head dim (None: any the device runs). NotImplementedError where
    none runs: off Hopper, at a head dim no kernel takes, under torch.use_deterministic_algorithms(True) (no masked
    backward has a fixed dQ order); ValueError for a named version that does not exist or take the head dim."""
    capability = _capability(device)
    for name in ((version,) if version is not None else BEST_MASKED_BWD):
        if name not in MASKED_BWD:
            raise ValueError(f"masked backward versions: {sorted(MASKED_BWD)}, got {name!r}")
    runs = [name for name in ((version,) if version is not None else BEST_MASKED_BWD)
            if not MASKED_BWD[name].capabilities or capability in MASKED_BWD[name].capabilities]
    if not runs:
        raise NotImplementedError(f"the backward pass of window_size / softcap / sinks runs on compute capability "
                                  f"{MASKED_BWD[BEST_MASKED_BWD[0]].capabilities} (Hopper) only; this device has "
                                  f"{capability}")
    if head_dim is not None:
        takes = [name for name in runs if head_dim in MASKED_BWD[name].head_dims]
        if not takes:
            dims = sorted({d for name in runs for d in MASKED_BWD[name].head_dims})
            error = ValueError if version is not None else NotImplementedError
            raise error(f"the backward pass of window_size / softcap / sinks at head dim {head_dim}: "
                        f"{version or 'no kernel'} takes it (head dims {dims}; lab.ops.attention pads the others)")
        runs = takes
    if torch.are_deterministic_algorithms_enabled() and runs[0] not in DETERMINISTIC_MASKED_BWD:
        raise NotImplementedError(
            f"the backward pass of window_size / softcap / sinks has no deterministic mode: masked bwd {runs[0]} adds "
            f"dQ by reductions in no fixed order; turn torch.use_deterministic_algorithms off for this call, or call "
            f"it without gradients")
    return runs[0]


def kernel_width(head_dim: int) -> int:
    """The masked backward's kernel head dim for a call's D: itself, or the next kernel's (zero columns are exact:
    lab.fwd.head_dims)."""
    widths = sorted({d for kernel in MASKED_BWD.values() for d in kernel.head_dims})
    for d in widths:
        if d >= head_dim:
            return d
    raise ValueError(f"head dim {head_dim}: the masked backward runs D up to {widths[-1]}")


def launch_backward(grad_out, q, k, v, out, lse, grad_lse, sinks, want_dsinks: bool, left: int, right: int,
                    offset: int, softcap: float, scale: float, version: str | None = None, defines=None,
                    seqlens=None):
    """(dq, dk, dv, dsinks) of a dense masked call; dsinks is an empty tensor unless want_dsinks. seqlens: packed
    sequences padded into the dense tensors (lab.masks.varlen_bwd), int32 (2, B) of their S_q and S_k."""
    D = q.shape[-1]
    if k.shape[-1] != D or v.shape[-1] != D or out.shape[-1] != D:
        raise ValueError(f"head dims: query {D}, key {k.shape[-1]}, value {v.shape[-1]}, out {out.shape[-1]}: the "
                         f"masked backward takes one D (lab.ops.attention pads D_v != D_qk in its forward)")
    width = kernel_width(D)
    if width != D:  # zero columns: the same scores and Delta, the gradients cut back
        pad = (0, width - D)
        dq, dk, dv, dsinks = launch_backward(F.pad(grad_out, pad), F.pad(q, pad), F.pad(k, pad), F.pad(v, pad),
                                             F.pad(out, pad), lse, grad_lse, sinks, want_dsinks, left, right, offset,
                                             softcap, scale, version, defines, seqlens)
        return dq[..., :D].contiguous(), dk[..., :D].contiguous(), dv[..., :D].contiguous(), dsinks
    version = masked_bwd_version(q.device, version, D)
    key = (version, tuple(sorted(defines.items())) if defines else ())
    call = _calls.get(key)
    if call is None:
        call = _calls[key] = _LAUNCH(launcher(MASKED_BWD, version, defines))
    dq, dk, dv = grad_like(q), grad_like(k), grad_like(v)  # the inputs' layout (as the fake below says)
    q, k, v, out, dout = (_readable(t) for t in (q, k, v, out, grad_out))
    lse = lse.contiguous()
    dlse = grad_lse.contiguous() if grad_lse is not None else None
    B, Hq, Sq, D = q.shape
    dsinks = torch.zeros(Hq if want_dsinks else 0, dtype=torch.float32, device=q.device)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_(), dsinks
    padded = B * Hq * ((Sq + ROW_PAD - 1) // ROW_PAD * ROW_PAD)
    work = torch.empty(2 * padded + padded * D, dtype=torch.float32, device=q.device)
    base = work.data_ptr()
    strides = tuple(x for t in (q, k, v, out, dout, dq, dk, dv) for x in t.stride()[:3])
    params = PARAMS.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(),
                         dlse.data_ptr() if dlse is not None else 0, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                         base, base + 4 * padded, base + 8 * padded, *strides, B, Hq, k.shape[1], Sq, k.shape[2], D,
                         scale, int(right >= 0), _DTYPE_CODE[q.dtype], 0, left, right, offset, softcap,
                         sinks.data_ptr() if sinks is not None else 0, dsinks.data_ptr() if want_dsinks else 0,
                         seqlens.data_ptr() if seqlens is not None else 0, 0, 0, 0, 0)
    run_packed_launcher(call, params, q.device, f"masked attention backward kernel {version}")
    return dq, dk, dv, dsinks


@torch.library.custom_op("lab::attention_masked_backward", mutates_args=())
def _masked_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None,
                        sinks: torch.Tensor | None, want_dsinks: bool, left: int, right: int, offset: int,
                        softcap: float, scale: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_backward(grad_out, query, key, value, out, lse, grad_lse, sinks, want_dsinks, left, right, offset,
                           softcap, scale)


@_masked_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, grad_lse, sinks, want_dsinks, left, right, offset, softcap, scale):
    padded = kernel_width(query.shape[-1]) != query.shape[-1]  # the gradients cut back from padded ones: contiguous
    like = (lambda t: t.new_empty(t.shape)) if padded else grad_like
    return (like(query), like(key), like(value),
            query.new_empty((query.shape[1] if want_dsinks else 0,), dtype=torch.float32))


def _setup_context(ctx, inputs, output):
    query, key, value, sinks, left, right, offset, softcap, scale, _version = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, sinks)
    ctx.mask = (left, right, offset, softcap, scale)
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse):
    query, key, value, out, lse, sinks = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    want_dsinks = sinks is not None and ctx.needs_input_grad[3]
    dq, dk, dv, dsinks = _masked_backward_op(grad_out, query, key, value, out, lse, grad_lse, sinks, want_dsinks,
                                             *ctx.mask)
    return dq, dk, dv, (dsinks if want_dsinks else None), None, None, None, None, None, None


class EagerMasked(torch.autograd.Function):
    """lab::attention_masked's forward and backward for plain eager calls that want gradients: the custom op's
    autograd wrapper and the backward op's dispatch cost more host time than the kernels of a short call
    (lab.backward.op.EagerAttention has the measurement); torch.compile and fake tensors still see the ops."""

    @staticmethod
    def forward(ctx, query, key, value, sinks, left, right, offset, softcap, scale, version, impl):
        out, lse = impl(query, key, value, sinks, left, right, offset, softcap, scale, version)
        ctx.save_for_backward(query, key, value, out, lse, sinks)
        ctx.mask = (left, right, offset, softcap, scale)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        query, key, value, out, lse, sinks = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        want_dsinks = sinks is not None and ctx.needs_input_grad[3]
        dq, dk, dv, dsinks = launch_backward(grad_out, query, key, value, out, lse, grad_lse, sinks, want_dsinks,
                                             *ctx.mask)
        return dq, dk, dv, (dsinks if want_dsinks else None), None, None, None, None, None, None, None


def register() -> None:
    """Make lab::attention_masked differentiable (lab.masks.op calls this once it has defined the op)."""
    register_autograd_once("lab::attention_masked", _backward, _setup_context)
