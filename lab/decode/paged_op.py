"""lab.ops.decode's paged and causal call: a block table (paged KV cache, decode v03-v08) or the bottom-right causal
mask, as the torch.library custom op lab::decode_paged.

lab.decode.op.decode routes here; the checks it shares with the contiguous call are lab.decode.checks'. A call
without page_errors has its flags read at a later call (lab.decode.deferred); raise_page_errors reads a caller's
flags now. The paged layout is written out in NumPy in lab.decode.emulate_paged.
"""
from __future__ import annotations

import torch

from .. import build
from ..kernels import keep_plan, launcher
from ..kernels import resolve_version as _version
from ..op_common import PAGED_LAYOUT, _check_cuda, _check_tensor, _direct, _scale
from ..registry import DECODE, PAGED_DECODE, SPLIT_RULE, paged_versions
from ..masks.spec import check_bools
from . import deferred
from .checks import (MAX_NUM_SPLITS, _check_decode, _check_q_len, _decode_plans, _num_splits, _require_heads,
                     check_arguments, check_page_shapes)
from .plan import ragged_splits


def _check_paged(query, key_cache, value_cache, block_table, page_errors, cache_seqlens=None, scale=None,
                 version=None, num_splits=None):
    """The paged call's checks (the binding's check_paged, in Python's exception types); returns the block
    table as the kernel reads it (rows contiguous) and cache_seqlens as the kernels read them."""
    _check_tensor(query, "query", cuda=False)
    _check_q_len(query)
    _check_tensor(key_cache, "key_cache", query, PAGED_LAYOUT, cuda=False)
    _check_tensor(value_cache, "value_cache", query, PAGED_LAYOUT, cuda=False)
    num_pages, page_size, heads_kv, head_dim = check_page_shapes(query, key_cache, value_cache)
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be an int32 tensor of shape (B, max_pages), got "
                        f"{getattr(block_table, 'dtype', type(block_table).__name__)}")
    if block_table.dim() != 2 or block_table.shape[0] != query.shape[0]:
        raise ValueError(f"block_table must have shape ({query.shape[0]}, max_pages), got {tuple(block_table.shape)}")
    if block_table.device != query.device:
        raise ValueError(f"block_table is on {block_table.device} but query is on {query.device}")
    if block_table.shape[1] == 0:
        raise ValueError("block_table must have at least one column (max_pages >= 1)")
    if block_table.shape[1] * page_size > 2**31 - 1 - 64 * MAX_NUM_SPLITS:
        raise ValueError(f"block_table capacity max_pages * page_size = {block_table.shape[1] * page_size} "
                         f"overflows the kernel's int32 key offsets")
    if page_errors is not None:
        if not isinstance(page_errors, torch.Tensor) or page_errors.dtype != torch.int32:
            raise TypeError("page_errors must be an int32 tensor of shape (B,)")
        if page_errors.shape != (query.shape[0],) or page_errors.device != query.device or \
                not page_errors.is_contiguous():
            raise ValueError(f"page_errors must be a contiguous ({query.shape[0]},) tensor on {query.device}, got "
                             f"{tuple(page_errors.shape)} on {page_errors.device}")
    seqlens = check_arguments(query, cache_seqlens, scale, version, num_splits)
    _check_cuda(query)
    return _kernel_table(block_table), seqlens


def _kernel_table(block_table):
    """The table itself when its rows are contiguous and apart, else a contiguous copy (an expanded or
    transposed table): the kernel reads row b as max_pages consecutive ints."""
    rows_ok = block_table.shape[1] <= 1 or block_table.stride(1) == 1
    if rows_ok and (block_table.shape[0] <= 1 or block_table.stride(0) >= block_table.shape[1]):
        return block_table
    return block_table.contiguous()


def _v03_plan(query, heads_kv: int, capacity: int, version, num_splits, paged: bool = False) -> tuple[str, int]:
    """(version, splits) of a paged or causal call, memoised like _decode_plan; the plan is the version's rule
    over the cache capacity (for a paged cache max_pages * page_size, known without a host sync) and, paged, at
    least one split per RAGGED_CHUNK keys of the capacity (lab.decode.plan.ragged_splits)."""
    key = ("v03", query.shape, heads_kv, capacity, query.device, version, num_splits, paged)
    plan = _decode_plans.get(key)
    if plan is None:
        if version is not None and _version(version, DECODE, query.shape[-1], ()) not in PAGED_DECODE:
            raise ValueError(f"decode version {version!r} has no block table or causal mask; use one of "
                             f"{list(PAGED_DECODE)} or version=None")
        takes = paged_versions(heads_kv)
        named = version is not None and _version(version, DECODE, query.shape[-1], ())
        if named:  # a version off the default list (v05) may be named too
            _require_heads(version, named, heads_kv, takes)
        name = _version(version, DECODE, query.shape[-1], takes)
        splits = _num_splits(num_splits, query.shape[0], heads_kv, capacity, query.device, SPLIT_RULE.get(name, name))
        if paged and num_splits is None:
            splits = ragged_splits(splits, capacity)
        plan = keep_plan(key, (name, splits), _decode_plans)
    return plan


def _v03_impl(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, scale: float, num_splits: int,
              is_causal: bool, version: str):
    out, errors = build.binding().decode_paged_call(launcher(DECODE, version), query, key_cache, value_cache,
                                                    cache_seqlens, block_table, page_errors, scale, num_splits,
                                                    is_causal)
    return out, errors


@torch.library.custom_op("lab::decode_paged", mutates_args=("page_errors",))
def _v03_op(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, cache_seqlens: torch.Tensor | None,
            block_table: torch.Tensor | None, page_errors: torch.Tensor | None, scale: float, num_splits: int,
            is_causal: bool, version: str) -> torch.Tensor:
    return _v03_impl(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, scale, num_splits,
                     is_causal, version)[0]


@_v03_op.register_fake
def _(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, scale, num_splits, is_causal, version):
    return query.new_empty(query.shape)


def raise_page_errors(errors) -> None:
    """ValueError naming every sequence whose page_errors flag is set (reads the flags: one host sync), for a caller
    that passed page_errors and wants them checked now."""
    if errors is None or not bool(errors.any()):
        return
    rows = errors.nonzero().flatten().tolist()
    raise ValueError(f"block_table is bad for sequence(s) {deferred.named_flags(zip(rows, errors[rows].tolist()))}: "
                     f"their outputs are zero. (lab.ops.decode writes these flags into page_errors with no host "
                     f"sync; reading them here waited for the GPU.)")


def _decode_v03(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version, block_table, is_causal,
                page_errors):
    """The paged or causal call, checked; None for a causal call that is the unmasked one (one token, a contiguous
    cache, no version named: it sees its whole cache), which lab.decode.op.decode runs as such."""
    check_bools(is_causal=is_causal)
    if block_table is None:
        if page_errors is not None:
            raise ValueError("page_errors goes with block_table (a paged cache)")
        seqlens = _check_decode(query, key_cache, value_cache, cache_seqlens, scale, version, num_splits)
        heads_kv, capacity = key_cache.shape[1], key_cache.shape[2]
        if query.shape[2] == 1 and version is None:  # one token sees its whole cache: no mask, v01/v02's call
            return None
    else:
        block_table, seqlens = _check_paged(query, key_cache, value_cache, block_table, page_errors, cache_seqlens,
                                            scale, version, num_splits)
        heads_kv, capacity = key_cache.shape[2], block_table.shape[1] * key_cache.shape[1]
    name, splits = _v03_plan(query, heads_kv, capacity, version, num_splits, block_table is not None)
    scale = _scale(scale, query.shape[-1])
    if _direct(query, key_cache, value_cache):
        if block_table is not None and page_errors is None:  # flags read at a later call (lab.decode.deferred)
            error, out = deferred.call(launcher(DECODE, name), query, key_cache, value_cache, seqlens, block_table,
                                       scale, splits, is_causal)
            if error:
                raise RuntimeError(error)
        else:
            out = _v03_impl(query, key_cache, value_cache, seqlens, block_table, page_errors, scale, splits,
                            is_causal, name)[0]
        if block_table is not None:  # checked: the next such call may go straight in (fast.paged / paged_deferred)
            keep_plan(("paged", query.shape, key_cache.shape, block_table.shape, query.get_device(), version,
                       num_splits), (launcher(DECODE, name), splits))
        return out
    # traced (torch.compile, fake tensors): the flags go to page_errors when given, else nowhere (no host read)
    return _v03_op(query, key_cache, value_cache, seqlens, block_table, page_errors, scale, splits, is_causal, name)
