"""The log-sum-exp merge of partial attention results over disjoint key sets, in torch.

The algebra of the split-K combine (lab.decode.splits.merge_partials, common/splitk_combine.cuh): the ring
(lab.ring) merges one K/V shard per step with it, and the bottom-right causal alignment (lab.fwd.causal) its
prefix and suffix.
"""
from __future__ import annotations

import torch


def lse_merge(out_a, lse_a, out_b, lse_b):
    """Merge two partial softmax results over disjoint key sets: L = log(e^La + e^Lb),
    O = e^(La-L) Oa + e^(Lb-L) Ob. A part that saw no key has L = -inf and weight 0; rows that saw no key
    at all keep O = 0, L = -inf (lab.decode.splits.merge_partials, the combine kernel's rule)."""
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    wa = torch.exp(lse_a - safe).unsqueeze(-1)
    wb = torch.exp(lse_b - safe).unsqueeze(-1)
    return wa * out_a + wb * out_b, lse
