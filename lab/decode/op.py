"""lab.ops.decode: split-K decoding over a contiguous or paged KV cache, as a torch.library custom op.

The split plan and the paged error flags are lab.decode.plan's (memoised per shape, no host sync); the paged
layout is written out in NumPy in lab.decode.emulate_paged. The checks shared with lab.ops.attention are lab.op_common's.
"""
from __future__ import annotations

import torch
from torch import Tensor as _Tensor

from .. import build
from ..kernels import keep_plan, launcher
from ..kernels import resolve_version as _version
from ..op_common import PAGED_LAYOUT, _check_cuda, _check_heads, _check_qkv, _check_tensor, _direct, _scale, sm_count
from ..registry import DECODE, PAGED_DECODE, PAGED_HEADS, SPLIT_RULE, default_decode_version, paged_versions
from . import deferred, fast
from .plan import ragged_splits, split_plan  # split_plan: memoised, O(1) per decode step

MAX_DECODE_Q_LEN = 16


def _decode_version(version, query, key_cache) -> str:
    if version is None:  # the default, or for a head dim no kernel takes: a ValueError naming those that exist
        return _version(None, DECODE, query.shape[-1],
                        (default_decode_version(query.shape[1], key_cache.shape[1], query.shape[2], query.shape[-1]),))
    name, heads_kv = _version(version, DECODE, query.shape[-1], ()), key_cache.shape[1]
    _require_heads(version, name, heads_kv, [v for v in DECODE if not heads_kv % PAGED_HEADS.get(v, 1)])
    return name


def _require_heads(version, name: str, heads_kv: int, instead) -> None:
    """A version whose block reads PAGED_HEADS[name] KV heads together (v04) takes H_kv only in multiples of that:
    the kernel would refuse the launch with a bare status code, so the call says why first."""
    if heads_kv % PAGED_HEADS.get(name, 1):
        raise ValueError(f"decode version {version!r} needs H_kv to be a multiple of {PAGED_HEADS[name]}, got "
                         f"{heads_kv}; use one of {list(instead)} or version=None")


MAX_NUM_SPLITS = 1024  # the combine kernel and the int offsets of the workspaces are sized for this many


def _num_splits(num_splits, batch, heads_kv, seqlen, device, version: str = "v01") -> int:
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_NUM_SPLITS:
            raise ValueError(f"num_splits must be an int in [1, {MAX_NUM_SPLITS}] or None, got {num_splits!r}")
        return num_splits
    return split_plan(batch, heads_kv, seqlen, sm_count(device), version)


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


def _check_decode(query, key_cache, value_cache, cache_seqlens):
    _check_qkv(query, key_cache, value_cache, "key_cache", "value_cache")
    _check_q_len(query)
    _check_heads(query, key_cache, True, "key_cache")
    _check_cuda(query)
    return _check_seqlens(query, cache_seqlens)


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


_decode_plans: dict = {}


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
           version=None, *, block_table=None, is_causal: bool = False, page_errors=None):
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
    """
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
        return _decode_v03(query, key_cache, value_cache, cache_seqlens, scale, num_splits, version, block_table,
                           is_causal, page_errors)
    seqlens = _check_decode(query, key_cache, value_cache, cache_seqlens)
    name, splits = _decode_plan(query, key_cache, version, num_splits)
    if not _direct(query, key_cache, value_cache):
        return _decode_op(query, key_cache, value_cache, seqlens, _scale(scale, query.shape[-1]), splits, name)
    out = _decode_impl(query, key_cache, value_cache, seqlens, _scale(scale, query.shape[-1]), splits, name)
    keep_plan(("decode", query.shape, key_cache.shape, query.get_device(), version, num_splits),
              (launcher(DECODE, name), splits))  # checked: the next such call may go straight in
    return out


# ------------------------------------------------------------------ decode v03: paged cache, causal

def _check_paged(query, key_cache, value_cache, block_table, page_errors):
    """The paged call's checks (the binding's check_paged, in Python's exception types); returns the block
    table as the kernel reads it (rows contiguous)."""
    _check_tensor(query, "query", cuda=False)
    _check_q_len(query)
    _check_tensor(key_cache, "key_cache", query, PAGED_LAYOUT, cuda=False)
    _check_tensor(value_cache, "value_cache", query, PAGED_LAYOUT, cuda=False)
    num_pages, page_size, heads_kv, head_dim = key_cache.shape
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"key_cache and value_cache shapes differ: {tuple(key_cache.shape)} vs {tuple(value_cache.shape)}")
    if page_size <= 0 or page_size % 16:
        raise ValueError(f"page_size (key_cache.shape[1]) must be a positive multiple of 16, got {page_size}")
    if num_pages == 0:
        raise ValueError("key_cache has no pages (num_pages = 0)")
    if heads_kv == 0 or query.shape[1] % heads_kv:
        raise ValueError(f"query heads ({query.shape[1]}) must be a multiple of key_cache heads ({heads_kv})")
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
    _check_cuda(query)
    return _kernel_table(block_table)


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
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if block_table is None:
        if page_errors is not None:
            raise ValueError("page_errors goes with block_table (a paged cache)")
        seqlens = _check_decode(query, key_cache, value_cache, cache_seqlens)
        heads_kv, capacity = key_cache.shape[1], key_cache.shape[2]
        if query.shape[2] == 1 and version is None:  # one token sees its whole cache: no mask, v01/v02's call
            return decode(query, key_cache, value_cache, cache_seqlens, scale, num_splits)
    else:
        block_table = _check_paged(query, key_cache, value_cache, block_table, page_errors)
        seqlens = _check_seqlens(query, cache_seqlens)
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


