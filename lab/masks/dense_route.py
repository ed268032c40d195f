"""Packed sequences of one length through the dense default kernel: lab.ops.attention_varlen's forward when the
host has checked cu_seqlens and every sequence has S_q query rows and S_k keys.

Why: packed (total, H, D) rows whose cu_seqlens are [0, S, 2 S, ..., n S] ARE a dense [n, S, H, D] tensor (a view,
no copy), and the dense default (fwd v07 at D 64 / 128: the persistent PAIR order for causal rows) ran 8 x 2048
causal rows in 1 / 1.19 of the packed kernel's time (fwd v11's packed grid, non-persistent: chapter n13's race).

When: the decision needs cu_seqlens' values on the host: a checked call (check_cu_seqlens=True, one device-to-host
copy the call pays anyway), or cu_seqlens given on the CPU (lab.masks.op reads them with no sync and copies them to
the device through pinned memory: the route without waiting for the device). max_seqlen_q / _k play no part: the
lengths are read from the checked copy, so an untruthful max (already refused there when too small) cannot pick
this route; an unchecked call (check_cu_seqlens=False: no host copy, no sync) never takes it, because q.shape[0] ==
n max_seqlen_q does not prove equal lengths (rows of no sequence are allowed past cu_seqlens_q[-1]) and the dense
kernel cannot read cu_seqlens to refuse a batch that is not uniform. The route takes only the masks whose dense
meaning is the packed one on the dense default kernel: no window, softcap or sinks, and causal only when S_q = S_k
(the packed causal is bottom-right per sequence; the dense default's is top-left, equal only on square blocks). Any
other mask stays on the packed kernel (the masked dense call runs the same fwd v11, measured 1.03x faster than its
packed grid: too little to carry a second route). GQA, rows of no sequence past cu_seqlens_q[-1] (zeros, LSE -inf)
and past cu_seqlens_k[-1] (not read) are kept.

The dense forward hands O in the packed layout (written in place through the [n, H, S, D] view) and LSE
(H_q, total_q) (the dense kernel's (n, H_q, S_q) copied over: 4 bytes a row and head). The backward of a routed call
takes the route too (dense_backward): the dense default backward on the same views, its gradients in their layout
(lab.op_common.grad_like), so they are the packed rows with no copy. It was the packed backward while the dense one
returned contiguous gradients and paid a transposing copy of each on the way back (0.86x the dense op's time then);
on the gradients' own layout the dense kernel runs these tiles in 0.87x the packed kernel's time
(outputs/experiments/20261130-bwd-gradients-in-the-inputs-layout.json).

Measured on an H200 (8 x 2048, D 128, causal): with cu_seqlens on the host the public call is 1.009x the dense
op's forward (outputs/experiments/20261129-masks-varlen-one-length-dense-route.json), and with the backward on the
route 1.007x its backward and 1.009x forward + backward (outputs/experiments/20261130-masks-route-backward.json).
The unchecked call cannot take the route: 1.07x forward (fwd v11's packed grid); its backward, on the packed kernel's
causal steps, 0.96x the dense op's and forward + backward 0.99x (outputs/experiments/20261130-masks-packed-bwd-causal-
steps.json; the packed dK / dV kernel had run 15 % behind bwd v14 on the window rule's steps).
"""
from __future__ import annotations

import torch

from .. import build
from ..kernels import launcher
from ..fwd.head_dims import attention_version
from ..backward.op import default_backward
from ..op_common import _readable, varlen_outputs
from ..registry import FWD
from . import spec

taken = [0]  # calls that took the route (the GPU checks read it: a check of the route must have used it)


def uniform_shape(host_q: list, host_k: list) -> tuple | None:
    """(n, S_q, S_k) when host cu_seqlens_q = [0, S_q, ..., n S_q] and cu_seqlens_k = [0, S_k, ..., n S_k] with
    n, S_q, S_k >= 1; else None."""
    n = len(host_q) - 1
    if n < 1 or len(host_k) != n + 1:
        return None
    sq, sk = host_q[1] - host_q[0], host_k[1] - host_k[0]
    if sq < 1 or sk < 1 or host_q[0] != 0 or host_k[0] != 0:
        return None
    if any(x != b * sq for b, x in enumerate(host_q)) or any(x != b * sk for b, x in enumerate(host_k)):
        return None
    return n, sq, sk


def route(host_q: list, host_k: list, mask: spec.Mask, sinks, version) -> tuple | None:
    """The dense route's shape (n, S_q, S_k), or None: stay packed. host_q / host_k: the checked host copies of
    cu_seqlens (empty: unchecked call). A named version is a kernel the caller asked for: it is run as named."""
    if version is not None or not host_q or not host_k or sinks is not None or mask.softcap or mask.left != -1 \
            or mask.right not in (-1, 0):
        return None
    shape = uniform_shape(host_q, host_k)
    if shape is None or (mask.right == 0 and shape[1] != shape[2]):
        return None
    return shape


def dense_views(t: torch.Tensor, n: int, s: int) -> torch.Tensor:
    """The first n s rows of a packed (total, H, D) tensor as a (n, H, s, D) view (no copy, any strides; one
    as_strided where slice, unflatten and transpose were three views' host time)."""
    st = t.stride()
    return t.as_strided((n, t.shape[1], s, t.shape[2]), (s * st[0], st[1], st[0], st[2]), t.storage_offset())


def lse_to_packed(lse_dense: torch.Tensor, lse: torch.Tensor) -> None:
    """Copy the dense kernel's (n, H, S) LSE into the first n S columns of the packed (H, total) LSE."""
    n, h, s = lse_dense.shape
    lse[:, :n * s].view(h, n, s).copy_(lse_dense.transpose(0, 1))


def run_dense(qd, kd, vd, od, lse_dense, causal: bool, scale: float) -> None:
    """The dense default kernel on (B, H, S, D) views, O written into od in place (its strides: the packed rows)."""
    name = attention_version(qd, None, causal)
    build.binding().attn_fwd(launcher(FWD, name), qd, kd, vd, od, lse_dense, scale, causal, None)


def dense_impl(query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version,
               want_lse=True, rows_q=None, shape=None, run=None):
    """lab.masks.op._varlen_impl's contract (packed O, LSE (H_q, total_q) or None) on the dense route: shape is
    route()'s (n, S_q, S_k); run(qd, kd, vd, od, lse_dense, causal, scale) is the kernel (run_dense; tests pass the
    reference)."""
    n, sq, sk = shape
    q, k, v = (_readable(t) for t in (query, key, value))
    out, lse = varlen_outputs(q, want_lse, rows_q)
    lse_dense = torch.empty((n, q.shape[1], sq), dtype=torch.float32, device=q.device) if want_lse else None
    (run or run_dense)(dense_views(q, n, sq), dense_views(k, n, sk), dense_views(v, n, sk), dense_views(out, n, sq),
                       lse_dense, right == 0, scale)
    if want_lse:
        lse_to_packed(lse_dense, lse)
    taken[0] += 1
    return out, lse


def _to_packed(g: torch.Tensor, like: torch.Tensor, n: int, s: int) -> torch.Tensor:
    """(n, H, s, D) gradient -> packed (total, H, D) like `like`: a view when g lies in (n, s, H, D) order (the
    gradient of dense_views of a contiguous packed tensor), zero rows for rows of no sequence."""
    rows = g.transpose(1, 2).reshape(n * s, g.shape[1], g.shape[3])
    if like.shape[0] == n * s:
        return rows
    return torch.cat([rows, rows.new_zeros((like.shape[0] - n * s,) + tuple(rows.shape[1:]))])


def dense_backward(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks, max_q, max_k, left, right,
                   softcap, scale, shape=None, run=None):
    """lab.masks.varlen_bwd.launch's contract (dq, dk, dv, dsinks) for a call that took the route: shape is route()'s
    (n, S_q, S_k); run is lab.backward.op.default_backward (tests pass the reference). No sinks on this route
    (route() refuses them), so dsinks is empty."""
    n, sq, sk = shape
    h = q.shape[1]
    views = [dense_views(_readable(t), n, s) for t, s in ((grad_out, sq), (q, sq), (k, sk), (v, sk), (out, sq))]
    lse_dense = lse[:, :n * sq].reshape(h, n, sq).transpose(0, 1).contiguous()
    dlse = None if grad_lse is None else grad_lse[:, :n * sq].reshape(h, n, sq).transpose(0, 1).contiguous()
    dq, dk, dv = (run or default_backward)(*views, lse_dense, dlse, right == 0, scale)
    empty = torch.zeros(0, dtype=torch.float32, device=q.device)
    return _to_packed(dq, q, n, sq), _to_packed(dk, k, n, sk), _to_packed(dv, v, n, sk), empty
