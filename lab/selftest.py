"""Deliberately wrong attention "kernels": the check must fail every one of them.

Each is a torch function with the harness's run signature, run(q, k, v, is_causal, scale, out), so
the same check that judges our kernels judges these, on the GPU or the CPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _sdpa32(q, k, v, is_causal, scale):
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal, scale=scale,
                                          enable_gqa=gqa)


def correct(q, k, v, is_causal, scale, out):
    """Control: SDPA in float32, cast back. Must pass."""
    out.copy_(_sdpa32(q, k, v, is_causal, scale))


def transposed_layout(q, k, v, is_causal, scale, out):
    """The origin's bug class: (B, S, H, D) memory read as (B, H, S, D)."""
    def misread(t):
        return t.transpose(1, 2).contiguous().view(t.shape)
    out.copy_(_sdpa32(misread(q), misread(k), misread(v), is_causal, scale))


def missing_scale(q, k, v, is_causal, scale, out):
    out.copy_(_sdpa32(q, k, v, is_causal, 1.0))


def missing_causal_mask(q, k, v, is_causal, scale, out):
    out.copy_(_sdpa32(q, k, v, False, scale))


def unwritten_row(q, k, v, is_causal, scale, out):
    """Writes everything but the last query row of each head (left as the harness's NaN poison)."""
    full = _sdpa32(q, k, v, is_causal, scale)
    out[:, :, :-1].copy_(full[:, :, :-1])


WRONG = {"transposed layout": transposed_layout, "missing softmax scale": missing_scale,
         "missing causal mask": missing_causal_mask, "one unwritten row": unwritten_row}


def default_scale(D: int) -> float:
    return 1.0 / math.sqrt(D)
