"""The eager masked calls in one crossing of the binding, as lab.fwd.op's _attention_fast is the dense call's, and
the masked kernel a device runs (masked_version), which the plans memoise.

lab.ops.attention with window_size / softcap / sinks, and lab.ops.attention_varlen with check_cu_seqlens=False,
reach the kernel through binding.cpp's attn_mask_auto / attn_varlen_packed: a plan memoised per (shape, device, mask)
holds what the full path (lab.masks.op) checked once, the mask folded by lab.masks.spec, the diagonal offset and
the launcher's address; every check that can change between two calls of one plan (dtypes, devices, shapes, strides,
sinks, cu_seqlens, a gradient wanted) runs in C++. Any refusal or error answers None, and lab.masks.op then takes its
full path, which raises the right error: the fast path never decides what a call means, only how fast it runs.

Why: a cold call's window (an L2 flush, then one call) holds the host time the flush does not hide, and the masked
calls' Python path cost 86.9 us (dense) and 125.9 us (packed) per call against the default dense call's 16.9 us on
the H100's host (outputs/driver_logs/20261126-h100-masks-defaults-52d68b6/host_profile.log: the ctypes launch, the
Python checks, the device context and stream lookups). Prediction (outputs/driver_logs/20261126-h100-masks-fast-c53111c/, same host):
both masked calls within a few us of the dense call's host time, about 18-25 us, the launcher's tensor-map encoding
being the part the dense default has too; chapter n13's cold masked rows at S 4096 then lose up to the 40-60 us the
flush did not hide, and the rows at S 16384 (1-3 ms of GPU work) change by under 3 %.
"""
from __future__ import annotations

import functools

import torch

from .. import build
from ..fwd import head_dims
from ..kernels import keep_plan, launcher, plans
from ..op_common import _capability, _eager
from ..registry import BEST_MASKED_FWD, MASKED_FWD, choose
from . import spec

_Tensor = torch.Tensor  # exact types only: a subclass goes through the full path and the dispatcher


def masked_version(device, version=None, head_dim: int = 128) -> str:
    """The masked kernel for a device and a kernel head dim (64, 128, 192, 256: lab.fwd.head_dims pads the others):
    `version` checked, or choose("fwd_masked", ...)'s, the first of BEST_MASKED_FWD that runs there and takes the
    head dim (masked v12 at 192 / 256, on compute capability 9.0 only: NotImplementedError elsewhere)."""
    capability = _capability(device)
    if version is None:
        try:
            return choose("fwd_masked", {"head_dim": head_dim}, capability).version
        except NotImplementedError as error:
            raise NotImplementedError(f"window_size / softcap / sinks / attention_varlen: {error} (use "
                                      f"F.scaled_dot_product_attention or the eager formula there)") from None
    check_masked_version(version, head_dim)
    if MASKED_FWD[version].capabilities and capability not in MASKED_FWD[version].capabilities:
        raise ValueError(f"version={version!r} runs on compute capability {MASKED_FWD[version].capabilities}, "
                         f"this device has {capability}")
    return version


def check_masked_version(version: str, head_dim: int) -> None:
    """A named masked kernel that exists and takes this kernel head dim: what can be said of it before the device."""
    if version not in MASKED_FWD:
        raise ValueError(f"window_size / softcap / sinks / varlen run on the masked kernels {sorted(MASKED_FWD)}, "
                         f"got version={version!r}")
    if head_dim not in MASKED_FWD[version].head_dims:
        raise ValueError(f"version={version!r} takes head dims {list(MASKED_FWD[version].head_dims)}, "
                         f"got {head_dim}")


def masked_head_dims(capability: tuple) -> tuple:
    """The head dims some masked kernel takes on a GPU of this compute capability: 64 and 128 everywhere, 192 and
    256 on 9.0 (v12)."""
    return tuple(sorted({d for name in BEST_MASKED_FWD for d in MASKED_FWD[name].head_dims
                         if not MASKED_FWD[name].capabilities or capability in MASKED_FWD[name].capabilities}))


def _plain(window_size, softcap) -> bool:
    """Arguments that key a plan unambiguously: no window or a tuple of two ints, a float or int softcap (a bool is
    equal to an int in a dict key, and the full path refuses it)."""
    if window_size is not None and not (type(window_size) is tuple and len(window_size) == 2 and
                                        type(window_size[0]) is int and type(window_size[1]) is int):
        return False
    return type(softcap) is float or type(softcap) is int


def attention(query, key, value, is_causal, scale, enable_gqa, return_lse, causal_variant, window_size, softcap,
              sinks):
    """lab.ops.attention's eager masked call with the default kernel: the answer, or None (take the full path)."""
    if not (type(query) is _Tensor and type(key) is _Tensor and type(value) is _Tensor and type(is_causal) is bool
            and type(enable_gqa) is bool and type(return_lse) is bool and (sinks is None or type(sinks) is _Tensor)
            and (scale is None or type(scale) is float)
            and _plain(window_size, softcap) and _eager()):
        return None
    qs, ks, vs = query.shape, key.shape, value.shape
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        return None
    plan_key = ("masked", qs[2], ks[2], qs[3], vs[3], query.get_device(), is_causal, window_size, softcap,
                causal_variant)
    return run_plan(plans, plan_key, _dense_plan, (query, key, value, is_causal, window_size, softcap, causal_variant),
                    (query, key, value, sinks, enable_gqa, return_lse, scale), return_lse)


def run_plan(table: dict, plan_key, make, make_args: tuple, args: tuple, return_lse: bool):
    """One planned call in one crossing of the binding: the plan kept in `table` under plan_key (make(*make_args)
    the first time; None from it: no plan, the full path decides), called with args. -> the answer, or None where
    the binding refused or its checks failed (the full path then raises its own error)."""
    plan = table.get(plan_key)
    if plan is None:
        plan = make(*make_args)
        if plan is None:
            return None
        keep_plan(plan_key, plan, table)
    error, out, lse = plan(*args)
    if error:
        return None
    return (out, lse) if return_lse else out


def _dense_plan(query, key, value, is_causal, window_size, softcap, causal_variant):
    """attn_mask_auto bound to the default masked kernel, the mask and the offset; None where the full path must
    decide (not a CUDA tensor, a padded head dim, an argument it refuses)."""
    if query.get_device() < 0 or head_dims.needs_padding(query, value) or \
            causal_variant not in ("upper_left", "lower_right"):
        return None
    mask, address = _mask_and_kernel(query, is_causal, window_size, softcap)
    if mask is None:
        return None
    offset = key.shape[2] - query.shape[2] if causal_variant == "lower_right" else 0
    return functools.partial(build.binding().module.attn_mask_auto, address, mask.left, mask.right, offset,
                             mask.softcap)


def _mask_and_kernel(query, is_causal, window_size, softcap):
    """(the mask lab.masks.spec folds, the default masked kernel's launcher address), or (None, None) where the full
    path refuses an argument."""
    try:
        mask = spec.make_mask(is_causal, window_size, softcap)
        return mask, launcher(MASKED_FWD, masked_version(query.device, head_dim=query.shape[-1]))
    except (TypeError, ValueError, NotImplementedError):
        return None, None


def varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, window_size,
           softcap, sinks, return_lse, check_cu_seqlens, version):
    """lab.ops.attention_varlen's eager call without the host check of cu_seqlens: the answer, or None."""
    if not (check_cu_seqlens is False and version is None and type(query) is _Tensor and type(key) is _Tensor and
            type(value) is _Tensor and type(cu_seqlens_q) is _Tensor and type(cu_seqlens_k) is _Tensor and
            type(max_seqlen_q) is int and type(max_seqlen_k) is int and type(is_causal) is bool and
            type(return_lse) is bool and (sinks is None or type(sinks) is _Tensor) and
            (scale is None or type(scale) is float) and
            _plain(window_size, softcap) and _eager()):
        return None
    qs = query.shape
    if len(qs) != 3:
        return None
    plan_key = ("varlen", qs[2], query.get_device(), is_causal, window_size, softcap)
    return run_plan(plans, plan_key, _varlen_plan, (query, is_causal, window_size, softcap),
                    (query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sinks, return_lse,
                     scale), return_lse)


def _varlen_plan(query, is_causal, window_size, softcap):
    if query.get_device() < 0 or query.shape[-1] not in masked_head_dims(_capability(query.device)):
        return None
    mask, address = _mask_and_kernel(query, is_causal, window_size, softcap)
    if mask is None:
        return None
    return functools.partial(build.binding().module.attn_varlen_packed, address, mask.left, mask.right, mask.softcap)
