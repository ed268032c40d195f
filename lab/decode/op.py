"""lab.ops.decode: split-K decoding over a contiguous or paged KV cache, as torch.library custom ops.

decode() is the one entry: the contiguous call is here (lab::decode), a block table or a causal call goes to
lab.decode.paged_op (lab::decode_paged), and the checks both share are lab.decode.checks'. The split plan and the
paged error flags are lab.decode.plan's (memoised per shape, no host sync); the paged layout is written out in NumPy
in lab.decode.emulate_paged. The checks shared with lab.ops.attention are lab.op_common's.
"""
from __future__ import annotations

import torch
from torch import Tensor as _Tensor

from .. import build
from ..kernels import keep_plan, launcher
from ..kernels import resolve_version as _version
from ..op_common import _direct, _scale
from ..registry import DECODE, PAGED_HEADS, SPLIT_RULE, default_decode_version
from . import deferred, fast, masks
from .checks import (MAX_DECODE_Q_LEN, MAX_NUM_SPLITS, _check_decode, _decode_plans, _num_splits,  # noqa: F401
                     _require_heads)
# The paged and causal call; the names lab.ops and the tests read here stay here.
from .paged_op import (_check_paged, _decode_v03, _kernel_table, _v03_impl, _v03_op, _v03_plan,  # noqa: F401
                       raise_page_errors)


def _decode_version(version, query, key_cache) -> str:
    if version is None:  # the default, or for a head dim no kernel takes: a ValueError naming those that exist
        return _version(None, DECODE, query.shape[-1],
                        (default_decode_version(query.shape[1], key_cache.shape[1], query.shape[2], query.shape[-1]),))
    name, heads_kv = _version(version, DECODE, query.shape[-1], ()), key_cache.shape[1]
    _require_heads(version, name, heads_kv, [v for v in DECODE if not heads_kv % PAGED_HEADS.get(v, 1)])
    return name


def _decode_impl(query, key_cache, value_cache, cache_seqlens, scale: float, num_splits: int, version: str):
    # The binding allocates out and one workspace for the partials (B, Hq, q_len, num_splits, D + 1 floats).
    out, = build.binding().decode_call(launcher(DECODE, version), query, key_cache, value_cache, cache_seqlens,
                                       scale, num_splits)
    return out


@torch.library.custom_op("lab::decode", mutates_args=())
def _decode_op(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               cache_seqlens: torch.Tensor | None, scale: float, num_splits: int, version: str) -> torch.Tensor:
    return _decode_impl(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version)


@_decode_op.register_fake
def _(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version):
    return query.new_empty(query.shape)


def _decode_plan(query, key_cache, version, num_splits) -> tuple[str, int]:
    """(kernel, split count) for this call, memoised on the shapes, device and arguments: a decoding loop
    repeats them every step, and one dict lookup is cheaper than resolving both again (host cost per step)."""
    key = (query.shape, key_cache.shape, query.device, version, num_splits)
    plan = _decode_plans.get(key)
    if plan is None:
        name = _decode_version(version, query, key_cache)
        plan = keep_plan(key, (name, _num_splits(num_splits, query.shape[0], key_cache.shape[1], key_cache.shape[2],
                                                 query.device, SPLIT_RULE.get(name, name))), _decode_plans)
    return plan


def decode(query, key_cache, value_cache, cache_seqlens=None, scale: float | None = None, num_splits=None,
           version=None, *, block_table=None, is_causal: bool = False, page_errors=None, window_size=None,
           softcap: float = 0.0, sinks=None):
    """Split-K decoding: q_len (1..16) new tokens per sequence attend to a KV cache (B, H_kv, S_cache, D).

    cache_seqlens (B,) int32 on the device: sequence b sees only its first cache_seqlens[b] keys (None: all
    of them); a length of 0 gives a zero output. Lengths are never read on the host (no synchronisation,
    so the call can be captured in a CUDA graph and replayed with new lengths): the kernels clamp each one
    to [0, S_cache], so a negative length gives zeros and one past the cache sees the whole cache.
    H_q must be a multiple of H_kv (GQA/MQA is implied, as in serving). D is one of lab.registry.DECODE_HEAD_DIMS
    (64, 80, 96, 128, 192, 256; decode v01, v04 and v07 take 64 and 128, v08 80 and 96, v02 and v03 all of them);
    any other raises ValueError. The default kernel: lab.registry.default_decode_version (v07 at D 64 / 128, v08 at
    80 / 96, else v02), and for a block table or a causal call the first of lab.registry.paged_versions that takes D
    (v07 at D 64 / 128, v08 at 80 / 96, else v03; v04, 8 heads a block, runs when named).
    num_splits: None uses the memoised split plan (lab.decode.plan.split_plan) for this GPU; an int in
    [1, MAX_NUM_SPLITS] overrides it.

    Paged cache (decode v03-v08): with block_table (B, max_pages) int32, key_cache and value_cache are
    (num_pages, page_size, H_kv, D), the layout of vLLM and flash_attn_with_kvcache, page_size a multiple of
    16; key j of sequence b is row j % page_size of page block_table[b, j // page_size]. Lengths are clamped
    to [0, max_pages * page_size] (None: every sequence that long). The split plan is chosen from shapes
    only (max_pages * page_size), so the call can be captured in a CUDA graph and replayed with new
    cache_seqlens and block_table contents. Bad tables are found on the device and never read out of
    bounds: a sequence with a page index outside [0, num_pages) among its keys, or with cache_seqlens[b] >
    max_pages * page_size, gets a zero output and a flag (lab.decode.plan.PAGE_E_*). page_errors, an int32
    (B,) CUDA tensor, receives the flags with no host sync (serving loops, graphs); nothing reads them for you.
    Without it an eager call never waits for the GPU either: its flags are read later (lab.decode.deferred), and
    a later lab.ops.decode call, once the GPU has run this one, raises ValueError naming this call, its bad
    sequences and why (their outputs were zeros), instead of running. lab.ops.check_page_errors() waits for
    every such call and raises the same error: call it where you want the error at a known point. Under CUDA-graph
    capture or torch.compile the flags of a call without page_errors are not read.
    is_causal (q_len > 1, contiguous or paged): bottom-right, as FlashAttention's decode: token i of q_len
    sees keys [0, len - q_len + i], so the last token sees the whole cache (lab.ops.attention's is_causal is
    SDPA's top-left); a token with no key left gets zeros. Causal calls run the paged versions' kernels.

    Masks (lab.decode.masks; decode v03, v06-v08, contiguous or paged, any of the head dims): window_size
    (left, right), -1 for an unbounded side: token i sees keys [len - q_len + i - left, len - q_len + i + right] of
    its sequence, as flash_attn_with_kvcache (is_causal caps right at 0); softcap c > 0: scores s -> c * tanh(s / c)
    before the softmax; sinks, float32 (H_q,) logits on the query's device, join each row's softmax denominator
    and attend to nothing. The window clips the split plan to its span on the device, so a window never adds work.
    A named version without mask steps (v01, v02, v04, v05) raises ValueError; the default picks one that has them.
    """
    if window_size is not None or softcap != 0.0 or sinks is not None:
        if (block_table is None or page_errors is not None) and not torch.compiler.is_compiling() and deferred.queued:
            deferred.poll()  # as every other decode call while default paged calls' flags are queued
        out = fast.masked(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, is_causal, scale,
                          num_splits, version, window_size, softcap, sinks)  # a plan checked before: one crossing
        if out is not None:
            return out
        mask = masks.check(query, is_causal, window_size, softcap, sinks)  # checked before any device check
        if mask is not None:
            return masks.decode_masked(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version,
                                       block_table, is_causal, page_errors, mask, sinks, window_size, softcap)
    if block_table is not None and page_errors is None and (is_causal is False or is_causal is True):
        out = fast.paged_deferred(query, key_cache, value_cache, cache_seqlens, block_table, is_causal, scale,
                                  num_splits, version)  # retires the earlier such calls' flags in the same crossing
        if out is not None:
            return out
    elif not torch.compiler.is_compiling() and deferred.queued:  # (asked first: dynamo never reads `queued`)
        deferred.poll()  # another decode call while flags are queued: one crossing, no wait
    if block_table is None and page_errors is None and is_causal is False and type(query) is _Tensor:
        out = fast.contiguous(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version)
        if out is not None:
            return out
    if page_errors is not None and block_table is not None and (is_causal is False or is_causal is True):
        out = fast.paged(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, is_causal, scale,
                         num_splits, version)
        if out is not None:
            return out
    if block_table is not None or page_errors is not None or is_causal is not False:
        out = _decode_v03(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version, block_table,
                          is_causal, page_errors)
        if out is not None:
            return out
        return decode(query, key_cache, value_cache, cache_seqlens, scale, num_splits)  # causal, one token: unmasked
    seqlens = _check_decode(query, key_cache, value_cache, cache_seqlens, scale, version, num_splits)
    name, splits = _decode_plan(query, key_cache, version, num_splits)
    if not _direct(query, key_cache, value_cache):
        return _decode_op(query, key_cache, value_cache, seqlens, _scale(scale, query.shape[-1]), splits, name)
    out = _decode_impl(query, key_cache, value_cache, seqlens, _scale(scale, query.shape[-1]), splits, name)
    keep_plan(("decode", query.shape, key_cache.shape, query.get_device(), version, num_splits),
              (launcher(DECODE, name), splits))  # checked: the next such call may go straight in
    return out


def _workspaces(q, splits: int):
    """partial_o (B, Hq, q_len, splits, D) and partial_lse (B, Hq, q_len, splits), float32."""
    B, Hq, q_len, D = q.shape
    return (torch.empty(B, Hq, q_len, splits, D, device=q.device, dtype=torch.float32),
            torch.empty(B, Hq, q_len, splits, device=q.device, dtype=torch.float32))


def decode_writer(version: str | None = None, num_splits=None):
    """For lab.check: run(q, k, v, seqlens, scale, out) writes into the caller's (poisoned) `out`.

    version=None chooses per shape, as lab.ops.decode does.
    """
    def run(q, k, v, seqlens, scale, out):
        name, splits = _decode_plan(q, k, version, num_splits)
        build.binding().decode_fwd(launcher(DECODE, name), q, k, v, out, seqlens, *_workspaces(q, splits), None,
                                   _scale(scale, q.shape[-1]), splits)
    return run


def decode_call_factory(version: str | None = None, num_splits=None):
    """For lab.sweep: make(q, k, v, seqlens) -> a zero-argument call, workspace allocated up front."""
    def make(q, k, v, seqlens):
        name, splits = _decode_plan(q, k, version, num_splits)
        work, out, address, bind = _workspaces(q, splits), torch.empty_like(q), launcher(DECODE, name), build.binding()
        scale = _scale(None, q.shape[-1])
        return lambda: bind.decode_fwd(address, q, k, v, out, seqlens, *work, None, scale, splits)
    return make
