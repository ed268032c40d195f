"""Small torch functions standing in for kernels, for the self-test of lab.check (CPU in test_check.py,
CUDA in test_gpu.py). Each has a kernel's signature and writes into the caller's NaN-poisoned `out`:
forward run(q, k, v, is_causal, scale, out), decode run(q, k, v, seqlens, scale, out).

The correct ones must pass the harness; each wrong one reproduces a real bug class and must fail it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab import check, selftest


def _gqa(q, k):
    return k.shape[1] != q.shape[1]


# The self-test's own kernels (lab/selftest.py, shown in the harness chapter) under the names the tests use.
run_sdpa_fp32 = selftest.correct  # correct: SDPA in float32, cast to the output dtype
run_bshd_as_bhsd = selftest.transposed_layout  # wrong: (B, S, H, D) memory read as (B, H, S, D)
run_missing_scale = selftest.missing_scale  # wrong: softmax(QK^T) V, the 1/sqrt(D) forgotten
run_missing_causal_mask = selftest.missing_causal_mask  # wrong: ignores is_causal
run_unwritten_last_row = selftest.unwritten_row  # wrong: the last query row stays NaN-poisoned


def run_reference_cast(q, k, v, is_causal, scale, out):
    """Correct: the float64 reference, cast."""
    out.copy_(check.reference(q, k, v, is_causal, scale).to(out.dtype))


def run_unwritten_one_row(q, k, v, is_causal, scale, out):
    """Wrong: a single (batch 0, head 1, row 2) row is never stored."""
    run_sdpa_fp32(q, k, v, is_causal, scale, out)
    out[0, 1, 2] = float("nan")


def decode_correct(q, k, v, seqlens, scale, out):
    """Correct: each sequence attends to its first seqlens[b] keys (float32 SDPA with a padding mask)."""
    keep = torch.arange(k.shape[2], device=k.device)[None, :] < seqlens.long()[:, None]
    mask = keep[:, None, None, :]
    out.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale,
                                             enable_gqa=_gqa(q, k)).to(out.dtype))


def decode_ignores_seqlens(q, k, v, seqlens, scale, out):
    """Wrong: attends to the whole cache, garbage tail included."""
    out.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale,
                                             enable_gqa=_gqa(q, k)).to(out.dtype))


def run_ignores_strides(q, k, v, is_causal, scale, out):
    """Wrong only for strided inputs: reads each tensor's memory as if it were contiguous (B, H, S, D),
    like a kernel that computes offsets from the shape instead of the strides (LAB_BUG_LAYOUT)."""
    def as_contiguous(t):
        return t.as_strided(t.shape, torch.empty(t.shape, device="meta").stride(), t.storage_offset())
    run_sdpa_fp32(as_contiguous(q), as_contiguous(k), as_contiguous(v), is_causal, scale, out)
