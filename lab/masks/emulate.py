"""The masked tiled algorithm on the CPU (NumPy, float32 like the kernels' accumulators), step for step as
kernels/fwd/v08_masks.cu runs it, and the backward formulas of the four features.

Forward, per block of B_r query rows (FlashAttention-2's loop, lab.emulate's "mma" order):
- only the key tiles in spec.tile_range are read: the others lie wholly outside the window and are skipped,
  not masked, so a window of W keys costs O(S_q (W + B_r + B_c)) scores, not O(S_q S_k). Tiles inside the
  range that some row sees only partly get the per-element mask; the counts come back in `stats`.
- softcap: the raw score becomes t = tanh(s * scale / softcap) and the exp2 step runs on t with the factor
  c = softcap * log2(e) instead of scale * log2(e) (one FMUL and one tanh more per score; the running max is
  over t, whose exp2 offset is then m c as before).
- sinks: the final normaliser l += exp2(sink log2(e) - m c), taken against max(m c, sink log2(e)) so a large
  sink cannot overflow; LSE includes the sink.
Varlen: `varlen_schedule` is the kernel's grid over packed sequences: ceil(max_seqlen_q / B_r) x B x H_q CTAs
(max_seqlen_q a host int: no device-to-host copy of cu_seqlens), a CTA whose block starts past its sequence's
length returns at once; every tile that computes belongs to a real sequence (no padding of the data).

Backward (`backward`, float64): with P_ij = exp(s_ij - LSE_i) and D_i = rowsum(dO_i * O_i) - dLSE_i,
  dV = P^T dO, dP = dO V^T, dS = P * (dP - D), and with softcap dS *= 1 - tanh^2 (s' = c tanh(s / c) has
  ds'/ds = 1 - tanh^2(s / c)); dQ = scale dS K, dK = scale dS^T Q.
  Sink gradient: LSE_i = log(sum_j exp(s_ij) + exp(sink)), so dP_ij/dsink = -P_ij P_sink,i and
  dLSE_i/dsink = P_sink,i = exp(sink - LSE_i); hence d sink_h = sum_i P_sink,i (dLSE_i - dO_i . O_i)
  = -sum_i P_sink,i D_i, over every row of every batch element of head h.
"""
from __future__ import annotations

import math

import numpy as np

from .spec import Mask, query_block_range, tile_is_full, tile_range, visible as _visible_t

LOG2E = 1.0 / math.log(2.0)
# fwd v09's softcap softmax with a fixed offset (kernels/common/hopper/attn_mask_sm90.cuh kCapHeadroom,
# kCapMaxLog2): the cap bounds every score, so P = exp2(t c - (c - CAP_HEADROOM)) needs no running max while
# softcap log2 e <= CAP_MAX_LOG2.
CAP_HEADROOM = 48.0
CAP_MAX_LOG2 = 74.0


def _ftz(p):
    """ex2.approx.ftz: results below fp32's normal range flush to 0."""
    return np.where(p < np.float32(2.0 ** -126), np.float32(0), p).astype(np.float32)


def _bf16(x):
    """Round float32 to bfloat16 (nearest even) and back, as the P fragments are."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def _visible(rows, cols, seqlen_k, offset, mask):
    import torch
    return _visible_t(torch.from_numpy(rows), torch.from_numpy(cols), seqlen_k, offset, mask).numpy()


def forward_head(q, k, v, mask: Mask, scale: float, offset: int = 0, sink=None, block_m: int = 64,
                 block_n: int = 64, ignore_window: bool = False, stats: dict | None = None, bounded: bool = False,
                 rounded_l: bool = True):
    """One head: q (S_q, D), k and v (S_k, D) float32 arrays -> (out (S_q, D_v), lse (S_q,)), natural log.
    ignore_window: the deliberately wrong variant (every key tile read, no window mask). bounded (softcap only):
    the fixed offset c - CAP_HEADROOM instead of the running max, exp2 flushing to zero below 2^-126 as the
    kernel's does (whatever the cap: the kernel takes this form only up to CAP_MAX_LOG2), P rounded to bf16 for
    P V and, with rounded_l, for l too (exp_rows_rounded); rounded_l=False: l from the unrounded P (the first
    form, which leaves a row of one key off by up to 2^-9)."""
    bounded = bounded and mask.softcap > 0
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    out = np.zeros((seqlen_q, v.shape[1]), np.float32)
    lse = np.full(seqlen_q, -np.inf, np.float32)
    # ignore_window: the wrong variant keeps causality and the softcap, and drops the window's edges.
    use = Mask(-1, 0 if mask.right == 0 else -1, mask.softcap) if ignore_window else mask
    c = np.float32((mask.softcap if mask.softcap > 0 else abs(scale)) * LOG2E)
    st = stats if stats is not None else {}
    for m0 in range(0, seqlen_q, block_m):
        m1 = min(m0 + block_m, seqlen_q)
        first, last = tile_range(m0, m1, seqlen_k, offset, use, block_n)
        total = -(-seqlen_k // block_n)
        st["skipped"] = st.get("skipped", 0) + total - (last - first)
        m = np.full(m1 - m0, -np.inf, np.float32)
        l = np.zeros(m1 - m0, np.float32)
        acc = np.zeros((m1 - m0, v.shape[1]), np.float32)
        for j in range(first, last):
            n0, n1 = j * block_n, min((j + 1) * block_n, seqlen_k)
            s = (q[m0:m1] @ k[n0:n1].T).astype(np.float32)
            if mask.softcap > 0:
                s = np.tanh(s * np.float32(scale / mask.softcap)).astype(np.float32)
            elif scale < 0:  # the kernels negate Q and run with |scale|
                s = -s
            if tile_is_full(m0, m1, n0, n1, seqlen_k, offset, use):
                st["full"] = st.get("full", 0) + 1
            else:
                st["masked"] = st.get("masked", 0) + 1
                s = np.where(_visible(np.arange(m0, m1), np.arange(n0, n1), seqlen_k, offset, use), s, -np.inf)
            if bounded:  # no max, no alpha: every tile against the same offset
                p = _ftz(np.exp2(s * c - np.float32(c - CAP_HEADROOM)).astype(np.float32))
                l = l + (_bf16(p) if rounded_l else p).sum(axis=1)
                acc = acc + _bf16(p) @ v[n0:n1]
                continue
            m_new = np.maximum(m, s.max(axis=1))
            off = np.where(np.isneginf(m_new), 0, m_new * c).astype(np.float32)
            alpha = np.exp2(np.where(np.isneginf(m), -np.inf, m * c) - off).astype(np.float32)
            p = np.exp2(s * c - off[:, None]).astype(np.float32)
            l = l * alpha + p.sum(axis=1)
            acc = acc * alpha[:, None] + p @ v[n0:n1]
            m = m_new
        # Epilogue: the sink joins the normaliser against max(m c, sink log2 e).
        mc = np.where(np.isneginf(m), -np.inf, m * c).astype(np.float32)
        if bounded:
            mc = np.full(m1 - m0, c - CAP_HEADROOM, np.float32)
        if sink is not None:
            sl = np.float32(sink * LOG2E)
            top = np.maximum(mc, sl)
            a = np.exp2(mc - top)
            l_tot = l * a + np.exp2(sl - top)
            out[m0:m1] = acc * (a / l_tot)[:, None]
            lse[m0:m1] = (top + np.log2(l_tot)) / LOG2E
        else:
            good = l > 0
            out[m0:m1] = np.where(good[:, None], acc / np.where(good, l, 1)[:, None], 0)
            lse[m0:m1] = np.where(good, (mc + np.log2(np.where(good, l, 1))) / LOG2E, -np.inf)
    return out, lse


def forward(q, k, v, mask: Mask, scale=None, offset: int = 0, sinks=None, stats: dict | None = None, **kw):
    """(B, H, S, D) arrays (GQA by head groups) -> (out, lse (B, H_q, S_q)), forward_head per (b, h)."""
    B, Hq, Sq, D = q.shape
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    out = np.zeros((B, Hq, Sq, v.shape[-1]), np.float32)
    lse = np.zeros((B, Hq, Sq), np.float32)
    for b in range(B):
        for h in range(Hq):
            sink = None if sinks is None else float(sinks[h])
            out[b, h], lse[b, h] = forward_head(np.float32(q[b, h]), np.float32(k[b, h // group]),
                                                np.float32(v[b, h // group]), mask, scale, offset, sink,
                                                stats=stats, **kw)
    return out, lse


def varlen_schedule(cu_seqlens_q, max_seqlen_q: int, heads: int, block_m: int = 64):
    """The kernel's CTAs over packed sequences: (b, h, m0, rows) for those that compute, and the count of
    those that return at once (their block starts past the sequence's end)."""
    cu = [int(x) for x in cu_seqlens_q]
    work, idle = [], 0
    for b in range(len(cu) - 1):
        length = cu[b + 1] - cu[b]
        for h in range(heads):
            for mb in range(-(-max_seqlen_q // block_m)):
                m0 = mb * block_m
                if m0 < length:
                    work.append((b, h, m0, min(block_m, length - m0)))
                else:
                    idle += 1
    return work, idle


def forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, mask: Mask, scale=None, sinks=None,
                   block_m: int = 64, block_n: int = 64, stats: dict | None = None, **kw):
    """Packed (total, H, D) arrays through varlen_schedule: out (total_q, H_q, D_v), lse (H_q, total_q)."""
    Hq, D = q.shape[1], q.shape[2]
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    cq, ck = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    out = np.zeros((q.shape[0], Hq, v.shape[-1]), np.float32)
    lse = np.full((Hq, q.shape[0]), -np.inf, np.float32)
    work, idle = varlen_schedule(cq, max_seqlen_q, Hq, block_m)
    if stats is not None:
        stats["idle_ctas"], stats["ctas"] = idle, len(work)
    for b, h, m0, rows in work:
        sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        qb = np.float32(q[cq[b]:cq[b + 1], h])
        kb, vb = np.float32(k[ck[b]:ck[b + 1], h // group]), np.float32(v[ck[b]:ck[b + 1], h // group])
        # One CTA's rows: the block [m0, m0 + rows) of this sequence, aligned bottom-right.
        o, l = forward_head(qb, kb, vb, mask, scale, sk - sq, None if sinks is None else float(sinks[h]),
                            block_m, block_n, stats=stats, **kw)
        out[cq[b] + m0:cq[b] + m0 + rows, h] = o[m0:m0 + rows]
        lse[h, cq[b] + m0:cq[b] + m0 + rows] = l[m0:m0 + rows]
    return out, lse


class _Grads:
    """What both backward orders share: the float64 inputs, Delta, the gradients, and one tile's contribution."""

    def __init__(self, q, k, v, out, lse, dout, mask: Mask, scale, offset: int, dlse):
        self.q, self.k, self.v, out, self.dout = (np.asarray(t, np.float64) for t in (q, k, v, out, dout))
        self.lse = np.asarray(lse, np.float64)
        self.group = self.q.shape[1] // self.k.shape[1]
        self.Sq, self.Sk = self.q.shape[2], self.k.shape[2]
        self.scale = 1.0 / math.sqrt(self.q.shape[-1]) if scale is None else float(scale)
        self.delta = (self.dout * out).sum(-1) - (0 if dlse is None else np.asarray(dlse, np.float64))
        self.dq, self.dk, self.dv = (np.zeros_like(t) for t in (self.q, self.k, self.v))
        self.safe = np.where(np.isfinite(self.lse), self.lse, 0.0)
        self.mask, self.offset = mask, offset

    def tile(self, b: int, h: int, m0: int, m1: int, n0: int, n1: int) -> None:
        """Query rows [m0, m1) of head h against keys [n0, n1): P, dP, dS (softcap's derivative), the adds."""
        hk, mask, scale = h // self.group, self.mask, self.scale
        q, k, v, dout = self.q[b, h, m0:m1], self.k[b, hk, n0:n1], self.v[b, hk, n0:n1], self.dout[b, h, m0:m1]
        s = scale * (q @ k.T)
        t = np.tanh(s / mask.softcap) if mask.softcap > 0 else None
        if t is not None:
            s = mask.softcap * t
        seen = _visible(np.arange(m0, m1), np.arange(n0, n1), self.Sk, self.offset, mask)
        p = np.where(seen, np.exp(np.where(seen, s, 0) - self.safe[b, h, m0:m1, None]), 0.0)
        self.dv[b, hk, n0:n1] += p.T @ dout
        ds = p * (dout @ v.T - self.delta[b, h, m0:m1, None])
        if t is not None:
            ds = ds * (1.0 - t * t)
        self.dq[b, h, m0:m1] += scale * ds @ k
        self.dk[b, hk, n0:n1] += scale * ds.T @ q

    def result(self, sinks):
        """(dq, dk, dv, dsinks or None): dsinks_h = -sum over rows of exp(sink_h - LSE) Delta."""
        dsinks = None
        if sinks is not None:
            dsinks = -(np.exp(np.asarray(sinks, np.float64)[None, :, None] - self.lse) * self.delta).sum(axis=(0, 2))
        return self.dq, self.dk, self.dv, dsinks


def backward(q, k, v, out, lse, dout, mask: Mask, scale=None, offset: int = 0, sinks=None, dlse=None,
             block_m: int = 64, block_n: int = 64):
    """The backward formulas (module docstring), float64, tile by tile over the forward's tile range.
    (B, H, S, D) arrays -> (dq, dk, dv, dsinks or None); dk/dv summed over each GQA group."""
    g = _Grads(q, k, v, out, lse, dout, mask, scale, offset, dlse)
    B, Hq = g.q.shape[:2]
    for b in range(B):
        for h in range(Hq):
            for m0 in range(0, g.Sq, block_m):
                m1 = min(m0 + block_m, g.Sq)
                first, last = tile_range(m0, m1, g.Sk, offset, mask, block_n)
                for j in range(first, last):
                    g.tile(b, h, m0, m1, j * block_n, min((j + 1) * block_n, g.Sk))
    return g.result(sinks)


def backward_by_keys(q, k, v, out, lse, dout, mask: Mask, scale=None, offset: int = 0, sinks=None, dlse=None,
                     block_m: int = 64, block_n: int = 128):
    """backward's formulas in bwd v08's order: one key block at a time (a CTA), over only the query blocks of
    spec.query_block_range. Same returns as backward."""
    g = _Grads(q, k, v, out, lse, dout, mask, scale, offset, dlse)
    B, Hkv = g.k.shape[:2]
    for b in range(B):
        for hk in range(Hkv):
            for n0 in range(0, g.Sk, block_n):
                n1 = min(n0 + block_n, g.Sk)
                first, last = query_block_range(n0, n1, g.Sq, offset, mask, block_m)
                for h in range(hk * g.group, (hk + 1) * g.group):
                    for i in range(first, last):
                        g.tile(b, h, i * block_m, min((i + 1) * block_m, g.Sq), n0, n1)
    return g.result(sinks)


def backward_varlen(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                    mask: Mask, scale=None, sinks=None, dlse=None, block_m: int = 64, block_n: int = 128):
    """Packed sequences in bwd v08's way (lab.masks.varlen_bwd): copied into right-padded dense buffers (torch
    tensors: out and dout (total_q, H_q, D), lse and dlse (H_q, total_q)), backward_by_keys per sequence with its
    own S_q, S_k and bottom-right offset, the gradients copied back. -> (dq, dk, dv) packed float64, dsinks."""
    import torch

    from .varlen_bwd import lengths, pad, unpad
    dense = [pad(t.double(), cu_seqlens_q, max_seqlen_q) for t in (q, out, dout)]
    kd, vd = (pad(t.double(), cu_seqlens_k, max_seqlen_k) for t in (k, v))
    ld = pad(lse.double().t().unsqueeze(-1), cu_seqlens_q, max_seqlen_q, float("inf")).squeeze(-1)
    dld = None if dlse is None else pad(dlse.double().t().unsqueeze(-1), cu_seqlens_q, max_seqlen_q).squeeze(-1)
    grads = [torch.zeros_like(t) for t in (dense[0], kd, vd)]
    dsinks = None if sinks is None else np.zeros(q.shape[1])
    for b, (sq, sk) in enumerate(zip(lengths(cu_seqlens_q, max_seqlen_q).tolist(),
                                     lengths(cu_seqlens_k, max_seqlen_k).tolist())):
        rows, keys = slice(b, b + 1), (slice(b, b + 1), slice(None), slice(0, sk))
        qb, ob, gb = (t[rows, :, :sq].numpy() for t in dense)
        res = backward_by_keys(qb, kd[keys].numpy(), vd[keys].numpy(), ob, ld[rows, :, :sq].numpy(), gb, mask, scale,
                               sk - sq, sinks, None if dld is None else dld[rows, :, :sq].numpy(), block_m, block_n)
        grads[0][rows, :, :sq] = torch.from_numpy(res[0])
        grads[1][keys], grads[2][keys] = torch.from_numpy(res[1]), torch.from_numpy(res[2])
        if sinks is not None:
            dsinks += res[3]
    return (unpad(grads[0], cu_seqlens_q, q.shape[0]), unpad(grads[1], cu_seqlens_k, k.shape[0]),
            unpad(grads[2], cu_seqlens_k, k.shape[0]), dsinks)
