"""Attention in float64 NumPy, the yardstick: softmax(scale * Q K^T) V and its LSE, with the shape checks.

The ring's CPU path (lab.ring.blocks.reference_attend) runs it, and lab.emulate's tiled emulations are measured
against it. Arrays are (B, H, S, D); GQA maps query head h to KV head h // (Hq // Hkv); causal is SDPA's
is_causal, top-left aligned: query i sees key j iff j <= i, also when Sq != Sk; LSE is the natural log.
"""
from __future__ import annotations

import math

import numpy as np


def _shapes(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"expected (B, H, S, D) arrays, got q{q.shape} k{k.shape} v{v.shape}")
    batch, heads_q, seqlen_q, head_dim = q.shape
    heads_kv, seqlen_k = k.shape[1], k.shape[2]
    if k.shape[0] != batch or k.shape[3] != head_dim or heads_q % heads_kv != 0:
        raise ValueError(f"incompatible shapes q{q.shape} k{k.shape}")
    if seqlen_k == 0:
        raise ValueError("softmax over zero keys is undefined")
    return batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim


def _resolve_scale(scale, head_dim):
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def _expand_kv(x, heads_q):
    """Repeat KV heads so query head h reads KV head h // group (GQA)."""
    return np.repeat(x, heads_q // x.shape[1], axis=1)


def _visible(rows, cols, is_causal):
    """Boolean [len(rows), len(cols)]: query i may see key j (top-left causal)."""
    if not is_causal:
        return np.ones((len(rows), len(cols)), dtype=bool)
    return cols[None, :] <= rows[:, None]


def attention_reference(q, k, v, is_causal=False, scale=None):
    """softmax(scale * Q K^T) V in float64. Returns (out [B,Hq,Sq,D], lse [B,Hq,Sq])."""
    _, heads_q, _, seqlen_q, seqlen_k, head_dim = _shapes(q, k, v)
    scale = _resolve_scale(scale, head_dim)
    q64 = np.asarray(q, dtype=np.float64)
    k64 = _expand_kv(np.asarray(k, dtype=np.float64), heads_q)
    v64 = _expand_kv(np.asarray(v, dtype=np.float64), heads_q)
    s = scale * (q64 @ k64.swapaxes(-1, -2))
    s = np.where(_visible(np.arange(seqlen_q), np.arange(seqlen_k), is_causal), s, -np.inf)
    m = s.max(axis=-1, keepdims=True)  # finite: top-left causal always shows key 0
    p = np.exp(s - m)
    l = p.sum(axis=-1, keepdims=True)
    return (p @ v64) / l, (m + np.log(l))[..., 0]
