"""Bottom-right (lower-right) causal alignment for lab.ops.attention, built from the top-left kernels.

SDPA's is_causal is top-left: query i sees keys j <= i, also when S_q != S_k. FlashAttention aligns it
bottom-right, as serving does when the S_q queries are the *last* S_q positions of an S_k-long sequence
(chunked prefill, speculative tokens): query i sees keys j <= i + S_k - S_q. torch names the two
torch.nn.attention.bias.CausalVariant.UPPER_LEFT and LOWER_RIGHT; lab.ops.attention takes
causal_variant="upper_left" (the default, SDPA's) or "lower_right" (FlashAttention's; flash-attention
issues #402 and #1778 ask for it). lab.ops.decode's is_causal is always bottom-right (lab/decode/paged.py).

No kernel change. With d = S_k - S_q:
- d = 0: the two alignments are the same mask.
- d > 0: every query sees the first d keys whole and the last S_q keys top-left causally: two kernel calls,
  non-causal on the prefix and causal on the suffix, each with its LSE, merged by log-sum-exp (lab.merge).
- d < 0: the first -d queries see no key. Their output is 0 and their LSE -inf (FlashAttention's rule;
  SDPA with a lower-right bias returns NaN there); the others are top-left causal over all keys.
The cost at d > 0: the same FLOPs in two launches, plus one merge pass over O in fp32. A mask offset inside
the kernels would save the merge; it is not built yet.
"""
from __future__ import annotations

import torch

from ..merge import lse_merge

VARIANTS = ("upper_left", "lower_right")


def lower_right(attend, query, key, value):
    """(out, lse) of causal attention aligned bottom-right. attend(q, k, v, is_causal) -> (out, lse (B, H, S_q),
    natural log) runs the top-left kernels; out comes back in query's dtype, lse in float32."""
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    d = seqlen_k - seqlen_q
    if d == 0:
        return attend(query, key, value, True)
    if d < 0:
        tail_out, tail_lse = attend(query[:, :, -d:], key, value, True)
        blind = (*query.shape[:2], -d)
        out = torch.cat([query.new_zeros(*blind, query.shape[3]), tail_out.to(query.dtype)], dim=2)
        lse = torch.cat([query.new_full(blind, float("-inf"), dtype=torch.float32), tail_lse.float()], dim=2)
        return out, lse
    out_a, lse_a = attend(query, key[:, :, :d], value[:, :, :d], False)
    out_b, lse_b = attend(query, key[:, :, d:], value[:, :, d:], True)
    work = torch.promote_types(query.dtype, torch.float32)  # fp32 for fp16/bf16 outputs
    out, lse = lse_merge(out_a.to(work), lse_a.to(work), out_b.to(work), lse_b.to(work))
    return out.to(query.dtype), lse.float()
