"""NumPy emulation of tiled (FlashAttention) forward attention, for CPU-only chapters.

Three things, NumPy only (no torch, no GPU):

* ``attention_reference`` -- plain softmax(scale * Q K^T) V in float64, the yardstick (lab.reference's).
* ``flash_forward_emulated`` -- the tiled online-softmax algorithm in float32,
  tile by tile, in either loop order the kernels use:
    - ``order="fa1"``: FlashAttention-1 (Dao et al. 2022, Algorithm 1): the outer
      loop walks K_j/V_j tiles, the inner loop Q_i tiles; O_i, m_i, l_i live in
      "memory" (whole arrays) and O_i is rescaled and renormalised at every step.
    - ``order="fa2"``: FlashAttention-2: the outer loop walks Q_i tiles, the inner
      loop K_j/V_j tiles; exp2 with scale*log2(e) folded into the scores,
      unnormalised accumulator, one division by l_i at the end, and key tiles
      entirely above the causal diagonal are skipped.
    - ``order="mma"``: fa2 with the arithmetic of the tensor-core kernels (fwd v02-v04):
      the running max over raw scores q.k, the scale folded into the exp2 argument
      (one FFMA per score), any finite scale by the rewrite of kernels/common/softmax.cuh
      (negated Q for a negative scale, FLT_MIN for 0; ``kernel_scale``).
* ``lazy_rescale_emulated`` -- v07's softmax with FA4's conditional rescaling: the running
  max is kept unless a score beats it by more than 2^8, so most tiles skip the O rescale.
* ``debug_intermediates`` -- S, m, l, P, O of (b=0, h=0), the same quantities and
  layout as the LAB_DEBUG_DUMP build of kernels/fwd/v01_scalar.cu, so a chapter
  can diff the kernel's dump against them (``unpack_debug`` splits the flat dump).

Conventions shared with the kernels: arrays are (B, H, S, D); GQA maps query head
h to KV head h // (Hq // Hkv); causal is SDPA's is_causal, top-left aligned: query
i sees key j iff j <= i, also when Sq != Sk; LSE is the natural log.
"""
from __future__ import annotations

import math

import numpy as np

from .reference import _expand_kv, _resolve_scale, _shapes, _visible, attention_reference  # noqa: F401

LOG2E = 1.0 / math.log(2.0)  # log2(e): exp(x) == exp2(x * LOG2E)
DEBUG_KEYS = ("S", "m", "l", "P", "O")  # order of the blocks in the flat debug dump


def _fa1(q, k, v, is_causal, scale, block_m, block_n):
    """FA1 order: K_j/V_j outer, Q_i inner, O_i/m_i/l_i read and written back each step."""
    batch, heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    out = np.zeros((batch, heads, seqlen_q, head_dim), dtype=np.float32)  # "HBM"
    row_max = np.full((batch, heads, seqlen_q), -np.inf, dtype=np.float32)
    row_sum = np.zeros((batch, heads, seqlen_q), dtype=np.float32)
    for j0 in range(0, seqlen_k, block_n):
        j1 = min(j0 + block_n, seqlen_k)
        k_j, v_j = k[:, :, j0:j1], v[:, :, j0:j1]
        for i0 in range(0, seqlen_q, block_m):
            i1 = min(i0 + block_m, seqlen_q)
            if is_causal and j0 > i1 - 1:
                continue  # every key of K_j is right of every query of Q_i
            s = scale * (q[:, :, i0:i1] @ k_j.swapaxes(-1, -2))
            s = np.where(_visible(np.arange(i0, i1), np.arange(j0, j1), is_causal), s, -np.inf)
            m_tile = s.max(axis=-1)
            # A row with no visible key in this tile: exponentiate against 0, not
            # -inf, so exp(-inf - (-inf)) never produces a NaN.
            p = np.exp(s - np.where(np.isneginf(m_tile), 0, m_tile)[..., None])
            l_tile = p.sum(axis=-1)
            m_old, l_old = row_max[:, :, i0:i1], row_sum[:, :, i0:i1]
            m_new = np.maximum(m_old, m_tile)
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            alpha_old, alpha_tile = np.exp(m_old - m_ref), np.exp(m_tile - m_ref)
            l_new = alpha_old * l_old + alpha_tile * l_tile
            o_new = ((l_old * alpha_old)[..., None] * out[:, :, i0:i1]
                     + alpha_tile[..., None] * (p @ v_j))
            out[:, :, i0:i1] = o_new / np.where(l_new > 0, l_new, 1)[..., None]
            row_max[:, :, i0:i1], row_sum[:, :, i0:i1] = m_new, l_new
    return out, row_max + np.log(row_sum)


def _fa2(q, k, v, is_causal, scale, block_m, block_n):
    """FA2 order: Q_i outer, K_j/V_j inner, base-2 exponent, one normalisation at the end."""
    batch, heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    scale_log2 = np.float32(scale * LOG2E)  # folded once, as the kernels do
    out = np.empty((batch, heads, seqlen_q, head_dim), dtype=np.float32)
    lse = np.empty((batch, heads, seqlen_q), dtype=np.float32)
    for i0 in range(0, seqlen_q, block_m):
        i1 = min(i0 + block_m, seqlen_q)
        q_i = q[:, :, i0:i1]
        acc = np.zeros((batch, heads, i1 - i0, head_dim), dtype=np.float32)
        m_i = np.full((batch, heads, i1 - i0), -np.inf, dtype=np.float32)  # base-2 units
        l_i = np.zeros((batch, heads, i1 - i0), dtype=np.float32)
        kv_end = min(seqlen_k, i1) if is_causal else seqlen_k  # later tiles are fully masked
        for j0 in range(0, kv_end, block_n):
            j1 = min(j0 + block_n, seqlen_k)
            s = (q_i @ k[:, :, j0:j1].swapaxes(-1, -2)) * scale_log2
            s = np.where(_visible(np.arange(i0, i1), np.arange(j0, j1), is_causal), s, -np.inf)
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_ref = np.where(np.isneginf(m_new), 0, m_new)
            p = np.exp2(s - m_ref[..., None])
            alpha = np.exp2(m_i - m_ref)  # rescales what was accumulated so far
            l_i = alpha * l_i + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]
            m_i = m_new
        out[:, :, i0:i1] = acc / np.where(l_i > 0, l_i, 1)[..., None]
        lse[:, :, i0:i1] = (m_i + np.log2(l_i)) / np.float32(LOG2E)  # back to natural log
    return out, lse


FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal float32, what the kernels run scale 0 with


def kernel_scale(scale: float) -> tuple[float, bool]:
    """(positive factor, negate Q) the mma kernels run a softmax scale with (kernels/common/softmax.cuh).

    scale * (q.k) = |scale| * ((-q).k), so a negative scale becomes a sign flip of Q; 0 becomes FLT_MIN,
    which leaves every weight exp2(s*c - m*c) at exactly 1.0f for |q.k| < 1e30 and a masked -inf at -inf.
    """
    return (FLT_MIN if scale == 0 else abs(scale)), scale < 0


def _fa2_raw_max(q, k, v, is_causal, scale, block_m, block_n, rewrite=True):
    """FA2 order as the mma kernels compute it: max over raw scores, P = exp2(s*c - m*c).

    rewrite=False applies c = scale * log2(e) as it comes: right only for scale > 0 (for a negative scale
    the max should be a min, and a masked score gives -inf * 0 = NaN at scale 0), kept to show why.
    """
    factor, negate = kernel_scale(scale) if rewrite else (scale, False)
    if negate:
        q = -q
    c = np.float32(factor * LOG2E)
    batch, heads, seqlen_q, head_dim = q.shape
    seqlen_k = k.shape[2]
    out = np.empty((batch, heads, seqlen_q, head_dim), dtype=np.float32)
    lse = np.empty((batch, heads, seqlen_q), dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):  # rewrite=False is meant to show the NaN
        for i0 in range(0, seqlen_q, block_m):
            i1 = min(i0 + block_m, seqlen_q)
            acc = np.zeros((batch, heads, i1 - i0, head_dim), dtype=np.float32)
            m_i = np.full((batch, heads, i1 - i0), -np.inf, dtype=np.float32)  # raw-score units
            l_i = np.zeros((batch, heads, i1 - i0), dtype=np.float32)
            kv_end = min(seqlen_k, i1) if is_causal else seqlen_k
            for j0 in range(0, kv_end, block_n):
                j1 = min(j0 + block_n, seqlen_k)
                s = q[:, :, i0:i1] @ k[:, :, j0:j1].swapaxes(-1, -2)  # unscaled
                s = np.where(_visible(np.arange(i0, i1), np.arange(j0, j1), is_causal), s, -np.inf)
                m_new = np.maximum(m_i, s.max(axis=-1))
                m_c = np.where(np.isneginf(m_new), 0, m_new * c)  # a row with nothing visible yet: offset 0
                p = np.exp2(s * c - m_c[..., None])
                alpha = np.exp2(m_i * c - m_c)
                l_i = alpha * l_i + p.sum(axis=-1)
                acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]
                m_i = m_new
            out[:, :, i0:i1] = acc / np.where(l_i > 0, l_i, 1)[..., None]
            lse[:, :, i0:i1] = m_i * np.float32(factor) + np.log(l_i)
    return out, lse


LAZY_SLACK = 8.0  # kernels/common/hopper/attn_fwd_sm90.cuh kLazySlack: the kept max may trail by 2^8
WARP_ROWS = 16  # rows of one consumer warp: the kernel's vote (and so the full step) is per warp


def lazy_rescale_emulated(q, k, v, is_causal=False, scale=None, block_m=128, block_n=176, slack=LAZY_SLACK):
    """v07's softmax with FA4's conditional rescaling (softmax_scores_lazy), in float32.

    The running max m (scaled, log2 units) is kept while no score of an unmasked tile beats it by more than
    `slack`; then P = exp2(s*c - m) <= 2^slack and O needs no rescale. A warp (16 rows) that sees a larger
    score, and every tile the mask touches, takes the full online-softmax step. Needs scale > 0 (the kernel
    runs it only then). Returns (out, lse, stats) with stats = {"tiles", "full_steps", "p_max"}: warp-tiles,
    how many took the full step, and the largest P seen (at most 2^slack).
    """
    _, heads_q, _, _, _, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    if not scale > 0:
        raise ValueError("the lazy rescale runs only for scale > 0 (the folded-scale kernel)")
    q = np.asarray(q, dtype=np.float32)
    k = _expand_kv(np.asarray(k, dtype=np.float32), heads_q)
    v = _expand_kv(np.asarray(v, dtype=np.float32), heads_q)
    c = np.float32(scale * LOG2E)
    batch, heads, seqlen_q, _ = q.shape
    seqlen_k = k.shape[2]
    out = np.empty((batch, heads, seqlen_q, head_dim), dtype=np.float32)
    lse = np.empty((batch, heads, seqlen_q), dtype=np.float32)
    stats = {"tiles": 0, "full_steps": 0, "p_max": 0.0}
    for w0 in range(0, seqlen_q, WARP_ROWS):  # one warp's rows at a time: its decisions are its own
        w1 = min(w0 + WARP_ROWS, seqlen_q)
        m0 = w0 - w0 % block_m  # the CTA's first row: its causal key range
        acc = np.zeros((batch, heads, w1 - w0, head_dim), dtype=np.float32)
        m = np.full((batch, heads, w1 - w0), -np.inf, dtype=np.float32)  # scaled, log2 units
        l = np.zeros((batch, heads, w1 - w0), dtype=np.float32)
        kv_end = min(seqlen_k, seqlen_q, m0 + block_m) if is_causal else seqlen_k
        for j0 in range(0, kv_end, block_n):
            j1 = min(j0 + block_n, seqlen_k)
            s = q[:, :, w0:w1] @ k[:, :, j0:j1].swapaxes(-1, -2)
            masked = j0 + block_n > seqlen_k or (is_causal and j0 + block_n - 1 > w0 - w0 % 64)
            s = np.where(_visible(np.arange(w0, w1), np.arange(j0, j1), is_causal), s, -np.inf)
            stats["tiles"] += batch * heads
            grow = (s.max(axis=-1) * c > m + np.float32(slack)).any(axis=-1)  # per (b, h): the warp's vote
            full = np.ones_like(grow) if masked else grow
            stats["full_steps"] += int(full.sum())
            m_new = np.where(full[..., None], np.maximum(m, s.max(axis=-1) * c), m)
            off = np.where(np.isneginf(m_new), 0, m_new)
            p = np.exp2(s * c - off[..., None])
            alpha = np.where(full[..., None], np.exp2(m - off), np.float32(1))
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ v[:, :, j0:j1]
            m = m_new
            stats["p_max"] = max(stats["p_max"], float(p.max(initial=0.0)))
        out[:, :, w0:w1] = acc / np.where(l > 0, l, 1)[..., None]
        with np.errstate(divide="ignore"):
            lse[:, :, w0:w1] = np.where(l > 0, (m + np.log2(np.where(l > 0, l, 1))) / np.float32(LOG2E), -np.inf)
    return out, lse, stats


def flash_forward_emulated(q, k, v, is_causal=False, scale=None, block_m=64, block_n=64,
                           order="fa2"):
    """Tiled online-softmax forward pass in float32. Returns (out, lse) like the reference.

    block_m is B_r (query rows per tile), block_n is B_c (key rows per tile); neither
    sequence length needs to be a multiple of them (the last tile is partial).
    """
    _, heads_q, _, _, _, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    if block_m < 1 or block_n < 1:
        raise ValueError("block sizes must be positive")
    q32 = np.asarray(q, dtype=np.float32)
    k32 = _expand_kv(np.asarray(k, dtype=np.float32), heads_q)
    v32 = _expand_kv(np.asarray(v, dtype=np.float32), heads_q)
    if order == "fa1":
        return _fa1(q32, k32, v32, is_causal, np.float32(scale), block_m, block_n)
    if order == "fa2":
        return _fa2(q32, k32, v32, is_causal, scale, block_m, block_n)
    if order == "mma":
        return _fa2_raw_max(q32, k32, v32, is_causal, scale, block_m, block_n)
    raise ValueError(f"order must be 'fa1', 'fa2' or 'mma', got {order!r}")


def debug_intermediates(q, k, v, is_causal=False, scale=None):
    """S, m, l, P, O of (b=0, h=0) in float64, as the LAB_DEBUG_DUMP kernel build dumps them.

    S [Sq, Sk] = scale * Q K^T with masked entries -inf; m [Sq] = row max of S;
    l [Sq] = sum_j exp(S - m); P [Sq, Sk] = exp(S - m) / l; O [Sq, D] = P V.
    (The kernel dumps these only for Sq <= 64 and Sk <= 64; this works for any size.)
    """
    _, _, _, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    q0 = np.asarray(q[0, 0], dtype=np.float64)
    k0 = np.asarray(k[0, 0], dtype=np.float64)  # query head 0 reads KV head 0
    v0 = np.asarray(v[0, 0], dtype=np.float64)
    s = scale * (q0 @ k0.T)
    s = np.where(_visible(np.arange(seqlen_q), np.arange(seqlen_k), is_causal), s, -np.inf)
    m = s.max(axis=-1)
    e = np.exp(s - m[:, None])
    l = e.sum(axis=-1)
    p = e / l[:, None]
    return {"S": s, "m": m, "l": l, "P": p, "O": p @ v0}


def debug_layout(seqlen_q, seqlen_k, head_dim):
    """{name: (offset in floats, shape)} of the flat debug dump; total = 2*Sq*Sk + 2*Sq + Sq*D."""
    sq, sk = seqlen_q, seqlen_k
    return {"S": (0, (sq, sk)), "m": (sq * sk, (sq,)), "l": (sq * sk + sq, (sq,)),
            "P": (sq * sk + 2 * sq, (sq, sk)), "O": (2 * sq * sk + 2 * sq, (sq, head_dim))}


def debug_size(seqlen_q, seqlen_k, head_dim):
    """Number of floats the kernel's debug buffer must hold."""
    return 2 * seqlen_q * seqlen_k + 2 * seqlen_q + seqlen_q * head_dim


def unpack_debug(flat, seqlen_q, seqlen_k, head_dim):
    """Split a flat dump (the kernel's p->debug buffer) into the dict of debug_intermediates."""
    flat = np.asarray(flat).reshape(-1)
    if flat.size < debug_size(seqlen_q, seqlen_k, head_dim):
        raise ValueError(f"dump has {flat.size} floats, needs {debug_size(seqlen_q, seqlen_k, head_dim)}")
    return {name: flat[off:off + math.prod(shape)].reshape(shape)
            for name, (off, shape) in debug_layout(seqlen_q, seqlen_k, head_dim).items()}


def pack_debug(parts):
    """Inverse of unpack_debug: concatenate S, m, l, P, O into one flat float32 array."""
    return np.concatenate([np.asarray(parts[name], dtype=np.float32).reshape(-1) for name in DEBUG_KEYS])
