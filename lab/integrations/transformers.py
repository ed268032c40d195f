"""`attn_implementation="lab"` for Hugging Face transformers models.

    import lab.integrations.transformers as lab_hf
    lab_hf.register()                      # once; then
    model = AutoModelForCausalLM.from_config(config, attn_implementation="lab")

register() adds `attention_forward` to transformers' AttentionInterface and a mask function under the same name
to its AttentionMaskInterface (transformers_masks.lab_mask: FlashAttention-2's contract, no mask for a causal batch
without padding), which the lab runs as its causal mask (bottom-right when the cached keys outnumber the new
queries, as in decoding with a KV cache), with the layer's sliding window and logit softcap, and documents packed
into one row (position ids that restart, or FlashAttention's cu_seq_lens_q / cu_seq_lens_k) through
lab.ops.attention_varlen (transformers_masks), and GPT-OSS's attention sinks (`s_aux`, one logit per query head
that joins the softmax and attends to nothing) as the kernels' `sinks`. Every keyword transformers passes is either
honoured, or known to describe the model's call rather than the attention (the cache, the outputs: BOOKKEEPING),
or refused with a TypeError naming it: an argument the lab does not understand is never dropped. A call the lab
cannot run (an explicit mask, dropout, a head dim over 256, a head dim over 128 when a gradient is wanted under
torch.use_deterministic_algorithms (no deterministic backward there) or off compute capability 9.0 (the wide
kernels, masked v12 among them, are Hopper-only), a softcap, window, sinks or packed documents with gradients at a
head dim no masked backward takes (lab.registry.MASKED_BWD) or off compute capability 9.0, CPU tensors, float32)
runs PyTorch's SDPA instead (the eager formula with a softcap or sinks, which SDPA lacks), with the window and
documents as an explicit mask and a warning naming the reason once per reason: never silently. So Gemma-2 (D = 256,
softcap 50, window 4096) and Gemma-3 (D = 256, window) run the lab's kernels on an H100 / H200: the plain layers
forward and backward, the masked ones forward on masked v12 and backward on the masked backward that
lab.registry.MASKED_BWD lists at D 256 (masked v21); a call that wants a gradient no listed kernel computes falls
back, saying why.

transformers is imported only inside register(): the adapter itself needs torch alone.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..fwd.head_dims import kernel_head_dim
from ..op_common import _capability
from ..registry import FAST_HEAD_DIMS, FWD_HEAD_DIMS, HOPPER_CAPABILITIES
from . import transformers_masks

NAME = "lab"
_warned: set[str] = set()

# Keywords the adapter acts on beyond its named parameters.
HONOURED = frozenset({"s_aux", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                      "output_attentions"})
# Keywords that describe the model's call, not the attention: the KV cache (already applied to key and value when
# the call arrives), what the model returns, the loss's normaliser. Nothing in them changes the attention's output.
BOOKKEEPING = frozenset({"use_cache", "past_key_values", "past_key_value", "cache_position", "position_embeddings",
                         "layer_idx", "output_hidden_states", "output_router_logits", "num_items_in_batch",
                         "return_dict"})


def check_keywords(kwargs: dict) -> None:
    """TypeError naming every keyword that is neither honoured nor bookkeeping and carries a value (None and False
    ask for nothing). A new transformers argument must be taught to the adapter, never ignored."""
    unknown = sorted(k for k, v in kwargs.items() if k not in HONOURED and k not in BOOKKEEPING
                     and v is not None and v is not False)
    if unknown:
        raise TypeError(f"lab attention: transformers passed {', '.join(map(repr, unknown))}, which the lab's "
                        f"adapter does not understand; it refuses the call rather than drop an argument that may "
                        f"change the attention (run attn_implementation='eager' for this model, or teach "
                        f"lab.integrations.transformers the argument)")


def unsupported(query, key, value, attention_mask, dropout: float = 0.0, softcap: float | None = None,
                sliding_window: int | None = None, packed=None, causal: bool = True, sinks=None) -> str | None:
    """Why the lab cannot run this call (a reason for the warning), or None when it can. packed: a row of
    documents (transformers_masks.documents), whose 4-D mask transformers_masks.run checks itself."""
    if not (query.is_cuda and key.is_cuda and value.is_cuda):
        return "tensors not on a CUDA device"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {query.dtype} (the kernels take float16 and bfloat16)"
    if attention_mask is not None and packed is None:
        return "an explicit attention mask (padding or a custom mask)"
    if dropout:
        return f"attention dropout {dropout}"
    masks = transformers_masks.reason(query, key, value, attention_mask, softcap, sliding_window, packed, causal,
                                      sinks)
    if masks is not None:
        return masks
    wide = max(query.shape[-1], value.shape[-1])
    try:
        kernel_head_dim(query.shape[-1], value.shape[-1])
    except ValueError:
        return f"head dim {wide} (the lab runs up to {FWD_HEAD_DIMS[-1]})"
    if wide > FAST_HEAD_DIMS[-1]:
        if torch.are_deterministic_algorithms_enabled() and torch.is_grad_enabled() and \
                (query.requires_grad or key.requires_grad or value.requires_grad):
            return (f"head dim {wide} with gradients in deterministic mode (the lab's deterministic backward runs up "
                    f"to {FAST_HEAD_DIMS[-1]})")
        capability = _capability(query.device)
        if capability not in HOPPER_CAPABILITIES:
            return (f"head dim {wide} on compute capability {capability[0]}.{capability[1]} (the lab's kernels above "
                    f"{FAST_HEAD_DIMS[-1]} run on 9.0)")
    return None


def _fallback(reason: str, query, key, value, attention_mask, dropout, scaling, is_causal, softcap=None,
              sliding_window=None, packed=None, sinks=None):
    if reason not in _warned:
        _warned.add(reason)
        what = ("the eager formula (SDPA has no softcap)" if softcap else
                "the eager formula (SDPA has no sinks)" if sinks is not None else "PyTorch SDPA")
        warnings.warn(f"lab attention: {reason}; this call runs {what} instead", stacklevel=3)
    if softcap or sinks is not None or packed is not None or \
            transformers_masks.window(sliding_window, key.shape[2]) >= 0:
        return transformers_masks.fallback(query, key, value, attention_mask, dropout, scaling, bool(is_causal),
                                           softcap, sliding_window, packed, sinks)
    gqa = query.shape[1] != key.shape[1]
    causal = is_causal and attention_mask is None and query.shape[2] > 1
    if causal and query.shape[2] != key.shape[2]:  # keys cached before these queries: bottom-right alignment
        attention_mask = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool, device=query.device).tril(
            key.shape[2] - query.shape[2])
        causal = False
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                          scale=scaling, is_causal=causal, enable_gqa=gqa)


def attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, sliding_window: int | None = None, softcap: float | None = None,
                      s_aux: torch.Tensor | None = None, **kwargs):
    """transformers' attention signature: query (B, H_q, S_q, D), key and value (B, H_kv, S_k, D) -> (output
    (B, S_q, H_q, D_v), None). is_causal defaults to the module's flag, as SDPA's adapter does. s_aux: GPT-OSS's
    sinks, (H_q,) logits in any float dtype (the kernels take them in float32; the cast keeps their gradient)."""
    from .. import ops

    check_keywords(kwargs)
    if kwargs.get("output_attentions") and "output_attentions" not in _warned:
        _warned.add("output_attentions")  # as SDPA and FlashAttention: no weights are formed, so none return
        warnings.warn("lab attention: output_attentions=True, but the lab's attention forms no weights and "
                      "returns None for them (use attn_implementation='eager' to get them)", stacklevel=2)
    sinks = None if s_aux is None else s_aux.float()
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    packed = transformers_masks.packed_documents(query, key, bool(is_causal), kwargs)
    reason = unsupported(query, key, value, attention_mask, dropout, softcap, sliding_window, packed, bool(is_causal),
                         sinks)
    masked = softcap or sinks is not None or packed is not None or \
        transformers_masks.window(sliding_window, key.shape[2]) >= 0
    if reason is None and masked:
        out = transformers_masks.run(query, key, value, attention_mask, scaling, bool(is_causal), softcap,
                                     sliding_window, packed, sinks)
        if out is not None:
            return out.contiguous(), None
        reason = "an explicit attention mask (padding or a custom mask)"
    if reason is not None:
        out = _fallback(reason, query, key, value, attention_mask, dropout, scaling, is_causal, softcap,
                        sliding_window, packed, sinks)
    else:
        causal = bool(is_causal) and query.shape[2] > 1  # one new token sees every cached key
        out = ops.attention(query, key, value, is_causal=causal, scale=scaling, enable_gqa=query.shape[1] != key.shape[1],
                            causal_variant="lower_right")
    return out.transpose(1, 2).contiguous(), None


def register(name: str = NAME) -> str:
    """Register the lab's attention (and SDPA's mask function) with transformers under `name`; returns it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, transformers_masks.lab_mask)
    return name
