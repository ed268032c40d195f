"""The backward pass of lab.ops.attention_varlen: packed (total, H, D) sequences through bwd v08 (D 64 / 128) and
bwd v21 (D 192 / 256, through the padded copies: lab.masks.backward picks the kernel by head dim).

In place (the default where the kernel takes the call: bwd v08, D 64 / 128): bwd v08 reads and writes the packed
tensors themselves (MaskBwdParams::cu_seqlens_q / _k; kernels/common/hopper/attn_bwd_packed_sm90.cuh): a grid of key
slots per sequence, tensor maps over the packed rows, workspaces in per-sequence 128-aligned rows of
[H_q][floor((total_q + 128 B) / 128) 128], the rows of no sequence zeroed on the device; no host sync, max_seqlen_q /
_k stay host ints as in the forward.

Padded (layout="padded", and every call the in-place kernel does not take): the packed tensors copied into
right-padded dense buffers of max_seqlen rows (each sequence's rows first, the rest zeros; LSE +inf there, so no
padded row has a probability), the dense masked launch with every rule per sequence (MaskBwdParams::seqlens), the
gradients copied back, with gathers indexed on the device from cu_seqlens. The padding costs memory and the copies
(B max_seqlen H D elements each way), not tiles.

pad / unpad are plain torch (any device), so the CPU tests check them with lab.masks.emulate.backward_varlen.
"""
from __future__ import annotations

import contextlib
import functools

import torch


from ..op_common import _readable, register_autograd_once, run_packed_launcher
from . import backward, dense_route

IN_PLACE = ("v08",)  # masked backward versions that read packed tensors in place (MaskBwdParams::cu_seqlens_q)
IN_PLACE_DIMS = (64, 128)
LAYOUT: str | None = None  # the layout of a call that names none (an A/B of the two sets "padded")
DEFINES: dict | None = None  # the kernel build of a call that names none (an A/B of the public op sets one)
ALIGN = 128  # kPackedAlign (common/hopper/attn_bwd_packed_sm90.cuh): workspace rows of a sequence, keys of a slot


@contextlib.contextmanager
def default_build(layout: str | None = None, defines: dict | None = None):
    """Inside the block, calls that name no layout or build run as `layout` and `defines` (an A/B of the public op,
    whose autograd node names neither); the values before come back on leaving."""
    global LAYOUT, DEFINES
    before, (LAYOUT, DEFINES) = (LAYOUT, DEFINES), (layout, defines)
    try:
        yield
    finally:
        LAYOUT, DEFINES = before


def lengths(cu: torch.Tensor, max_len: int) -> torch.Tensor:
    """Each sequence's length, clamped to [0, max_len] (unchecked cu_seqlens must not read out of bounds)."""
    return (cu[1:] - cu[:-1]).clamp(0, max_len)


def pad(x: torch.Tensor, cu: torch.Tensor, max_len: int, fill: float = 0.0) -> torch.Tensor:
    """Packed (total, H, ...) -> (B, H, max_len, ...): sequence b's rows first in entry b, `fill` after them."""
    B = cu.shape[0] - 1
    rows = torch.arange(max_len, device=x.device)
    valid = rows[None] < lengths(cu, max_len).to(x.device)[:, None]
    if x.shape[0] == 0:
        dense = x.new_full((B, max_len) + tuple(x.shape[1:]), fill)
    else:
        index = (cu[:-1].to(x.device).long()[:, None] + rows[None]).clamp_(0, x.shape[0] - 1)
        dense = x[index].masked_fill_(~valid.view(B, max_len, *([1] * (x.dim() - 1))), fill)
    return dense.transpose(1, 2)


def unpad(dense: torch.Tensor, cu: torch.Tensor, total: int) -> torch.Tensor:
    """(B, H, max_len, ...) -> packed (total, H, ...): row t from its sequence's entry, zeros for rows of none."""
    B, max_len = dense.shape[0], dense.shape[2]
    t = torch.arange(total, device=dense.device, dtype=torch.int32)
    cu = cu.to(dense.device)
    if B == 0 or max_len == 0 or total == 0:
        return dense.new_zeros((total, dense.shape[1]) + tuple(dense.shape[3:]))
    b = torch.searchsorted(cu[1:].contiguous(), t, right=True)  # the sequence of row t (B: past the last)
    bc = b.clamp(max=B - 1)
    r = t.long() - cu[bc].long()
    valid = (b < B) & (r >= 0) & (r < max_len)
    rows = dense.transpose(1, 2)[bc, r.clamp(0, max_len - 1)]
    return rows.masked_fill_(~valid.view(total, *([1] * (rows.dim() - 1))), 0)


def launch(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks: bool, max_q: int, max_k: int,
           left: int, right: int, softcap: float, scale: float, version: str | None = None, defines=None,
           layout: str | None = None, poison_workspace: bool = False):
    """(dq, dk, dv, dsinks) of a packed call: q, out, grad_out (total_q, H_q, D), k, v (total_k, H_kv, D), lse and
    grad_lse (H_q, total_q) or None. layout: "packed" (the kernel reads the packed tensors; ValueError where it
    cannot), "padded" (dense copies), None: packed where the kernel takes the call. poison_workspace (checks only):
    the packed path's workspace (Delta, LSE log2 e, dq_accum) filled with NaN before the launch, so a pass that
    leaves any of it unwritten shows in the gradients; the caching allocator cannot be relied on for that."""
    if layout not in (None, "packed", "padded"):
        raise ValueError(f"layout must be None, 'packed' or 'padded', got {layout!r}")
    layout = layout or LAYOUT
    defines = defines if defines is not None else DEFINES
    B = cu_q.shape[0] - 1
    dsinks = torch.zeros(q.shape[1] if want_dsinks else 0, dtype=torch.float32, device=q.device)
    if B == 0 or max_q == 0 or max_k == 0 or q.shape[0] == 0 or k.shape[0] == 0:
        if want_dsinks and grad_lse is not None:  # no row sees a key: O = 0, LSE = sink, so d sink = sum of dLSE
            dsinks += torch.where(torch.isfinite(lse), grad_lse, 0.0).sum(1)  # (rows of no sequence: LSE -inf)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dsinks
    in_place = q.shape[-1] in IN_PLACE_DIMS and backward.masked_bwd_version(q.device, version) in IN_PLACE
    if layout == "packed" and not in_place:
        raise ValueError(f"the packed layout runs masked bwd {IN_PLACE} at D {IN_PLACE_DIMS}; got "
                         f"{version or 'the default'} at D {q.shape[-1]}")
    if in_place and layout != "padded":
        return launch_packed(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks, max_q, max_k,
                             left, right, softcap, scale, version, defines, poison_workspace)
    qd, od, god = (pad(t, cu_q, max_q) for t in (q, out, grad_out))
    kd, vd = (pad(t, cu_k, max_k) for t in (k, v))
    lsed = pad(lse.t().unsqueeze(-1), cu_q, max_q, float("inf")).squeeze(-1).contiguous()
    dlsed = None if grad_lse is None else pad(grad_lse.t().unsqueeze(-1), cu_q, max_q).squeeze(-1).contiguous()
    seqlens = torch.stack((lengths(cu_q, max_q), lengths(cu_k, max_k))).to(torch.int32).contiguous()
    dq, dk, dv, ds = backward.launch_backward(god, qd, kd, vd, od, lsed, dlsed, sinks, want_dsinks, left, right, 0,
                                              softcap, scale, version, defines, seqlens=seqlens)
    return unpad(dq, cu_q, q.shape[0]), unpad(dk, cu_k, k.shape[0]), unpad(dv, cu_k, k.shape[0]), ds


def packed_layout(cu_q: list[int], cu_k: list[int], max_q: int, max_k: int) -> dict:
    """The in-place kernel's arithmetic on the host, for the CPU tests (common/hopper/attn_bwd_packed_sm90.cuh
    computes the same on the device from cu_seqlens): each sequence's clamped rows, workspace start
    ws(b) = floor((cu_q[b] + 128 b) / 128) 128 and first key slot floor((cu_k[b] + 128 b) / 128); R and the slot
    count; slot -> (sequence, key block) by the kernel's search (None: a slot with no key block)."""
    B, total_q, total_k = len(cu_q) - 1, cu_q[-1], cu_k[-1]

    def clamp(x, lo, hi):
        return min(max(x, lo), hi)
    seqs = []
    for b in range(B):
        qa, ka = clamp(cu_q[b], 0, total_q), clamp(cu_k[b], 0, total_k)
        sq = min(clamp(cu_q[b + 1], qa, total_q) - qa, max_q)
        sk = min(clamp(cu_k[b + 1], ka, total_k) - ka, max_k)
        seqs.append(dict(qa=qa, sq=sq, ka=ka, sk=sk, ws=(qa + ALIGN * b) // ALIGN * ALIGN,
                         slot=(ka + ALIGN * b) // ALIGN))
    slots = (total_k + ALIGN * B) // ALIGN
    mapping = []
    for slot in range(slots):
        b = max([i for i in range(B) if seqs[i]["slot"] <= slot], default=0)
        nb = slot - seqs[b]["slot"]
        mapping.append((b, nb) if 0 <= nb and nb * ALIGN < seqs[b]["sk"] else None)
    return dict(seqs=seqs, rows=(total_q + ALIGN * B) // ALIGN * ALIGN, slots=slots, mapping=mapping)


def launch_packed(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks: bool, max_q: int,
                  max_k: int, left: int, right: int, softcap: float, scale: float, version: str | None = None,
                  defines=None, poison_workspace: bool = False):
    """launch's in-place path: one MaskBwdParams over the packed tensors (strides {unused, head, token})."""
    version = backward.masked_bwd_version(q.device, version)
    key = (version, tuple(sorted(defines.items())) if defines else ())
    call = backward._calls.get(key)
    if call is None:
        call = backward._calls[key] = backward._LAUNCH(backward.launcher(backward.MASKED_BWD, version, defines))
    q, k, v, out, dout = (_readable(t) for t in (q, k, v, out, grad_out))
    lse = lse.contiguous()
    dlse = grad_lse.contiguous() if grad_lse is not None else None
    cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
    B, (total_q, Hq, D), total_k = cu_q.shape[0] - 1, q.shape, k.shape[0]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = torch.zeros(Hq if want_dsinks else 0, dtype=torch.float32, device=q.device)
    rows = Hq * ((total_q + ALIGN * B) // ALIGN * ALIGN)  # Delta, LSE log2 e: H_q R floats each; dq_accum: D times
    work = torch.empty(rows * (2 + D), dtype=torch.float32, device=q.device)
    if poison_workspace:
        work.fill_(float("nan"))
    base = work.data_ptr()
    strides = tuple(x for t in (q, k, v, out, dout, dq, dk, dv) for x in (0, t.stride(1), t.stride(0)))
    params = backward.PARAMS.pack(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr(), lse.data_ptr(),
        dlse.data_ptr() if dlse is not None else 0, dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), base,
        base + 4 * rows, base + 8 * rows, *strides, B, Hq, k.shape[1], max_q, max_k, D, scale, int(right >= 0),
        backward._DTYPE_CODE[q.dtype], 0, left, right, 0, softcap, sinks.data_ptr() if sinks is not None else 0,
        dsinks.data_ptr() if want_dsinks else 0, 0, cu_q.data_ptr(), cu_k.data_ptr(), total_q, total_k)
    run_packed_launcher(call, params, q.device, f"packed attention backward kernel {version}")
    return dq, dk, dv, dsinks


@torch.library.custom_op("lab::attention_varlen_backward", mutates_args=())
def _varlen_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, grad_lse: torch.Tensor | None, cu_seqlens_q: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, sinks: torch.Tensor | None, want_dsinks: bool, max_seqlen_q: int,
                        max_seqlen_k: int, left: int, right: int, softcap: float, scale: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch(grad_out, query, key, value, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, sinks, want_dsinks,
                  max_seqlen_q, max_seqlen_k, left, right, softcap, scale)


@_varlen_backward_op.register_fake
def _(grad_out, query, key, value, out, lse, grad_lse, cu_seqlens_q, cu_seqlens_k, sinks, want_dsinks, max_seqlen_q,
      max_seqlen_k, left, right, softcap, scale):
    return (query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape),
            query.new_empty((query.shape[1] if want_dsinks else 0,), dtype=torch.float32))


_NONE_AFTER_SINKS = (None,) * 7  # max_seqlen_q, max_seqlen_k, left, right, softcap, scale, version


def _setup_context(ctx, inputs, output):
    query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, _version = inputs
    ctx.save_for_backward(query, key, value, output[0], output[1], cu_q, cu_k, sinks)
    ctx.mask = (max_q, max_k, left, right, softcap, scale)
    ctx.set_materialize_grads(False)


def _grads(ctx, grad_out, grad_lse, op):
    query, key, value, out, lse, cu_q, cu_k, sinks = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    want_dsinks = sinks is not None and ctx.needs_input_grad[5]
    dq, dk, dv, dsinks = op(grad_out, query, key, value, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks,
                            *ctx.mask)
    return (dq, dk, dv, None, None, dsinks if want_dsinks else None) + _NONE_AFTER_SINKS


def _backward(ctx, grad_out, grad_lse):
    return _grads(ctx, grad_out, grad_lse, _varlen_backward_op)


class EagerVarlen(torch.autograd.Function):
    """lab::attention_varlen and its backward for plain eager calls that want gradients (the custom op's autograd
    wrapper costs host time, as for lab.masks.backward.EagerMasked); torch.compile still sees the ops."""

    @staticmethod
    def forward(ctx, query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version, impl,
                dense_shape=None):
        out, lse = impl(query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version)
        _setup_context(ctx, (query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale,
                             version), (out, lse))
        ctx.dense_shape = dense_shape  # the forward took lab.masks.dense_route: so does the backward
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        op = launch if ctx.dense_shape is None else functools.partial(dense_route.dense_backward,
                                                                       shape=ctx.dense_shape)
        return _grads(ctx, grad_out, grad_lse, op) + (None, None)


def register() -> None:
    """Make lab::attention_varlen differentiable (lab.masks.op calls this once it has defined the op)."""
    register_autograd_once("lab::attention_varlen", _backward, _setup_context)
