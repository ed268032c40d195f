"""Head dims without a kernel of their own, and value head dims other than the query's, on the kernels that
exist: zero columns appended to query, key and value. Kernels: 64 and 128 (forward and backward on every GPU),
192 and 256 (forward fwd v10 on compute capability 9.0, backward bwd v19 there, bwd v09 elsewhere): every D_qk, D_v
from 1 to 256 runs on the next of these, gradients included.

Why it is exact: appended zero columns add 0 to every score q·k, and the output's extra columns (P times zero
values) are cut off; the softmax scale is the caller's (1/sqrt of the true D_qk), never the padded width's.
The padding is plain torch (F.pad, a slice), so autograd carries the gradients back to the unpadded tensors
and torch.compile traces it. The cost is the wider kernel's (D = 80 and 96 run the D = 128 kernel: 1.6x and
1.33x its FLOPs) plus the copies, bytes per token that do not shrink with S; chapter n14 races the padded
cells (lab.cases.head_dim_cases, and D = 200 among the wide ones) against SDPA. On compute capability 9.0 a call
with D_qk = D_v a multiple of 8 below 256 skips the copies (`narrow`): fwd v05 / v07 (up to 128) and v10 (above)
read the tensors through maps over the true D, whose out-of-bounds fill gives the same zero columns, and below
128 its gradients run the same way on bwd v20 (outside deterministic mode); a call that trains above 128 pads.
The masked calls (window_size / softcap / sinks: lab.masks.op) pad the same way, to masked v11 / v08 at 64 / 128 and
masked v12 at 192 / 256 (compute capability 9.0); a packed masked call pads D 129-255 (masked_varlen_width).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels import resolve_version
from ..op_common import _capability, _check_cuda, _check_qkv_own_dv, _scale
from ..registry import (BEST_FWD, FAST_HEAD_DIMS, FWD, FWD_HEAD_DIMS, NARROW_FWD, WIDE_HEAD_DIMS,
                        default_attention_version, narrow_backward_dim)


def kernel_head_dim(d_qk: int, d_v: int) -> int | None:
    """The smallest kernel head dim that holds both, or None when both are already one (same D, a kernel's)."""
    if d_qk == d_v and d_qk in FWD_HEAD_DIMS:
        return None
    wide = max(d_qk, d_v)
    for d in FWD_HEAD_DIMS:
        if d >= wide:
            return d
    raise ValueError(f"head dims query/key {d_qk}, value {d_v}: lab.ops.attention runs D_qk and D_v up to "
                     f"{FWD_HEAD_DIMS[-1]} (kernels at {list(FWD_HEAD_DIMS)}, smaller dims padded to the next; "
                     f"{list(WIDE_HEAD_DIMS)} on compute capability 9.0 only); "
                     f"use F.scaled_dot_product_attention for wider heads")


def attention_version(query, version=None, is_causal: bool = False) -> str:
    """The forward kernel lab.ops.attention runs for this query: `version` checked, or the default for its
    head dim (BEST_FWD order). Device-specific defaults belong here, cached per device."""
    if version is None:
        head_dim = kernel_head_dim(query.shape[-1], query.shape[-1]) or query.shape[-1]
        return default_attention_version(head_dim, query.shape[2], is_causal, _capability(query.device))
    return resolve_version(version, FWD, query.shape[-1], BEST_FWD)


def no_deterministic_backward(d_qk: int, d_v: int) -> bool:
    """True when the call's kernel head dim has no deterministic backward (192, 256: bwd v19's and v09's dQ atomics)."""
    return (kernel_head_dim(d_qk, d_v) or d_qk) not in FAST_HEAD_DIMS


def refuse_gradients(query, key, value) -> None:
    """NotImplementedError when a gradient is wanted through a head dim above 128 under
    torch.use_deterministic_algorithms(True) (checked before the forward runs, so the error names the cause
    rather than a kernel refusing the mode at backward time)."""
    if not torch.are_deterministic_algorithms_enabled() or not torch.is_grad_enabled():
        return
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in (query, key, value)):
        raise NotImplementedError(
            f"head dims query/key {query.shape[-1]}, value {value.shape[-1]}: lab.ops.attention has no deterministic "
            f"backward above D = {FAST_HEAD_DIMS[-1]} (bwd v19 and v09 add dQ by atomics, in no fixed order); turn "
            f"torch.use_deterministic_algorithms off for this call, or use F.scaled_dot_product_attention")


def needs_padding(query, value) -> bool:
    """True when this call runs through pad_and_attend: a head dim without a fast kernel, or D_v != D_qk."""
    return isinstance(query, torch.Tensor) and isinstance(value, torch.Tensor) and query.dim() == 4 and \
        value.dim() == 4 and (query.shape[-1] != value.shape[-1] or query.shape[-1] not in FWD_HEAD_DIMS)


def narrow_dim(d: int) -> bool:
    """A head dim that a NARROW_FWD kernel reads unpadded: a multiple of 8 below 256 that is no kernel's own
    (kernels/common/hopper/attn_fwd_sm90.cuh's narrow_head_dim, which the launchers check again)."""
    return 0 < d < FWD_HEAD_DIMS[-1] and d % 8 == 0 and d not in FWD_HEAD_DIMS


def narrow(query, key, value, version: str) -> bool:
    """True when `version` runs this call with no padded copies: a NARROW_FWD version, D_qk = D_v a narrow_dim,
    and, when a gradient is wanted, a D below 128 outside deterministic mode (its backward, NARROW_BWD's bwd v20,
    reads and writes the true D too; above 128 and in deterministic mode a call that trains pads). Its tensor maps
    run over the true D and TMA fills the missing columns with zeros: the padding without its copies, bytes per
    token that chapter n14's padded cells pay at every S."""
    d = query.shape[-1]
    if version not in NARROW_FWD or d != value.shape[-1] or not narrow_dim(d):
        return False
    if not (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                            for t in (query, key, value))):
        return True
    return narrow_backward_dim(d) and not torch.are_deterministic_algorithms_enabled()


def masked_varlen_width(d: int, dims) -> int | None:
    """The masked kernel head dim a packed call (lab.ops.attention_varlen, D_qk = D_v = d) runs at, given the head dims
    the device's masked kernels take (`dims`): d itself when one takes it; above 128 the next of 192 / 256 that the
    device has (masked v12 on compute capability 9.0), the zero columns appended as pad_and_attend does; else None
    (below 128 the packed call runs 64 and 128 only; the dense call pads every dim)."""
    if d in dims:
        return d
    if d <= FAST_HEAD_DIMS[-1]:
        return None
    return next((w for w in WIDE_HEAD_DIMS if w >= d and w in dims), None)


def aligned_rows(t: torch.Tensor, line: int = 128) -> torch.Tensor:
    """t itself when each of its rows (the last dim, at every batch, head and position) starts on a `line`-byte
    boundary, else a copy whose rows do: a view of the first D columns of a buffer whose row pitch is D rounded up
    to the line. Why: a narrow call's tensor maps read rows of D elements, and at D = 200 (400-byte rows) TMA's
    128-byte boxes start off the 128-byte lines of L2 in 7 rows of 8 (outputs/experiments/20261126-head-dims-d200-aligned.json
    has the profile). Measured
    with lab.fwd.narrow_gpu.aligned_race; the op does not call it: the copy costs more than the aligned rows save."""
    e = t.element_size()
    if all(n == 1 or (st * e) % line == 0 for n, st in zip(t.shape[:-1], t.stride()[:-1])) and \
            (t.storage_offset() * e) % line == 0:
        return t
    pitch = -(-t.shape[-1] * e // line) * line // e
    out = t.new_empty(*t.shape[:-1], pitch)[..., :t.shape[-1]]
    return out.copy_(t)


def lines_per_row(d: int, width: int, elem: int = 2, pitch: int | None = None, line: int = 128, box: int = 64) -> float:
    """The model behind aligned_rows: L2 lines (128 bytes) that a narrow call's tensor map touches per K or V row,
    averaged over the rows, if each box (64 columns, 128 bytes with 128-byte swizzle) fetches every line its
    in-bounds bytes touch; boxes wholly past d read nothing. pitch: the row pitch in bytes (default d * elem). Against
    the width's own kernel (width / 64 lines): D = 200 at width 256 touches 6.625 lines for 4 (1.66x, the ncu
    profile's 1.68x L2 sectors), D = 160 at 192 4 for 3, D = 80 at 128 2.75 for 2."""
    pitch = pitch or d * elem
    period = line // math.gcd(pitch, line)  # rows after which the offsets within a line repeat
    total = 0
    for r in range(period):
        for c in range(width // box):
            n = min(box, max(0, d - c * box)) * elem
            if n:
                start = (r * pitch + c * box * elem) % line
                total += (start + n + line - 1) // line
    return total / period


def pad_and_attend(attend, query, key, value, scale):
    """Check the shapes (value may have its own head dim), pad to the kernel's head dim, call
    attend(q, k, v, scale) -> (out, lse) on the padded tensors and cut the output back to D_v."""
    _check_qkv_own_dv(query, key, value)
    scale = _scale(scale, query.shape[-1])
    width = kernel_head_dim(query.shape[-1], value.shape[-1])  # every argument before the device
    _check_cuda(query)
    return padded(attend, query, key, value, scale, width)


def padded(attend, query, key, value, scale: float, width: int | None = None):
    """The padding itself (any device, no checks): attend(q, k, v, scale) -> (out, lse) on tensors padded to
    `width` (default: kernel_head_dim's), the output cut back to value's head dim."""
    d_qk, d_v = query.shape[-1], value.shape[-1]
    d = width or kernel_head_dim(d_qk, d_v) or d_qk
    out, lse = attend(F.pad(query, (0, d - d_qk)), F.pad(key, (0, d - d_qk)), F.pad(value, (0, d - d_v)), scale)
    return out[..., :d_v].contiguous(), lse
