"""lab.ops.decode's masked call: a sliding window, a logit softcap and attention sinks (Mistral's and Gemma's windows,
Gemma-2's softcap 50, GPT-OSS's sinks with a 128-key window), contiguous or paged, as the custom op
lab::decode_masked.

The rule is lab.masks.spec's, bottom-right as flash_attn_with_kvcache: token i of q_len sits on key
len - q_len + i and sees keys [len - q_len + i - left, len - q_len + i + right] of [0, len) (-1: that side
unbounded; is_causal caps the right edge at 0); softcap c > 0 maps a scaled score s to c * tanh(s / c) before the
mask; sinks, float32 (H_q,) logits in the units of the scaled scores, join the softmax's denominator and attend to
nothing (a token that sees no key then gets O = 0). The kernels (decode v03, v06-v08: kernels/common/decode_masks.cuh)
take the masks as run-time fields; the window clips the split plan to its span (window_span), computed from shapes
only, and each sequence's first key on the device, so lengths are never read on the host. The float64 reference
and the emulation of the kernel's algorithm: lab.decode.emulate_masks.
"""
from __future__ import annotations

import torch

from .. import build
from ..kernels import keep_plan, launcher
from ..kernels import resolve_version as _version
from ..masks import spec
from ..op_common import _direct, _scale
from ..registry import DECODE
from . import deferred, fast
from .checks import _check_decode
from .paged_op import _check_paged, _v03_plan

MASK_VERSIONS = ("v03", "v06", "v07", "v08")  # the versions with mask steps; the others refuse (LAB_E_MODE)
WINDOW_ALIGN = 64  # a window's first key is rounded down to a 64-key tile (kernels/common/decode_masks.cuh)


def check(query, is_causal, window_size, softcap, sinks):
    """The masks' argument checks, before any device check: a lab.masks.spec.Mask with causal folded in (right 0),
    or None when no mask is set (window None or (-1, -1), softcap 0, no sinks): the plain call."""
    mask = spec.make_mask(is_causal, window_size, softcap)  # TypeError / ValueError naming the argument
    if sinks is not None:
        if not isinstance(query, torch.Tensor) or query.dim() != 4:
            raise ValueError("query must be a 4-D (B, H_q, q_len, D) tensor to take sinks")
        spec.check_sinks(sinks, query.shape[1], query.device)
    windowed = window_size is not None and tuple(window_size) != (-1, -1)
    return mask if windowed or mask.softcap or sinks is not None else None


def window_span(capacity: int, q_len: int, left: int) -> int:
    """Keys the split plan covers: the capacity, or with a left edge the window's span (left + q_len keys and the
    rounding of its first key down to a tile), kernels/common/decode_masks.cuh's window_span."""
    return capacity if left < 0 else min(capacity, left + q_len + WINDOW_ALIGN - 1)


def _check_version(query, version) -> None:
    """A named version must have mask steps (before the device check: the answer does not depend on the GPU)."""
    if version is not None and isinstance(query, torch.Tensor) and query.dim() == 4:
        name = _version(version, DECODE, query.shape[-1], ())
        if name not in MASK_VERSIONS:
            raise ValueError(f"decode version {version!r} has no window, softcap or sinks; use one of "
                             f"{list(MASK_VERSIONS)} or version=None")


def _plan(query, heads_kv: int, span: int, version, num_splits, paged: bool) -> tuple[str, int]:
    name, splits = _v03_plan(query, heads_kv, span, version, num_splits, paged)
    if name not in MASK_VERSIONS:  # the default order must start with a masked kernel at every head dim
        raise ValueError(f"decode version {name} (the default at D {query.shape[-1]}) has no window, softcap or "
                         f"sinks; name one of {list(MASK_VERSIONS)}")
    return name, splits


def _args(mask: spec.Mask, is_causal: bool) -> tuple[int, int, float]:
    return mask.left, (0 if is_causal else mask.right), mask.softcap


@torch.library.custom_op("lab::decode_masked", mutates_args=("page_errors",))
def _masked_op(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               cache_seqlens: torch.Tensor | None, block_table: torch.Tensor | None, page_errors: torch.Tensor | None,
               sinks: torch.Tensor | None, scale: float, num_splits: int, is_causal: bool, left: int, right: int,
               softcap: float, version: str) -> torch.Tensor:
    error, out, _ = build.binding().module.decode_masked_call(
        launcher(DECODE, version), query, key_cache, value_cache, cache_seqlens, block_table, page_errors, scale,
        num_splits, is_causal, left, right, softcap, sinks)
    if error:
        raise RuntimeError(error)
    return out


@_masked_op.register_fake
def _(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, sinks, scale, num_splits, is_causal,
      left, right, softcap, version):
    return query.new_empty(query.shape)


def decode_masked(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version, block_table, is_causal,
                  page_errors, mask: spec.Mask, sinks, window_size=None, softcap_arg=None):
    """The masked call, checked as the paged / causal call is (lab.decode.paged_op), planned over the window's span,
    run by a masked kernel: the paged call without page_errors reads its flags later (lab.decode.deferred).
    window_size, softcap_arg: the caller's arguments, the key of the plan kept for lab.decode.fast.masked."""
    spec.check_bools(is_causal=is_causal)
    _check_version(query, version)
    if block_table is None:
        if page_errors is not None:
            raise ValueError("page_errors goes with block_table (a paged cache)")
        seqlens = _check_decode(query, key_cache, value_cache, cache_seqlens, scale, version, num_splits)
        heads_kv, capacity = key_cache.shape[1], key_cache.shape[2]
    else:
        block_table, seqlens = _check_paged(query, key_cache, value_cache, block_table, page_errors, cache_seqlens,
                                            scale, version, num_splits)
        heads_kv, capacity = key_cache.shape[2], block_table.shape[1] * key_cache.shape[1]
    name, splits = _plan(query, heads_kv, window_span(capacity, query.shape[2], mask.left), version, num_splits,
                         block_table is not None)
    scale = _scale(scale, query.shape[-1])
    left, right, softcap = _args(mask, is_causal)
    if sinks is not None and not sinks.is_contiguous():
        sinks = sinks.contiguous()
    if not _direct(query, key_cache, value_cache):  # traced (torch.compile): flags to page_errors or nowhere
        return _masked_op(query, key_cache, value_cache, seqlens, block_table, page_errors, sinks, scale, splits,
                          is_causal, left, right, softcap, name)
    address = launcher(DECODE, name)
    if block_table is not None and page_errors is None:  # flags read at a later call (lab.decode.deferred)
        error, out = deferred.call(address, query, key_cache, value_cache, seqlens, block_table, scale, splits,
                                   is_causal, masks=(left, right, softcap, sinks))
    else:
        error, out, _ = build.binding().module.decode_masked_call(
            address, query, key_cache, value_cache, seqlens, block_table, page_errors, scale, splits, is_causal, left,
            right, softcap, sinks)
    if error:
        raise RuntimeError(error)
    key = fast.masked_key(query, key_cache, block_table, version, num_splits, is_causal, window_size, softcap_arg)
    if key is not None:  # checked: the next such call may go straight in (lab.decode.fast.masked)
        keep_plan(key, (address, splits))
    return out
