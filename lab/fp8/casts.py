"""The FP8 casts of training through the FP8 forward (kernels/bwd/fp8_cast.cu, called through ctypes): bf16 to e4m3
with an amax descale per tensor or per (b, h), and e4m3 times its descale back to bf16. lab.fp8.backward quantises
the model's tensors with them, and lab.fp8.kernel_bwd quantises dO; a module of their own so that neither imports
the other for them."""
from __future__ import annotations

import ctypes

import torch

from .. import kernels
from . import quant

HEAD_DIMS = (64, 128)  # the cast kernels' build table (lab.kernels.Kernel): the head dims the FP8 backward takes


CASTS = "bwd/fp8_cast.cu"  # fp8_dequant_bf16 and fp8_quantize_e4m3, called through ctypes
_DEQUANT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                               ctypes.c_int64, ctypes.c_void_p)
_QUANT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p)
_casts: dict = {}


def _cast_fn(symbol: str, prototype):
    if symbol not in _casts:
        _casts[symbol] = prototype(kernels.launcher({symbol: kernels.Kernel(CASTS, symbol, HEAD_DIMS)}, symbol))
    return _casts[symbol]


def _kernel_layout(t: torch.Tensor) -> bool:
    return (t.is_cuda and t.is_contiguous() and t.data_ptr() % 16 == 0 and t.dim() == 4
            and (t.shape[-2] * t.shape[-1]) % 16 == 0 and 0 < t.shape[0] * t.shape[1] <= 65535)


def _check_rc(rc: int, symbol: str):
    if rc:
        raise RuntimeError(f"{symbol}: {'layout not supported' if rc == -3 else 'CUDA error'} (code {rc})")


def quantize_e4m3(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 data, float32 descale (B, H)): lab.fp8.quant.quantize(x, "e4m3", granularity) bit for bit, in two
    passes over bf16 CUDA tensors (kernels/bwd/fp8_cast.cu); quant.quantize itself for other inputs."""
    if x.dtype != torch.bfloat16 or not _kernel_layout(x) or x.numel() == 0:
        q = quant.quantize(x, "e4m3", granularity)
        return q.data, q.descale
    B, H = x.shape[:2]
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    descale = torch.empty((B, H), dtype=torch.float32, device=x.device)
    scratch = torch.empty((B, H), dtype=torch.int32, device=x.device)
    with torch.cuda.device(x.device):
        rc = _cast_fn("fp8_quantize_e4m3", _QUANT_FN)(x.data_ptr(), scratch.data_ptr(), descale.data_ptr(),
                                                      data.data_ptr(), B * H, x.numel() // (B * H),
                                                      int(granularity == "tensor"),
                                                      torch.cuda.current_stream().cuda_stream)
    _check_rc(rc, "fp8_quantize_e4m3")
    return data, descale


def dequantize_bf16_torch(data: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """e4m3 (B, H, S, D) x float32 descale (B, H) -> bf16, one rounding (torch: three passes)."""
    return (data.float() * descale[..., None, None]).to(torch.bfloat16)


def dequantize_bf16(data: torch.Tensor, descale: torch.Tensor) -> torch.Tensor:
    """dequantize_bf16_torch bit for bit, in one pass (kernels/bwd/fp8_cast.cu) on CUDA tensors as
    quantize_e4m3 makes them (contiguous, 16-byte aligned); torch's three passes elsewhere."""
    if not (_kernel_layout(data) and descale.is_contiguous()):
        return dequantize_bf16_torch(data, descale)
    out = torch.empty(data.shape, dtype=torch.bfloat16, device=data.device)
    heads = data.shape[0] * data.shape[1]
    with torch.cuda.device(data.device):
        rc = _cast_fn("fp8_dequant_bf16", _DEQUANT_FN)(data.data_ptr(), descale.data_ptr(), out.data_ptr(), heads,
                                                       data.numel() // heads, torch.cuda.current_stream().cuda_stream)
    _check_rc(rc, "fp8_dequant_bf16")
    return out
