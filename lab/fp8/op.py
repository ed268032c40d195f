"""lab.ops.attention_fp8: the lab's FP8 forward (fwd v13, sm_90a), with FlashAttention-3's FP8 arguments.

    out = attention_fp8(query, key, value, q_descale=None, k_descale=None, v_descale=None, is_causal=False,
                        scale=None, enable_gqa=False, return_lse=False)

query, key, value: torch.float8_e4m3fn, (B, H, S, D) (any strides; a (B, S, H, D) tensor seen through
.transpose(1, 2) is read in place), D in (64, 128, 256). The descales follow FA3: x ~= x_fp8 * descale, float32
CUDA tensors of one element (per tensor) or of shape (B, H_kv) (per batch and KV head; q_descale also (B, H_q));
None means 1. out: bfloat16 (B, H_q, S_q, D); with return_lse also the natural-log LSE, float32 (B, H_q, S_q).
is_causal is top-left (query i sees keys j <= i), as lab.ops.attention and SDPA.

The kernel reads V as V^T: each call first writes V^T into a workspace (fwd/v13_fp8.cu says why and what it
costs). Each key tile's P V is added to O in float32: Hopper's FP8 tensor cores keep a reduced-precision
accumulator, which drops the small increments of a running sum that grows with the keys (a V with a mean: O 5-18 %
low at 4k-16k keys without it, as cuDNN FP8 is). The launcher is called through ctypes with AttnFp8Params (kernels/common/hopper/attn_fp8_sm90.cuh),
field for field below. No autograd: the FP8 forward has no backward here.
"""
from __future__ import annotations

import ctypes

import torch

from .. import kernels, registry
from ..masks.spec import check_bools
from ..op_common import _check_heads, _scale

HEAD_DIMS = (64, 128, 256)
P_SCALE = 448.0  # lab.fp8.emulate.P_SCALE: P is stored as e4m3(P * 448) before P V
VT_KEYS = 128  # V^T rows are padded to a multiple of this many keys
# The default build's key tile B_c per head dim (fwd v13: D 64 one warpgroup, D 128 / 256 warp-specialised): where
# P is rounded against the running max, so the emulation that the checks hold the kernel to runs at the same width.
KEY_TILE = {64: 128, 128: 192, 256: 128}


def key_tile(head_dim: int, defines=None, causal: bool = False) -> int:
    """B_c of the build that `defines` make (fwd v13's LAB_FWD_FP8_WARPSPEC and tile knobs) at head_dim, for causal
    or non-causal calls: the width the emulation runs at when a candidate build is checked. No defines:
    KEY_TILE[head_dim]."""
    d = {name: int(value) for name, value in (defines or {}).items()}
    mode = d.get("LAB_FWD_FP8_WARPSPEC", 3)
    if mode == 1 or (mode == 3 and head_dim >= 128) or (mode == 2 and head_dim == 256):
        tile = d.get(f"LAB_FWD_FP8_WS_D{head_dim}_BC", KEY_TILE[128] if head_dim == 128 else 128)
        return d.get("LAB_FWD_FP8_WS_D128_CAUSAL_BC", tile) if causal and head_dim == 128 else tile
    return {64: 128, 128: d.get("LAB_FWD_FP8_D128_BC", 128), 256: 64}[head_dim]
ERRORS = {-1: "head dim not supported", -2: "dtype not supported", -3: "shape or layout not supported"}


def vt_columns(seqlen: int) -> int:
    """Columns of a transposed e4m3 tensor as the V^T pass writes it (the forward's V^T, the backward's Q^T, K^T,
    dO^T): the sequence padded to a multiple of VT_KEYS, the tail zeroed by the pass."""
    return max(VT_KEYS, -(-seqlen // VT_KEYS) * VT_KEYS)


def kernel_strides(t: torch.Tensor) -> list:
    """(batch, head, seq) strides in elements as the launchers take them; a dim of size 1 gets a packed stride
    (never read, but a legal tensor-map value)."""
    return [t.stride(i) if t.shape[i] > 1 else t.stride(i + 1) * t.shape[i + 1] for i in range(3)]


class Params(ctypes.Structure):
    """AttnFp8Params, field for field (kernels/common/hopper/attn_fp8_sm90.cuh)."""

    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("vt", ctypes.c_void_p),
                ("o", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("q_descale", ctypes.c_void_p),
                ("k_descale", ctypes.c_void_p), ("v_descale", ctypes.c_void_p),
                ("q_stride", ctypes.c_int64 * 3), ("k_stride", ctypes.c_int64 * 3), ("v_stride", ctypes.c_int64 * 3),
                ("o_stride", ctypes.c_int64 * 3), ("descale_stride", (ctypes.c_int64 * 2) * 3),
                ("q_descale_by_kv", ctypes.c_int), ("batch", ctypes.c_int), ("heads_q", ctypes.c_int),
                ("heads_kv", ctypes.c_int), ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("vt_cols", ctypes.c_int), ("scale", ctypes.c_float),
                ("p_scale", ctypes.c_float), ("causal", ctypes.c_int), ("tile_counter", ctypes.c_void_p)]


_LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Params), ctypes.c_void_p)
_functions: dict = {}


def _function(symbol: str, defines=None):
    key = (symbol, tuple(sorted(defines.items())) if defines else ())
    fn = _functions.get(key)
    if fn is None:
        table = {symbol: kernels.Kernel(registry.FP8_FWD["v13"].source, symbol, HEAD_DIMS)}
        fn = _functions[key] = _LAUNCHER(kernels.launcher(table, symbol, defines))
    return fn


def _check(t, name: str, like=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name}.dtype must be torch.float8_e4m3fn, got {t.dtype} (quantise with "
                        f"lab.fp8.quant.quantize(x, 'e4m3'))")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")
    if like is not None:
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but query is on {like.device}")
        if t.shape[0] != like.shape[0]:
            raise ValueError(f"{name} has batch {t.shape[0]} but query has batch {like.shape[0]}")
        if t.shape[3] != like.shape[3]:
            raise ValueError(f"{name} has head dim {t.shape[3]} but query has {like.shape[3]}")


def _check_descale(x, name: str, batch: int, heads_kv: int, heads_q: int | None):
    """(tensor or None, (batch stride, head stride), indexed by KV head); shape and dtype only."""
    if x is None:
        return None, (0, 0), True
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor or None (FA3's descale), got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name}.dtype must be torch.float32, got {x.dtype}")
    if x.numel() == 1:
        return x, (0, 0), True
    if x.dim() == 2 and tuple(x.shape) == (batch, heads_kv):
        return x, (x.stride(0), x.stride(1)), True
    if heads_q is not None and x.dim() == 2 and tuple(x.shape) == (batch, heads_q):
        return x, (x.stride(0), x.stride(1)), False
    shapes = f"(B, H_kv) = {(batch, heads_kv)}" + (f" or (B, H_q) = {(batch, heads_q)}" if heads_q else "")
    raise ValueError(f"{name} must have one element or shape {shapes}, got {tuple(x.shape)}")


def _readable(t):
    """TMA's and the V^T pass's preconditions: a 16-byte aligned base, strides in multiples of 16 bytes."""
    if t.numel() and (t.data_ptr() % 16 or any(s % 16 for s in t.stride()[:-1]) or t.stride(-1) != 1):
        return t.view(torch.uint8).clone(memory_format=torch.contiguous_format).view(t.dtype)
    return t


def check_args(query, key, value, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa):
    """Every check that needs no GPU, in order; returns (scale, the three descales' (tensor, strides, by_kv))."""
    _check(query, "query")
    _check(key, "key", query)
    _check(value, "value", query)
    if key.shape != value.shape:
        raise ValueError(f"key and value shapes differ: {tuple(key.shape)} vs {tuple(value.shape)}")
    if query.shape[3] not in HEAD_DIMS:
        raise ValueError(f"head dim {query.shape[3]}: the FP8 forward runs D in {HEAD_DIMS}; pad Q, K and V with "
                         f"zero columns to the next one (exact: zeros add nothing to Q K^T) and slice O")
    _check_heads(query, key, enable_gqa)
    check_bools(is_causal=is_causal, enable_gqa=enable_gqa)
    B, Hq, Hkv = query.shape[0], query.shape[1], key.shape[1]
    descales = (_check_descale(q_descale, "q_descale", B, Hkv, Hq), _check_descale(k_descale, "k_descale", B, Hkv, None),
                _check_descale(v_descale, "v_descale", B, Hkv, None))
    return _scale(scale, query.shape[3]), descales


def _refuse_grad(*tensors):
    """e4m3 inputs that require grad: this op has no backward (an e4m3 tensor has no useful gradient dtype);
    training goes through lab.fp8.backward.attention_fp8_train, which takes the high-precision tensors."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError("lab.ops.attention_fp8 is forward-only: its e4m3 inputs get no gradient. To train, pass "
                           "the bf16 / fp16 / fp32 tensors to lab.fp8.backward.attention_fp8_train, which quantises "
                           "them to e4m3 inside and returns gradients in their dtype")


def attention_fp8(query, key, value, q_descale=None, k_descale=None, v_descale=None, is_causal: bool = False,
                  scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False):
    """The FP8 forward (module notes). Shape and dtype errors come before the device check."""
    _refuse_grad(query, key, value)
    check_bools(return_lse=return_lse)
    return run(query, key, value, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa, return_lse)


def run(query, key, value, q_descale=None, k_descale=None, v_descale=None, is_causal=False, scale=None,
        enable_gqa=False, return_lse=False, defines=None, symbol: str = "attn_fwd_v13", out=None, lse=None):
    """attention_fp8 with a build's defines (lab.fp8.checks' wrong builds), into given (poisoned) contiguous
    `out` / `lse` buffers, or through another entry (the V^T pass alone, symbol "attn_fp8_vt_v13": returns the
    V^T workspace)."""
    scale, descales = check_args(query, key, value, q_descale, k_descale, v_descale, is_causal, scale, enable_gqa)
    if query.device.type != "cuda":
        raise ValueError(f"query must be on a CUDA device, got {query.device} (CPU: lab.fp8.emulate.forward)")
    for (x, _, _), name in zip(descales, ("q_descale", "k_descale", "v_descale")):
        if x is not None and x.device != query.device:
            raise ValueError(f"{name} is on {x.device} but query is on {query.device}")
    B, Hq, Sq, D = query.shape
    Hkv, Sk = key.shape[1], key.shape[2]
    if Sk == 0:
        raise ValueError("key has sequence length 0: every query row would attend to nothing")
    q, k, v = _readable(query), _readable(key), _readable(value)
    vt_cols = vt_columns(Sk)
    # V^T, and behind it (16 bytes on) the int that the V^T pass zeroes for the kernel's dynamic tile scheduler
    vt_bytes = B * Hkv * D * vt_cols
    workspace = torch.empty(vt_bytes + 16, dtype=torch.uint8, device=query.device)
    vt = workspace[:vt_bytes].view(B, Hkv, D, vt_cols)
    if out is None:
        out = torch.empty((B, Hq, Sq, D), dtype=torch.bfloat16, device=query.device)
    if return_lse and lse is None:
        lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=query.device)
    p = Params(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), vt=vt.data_ptr(), o=out.data_ptr(),
               lse=lse.data_ptr() if lse is not None else None,
               batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq, seqlen_k=Sk, head_dim=D, vt_cols=vt_cols,
               scale=scale, p_scale=P_SCALE, causal=int(is_causal), tile_counter=workspace.data_ptr() + vt_bytes)
    for field, t in (("q_stride", q), ("k_stride", k), ("v_stride", v), ("o_stride", out)):
        getattr(p, field)[:] = kernel_strides(t)
    for i, ((x, strides, by_kv), field) in enumerate(zip(descales, ("q_descale", "k_descale", "v_descale"))):
        setattr(p, field, x.data_ptr() if x is not None else None)
        p.descale_stride[i][:] = list(strides)
        if i == 0:
            p.q_descale_by_kv = int(by_kv)
    with torch.cuda.device(query.device):
        rc = _function(symbol, defines)(ctypes.byref(p), torch.cuda.current_stream().cuda_stream)
    if rc < 0:
        raise ValueError(f"fwd v13 (FP8): {ERRORS.get(rc, 'unknown launcher error')} (code {rc})")
    if rc > 0:
        raise RuntimeError(f"fwd v13 (FP8): CUDA error {rc}")
    if symbol != "attn_fwd_v13":
        return vt
    return (out, lse) if return_lse else out
