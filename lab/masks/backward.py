"""The backward pass of lab.ops.attention's window_size / softcap / sinks: autograd of the custom op
`lab::attention_masked`, the backward custom op `lab::attention_masked_backward` and its launch.

The kernel (lab.registry.MASKED_BWD: bwd v08, compute capability 9.0) takes MaskBwdParams
(kernels/common/hopper/attn_bwd_mask_sm90.cuh: AttnBwdParams, then the window, offset, softcap, sinks and the
sinks' gradient), packed here with one struct.pack and handed to the launcher's address, as lab.masks.op does for
the forward. Autograd saves q, k, v, out, the natural-log LSE (the sink's share included) and the sinks, never P.
d sinks is computed only when sinks.requires_grad. Packed (varlen) calls: lab.masks.varlen_bwd, on the same launch.
"""
from __future__ import annotations

import ctypes
import struct

import torch

from ..kernels import launcher
from ..op_common import _capability, _readable, register_autograd_once
from ..registry import BEST_MASKED_BWD, MASKED_BWD

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


def masked_bwd_version(device, version=None) -> str:
    """The masked backward kernel for a device (NotImplementedError where none runs)."""
    capability = _capability(device)
    for name in ((version,) if version is not None else BEST_MASKED_BWD):
        if name not in MASKED_BWD:
            raise ValueError(f"masked backward versions: {sorted(MASKED_BWD)}, got {name!r}")
        if not MASKED_BWD[name].capabilities or capability in MASKED_BWD[name].capabilities:
            return name
    raise NotImplementedError(f"the backward pass of window_size / softcap / sinks runs on compute capability "
                              f"{MASKED_BWD[BEST_MASKED_BWD[0]].capabilities} (Hopper) only; this device has "
                              f"{capability}")


def launch_backward(grad_out, q, k, v, out, lse, grad_lse, sinks, want_dsinks: bool, left: int, right: int,
                    offset: int, softcap: float, scale: float, version: str | None = None, defines=None,
                    seqlens=None):
    """(dq, dk, dv, dsinks) of a dense masked call; dsinks is an empty tensor unless want_dsinks. seqlens: packed
    sequences padded into the dense tensors (lab.masks.varlen_bwd), int32 (2, B) of their S_q and S_k."""
    version = masked_bwd_version(q.device, version)
    key = (version, tuple(sorted(defines.items())) if defines else ())
    call = _calls.get(key)
    if call is None:
        call = _calls[key] = _LAUNCH(launcher(MASKED_BWD, version, defines))
    q, k, v, out, dout = (_readable(t) for t in (q, k, v, out, grad_out))
    lse = lse.contiguous()
    dlse = grad_lse.contiguous() if grad_lse is not None else None
    B, Hq, Sq, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
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
    with torch.cuda.device(q.device):
        rc = call(params, ctypes.c_void_p(torch.cuda.current_stream(q.device).cuda_stream))
    if rc != 0:
        raise RuntimeError(f"masked attention backward kernel {version} failed with code {rc} "
                           f"(LAB_E_* < 0, or a cudaError_t)")
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
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
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
