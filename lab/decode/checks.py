"""What lab.ops.decode's contiguous call (lab.decode.op) and its paged and causal call (lab.decode.paged_op) share:
the argument checks, the split count and the memo of their plans (no host sync in any of them).

The checks shared with lab.ops.attention are lab.op_common's; the split plan is lab.decode.plan's.
"""
from __future__ import annotations

import torch

from ..kernels import resolve_version
from ..op_common import _check_cuda, _check_heads, _check_qkv, _scale, sm_count
from ..registry import DECODE, PAGED_HEADS
from .plan import split_plan  # memoised, O(1) per decode step

MAX_DECODE_Q_LEN = 16


def _require_heads(version, name: str, heads_kv: int, instead) -> None:
    """A version whose block reads PAGED_HEADS[name] KV heads together (v04) takes H_kv only in multiples of that:
    the kernel would refuse the launch with a bare status code, so the call says why first."""
    if heads_kv % PAGED_HEADS.get(name, 1):
        raise ValueError(f"decode version {version!r} needs H_kv to be a multiple of {PAGED_HEADS[name]}, got "
                         f"{heads_kv}; use one of {list(instead)} or version=None")


def check_page_shapes(query, key_cache, value_cache) -> tuple[int, int, int, int]:
    """The paged cache's shape rules that decode and the paged prefill share (vLLM's layout: num_pages, page_size,
    H_kv, D); returns those four."""
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"key_cache and value_cache shapes differ: {tuple(key_cache.shape)} vs "
                         f"{tuple(value_cache.shape)}")
    num_pages, page_size, heads_kv, head_dim = key_cache.shape
    if page_size <= 0 or page_size % 16:
        raise ValueError(f"page_size (key_cache.shape[1]) must be a positive multiple of 16, got {page_size}")
    if num_pages == 0:
        raise ValueError("key_cache has no pages (num_pages = 0)")
    if heads_kv == 0 or query.shape[1] % heads_kv:
        raise ValueError(f"query heads ({query.shape[1]}) must be a multiple of key_cache heads ({heads_kv})")
    return num_pages, page_size, heads_kv, head_dim


MAX_NUM_SPLITS = 1024  # the combine kernel and the int offsets of the workspaces are sized for this many


def _check_num_splits(num_splits) -> None:
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or not 1 <= num_splits <= MAX_NUM_SPLITS):
        raise ValueError(f"num_splits must be an int in [1, {MAX_NUM_SPLITS}] or None, got {num_splits!r}")


def _num_splits(num_splits, batch, heads_kv, seqlen, device, version: str = "v01") -> int:
    _check_num_splits(num_splits)
    if num_splits is not None:
        return num_splits
    return split_plan(batch, heads_kv, seqlen, sm_count(device), version)


def _check_decode(query, key_cache, value_cache, cache_seqlens, scale=None, version=None, num_splits=None):
    """The contiguous call's checks; returns cache_seqlens as the kernels read them."""
    _check_qkv(query, key_cache, value_cache, "key_cache", "value_cache")
    _check_q_len(query)
    _check_heads(query, key_cache, True, "key_cache")
    seqlens = check_arguments(query, cache_seqlens, scale, version, num_splits)
    _check_cuda(query)
    return seqlens


def check_arguments(query, cache_seqlens, scale, version, num_splits):
    """What can be said of a decode call's other arguments without its device, said before the device check (a
    call on CPU tensors names its bad argument first): cache_seqlens' type and shape, a finite scale, the head dim
    (some decode kernel's) and a named version that has it, num_splits' range. Returns cache_seqlens as the
    kernels read them."""
    seqlens = _check_seqlens(query, cache_seqlens)
    _scale(scale, query.shape[-1])
    resolve_version(version, DECODE, query.shape[-1], tuple(DECODE))
    _check_num_splits(num_splits)
    return seqlens


def _check_q_len(query):
    if not 1 <= query.shape[2] <= MAX_DECODE_Q_LEN:
        raise ValueError(f"query length must be 1..{MAX_DECODE_Q_LEN} tokens for decode, got {query.shape[2]} "
                         f"(use lab.ops.attention for prefill)")


def _check_seqlens(query, cache_seqlens):
    if cache_seqlens is None:
        return None
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError("cache_seqlens must be an int32 or int64 tensor of shape (B,)")
    if cache_seqlens.shape != (query.shape[0],):
        raise ValueError(f"cache_seqlens must have shape ({query.shape[0]},), got {tuple(cache_seqlens.shape)}")
    if cache_seqlens.device != query.device:
        raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but query is on {query.device}")
    # No value check here: reading min/max would synchronise with the GPU on every step and break CUDA-graph
    # capture (cudaErrorStreamCaptureInvalidated). The kernels clamp each length to [0, S_cache] on the
    # device instead: a negative length attends to nothing (zeros), a length past the cache to the whole
    # cache. Never an out-of-bounds read.
    if cache_seqlens.dtype != torch.int32 or not cache_seqlens.is_contiguous():
        cache_seqlens = cache_seqlens.to(torch.int32).contiguous()
    return cache_seqlens


# (kernel, split count) per call shape, device and arguments: lab.decode.op._decode_plan's and paged_op._v03_plan's
_decode_plans: dict = {}
