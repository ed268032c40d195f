"""lab.ops.attention's window_size / softcap / sinks, and lab.ops.attention_varlen: checks, custom ops, launch.

The masked kernels (lab.registry.MASKED_FWD: fwd v08 on mma.sync, v09 / v11 on wgmma for compute capability 9.0 at
D 64 / 128, v12 there at D 192 / 256) take AttnMaskParams, which this module fills through ctypes and hands to the
launcher's address (lab.kernels.launcher): no entry in the torch binding. Head dims without a kernel pad up to the
next (lab.fwd.head_dims: dense calls any D_qk, D_v up to 256; packed calls at the width of max(D_qk, D_v): 64,
128, and from 129 to 255 to 192 / 256). A checked packed call of one length runs the dense default kernel on a view
(lab.masks.dense_route).
Both calls are torch.library custom ops with fake implementations (torch.compile traces them). The dense call is
differentiable on compute capability 9.0 (lab.masks.backward and, for packed calls, lab.masks.varlen_bwd: bwd v08).
What has no kernel yet raises NotImplementedError naming it: the backward off Hopper or at a head dim no masked
backward takes (MASKED_BWD), the wide head dims off Hopper, and head dims the padding rule cannot reach. Nothing falls back to a slow path.
"""
from __future__ import annotations

import ctypes
import functools
import struct

import torch
import torch.nn.functional as F

from ..kernels import launcher
from ..op_common import (_capability, _check_cuda, _check_heads, _check_qkv, _check_qkv_own_dv, _direct, _eager,
                         _readable, _scale, run_packed_launcher, varlen_outputs)
from ..fwd import head_dims
from ..registry import BEST_MASKED_BWD, MASKED_BWD, MASKED_FWD
from . import backward, dense_route, fast, spec, varlen_bwd
from .fast import masked_head_dims, masked_version  # (the kernel choice lives with the plans that memoise it)
_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1}
# AttnMaskParams (kernels/common/params.h) packed in one struct.pack call: AttnFwdParams (q, k, v, o, lse; four
# strides of 3; batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim; scale; causal, dtype; 4 bytes of padding;
# debug), then window_left, window_right, diag_offset, softcap, sinks, cu_seqlens_q, cu_seqlens_k, total_q, total_k,
# then the paged fields: block_table, page_errors, block_table_stride, num_pages, page_size, max_pages, 4 bytes of padding.
# Filling a ctypes.Structure field by field cost ~28 us a call on the CPU box; the pack costs a few.
# tests/masks/test_masks.py checks the layout against ctypes' own (the C rules of alignment).
PARAMS = struct.Struct("<5Q12q6if2i4xQ3ifQQQ2iQQq3i4x")
assert PARAMS.size == 272
_NOT_PAGED = (0, 0, 0, 0, 0, 0)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_calls: dict = {}


def launch(q, k, v, out, lse, mask: spec.Mask, scale: float, offset: int = 0, sinks=None, cu_q=None, cu_k=None,
           max_q: int = 0, max_k: int = 0, version: str | None = None, defines=None, paged=None) -> None:
    """Run the masked kernel into `out` (and `lse` when given). Dense (B, H, S, D) or, with cu_q/cu_k, packed
    (total, H, D) tensors; paged = (block_table, page_errors): k and v are (num_pages, page_size, H_kv, D) caches
    (lab.masks.paged). No checks beyond the kernel's own: callers check first (attention_masked, varlen, paged)."""
    version = masked_version(q.device, version, q.shape[-1])
    call = kernel_call(version, defines)
    if paged is not None:
        params = PARAMS.pack(*paged_fields(q, k, v, out, lse, sinks, cu_q, cu_k, *paged, max_q, max_k, mask.left,
                                           mask.right, mask.softcap, scale, offset))
        run_packed_launcher(call, params, q.device, f"masked attention kernel {version} (paged)")
        return
    if cu_q is None:
        strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3])
        sizes = (q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3])
        packed = (0, 0, 0, 0)
    else:
        strides = tuple(x for t in (q, k, v, out) for x in (0, t.stride(1), t.stride(0)))
        sizes = (cu_q.shape[0] - 1, q.shape[1], k.shape[1], max_q, max_k, q.shape[2])
        packed = (cu_q.data_ptr(), cu_k.data_ptr(), q.shape[0], k.shape[0])
    params = PARAMS.pack(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                         lse.data_ptr() if lse is not None else 0, *strides, *sizes, scale, 0, _DTYPE_CODE[q.dtype], 0,
                         mask.left, mask.right, offset, mask.softcap, sinks.data_ptr() if sinks is not None else 0,
                         *packed, *_NOT_PAGED)
    run_packed_launcher(call, params, q.device, f"masked attention kernel {version}")


def kernel_call(version: str, defines=None):
    """A masked kernel's launcher as a ctypes function, memoised per version and defines."""
    key = (version, tuple(sorted(defines.items())) if defines else ())
    call = _calls.get(key)
    if call is None:
        call = _calls[key] = _LAUNCH(launcher(MASKED_FWD, version, defines))
    return call


# paged_fields' pointer fields, in its order: q, k, v, out, lse, then sinks, cu_q, cu_k, then table, errors
PAGED_POINTERS = (0, 1, 2, 3, 4, 31, 32, 33, 36, 37)


def paged_fields(q, k, v, out, lse, sinks, cu_q, cu_k, table, errors, max_q, max_k, left, right, softcap, scale,
                 offset: int = 0) -> list:
    """AttnMaskParams' fields of a paged call (lab.masks.paged): the caches' (page, head, key in page) strides;
    total_k is not read, its bound is the kernel's limit."""
    strides = (0, q.stride(1), q.stride(0), k.stride(0), k.stride(2), k.stride(1), v.stride(0), v.stride(2),
               v.stride(1), 0, out.stride(1), out.stride(0))
    return [q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 0 if lse is None else lse.data_ptr(), *strides,
            cu_q.shape[0] - 1, q.shape[1], k.shape[2], max_q, max_k, q.shape[2], scale, 0, _DTYPE_CODE[q.dtype], 0,
            left, right, offset, softcap, 0 if sinks is None else sinks.data_ptr(), cu_q.data_ptr(), cu_k.data_ptr(),
            q.shape[0], 1 << 30, table.data_ptr(), errors.data_ptr(), table.stride(0), k.shape[0], k.shape[1],
            table.shape[1]]


# ------------------------------------------------------------------ custom ops

@torch.library.custom_op("lab::attention_masked", mutates_args=())
def _masked_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor | None, left: int,
               right: int, offset: int, softcap: float, scale: float, version: str
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return _masked_impl(query, key, value, sinks, left, right, offset, softcap, scale, version)


@_masked_op.register_fake
def _(query, key, value, sinks, left, right, offset, softcap, scale, version):
    return query.new_empty(query.shape), query.new_empty(query.shape[:3], dtype=torch.float32)


def _masked_impl(query, key, value, sinks, left, right, offset, softcap, scale, version, want_lse=True):
    q, k, v = (_readable(t) for t in (query, key, value))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if want_lse else None
    launch(q, k, v, out, lse, spec.Mask(left, right, softcap), scale, offset, sinks, version=version)
    return out, lse


@torch.library.custom_op("lab::attention_varlen", mutates_args=())
def _varlen_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens_q: torch.Tensor,
               cu_seqlens_k: torch.Tensor, sinks: torch.Tensor | None, max_seqlen_q: int, max_seqlen_k: int,
               left: int, right: int, softcap: float, scale: float, version: str
               ) -> tuple[torch.Tensor, torch.Tensor]:
    return _varlen_impl(query, key, value, cu_seqlens_q, cu_seqlens_k, sinks, max_seqlen_q, max_seqlen_k, left,
                        right, softcap, scale, version)


@_varlen_op.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, sinks, max_seqlen_q, max_seqlen_k, left, right, softcap,
      scale, version):
    return query.new_empty(query.shape), query.new_empty((query.shape[1], query.shape[0]), dtype=torch.float32)


def _varlen_impl(query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version,
                 want_lse=True, rows_q=None):
    """rows_q: cu_seqlens_q[-1] when the host has checked it, else None. The kernel writes every row of every
    sequence (a row that sees no key too: O = 0, LSE = -inf or the sink) and no other, so only rows_q: (rows of no
    sequence) need a fill: zeros and -inf. Unknown (None: no host copy of cu_seqlens), they stay unwritten, as
    FlashAttention leaves them: filling the whole output first cost a pass over it on every call (one 64 MiB
    memset at 16384 tokens, H 16, D 128)."""
    q, k, v = (_readable(t) for t in (query, key, value))
    out, lse = varlen_outputs(q, want_lse, rows_q)
    launch(q, k, v, out, lse, spec.Mask(left, right, softcap), scale, 0, sinks, cu_q, cu_k, max_q, max_k, version)
    return out, lse


# ------------------------------------------------------------------ public calls

def attention_masked(query, key, value, is_causal, scale, enable_gqa, version, return_lse, causal_variant,
                     window_size, softcap, sinks):
    """lab.ops.attention with window_size, softcap or sinks (lab.fwd.op.attention hands such calls here)."""
    if version is None:  # the eager call in one crossing (lab.masks.fast), or None: the full path below
        answer = fast.attention(query, key, value, is_causal, scale, enable_gqa, return_lse, causal_variant,
                                window_size, softcap, sinks)
        if answer is not None:
            return answer
    mask = spec.make_mask(is_causal, window_size, softcap)
    spec.check_bools(enable_gqa=enable_gqa, return_lse=return_lse)
    if causal_variant not in ("upper_left", "lower_right"):
        raise ValueError(f"causal_variant must be 'upper_left' or 'lower_right', got {causal_variant!r}")
    padded = head_dims.needs_padding(query, value)
    if not padded:  # the padded path checks its own (value may have its own head dim)
        _check_qkv(query, key, value, "key", "value")
    _check_heads(query, key, enable_gqa)
    if key.shape[2] == 0:
        raise ValueError("key has sequence length 0: every query row would attend to nothing")
    spec.check_sinks(sinks, query.shape[1], query.device)
    scale = _scale(scale, query.shape[-1])
    if not padded:  # after every argument check (the padded path checks the device after its own shape checks)
        if version is not None:
            fast.check_masked_version(version, query.shape[-1])
        _check_cuda(query)
    if sinks is not None and not sinks.is_contiguous():  # the kernels read sinks[h] at sinks.data_ptr() + 4 h
        sinks = sinks.contiguous()
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, sinks)):
        backward.masked_bwd_version(query.device)  # NotImplementedError where no masked backward runs
        _backward_head_dim(query, value)
    offset = key.shape[2] - query.shape[2] if causal_variant == "lower_right" else 0
    if padded:
        def attend(q, k, v, s):
            return attention_masked(q, k, v, is_causal, s, enable_gqa, version, True, causal_variant, window_size,
                                    softcap, sinks)
        out, lse = head_dims.pad_and_attend(attend, query, key, value, scale)
        return (out, lse) if return_lse else out
    args = (query, key, value, sinks, mask.left, mask.right, offset, mask.softcap, scale,
            masked_version(query.device, version, query.shape[-1]))
    if _direct(query, key, value, *(() if sinks is None else (sinks,))):
        out, lse = _masked_impl(*args, want_lse=return_lse)
    elif _eager() and all(type(t) is torch.Tensor for t in (query, key, value, *(() if sinks is None else (sinks,)))):
        out, lse = backward.EagerMasked.apply(*args, _masked_impl)  # gradients wanted, plain eager tensors
    else:
        out, lse = _masked_op(*args)
    return (out, lse) if return_lse else out


def _varlen_width(d: int, d_v: int, dims, where: str) -> int:
    """The kernel head dim a packed call runs at (lab.fwd.head_dims.masked_varlen_width) among `dims`, or
    NotImplementedError naming the head dim: against every masked kernel's dims before the device check, against
    the device's own after it."""
    width = head_dims.masked_varlen_width(max(d, d_v), dims)
    if width is None:
        dim = f"{d}" if d == d_v else f"{max(d, d_v)} (query/key {d}, value {d_v})"
        raise NotImplementedError(f"lab.ops.attention_varlen: head dim {dim} has no kernel on {where} (kernels "
                                  f"at {list(dims)}; D 129-255 pad to 192 / 256 on compute capability 9.0; the dense "
                                  f"op pads other head dims)")
    return width


def backward_head_dims(capability: tuple) -> list:
    """The kernel head dims some masked backward (BEST_MASKED_BWD's rows of MASKED_BWD) takes on a GPU of this
    compute capability."""
    runs = [v for v in BEST_MASKED_BWD if not MASKED_BWD[v].capabilities or capability in MASKED_BWD[v].capabilities]
    return sorted({d for v in runs for d in MASKED_BWD[v].head_dims})


def _backward_head_dim(query, value) -> None:
    """NotImplementedError when a gradient is wanted at a kernel head dim that no masked backward (MASKED_BWD) takes
    on this device: the wide head dims until a masked wide backward is registered. The forward alone runs."""
    try:
        d = head_dims.kernel_head_dim(query.shape[-1], value.shape[-1]) or query.shape[-1]
    except ValueError:
        return  # no kernel at all: the forward's own checks say so
    dims = backward_head_dims(_capability(query.device))
    if d not in dims:
        raise NotImplementedError(
            f"the backward pass of window_size / softcap / sinks at head dim {d} has no kernel (masked backward "
            f"kernels take head dims {dims}); the forward runs at this head dim without gradients (torch.no_grad(), "
            f"or inputs that do not require grad)")


def _check_cu(cu, name: str, total: int, device, batch: int | None, check_values: bool, max_len: int,
              host: list | None = None) -> list | None:
    """Raise on a bad cu_seqlens; return its checked host copy when check_values (lab.masks.dense_route and the
    paged call's table check read it), else None. host: cu's host copy when the caller has it already
    (cu_seqlens_k is cu_seqlens_q: one copy, one sync)."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name}.dtype must be torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D (batch + 1,), got shape {tuple(cu.shape)}")
    if batch is not None and cu.shape[0] != batch + 1:
        raise ValueError(f"{name} has {cu.shape[0]} entries but cu_seqlens_q has {batch + 1}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but query is on {device}")
    if check_values and not isinstance(cu, torch._subclasses.fake_tensor.FakeTensor):
        host = cu.tolist() if not host else host  # one device-to-host copy: check_cu_seqlens=False skips it
        if host[0] != 0:
            raise ValueError(f"{name}[0] must be 0, got {host[0]}")
        lengths = [b - a for a, b in zip(host, host[1:])]
        if any(n < 0 for n in lengths):
            raise ValueError(f"{name} must be non-decreasing, got {host}")
        if host[-1] > total:
            raise ValueError(f"{name}[-1] = {host[-1]} exceeds the {total} packed rows")
        if lengths and max(lengths) > max_len:
            raise ValueError(f"a sequence of {max(lengths)} rows exceeds max_seqlen ({max_len}) for {name}")
        return host
    return None


def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
                     is_causal: bool = False, scale: float | None = None, window_size=None, softcap: float = 0.0,
                     sinks=None, return_lse: bool = False, check_cu_seqlens: bool = True, version=None):
    """Attention over packed variable-length sequences, FlashAttention's flash_attn_varlen_func.

    query and key (total, H, D_qk), value (total_k, H_kv, D_v) (D_v != D_qk runs at the kernel width of the
    larger, zero-padded, O cut back to D_v); sequence b is rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    of query and cu_seqlens_k[b]:cu_seqlens_k[b+1] of key/value (int32 on query's device, or both on the CPU: then
    their values are checked with no device sync and copied over). max_seqlen_q/k: host
    ints bounding every length (the grid is sized from them). Causal and the window are aligned bottom-right per
    sequence (FlashAttention's rule, lab.masks.spec). GQA when H_q is a multiple of H_kv. return_lse: also
    (H_q, total_q) float32 natural-log LSE. check_cu_seqlens: check cu_seqlens' values (starts at 0,
    non-decreasing, within the packed rows and max_seqlen) at the cost of one device-to-host copy; False skips
    it, and the kernel then clamps every length so no value reads or writes out of bounds. Rows of no sequence
    (past cu_seqlens_q[-1]) hold zeros (LSE -inf) when cu_seqlens was checked on the host (eager calls with
    check_cu_seqlens=True, or cu_seqlens on the CPU); otherwise they are left unwritten, as FlashAttention leaves
    them. A call whose cu_seqlens the host holds (checked, or on the CPU) with sequences all of one length and a mask
    without window, softcap or sinks runs the dense default kernel on a view of the packed rows
    (lab.masks.dense_route: the same answer, the dense call's speed). Differentiable in
    query, key, value and sinks on compute capability 9.0 (lab.masks.varlen_bwd). lab.ops.attention_varlen is
    lab.masks.paged.attention_varlen: this call, or with block_table the paged one.
    """
    answer = fast.varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                         window_size, softcap, sinks, return_lse, check_cu_seqlens, version)
    if answer is not None:  # the eager call in one crossing (lab.masks.fast); else the full path below
        return answer
    mask = spec.make_mask(is_causal, window_size, softcap)
    spec.check_bools(return_lse=return_lse, check_cu_seqlens=check_cu_seqlens)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total_tokens, H, D), got shape {tuple(t.shape)}")
    grads = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (query, key, value, sinks))
    if grads:
        backward.masked_bwd_version(query.device)  # NotImplementedError where no masked backward runs
        _backward_head_dim(query, value)
    # The 4-D checks of the dense op on (1, H, total, D) views (detached: checks only): dtype, device, strides; value
    # may have its own head dim (padded below, as the dense op pads it).
    q4, k4, v4 = (t.detach().unsqueeze(0).transpose(1, 2) for t in (query, key, value))
    _check_qkv_own_dv(q4, k4, v4, "(total_k, H)", (key.shape[:2], value.shape[:2]))
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"query heads ({query.shape[1]}) must be a multiple of key heads ({key.shape[1]})")
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TypeError(f"{name} must be a non-negative host int, got {n!r}")
    # The checked host copies (check_cu_seqlens=True, or cu_seqlens on the host) feed the dense route. cu_seqlens
    # on the CPU with a CUDA query: their values are read with no sync and always checked, then copied to the
    # device without waiting for it (pageable memory is staged at once).
    on_host = _on_host(cu_seqlens_q, cu_seqlens_k, query)
    where, check = (torch.device("cpu"), True) if on_host else (query.device, check_cu_seqlens)
    host_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", query.shape[0], where, None, check, max_seqlen_q)
    host_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", key.shape[0], where, cu_seqlens_q.shape[0] - 1, check,
                       max_seqlen_k, host_q if cu_seqlens_k is cu_seqlens_q else None)
    rows_q = host_q[-1] if host_q else None
    if on_host:  # through pinned memory (torch's caching host allocator): the copy is queued, not waited for
        same = cu_seqlens_k is cu_seqlens_q
        cu_seqlens_q = cu_seqlens_q.pin_memory().to(query.device, non_blocking=True)
        cu_seqlens_k = cu_seqlens_q if same else cu_seqlens_k.pin_memory().to(query.device, non_blocking=True)
    spec.check_sinks(sinks, query.shape[1], query.device)
    d, d_v = query.shape[-1], value.shape[-1]
    scale = _scale(scale, d)
    _varlen_width(d, d_v, sorted({w for kernel in MASKED_FWD.values() for w in kernel.head_dims}), "any device")
    _check_cuda(query)
    # the kernels read sinks and cu_seqlens as contiguous arrays
    sinks = sinks.contiguous() if sinks is not None and not sinks.is_contiguous() else sinks
    cu_seqlens_q, cu_seqlens_k = (cu if cu.is_contiguous() else cu.contiguous() for cu in (cu_seqlens_q, cu_seqlens_k))
    width = _varlen_width(d, d_v, masked_head_dims(_capability(query.device)), "this device")
    # zero columns (lab.fwd.head_dims): the scale stays the true D_qk's, the output is cut back to D_v; D_v != D_qk
    # runs at the kernel width of the larger (the padded columns of V give zero columns of O and of dV)
    query, key, value = (t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))
                         for t in (query, key, value))
    args = (query, key, value, cu_seqlens_q, cu_seqlens_k, sinks, max_seqlen_q, max_seqlen_k, mask.left,
            mask.right, mask.softcap, scale, masked_version(query.device, version, width))
    dense = dense_route.route(host_q, host_k, mask, sinks, version)  # one length: the dense default kernel
    impl = _varlen_impl if dense is None else functools.partial(dense_route.dense_impl, shape=dense)
    plain = all(type(t) is torch.Tensor for t in (query, key, value, *(() if sinks is None else (sinks,))))
    if _direct(query, key, value, *(() if sinks is None else (sinks,))) and _eager():
        out, lse = impl(*args, want_lse=return_lse, rows_q=rows_q)
    elif grads and _eager() and plain:  # gradients wanted, plain eager tensors
        out, lse = varlen_bwd.EagerVarlen.apply(*args, functools.partial(impl, rows_q=rows_q), dense)
    else:  # torch.compile, fake or subclassed tensors: the op's schema carries no host copy of cu_seqlens
        out, lse = _varlen_op(*args)
    if width != d_v:
        out = out[..., :d_v].contiguous()
    return (out, lse) if return_lse else out


def _on_host(cu_q, cu_k, query) -> bool:
    """Both cu_seqlens plain CPU tensors and query a CUDA tensor: the values are on the host already."""
    return all(type(t) is torch.Tensor and t.device.type == "cpu" for t in (cu_q, cu_k)) and \
        isinstance(query, torch.Tensor) and query.device.type == "cuda"


backward.register()  # lab::attention_masked is differentiable (lab.masks.backward)
varlen_bwd.register()  # and lab::attention_varlen (lab.masks.varlen_bwd)
