"""Sliding windows, logit softcapping and packed documents for the transformers adapter (lab.integrations.transformers).

The mask function registered under the lab's name keeps FlashAttention-2's contract in transformers
(masking_utils.flash_attention_mask): a causal call with no padded token gets no mask, so the attention call applies
what the model hands it as arguments: `sliding_window` as window_size=(sliding_window - 1, 0) (transformers' rule:
query i sees key j iff i - sliding_window < j <= i), `softcap`, and documents packed into one row (position_ids
that restart) through lab.ops.attention_varlen, with cu_seqlens where the positions restart as transformers' own
FlashAttention path finds them. Any other mask (padding, a packed row's mask, a model's own overlay) comes as SDPA's
4-D boolean mask: a packed row's is checked against the documents' mask before the lab runs it, anything else runs
the fallback. The fallback applies the window, the documents and the softcap itself (SDPA has no softcap: then the
eager formula), so no call silently loses a mask.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fwd.head_dims import kernel_head_dim
from ..op_common import _capability
from ..registry import FAST_HEAD_DIMS, HOPPER_CAPABILITIES


def lab_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
             allow_is_causal_skip: bool = True, **kwargs):
    """None for a plain causal (or sliding causal) call with no padded token; else SDPA's 4-D boolean mask."""
    from transformers.masking_utils import sdpa_mask

    if allow_is_causal_skip and (attention_mask is None or (attention_mask.shape[-1] >= kv_length and
                                                            bool(attention_mask[:, -kv_length:].all()))):
        return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function, attention_mask,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def window(sliding_window, kv_len: int) -> int:
    """The window's left edge for window_size=(left, 0), or -1 when the window covers every key."""
    return sliding_window - 1 if sliding_window is not None and 0 < sliding_window < kv_len else -1


def documents(query, key, position_ids):
    """(cu_seqlens int32, max length, document id per position) of one row whose positions restart, or None."""
    if position_ids is None or query.shape[0] != 1 or query.shape[2] != key.shape[2] or query.shape[2] < 2:
        return None
    pos = position_ids.reshape(-1)
    if pos.shape[0] != query.shape[2]:
        return None
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[1:] = pos[1:] - pos[:-1] != 1  # a new document wherever the position does not step by one
    first = starts.nonzero().flatten()  # one host sync, as transformers' FlashAttention path
    if first.numel() < 2:
        return None
    cu = torch.cat([first, first.new_tensor([pos.shape[0]])]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max()), starts.cumsum(0)


def allowed(doc, q_len: int, k_len: int, causal: bool, left: int, device):
    """Boolean (S_q, S_k): the documents (or None), bottom-right causal, the window's left edge."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    ok = (j <= i) if causal else torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if left >= 0:
        ok = ok & (j >= i - left)
    if doc is not None:
        ok = ok & (doc[:, None] == doc[None, :])
    return ok


def reason(query, key, value, attention_mask, softcap, sliding_window, packed, causal: bool) -> str | None:
    """Why the lab's masked or packed kernels cannot take this call, or None."""
    left = window(sliding_window, key.shape[2])
    if not (softcap or left >= 0 or packed):
        return None
    what = (f"logit softcapping ({softcap})" if softcap else
            f"a sliding window of {sliding_window} keys over {key.shape[2]}" if left >= 0 else "packed documents")
    if left >= 0 and not causal:
        return f"{what} on a non-causal layer"
    dim = kernel_head_dim(query.shape[-1], value.shape[-1]) or max(query.shape[-1], value.shape[-1])
    if dim not in FAST_HEAD_DIMS or (packed and query.shape[-1] not in FAST_HEAD_DIMS):
        return f"{what} at head dim {max(query.shape[-1], value.shape[-1])} (the lab's masked kernels run head " \
               f"dims up to {FAST_HEAD_DIMS[-1]})"
    grads = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if grads and _capability(query.device) not in HOPPER_CAPABILITIES:
        return f"{what} with gradients off compute capability 9.0 (the masked backward runs on Hopper)"
    return None


def run(query, key, value, attention_mask, scaling, causal, softcap, sliding_window, packed):
    """The lab's call: (B, S_q, H_q, D_v) output, or None when a 4-D mask is not the packed documents' own."""
    from .. import ops

    left = window(sliding_window, key.shape[2])
    if packed is not None:
        cu, longest, doc = packed
        if attention_mask is not None:
            want = allowed(doc, query.shape[2], key.shape[2], causal, left, query.device)
            if attention_mask.dtype != torch.bool or not bool((attention_mask == want).all()):
                return None
        out = ops.attention_varlen(*(t[0].transpose(0, 1) for t in (query, key, value)), cu, cu, longest, longest,
                                   is_causal=causal, scale=scaling, window_size=(left, -1 if not causal else 0),
                                   softcap=float(softcap or 0.0))
        return out[None]
    if attention_mask is not None:
        return None
    out = ops.attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                        causal_variant="lower_right", window_size=(left, 0 if causal else -1),
                        softcap=float(softcap or 0.0))
    return out.transpose(1, 2)


def fallback(query, key, value, attention_mask, dropout, scaling, causal, softcap, sliding_window, packed):
    """SDPA (or, with softcap, the eager formula) with the window and the documents as an explicit mask."""
    if attention_mask is None:
        attention_mask = allowed(None if packed is None else packed[2], query.shape[2], key.shape[2], causal,
                                 window(sliding_window, key.shape[2]), query.device)
    group = query.shape[1] // key.shape[1]
    if not softcap:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                              scale=scaling, enable_gqa=group > 1)
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = softcap * torch.tanh((query @ k.transpose(-1, -2)).float() * scale / softcap)
    s = s.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool else s + attention_mask
    p = F.dropout(torch.softmax(s, -1), dropout).to(v.dtype)
    return p @ v
