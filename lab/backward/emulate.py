"""NumPy emulation of FlashAttention-2's backward pass (kernels/bwd/v01_mma.cu), for CPU tests and chapters.

* ``backward_reference`` -- dQ, dK, dV of softmax(scale Q K^T) V in float64 by the closed form
  (dS = P * (dP - rowsum(dP * P))), GQA gradients summed over each group's query heads.
* ``flash_backward_emulated`` -- the kernel's algorithm in float32, tile by tile and in its order:
  a preprocessing pass Delta = rowsum(dO * O) (the "D term"); then one "CTA" per (K/V block, KV head,
  batch) walking every (query head of its group, query block) pair, recomputing P from Q, K and the
  saved LSE, accumulating dK and dV in registers-worth of float32; dQ either
    - ``dq_mode="atomic"``: each CTA adds its dS K into a float32 dQ buffer, CTAs in ``cta_order``
      (a permutation: the order the GPU happens to run them; float32 addition is not associative, so a
      different order gives a different last bit -- the race), or
    - ``dq_mode="separate"``: a second pass per query block over key blocks, a fixed order.
  ``no_delta=True`` emulates the self-test bug (Delta forgotten).

Conventions are lab.emulate's: (B, H, S, D) arrays, top-left causal, natural-log LSE.
"""
from __future__ import annotations

import math

import numpy as np

from ..emulate import LOG2E, _expand_kv, _resolve_scale, _shapes, _visible, attention_reference


def reference_ds(q, k, v, dout, is_causal, scale):
    """float64 (P, dS, K and V expanded to the query heads) of softmax(scale Q K^T) V, (B, Hq, Sq, Sk) each."""
    heads_q, seqlen_q, seqlen_k = q.shape[1], q.shape[2], k.shape[2]
    q64, do64 = np.asarray(q, np.float64), np.asarray(dout, np.float64)
    k64 = _expand_kv(np.asarray(k, np.float64), heads_q)
    v64 = _expand_kv(np.asarray(v, np.float64), heads_q)
    s = scale * (q64 @ k64.swapaxes(-1, -2))
    s = np.where(_visible(np.arange(seqlen_q), np.arange(seqlen_k), is_causal), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dp = do64 @ v64.swapaxes(-1, -2)
    return p, p * (dp - (dp * p).sum(axis=-1, keepdims=True)), k64, v64


def backward_reference(q, k, v, dout, is_causal=False, scale=None):
    """float64 (dq, dk, dv) of attention_reference; dk/dv have the KV heads' shape (GQA summed)."""
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    p, ds, k64, _ = reference_ds(q, k, v, dout, is_causal, scale)
    q64, do64 = np.asarray(q, np.float64), np.asarray(dout, np.float64)
    dv = p.swapaxes(-1, -2) @ do64
    dq = scale * ds @ k64
    dk = scale * ds.swapaxes(-1, -2) @ q64
    group = heads_q // heads_kv
    fold = lambda x: x.reshape(batch, heads_kv, group, seqlen_k, head_dim).sum(axis=2)  # noqa: E731
    return dq, fold(dk), fold(dv)


def flash_backward_emulated(q, k, v, dout, is_causal=False, scale=None, block_m=64, block_n=64, dq_mode="atomic",
                            cta_order=None, no_delta=False, out=None, lse=None):
    """The tiled backward in float32; returns (dq, dk, dv) float32.

    out/lse: the forward's (default: the float64 reference's, rounded to float32). cta_order: the order of
    the (batch, kv head, key block) CTAs for the atomic dQ adds (default: launch order).
    """
    if dq_mode not in ("atomic", "separate"):
        raise ValueError(f"dq_mode must be 'atomic' or 'separate', got {dq_mode!r}")
    batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    if out is None or lse is None:
        out, lse = attention_reference(q, k, v, is_causal, scale)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    q, k, v, dout, out, lse = map(f32, (q, k, v, dout, out, lse))
    c = np.float32(scale * LOG2E)
    lse2 = lse * np.float32(LOG2E)
    delta = np.zeros_like(lse) if no_delta else (dout * out).sum(axis=-1, dtype=np.float32)  # pass 1: the D term
    group = heads_q // heads_kv
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)

    def tile(b, h, q0, k0):
        """P and dS for query rows [q0, q0+block_m) and keys [k0, k0+block_n) of query head h."""
        rows, cols = np.arange(q0, min(q0 + block_m, seqlen_q)), np.arange(k0, min(k0 + block_n, seqlen_k))
        hk = h // group
        s = q[b, h, rows] @ k[b, hk, cols].T
        p = np.exp2(s * c - lse2[b, h, rows, None]).astype(np.float32)
        p = np.where(_visible(rows, cols, is_causal), p, np.float32(0))
        dp = dout[b, h, rows] @ v[b, hk, cols].T
        ds = (p * (dp - delta[b, h, rows, None])).astype(np.float32)
        return rows, cols, p, ds

    ctas = [(b, hk, kb) for b in range(batch) for hk in range(heads_kv) for kb in range(math.ceil(seqlen_k / block_n))]
    order = range(len(ctas)) if cta_order is None else cta_order
    for index in order:  # pass 2: one CTA per key block; in the atomic mode the CTAs' dQ adds land in this order
        b, hk, kb = ctas[index]
        k0 = kb * block_n
        first = (k0 // block_m) * block_m if is_causal else 0  # causal: earlier query blocks see none of it
        for h in range(hk * group, (hk + 1) * group):
            for q0 in range(first, seqlen_q, block_m):
                rows, cols, p, ds = tile(b, h, q0, k0)
                dv[b, hk, cols] += p.T @ dout[b, h, rows]
                dk[b, hk, cols] += ds.T @ q[b, h, rows]
                if dq_mode == "atomic":
                    dq[b, h, rows] += ds @ k[b, hk, cols]
    if dq_mode == "separate":  # pass 3: per query block, key blocks in a fixed order
        for b in range(batch):
            for h in range(heads_q):
                for q0 in range(0, seqlen_q, block_m):
                    end = min(seqlen_k, q0 + block_m) if is_causal else seqlen_k
                    for k0 in range(0, end, block_n):
                        rows, cols, _, ds = tile(b, h, q0, k0)
                        dq[b, h, rows] += ds @ k[b, h // group, cols]
    return dq * np.float32(scale), dk * np.float32(scale), dv


def relative_error(x, ref) -> float:
    """||x - ref|| / ||ref|| (0 when both are 0)."""
    ref = np.asarray(ref, np.float64)
    norm = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(np.asarray(x, np.float64) - ref))
    return diff / norm if norm else diff


def hbm_bytes(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, element_bytes: int = 2, dq_mode="atomic") -> dict:
    """Bytes that must move in the backward: reads of Q, K, V, O, dO, LSE; writes of dQ, dK, dV; plus the
    float32 dQ accumulator (zeroed, atomically added once per K/V block that touches a row, read back) in the
    atomic mode. Minimum traffic, not what the L2 serves."""
    q = B * Hq * Sq * D * element_bytes
    kv = B * Hkv * Sk * D * element_bytes
    reads = 3 * q + 2 * kv + B * Hq * Sq * 4  # q, o, dout; k, v; lse
    writes = q + 2 * kv
    out = {"reads": reads, "writes": writes}
    if dq_mode == "atomic":
        accum = B * Hq * Sq * D * 4
        out["dq_accum_per_key_block"] = accum
    return out
