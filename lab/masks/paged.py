"""lab.ops.attention_varlen with block_table: packed queries against a paged KV cache, FlashAttention's
flash_attn_varlen_func(..., block_table=) for chunked prefill and prefix caching.

Layout (lab.decode's paged cache, kernels/common/params.h): key_cache and value_cache are (num_pages, page_size,
H_kv, D); key j of sequence b is row j % page_size of page block_table[b, j // page_size]; cu_seqlens_k gives each
sequence's key count as a cumulative sum (no packed K rows exist); causal and the window are bottom-right per
sequence, so a chunk's S_q queries are the last S_q of its S_k keys. The kernel is fwd v11 (compute capability 9.0,
D 64 / 128) with paged TMA boxes (kernels/common/hopper/attn_mask_sm90.cuh paged_box_rows); forward only.

Bad tables (a page outside [0, num_pages) among a sequence's pages, or more keys than max_pages * page_size):
 - check_cu_seqlens=True (the default) copies cu_seqlens to the host already; the used part of block_table is
   copied with it and checked there, so a bad table raises ValueError before any launch.
 - Either way the kernel checks again, never reads outside the cache, and gives a bad sequence O = 0, LSE = -inf
   and its flag bits (LAB_PAGE_E_*, lab.decode.plan.ERROR_NAMES). page_errors=<int32 (B,) tensor> receives them
   (no host sync: the caller reads them when it wants, e.g. lab.ops.raise_page_errors). Without it and without the
   host check, the flags go to pinned host memory and are read at the next paged call once the GPU has run this
   one (an event query, no wait) or at check_page_errors() (lab.ops.check_varlen_page_errors), which waits:
   decode's deferred design (lab.decode.deferred), in Python here because the masked kernels launch through ctypes,
   not the binding. Chosen over a host sync per call, which a chunked-prefill loop would pay on every chunk.

The serving call (page_errors given, check_cu_seqlens=False, eager, plain tensors) crosses into C++ once, as
lab.masks.fast's packed call does: a plan per (head dim, device, mask) holds what the full path checked once (the mask,
the device's kernel address), and binding.cpp's attn_varlen_paged_auto makes this module's checks of everything that
can change between two calls, fills AttnMaskParams as pack does, allocates the output and launches; any refusal or
error takes the full path below, which raises the Python error. Why: the Python serving path (a plan key over eight
tensors' shapes and strides, the parameter packing, a ctypes call) cost 2-4 % of a 0.4 ms call through the public op.
Measured (H200 host, outputs/driver_logs/20261129-h200-batch6-ed9df1b/V): 21.5 us a call in one crossing against 83.6
through the full Python path (the packed call's crossing: 32.3); record 20261129-paged-prefill-public-op.
The dense op (lab.ops.attention) takes no block table: paged K/V is a packed-call feature.
"""
from __future__ import annotations

import functools

import torch

from .. import build, kernels
from ..decode.checks import check_page_shapes
from ..decode.plan import PAGE_E_INDEX, PAGE_E_SHORT
from ..op_common import _capability, _check_cuda, _direct, _eager, _readable, _scale
from ..registry import MASKED_FWD
from . import fast, op, spec

PAGED_HEAD_DIMS = (64, 128)  # fwd v11's; the wide masked kernel takes no block table
PAGED_VERSION = "v11"
MAX_CAPACITY = 1 << 30  # max_pages * page_size: the kernel's int key offsets and AttnMaskParams' checks
_pending: list = []  # (event, pinned flags (B,), call number, device) of calls without page_errors
_MAX_PENDING = 64
_count = 0
_plans: dict = {}  # serving plans: (head dim, device, mask arguments) -> attn_varlen_paged_auto bound to them
_Tensor = torch.Tensor  # exact types only: a subclass takes the full path
ERROR_NAMES = {PAGE_E_INDEX: "a page index outside [0, num_pages)",
               PAGE_E_SHORT: "more keys (cu_seqlens_k) than max_pages * page_size"}


def check_paged(query, key_cache, value_cache, block_table, page_errors, batch: int):
    """The checks of the cache, the table and the flags (TypeError / ValueError / NotImplementedError naming the
    argument); returns the table as the kernel reads it (rows contiguous)."""
    for name, t, dims in (("query", query, 3), ("key_cache", key_cache, 4), ("value_cache", value_cache, 4)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims:
            layout = "total_q, H, D" if dims == 3 else "num_pages, page_size, H_kv, D"
            raise ValueError(f"{name} must be {dims}-D ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float16, torch.bfloat16) or t.dtype != query.dtype:
            raise TypeError(f"{name}.dtype must be query's, torch.float16 or torch.bfloat16, got {t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device}")
    num_pages, page_size, heads_kv, head_dim = check_page_shapes(query, key_cache, value_cache)
    if query.shape[2] != head_dim:
        raise ValueError(f"query head dim {query.shape[2]} != key_cache head dim {head_dim}")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):  # a copy would cost the whole cache
        fake = isinstance(t, torch._subclasses.fake_tensor.FakeTensor)  # (no storage address to ask)
        if t.stride(-1) != 1 or any(s % 8 for s in t.stride()[:-1]) or (not fake and t.data_ptr() % 16):
            raise ValueError(f"{name} must have a contiguous last dim, other strides multiples of 8 elements and a "
                             f"16-byte aligned base (TMA), got strides {t.stride()}")
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be an int32 tensor of shape (B, max_pages), got "
                        f"{getattr(block_table, 'dtype', type(block_table).__name__)}")
    if block_table.dim() != 2 or block_table.shape[0] != batch or block_table.shape[1] == 0:
        raise ValueError(f"block_table must have shape ({batch}, max_pages >= 1), got {tuple(block_table.shape)}")
    if block_table.device != query.device:
        raise ValueError(f"block_table is on {block_table.device} but query is on {query.device}")
    if block_table.shape[1] * page_size > MAX_CAPACITY:
        raise ValueError(f"block_table capacity max_pages * page_size = {block_table.shape[1] * page_size} exceeds "
                         f"{MAX_CAPACITY} keys")
    if page_errors is not None:
        if not isinstance(page_errors, torch.Tensor) or page_errors.dtype != torch.int32:
            raise TypeError("page_errors must be an int32 tensor of shape (B,)")
        if page_errors.shape != (batch,) or page_errors.device != query.device or not page_errors.is_contiguous():
            raise ValueError(f"page_errors must be a contiguous ({batch},) tensor on {query.device}, got "
                             f"{tuple(page_errors.shape)} on {page_errors.device}")
    if head_dim not in PAGED_HEAD_DIMS:
        raise NotImplementedError(f"lab.ops.attention_varlen with block_table runs at head dims {PAGED_HEAD_DIMS} "
                                  f"(fwd v11), got {head_dim}")
    ok = block_table.shape[1] <= 1 or block_table.stride(1) == 1
    return block_table if ok and block_table.stride(0) >= block_table.shape[1] else block_table.contiguous()


def check_table_on_host(cu_k: list, block_table, page_size: int, num_pages: int) -> None:
    """ValueError naming each sequence whose keys do not fit its table row or whose pages leave the cache; reads
    only the pages the sequences use (one device-to-host copy, after cu_seqlens_k's)."""
    lengths = [b - a for a, b in zip(cu_k, cu_k[1:])]
    capacity = block_table.shape[1] * page_size
    short = [b for b, n in enumerate(lengths) if n > capacity]
    if short:
        raise ValueError(f"block_table is too short for sequence(s) {short}: their keys exceed max_pages * "
                         f"page_size = {capacity}")
    used = max(lengths, default=0)
    if used == 0:
        return
    pages = block_table[:, :(used + page_size - 1) // page_size].tolist()
    bad = [b for b, row in enumerate(pages) if any(not 0 <= p < num_pages for p in row[:(lengths[b] + page_size - 1)
                                                                                          // page_size])]
    if bad:
        raise ValueError(f"block_table is bad for sequence(s) {bad}: a page index outside [0, {num_pages})")


def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     is_causal: bool = False, scale: float | None = None, window_size=None, softcap: float = 0.0,
                     sinks=None, return_lse: bool = False, check_cu_seqlens: bool = True, version=None,
                     block_table=None, page_errors=None):
    """lab.ops.attention_varlen: lab.masks.op.attention_varlen (packed key and value, its docstring), or with
    block_table a paged KV cache (chunked prefill, prefix caching).

    block_table: (B, max_pages) int32 on query's device; key and value are then (num_pages, page_size, H_kv, D)
    caches, key j of sequence b is row j % page_size of page block_table[b, j // page_size], and cu_seqlens_k gives
    each sequence's key count (as a cumulative sum; no packed rows are read). page_size: a multiple of 16.
    page_errors: an int32 (B,) tensor that receives each sequence's bad-table flags (no host sync); without it the
    table is checked on the host with cu_seqlens (check_cu_seqlens=True) or its flags are read at a later paged call
    (check_varlen_page_errors). Forward only, on compute capability 9.0 at D 64 / 128 (fwd v11).
    """
    if page_errors is not None and check_cu_seqlens is False and version is None:  # the serving call: one crossing
        answer = serving(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                         window_size, softcap, sinks, return_lse, block_table, page_errors)
        if answer is not None:
            return answer
    if block_table is None and page_errors is None:
        return op.attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   is_causal, scale, window_size, softcap, sinks, return_lse, check_cu_seqlens,
                                   version)
    return attention_varlen_paged(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  is_causal, scale, window_size, softcap, sinks, return_lse, check_cu_seqlens,
                                  version, block_table, page_errors)


def attention_varlen_paged(query, key_cache, value_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           is_causal, scale, window_size, softcap, sinks, return_lse, check_cu_seqlens, version,
                           block_table, page_errors):
    """lab.ops.attention_varlen's paged call (attention_varlen above, when block_table or page_errors is given and
    the serving call's one crossing did not answer): the checks, then the launch."""
    if block_table is None:
        raise ValueError("page_errors goes with block_table (a paged KV cache)")
    mask = spec.make_mask(is_causal, window_size, softcap)
    spec.check_bools(return_lse=return_lse, check_cu_seqlens=check_cu_seqlens)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in (query, key_cache, value_cache, sinks)):
        raise NotImplementedError("lab.ops.attention_varlen with block_table is forward only (serving does not "
                                  "train): call it under torch.no_grad() or on tensors that do not require grad")
    op._check_cu(cu_seqlens_q, "cu_seqlens_q", 0, getattr(cu_seqlens_q, "device", None), None, False, 0)  # its type
    batch = cu_seqlens_q.shape[0] - 1
    table = check_paged(query, key_cache, value_cache, block_table, page_errors, batch)
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"{name} must be a non-negative host int, got {n!r}")
    host_q = op._check_cu(cu_seqlens_q, "cu_seqlens_q", query.shape[0], query.device, None, check_cu_seqlens,
                          max_seqlen_q)
    rows_q = host_q[-1] if host_q else None
    host_k = op._check_cu(cu_seqlens_k, "cu_seqlens_k", 2**62, query.device, batch, check_cu_seqlens,
                          max_seqlen_k)  # no packed rows bound it: check_table_on_host bounds each length
    if host_k is not None:  # the checked host copy (none for fake tensors): no second device-to-host copy
        check_table_on_host(host_k, table, key_cache.shape[1], key_cache.shape[0])
    spec.check_sinks(sinks, query.shape[1], query.device)
    if version not in (None, PAGED_VERSION):
        raise ValueError(f"a block table runs on masked {PAGED_VERSION} only, got version={version!r}")
    scale = _scale(scale, query.shape[-1])
    _check_cuda(query)
    if _capability(query.device) != (9, 0):
        raise NotImplementedError(f"lab.ops.attention_varlen with block_table runs on compute capability 9.0 "
                                  f"(fwd {PAGED_VERSION}'s paged TMA loads), this device has "
                                  f"{_capability(query.device)}")
    sinks = sinks.contiguous() if sinks is not None and not sinks.is_contiguous() else sinks
    cu_seqlens_q, cu_seqlens_k = (cu if cu.is_contiguous() else cu.contiguous() for cu in (cu_seqlens_q, cu_seqlens_k))
    args = (query, key_cache, value_cache, cu_seqlens_q, cu_seqlens_k, sinks, table)
    rest = (max_seqlen_q, max_seqlen_k, mask.left, mask.right, mask.softcap, scale)
    if not (_direct(query, key_cache, value_cache, table) and _eager()):  # traced: flags to page_errors or nowhere
        errors = page_errors if page_errors is not None else torch.empty(batch, dtype=torch.int32, device=query.device)
        out, lse = _paged_op(*args, errors, *rest)
    elif page_errors is not None or host_k is not None:  # the caller's flags, or a table checked on the host
        errors = page_errors if page_errors is not None else torch.empty(batch, dtype=torch.int32, device=query.device)
        out, lse = paged_impl(*args, errors, *rest, want_lse=return_lse, rows_q=rows_q)
    else:
        out, lse = _deferred(args, rest, batch, return_lse)
    return (out, lse) if return_lse else out


def serving(query, key_cache, value_cache, cu_q, cu_k, max_q, max_k, is_causal, scale, window_size, softcap, sinks,
            return_lse, block_table, page_errors):
    """The serving call in one crossing of the binding (the module docstring): the answer, or None (take the full
    path). Only exact argument types key a plan (lab.masks.fast's rule); C++ checks the tensors on every call."""
    if not (type(query) is _Tensor and type(key_cache) is _Tensor and type(value_cache) is _Tensor and
            type(cu_q) is _Tensor and type(cu_k) is _Tensor and type(block_table) is _Tensor and
            type(page_errors) is _Tensor and (sinks is None or type(sinks) is _Tensor) and type(max_q) is int and
            type(max_k) is int and type(is_causal) is bool and type(return_lse) is bool and
            (scale is None or type(scale) is float) and fast._plain(window_size, softcap) and _eager()):
        return None
    qs = query.shape
    if len(qs) != 3:
        return None
    return fast.run_plan(_plans, (qs[2], query.get_device(), is_causal, window_size, softcap), _serving_plan,
                         (query, is_causal, window_size, softcap), (query, key_cache, value_cache, cu_q, cu_k,
                         block_table, page_errors, max_q, max_k, sinks, return_lse, scale), return_lse)


def _serving_plan(query, is_causal, window_size, softcap):
    """attn_varlen_paged_auto bound to fwd v11's launcher and the mask; None where the full path must decide (not a
    CUDA tensor, a head dim or device v11's paged kernels do not take, a mask argument it refuses)."""
    if query.get_device() < 0 or query.shape[-1] not in PAGED_HEAD_DIMS or _capability(query.device) != (9, 0):
        return None
    try:
        mask = spec.make_mask(is_causal, window_size, softcap)
    except (TypeError, ValueError):
        return None
    return functools.partial(build.binding().module.attn_varlen_paged_auto, kernels.launcher(MASKED_FWD, PAGED_VERSION),
                             mask.left, mask.right, mask.softcap)


def paged_impl(query, key_cache, value_cache, cu_q, cu_k, sinks, table, errors, max_q, max_k, left, right, softcap,
               scale, want_lse=True, rows_q=None, defines=None):
    """The launch (no checks): out (total_q, H_q, D), lse (H_q, total_q) or None; rows of no sequence as in
    lab.masks.op._varlen_impl."""
    q = _readable(query)
    out, lse = op.varlen_outputs(q, want_lse, rows_q)
    if max_q == 0 or q.shape[0] == 0 or cu_q.shape[0] == 1:  # no CTA runs: no flag would be written
        errors.zero_()
        return out, lse
    params = pack(q, key_cache, value_cache, out, lse, sinks, cu_q, cu_k, table, errors, max_q, max_k, left, right,
                  softcap, scale)
    op.run_packed_launcher(kernel(defines), params, q.device, f"masked attention kernel {PAGED_VERSION} (paged)")
    return out, lse


def pack(q, k, v, out, lse, sinks, cu_q, cu_k, table, errors, max_q, max_k, left, right, softcap, scale) -> bytes:
    """AttnMaskParams of a paged call (lab.masks.op.paged_fields, the layout op.launch(paged=) packs too)."""
    return op.PARAMS.pack(*op.paged_fields(q, k, v, out, lse, sinks, cu_q, cu_k, table, errors, max_q, max_k, left,
                                           right, softcap, scale))


def kernel(defines=None):
    """fwd v11's launcher as a ctypes function (lab.masks.op.kernel_call's memo)."""
    return op.kernel_call(PAGED_VERSION, defines)


@torch.library.custom_op("lab::attention_varlen_paged", mutates_args=("page_errors",))
def _paged_op(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, sinks: torch.Tensor | None, block_table: torch.Tensor,
              page_errors: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, left: int, right: int, softcap: float,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return paged_impl(query, key_cache, value_cache, cu_seqlens_q, cu_seqlens_k, sinks, block_table, page_errors,
                      max_seqlen_q, max_seqlen_k, left, right, softcap, scale)


@_paged_op.register_fake
def _(query, key_cache, value_cache, cu_seqlens_q, cu_seqlens_k, sinks, block_table, page_errors, max_seqlen_q,
      max_seqlen_k, left, right, softcap, scale):
    return query.new_empty(query.shape), query.new_empty((query.shape[1], query.shape[0]), dtype=torch.float32)


# ------------------------------------------------------------------ deferred flags (no page_errors, no host check)

def _deferred(args, rest, batch: int, return_lse: bool):
    """The call with its flags in pinned host memory (the kernel writes them through the unified address), read
    once an event after the kernel has completed: at a later paged call or at check_page_errors()."""
    global _count
    poll()
    if len(_pending) >= _MAX_PENDING:
        poll(wait=True, oldest=True)
    flags = torch.zeros(batch, dtype=torch.int32, pin_memory=True)
    out, lse = paged_impl(*args, flags, *rest, want_lse=return_lse)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(args[0].device))
    _count += 1
    _pending.append((event, flags, _count, args[0].device))
    return out, lse


def poll(wait: bool = False, oldest: bool = False) -> None:
    """Retire the pending flags whose call has completed (wait: all, or with oldest only the first) and raise
    ValueError naming any earlier call with a bad table."""
    bad, keep = [], []
    for i, (event, flags, call, device) in enumerate(_pending):
        if (wait and (not oldest or i == 0)) or event.query():
            event.synchronize()
            rows = [(b, bits) for b, bits in enumerate(flags.tolist()) if bits]
            if rows:
                named = ", ".join(f"{b} ({' and '.join(t for bit, t in ERROR_NAMES.items() if bits & bit)})"
                                  for b, bits in rows)
                bad.append(f"call {call} on {device}: block_table is bad for sequence(s) {named}")
        else:
            keep.append((event, flags, call, device))
    _pending[:] = keep
    if bad:
        raise ValueError(f"an earlier paged lab.ops.attention_varlen call without page_errors or the host check had "
                         f"a bad block table ({'; '.join(bad)}); that call's outputs for those sequences are zero "
                         f"(LSE -inf). Pass page_errors=<int32 (B,) tensor> to receive the flags yourself.")


def check_page_errors() -> None:
    """Wait for every paged attention_varlen call made without page_errors or the host check, and raise
    ValueError if any had a bad block table."""
    poll(wait=True)
