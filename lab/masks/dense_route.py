"""Packed sequences of one length through the dense default kernel: lab.ops.attention_varlen's forward when the
host has checked cu_seqlens and every sequence has S_q query rows and S_k keys.

Why: packed (total, H, D) rows whose cu_seqlens are [0, S, 2 S, ..., n S] ARE a dense [n, S, H, D] tensor (a view,
no copy), and the dense default (fwd v07 at D 64 / 128: the persistent PAIR order for causal rows) ran 8 x 2048
causal rows in 1 / 1.19 of the packed kernel's time (fwd v11's packed grid, non-persistent: chapter n13's race).

When: the decision needs cu_seqlens' values on the host: a checked call (check_cu_seqlens=True, one device-to-host
copy the call pays anyway), or cu_seqlens given on the CPU (lab.masks.op reads them with no sync and copies them
to the device through pinned memory: the route without waiting for the device). max_seqlen_q / _k play no part: the lengths are read from the checked
copy, so an untruthful max (already refused there when too small) cannot pick this route; an unchecked call
(check_cu_seqlens=False: no host copy, no sync) never takes it, because q.shape[0] == n max_seqlen_q does not
prove equal lengths (rows of no sequence are allowed past cu_seqlens_q[-1]) and the dense kernel cannot read
cu_seqlens to refuse a batch that is not uniform. The route takes only the masks whose dense meaning is the
packed one on the dense default kernel: no window, softcap or sinks, and causal only when S_q = S_k (the packed
causal is bottom-right per sequence; the dense default's is top-left, equal only on square blocks). Any other
mask stays on the packed kernel (the masked dense call runs the same fwd v11, measured 1.03x faster than its
packed grid: too little to carry a second route). GQA, rows of no sequence past cu_seqlens_q[-1] (zeros,
LSE -inf) and past cu_seqlens_k[-1] (not read) are kept.

The backward stays the packed one (lab.masks.varlen_bwd: faster than the dense backward on these shapes, 0.86x),
so the dense forward hands it O in the packed layout (written in place through the [n, H, S, D] view) and LSE
(H_q, total_q) (the dense kernel's (n, H_q, S_q) copied over: 4 bytes a row and head).

Prediction (written before the first GPU run; H200, bf16, causal, H 16, 8 x 2048, lab.masks.gpu_varlen.race in GPU
time): the route's GPU work (dense_impl called directly, no host copy) 1.00-1.03x the dense op's forward (the same
kernel on the same strided view); the public checked call 1.2-1.5x in that timer, because its device-to-host copy
of cu_seqlens makes the timed window hold the Python path after the copy (the host cost, not the kernel's); its
forward + backward about 0.85-0.95x the dense op's (the packed backward stays 0.86x the dense one); the unchecked
call unchanged, 1.16-1.20x. D_v != D_qk (lab.masks.op pads V to the kernel width and cuts O back): 1.02-1.08x the
same call at D_v = D_qk = width, forward and forward + backward (the copies of V and O, and of dV back).
Outcome (H200, b88a6be, outputs/driver_logs/20261129-h200-batch4-b88a6be/R; GPU time, medians of 21 rounds, IQR
within 1 % unless said): the route's GPU work 0.993x the dense forward at D 128 (0.251 / 0.253 ms), 0.999x at D 64
(0.188 / 0.188): met. The public checked call 2.14x (D 128, 0.541 ms, IQR 0.032) and 2.47x (D 64): the exposed host
path is ~0.29 ms, twice the prediction's upper end; forward + backward 1.34x / 1.71x, missed. Unchecked: 1.17x (D
128) and 1.32x (D 64) forward, as before; backward 0.86x / 0.87x. D_v != D_qk (4 x 2048, H 16; F.pad then): forward
1.42x (192 / 128 against 192 / 192) and 1.39x (256 / 128 against 256 / 256), forward + backward 1.08x / 1.07x: the
forward missed by far (the copies of V and O, 30-45 us by bytes, were 94-96 us). Route checks 8/8 (the two forced
on uneven keys fail as they must), its gradient checks 2/2, D_v != D_qk checks 4/4 (out, dQ, dK, dV).
Then (9c9667b, outputs/driver_logs/20261129-h200-batch5-9c9667b/R): the same checks 10/10; the checked call on v11
with no route 1.02x / 1.01x the checked route (D 128 / 64): its device-to-host wait, not the kernel, sets its time.
So cu_seqlens on the CPU (ca72b20, outputs/driver_logs/20261129-h200-final-ca72b20/R; checked forward, O and LSE bit
for bit the device call's, gradients within 1 %): 1.009x the dense op's forward (0.252 / 0.249 ms, IQR 0.001),
backward 0.861x, forward + backward 0.893x: within 5 % in the public call. The unchecked call stays 1.17x (its fix
is fwd v11's packed grid: a persistent PAIR order with FUSE, as v07's).
"""
from __future__ import annotations

import torch

from ..kernels import launcher
from ..fwd.head_dims import attention_version
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
    from .. import build
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
