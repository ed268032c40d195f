"""lab.ops.decode's one-crossing calls: a call whose shapes passed the full path's checks once goes straight into the
binding, its plan (launcher address, split count) one dict lookup in lab.kernels.plans (which lab.kernels.reload()
forgets with the launcher addresses), keyed by (kind, the query's and caches' shapes, [the table's shape,] the device,
the version and splits asked). A None answer sends the caller down its full path, which raises the right error."""
from __future__ import annotations

from torch import Tensor as _Tensor

from .. import build
from ..kernels import plans
from ..op_common import _direct, _eager, _scale
from . import deferred


def contiguous(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version):
    """The eager contiguous call in one crossing into the binding (decode_auto), or None: then the full path runs,
    raising the right error for whatever the binding refused.

    Why: in a cold call (an L2 flush, then one call) the host time is not hidden, and a batch-1 step is ~20 us of GPU
    work, while the contiguous op's checks and plan lookup in Python cost several microseconds over the binding call.
    Here the plan (launcher and split count) is one dict lookup keyed by what the full path validated once (the
    query's and cache's shapes, the device, the version and splits asked); every rule that can change between two
    calls of one shape is decode_auto's, in C++ (binding.cpp)."""
    if type(key_cache) is not _Tensor or type(value_cache) is not _Tensor or \
            (cache_seqlens is not None and type(cache_seqlens) is not _Tensor) or \
            (scale is not None and type(scale) is not float) or not _eager():
        return None
    plan = plans.get(("decode", query.shape, key_cache.shape, query.get_device(), version, num_splits))
    if plan is None:
        return None
    address, splits = plan
    error, out = build.binding().module.decode_auto(address, query, key_cache, value_cache, cache_seqlens, scale,
                                                    splits)
    return None if error else out


def _paged_plan(query, key_cache, value_cache, block_table, version, num_splits):
    """(launcher address, splits) of a paged call whose shapes the full path validated once, or None."""
    if type(block_table) is not _Tensor or type(query) is not _Tensor:
        return None
    plan = plans.get(("paged", query.shape, key_cache.shape, block_table.shape, query.get_device(), version, num_splits))
    return plan if plan is not None and _direct(query, key_cache, value_cache) else None


def paged(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, is_causal, scale, num_splits, version):
    """The graph-safe paged call (page_errors given) in one crossing into the binding, or None: then the full path
    runs, raising the right error for whatever the binding refused.

    Why: a paged call's Python checks (table, flags, lengths, caches) cost several microseconds more than the
    contiguous call's, and an eager serving step of a small cache is tens of microseconds. Here the plan (kernel
    and split count) is one dict lookup keyed by the shapes that the full path validated once (q_len, capacity,
    H_kv against the version), and every per-call rule (devices, dtypes, strides, the flags buffer) is the
    binding's check_paged in C++. Lengths that are not int32, a table whose rows need a copy, tracing, or
    gradients take the full path."""
    plan = _paged_plan(query, key_cache, value_cache, block_table, version, num_splits)
    if plan is None:
        return None
    address, splits = plan
    error, out, _ = build.binding().module.decode_paged_call(address, query, key_cache, value_cache, cache_seqlens,
                                                             block_table, page_errors, _scale(scale, query.shape[-1]),
                                                             splits, is_causal)
    return None if error else out


def paged_deferred(query, key_cache, value_cache, cache_seqlens, block_table, is_causal, scale, num_splits, version):
    """The default paged call (no page_errors) in one crossing, as paged() is the page_errors call, through
    lab.decode.deferred.call (the binding first retires the earlier such calls' completed flags: ValueError if one
    was bad, and nothing runs then). None: the full path runs (no plan yet, tracing, gradients, or a refusal, which
    the full path raises as the right error)."""
    plan = _paged_plan(query, key_cache, value_cache, block_table, version, num_splits)
    if plan is None:
        return None
    address, splits = plan
    error, out = deferred.call(address, query, key_cache, value_cache, cache_seqlens, block_table,
                               _scale(scale, query.shape[-1]), splits, is_causal)
    return None if error else out


def masked_key(query, key_cache, block_table, version, num_splits, is_causal, window_size, softcap):
    """The plan key of a masked call (lab.decode.masks), or None when an argument is not of the plain types a key
    can hold (the full path then checks and runs it)."""
    if type(window_size) is not tuple and window_size is not None or type(softcap) not in (float, int) or \
            type(is_causal) is not bool:
        return None
    return ("masked", query.shape, key_cache.shape, None if block_table is None else block_table.shape,
            query.get_device(), version, num_splits, is_causal, window_size, softcap)


def masked(query, key_cache, value_cache, cache_seqlens, block_table, page_errors, is_causal, scale, num_splits,
           version, window_size, softcap, sinks):
    """A masked call whose shapes and masks the full path (lab.decode.masks.decode_masked) checked once, in one
    crossing into the binding (decode_masked_call, or the deferred call for a table without page_errors), or None.
    Every per-call rule (devices, dtypes, strides, the sinks' shape and dtype, the flags) is the binding's."""
    if type(query) is not _Tensor or type(key_cache) is not _Tensor or type(value_cache) is not _Tensor or \
            (block_table is not None and type(block_table) is not _Tensor) or \
            (sinks is not None and type(sinks) is not _Tensor) or (scale is not None and type(scale) is not float):
        return None
    key = masked_key(query, key_cache, block_table, version, num_splits, is_causal, window_size, softcap)
    plan = plans.get(key) if key is not None else None
    if plan is None or not _direct(query, key_cache, value_cache):
        return None
    address, splits = plan
    left, right = window_size or (-1, -1)
    masks = (left, 0 if is_causal else right, float(softcap), sinks)
    if block_table is not None and page_errors is None:
        error, out = deferred.call(address, query, key_cache, value_cache, cache_seqlens, block_table,
                                   _scale(scale, query.shape[-1]), splits, is_causal, masks=masks)
    else:
        error, out, _ = build.binding().module.decode_masked_call(
            address, query, key_cache, value_cache, cache_seqlens, block_table, page_errors,
            _scale(scale, query.shape[-1]), splits, is_causal, *masks)
    return None if error else out
