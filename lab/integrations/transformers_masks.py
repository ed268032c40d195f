"""Sliding windows, logit softcapping and packed documents for the transformers adapter (lab.integrations.transformers).

The mask function registered under the lab's name keeps FlashAttention-2's contract in transformers
(masking_utils.flash_attention_mask): a causal call with no padded token gets no mask, so the attention call applies
what the model hands it as arguments: `sliding_window` as window_size=(sliding_window - 1, 0) (transformers' rule:
query i sees key j iff i - sliding_window < j <= i), `softcap`, and documents packed into one row (position_ids
that restart) through lab.ops.attention_varlen, with cu_seqlens where the positions restart as transformers' own
FlashAttention path finds them. Any other mask (padding, a packed row's mask, a model's own overlay) comes as SDPA's
4-D boolean mask: a packed row's is checked against the documents' mask before the lab runs it, anything else runs
the fallback. The fallback applies the window, the documents, the softcap and the sinks itself (SDPA has neither softcap nor
sinks: then the eager formula), so no call silently loses a mask.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..fwd.head_dims import kernel_head_dim, masked_varlen_width
from ..masks.fast import masked_head_dims
from ..masks.op import backward_head_dims
from ..op_common import _capability
from ..registry import FWD_HEAD_DIMS, HOPPER_CAPABILITIES


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


def from_cu_seqlens(query, key, cu_q, cu_k, max_q=None, max_k=None):
    """The documents of one packed row given as FlashAttention's cumulative lengths: (cu_seqlens int32, max length,
    document id per position), or None for a single document. ValueError for what the lab cannot honour."""
    if cu_k is None or not torch.equal(cu_q.to(cu_k.device).long(), cu_k.long()):
        raise ValueError("lab attention: cu_seq_lens_q and cu_seq_lens_k must be given together and be equal (packed "
                         "self-attention); the adapter runs no other packing")
    total = int(cu_q[-1])
    if query.shape[0] != 1 or query.shape[2] != total or key.shape[2] != total or int(cu_q[0]) != 0:
        raise ValueError(f"lab attention: cu_seq_lens_q {cu_q.tolist()} does not describe one packed row of "
                         f"{query.shape[2]} queries and {key.shape[2]} keys (batch {query.shape[0]}, must be 1)")
    if cu_q.numel() < 3:
        return None
    cu = cu_q.to(device=query.device, dtype=torch.int32)
    lengths = cu[1:] - cu[:-1]
    longest = int(lengths.max())
    if max(max_q or 0, max_k or 0) > longest:  # a larger bound is harmless, but say what the row holds
        longest = int(max(max_q or 0, max_k or 0))
    doc = torch.repeat_interleave(torch.arange(1, lengths.numel() + 1, device=query.device), lengths.long())
    return cu, longest, doc


def packed_documents(query, key, causal: bool, kwargs):
    """The packed documents of this call: the caller's cu_seq_lens_q / cu_seq_lens_k when given, else restarting
    position_ids of a causal call on the GPU (documents()), else None."""
    if kwargs.get("cu_seq_lens_q") is not None or kwargs.get("cu_seq_lens_k") is not None:
        if kwargs.get("cu_seq_lens_q") is None:
            raise ValueError("lab attention: cu_seq_lens_k without cu_seq_lens_q")
        return from_cu_seqlens(query, key, kwargs["cu_seq_lens_q"], kwargs.get("cu_seq_lens_k"),
                               kwargs.get("max_length_q"), kwargs.get("max_length_k"))
    return documents(query, key, kwargs.get("position_ids")) if causal and query.is_cuda else None


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


def reason(query, key, value, attention_mask, softcap, sliding_window, packed, causal: bool,
           sinks=None) -> str | None:
    """Why the lab's masked or packed kernels cannot take this call, or None."""
    left = window(sliding_window, key.shape[2])
    if not (softcap or left >= 0 or packed or sinks is not None):
        return None
    what = (f"logit softcapping ({softcap})" if softcap else
            f"a sliding window of {sliding_window} keys over {key.shape[2]}" if left >= 0 else
            "attention sinks" if sinks is not None else "packed documents")
    if left >= 0 and not causal:
        return f"{what} on a non-causal layer"
    wide, capability = max(query.shape[-1], value.shape[-1]), _capability(query.device)
    dims = masked_head_dims(capability)  # 64 / 128; 192 / 256 on compute capability 9.0 (masked v12)
    dim = kernel_head_dim(query.shape[-1], value.shape[-1]) or wide
    if dim not in dims:
        return f"{what} at head dim {wide} (the lab's masked kernels run head dims up to {dims[-1]} on this " \
               f"device; up to {FWD_HEAD_DIMS[-1]} on compute capability 9.0)"
    if packed and (query.shape[-1] != value.shape[-1] or masked_varlen_width(query.shape[-1], dims) is None):
        return f"{what} at head dims {query.shape[-1]} / {value.shape[-1]} (the packed kernels take D_qk = D_v " \
               f"at {list(dims)}, and pad 129-255)"
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, sinks))
    if grads and capability not in HOPPER_CAPABILITIES:
        return f"{what} with gradients off compute capability 9.0 (the masked backward runs on Hopper)"
    if grads and dim not in backward_head_dims(capability):
        return f"{what} with gradients at head dim {wide} (the masked backward runs head dims " \
               f"{backward_head_dims(capability)}; the forward alone runs the lab's kernels)"
    if grads and torch.are_deterministic_algorithms_enabled():  # (lab.masks.backward would raise)
        return f"{what} with gradients in deterministic mode (the masked backward adds dQ in no fixed order)"
    return None


def run(query, key, value, attention_mask, scaling, causal, softcap, sliding_window, packed, sinks=None):
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
                                   softcap=float(softcap or 0.0), sinks=sinks)
        return out[None]
    if attention_mask is not None:
        return None
    out = ops.attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                        causal_variant="lower_right", window_size=(left, 0 if causal else -1),
                        softcap=float(softcap or 0.0), sinks=sinks)
    return out.transpose(1, 2)


def fallback(query, key, value, attention_mask, dropout, scaling, causal, softcap, sliding_window, packed, sinks=None):
    """SDPA (or, with a softcap or sinks, the eager formula) with the window and the documents as an explicit mask.
    A sink is one more logit per head in each row's softmax, with no value: GPT-OSS's eager formula."""
    if attention_mask is None:
        attention_mask = allowed(None if packed is None else packed[2], query.shape[2], key.shape[2], causal,
                                 window(sliding_window, key.shape[2]), query.device)
    group = query.shape[1] // key.shape[1]
    if not softcap and sinks is None:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                              scale=scaling, enable_gqa=group > 1)
    k, v = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    s = (query @ k.transpose(-1, -2)).float() * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~attention_mask, float("-inf")) if attention_mask.dtype == torch.bool else s + attention_mask
    if sinks is not None:
        sink = sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    p = F.dropout(p, dropout).to(v.dtype)
    return p @ v
