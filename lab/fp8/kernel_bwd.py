"""The FP8 backward kernel's call (bwd v22, lab.registry.FP8_BWD): its parameter block, workspaces and errors.

    dq, dk, dv = backward(grad_out, q8, k8, v8, q_descale, k_descale, v_descale, out, lse, is_causal, scale)

What it takes: the FP8 forward's e4m3 q, k, v (B, H, S, D) with their descales as (B, H) float32 tensors (q per
query head, k and v per KV head; lab.fp8.casts.quantize_e4m3 makes them so), the forward's bf16 O and natural-log
LSE, and the incoming bf16 gradient dO. dO is quantised here to e4m3 per tensor (one descale, amax / 448: dV sums
over a GQA group's heads, so one scale serves every head of it); the bf16 dO stays for Delta = rowsum(dO * O). What
it returns: bf16 dQ (B, H_q, S_q, D), dK, dV (B, H_kv, S_k, D), contiguous, the gradients of attention at the
dequantised inputs (x_fp8 * descale).

Where it rounds (lab.fp8.emulate_bwd.kernel_model does the same on the CPU): S = Q K^T from the e4m3 operands
(exact products, float32 sums); dP = dO V^T and dV = P^T dO read the e4m3 dO; P enters dV as e4m3(P * 448); dS
enters dK with a power-of-two scale per key row (m_j = 2^(7 - floor(log2 max_i |dS_ij q_descale|)): the row's
largest value lands in [128, 256), e4m3's top binades) and dQ with one per tile of 64 queries x 64 keys. Powers
of two make every rescale exact, so each scale costs only the e4m3 rounding of the values it scales.

The launcher takes AttnBwdFp8Params (kernels/common/hopper/attn_bwd_fp8_params.h), which embeds AttnBwdParams
(kernels/common/params.h): both mirrored field for field below (tests/fp8/test_fp8_kernel_bwd.py compares their
layout with the C compiler's). It runs head dims 64 and 128 on compute capability 9.0, never in deterministic mode
(`unavailable` says why a call cannot run it).
"""
from __future__ import annotations

import ctypes

import torch

from .. import kernels, registry
from . import op
from .casts import quantize_e4m3

VERSION = "v22"
ROW_PAD = 128  # LAB_BWD_ROW_PAD (kernels/common/params.h): delta, lse_log2 and dq_accum rows, per (b, h)
LAB_BF16 = 1  # LabDtype (kernels/common/params.h)
WRONG_BUILD = {"LAB_BWD_FP8_WRONG": 1}  # the deliberately wrong build: dK leaves without its row multiplier
ERRORS = {**op.ERRORS, -4: "a workspace pointer is missing", -5: "mode not supported (deterministic)"}
_I64x3 = ctypes.c_int64 * 3


class BwdParams(ctypes.Structure):
    """AttnBwdParams, field for field (kernels/common/params.h)."""

    _fields_ = [("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("dout", ctypes.c_void_p), ("lse", ctypes.c_void_p), ("dlse", ctypes.c_void_p),
                ("dq", ctypes.c_void_p), ("dk", ctypes.c_void_p), ("dv", ctypes.c_void_p),
                ("delta", ctypes.c_void_p), ("lse_log2", ctypes.c_void_p), ("dq_accum", ctypes.c_void_p),
                ("q_stride", _I64x3), ("k_stride", _I64x3), ("v_stride", _I64x3), ("o_stride", _I64x3),
                ("do_stride", _I64x3), ("dq_stride", _I64x3), ("dk_stride", _I64x3), ("dv_stride", _I64x3),
                ("batch", ctypes.c_int), ("heads_q", ctypes.c_int), ("heads_kv", ctypes.c_int),
                ("seqlen_q", ctypes.c_int), ("seqlen_k", ctypes.c_int), ("head_dim", ctypes.c_int),
                ("scale", ctypes.c_float), ("causal", ctypes.c_int), ("dtype", ctypes.c_int),
                ("deterministic", ctypes.c_int)]


class Fp8BwdParams(ctypes.Structure):
    """AttnBwdFp8Params, field for field (kernels/common/hopper/attn_bwd_fp8_params.h)."""

    _fields_ = [("base", BwdParams), ("dout8", ctypes.c_void_p), ("qt", ctypes.c_void_p), ("kt", ctypes.c_void_p),
                ("dot", ctypes.c_void_p), ("q_descale", ctypes.c_void_p), ("k_descale", ctypes.c_void_p),
                ("v_descale", ctypes.c_void_p), ("do_descale", ctypes.c_void_p), ("dout8_stride", _I64x3),
                ("q_cols", ctypes.c_int), ("k_cols", ctypes.c_int)]


_LAUNCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Fp8BwdParams), ctypes.c_void_p)
_functions: dict = {}


def _function(defines=None):
    key = tuple(sorted(defines.items())) if defines else ()
    if key not in _functions:
        _functions[key] = _LAUNCHER(kernels.launcher(registry.FP8_BWD, VERSION, defines))
    return _functions[key]


def unavailable(head_dim: int, capability: tuple | None = None, deterministic: bool = False) -> str | None:
    """Why the FP8 backward kernel cannot run a call (None: it can): its head dims, compute capability and mode are
    lab.registry.FP8_BWD's row and choose("bwd_fp8")'s rule. capability None: the argument checks alone."""
    kernel = registry.FP8_BWD[VERSION]
    if head_dim not in kernel.head_dims:
        return (f"the FP8 backward kernel (bwd {VERSION}) runs head dim {kernel.head_dims} only, this call's is "
                f"{head_dim}")
    if capability is not None and tuple(capability) not in kernel.capabilities:
        return (f"the FP8 backward kernel (bwd {VERSION}, wgmma e4m3) runs on compute capability 9.0 only, this GPU "
                f"is {'.'.join(map(str, capability))}")
    if deterministic:
        return (f"the FP8 backward kernel (bwd {VERSION}) has no deterministic mode (its dQ is summed in no fixed "
                f"order), and torch.use_deterministic_algorithms(True) is on")
    return None


def workspaces(B: int, Hq: int, Hkv: int, Sq: int, Sk: int, D: int, device) -> dict:
    """The caller's workspaces: Q^T, K^T, dO^T (e4m3, (B, H, D, cols)); delta, lse_log2 (B, H_q, R) and dq_accum
    (B, H_q, R, D) float32 in one buffer, R = S_q padded to ROW_PAD (v22 keeps no tile counters after dq_accum)."""
    q_cols, k_cols = op.vt_columns(Sq), op.vt_columns(Sk)  # the transposes are the V^T pass
    padded = B * Hq * (-(-Sq // ROW_PAD) * ROW_PAD)
    work = torch.empty(padded * (D + 2), dtype=torch.float32, device=device)
    fp8 = dict(dtype=torch.float8_e4m3fn, device=device)
    return {"qt": torch.empty((B, Hq, D, q_cols), **fp8), "kt": torch.empty((B, Hkv, D, k_cols), **fp8),
            "dot": torch.empty((B, Hq, D, q_cols), **fp8), "delta": work[:padded], "lse_log2": work[padded:2 * padded],
            "dq_accum": work[2 * padded:], "q_cols": q_cols, "k_cols": k_cols}


def backward(grad_out, q8, k8, v8, q_descale, k_descale, v_descale, out, lse, is_causal: bool, scale: float,
             defines=None, dout8=None, do_descale=None):
    """(dq, dk, dv) bf16 of the FP8 backward kernel (module notes). dout8 / do_descale: dO already quantised per
    tensor (do_descale a float32 CUDA tensor whose first element is the descale); None: quantised here."""
    B, Hq, Sq, D = q8.shape
    Hkv, Sk = k8.shape[1], k8.shape[2]
    device = q8.device
    if B == 0 or Sq == 0 or Sk == 0:  # no query sees a key: every gradient is zero (the launcher writes nothing)
        return (torch.zeros((B, Hq, Sq, D), dtype=torch.bfloat16, device=device),
                *(torch.zeros((B, Hkv, Sk, D), dtype=torch.bfloat16, device=device) for _ in range(2)))
    grad_out = grad_out.to(torch.bfloat16).contiguous()
    if dout8 is None:
        dout8, do_descale = quantize_e4m3(grad_out, "tensor")
    q8, k8, v8, dout8, out = (x.contiguous() for x in (q8, k8, v8, dout8, out))
    descales = [d.float().expand(B, h).contiguous() for d, h in ((q_descale, Hq), (k_descale, Hkv), (v_descale, Hkv))]
    lse = lse.float().contiguous()
    dq = torch.empty((B, Hq, Sq, D), dtype=torch.bfloat16, device=device)
    dk, dv = (torch.empty((B, Hkv, Sk, D), dtype=torch.bfloat16, device=device) for _ in range(2))
    work = workspaces(B, Hq, Hkv, Sq, Sk, D, device)
    base = BwdParams(q=q8.data_ptr(), k=k8.data_ptr(), v=v8.data_ptr(), o=out.data_ptr(), dout=grad_out.data_ptr(),
                     lse=lse.data_ptr(), dlse=None, dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr(),
                     delta=work["delta"].data_ptr(), lse_log2=work["lse_log2"].data_ptr(),
                     dq_accum=work["dq_accum"].data_ptr(), batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Sq,
                     seqlen_k=Sk, head_dim=D, scale=scale, causal=int(is_causal), dtype=LAB_BF16, deterministic=0)
    for field, t in (("q_stride", q8), ("k_stride", k8), ("v_stride", v8), ("o_stride", out), ("do_stride", grad_out),
                     ("dq_stride", dq), ("dk_stride", dk), ("dv_stride", dv)):
        getattr(base, field)[:] = op.kernel_strides(t)
    p = Fp8BwdParams(base=base, dout8=dout8.data_ptr(), qt=work["qt"].data_ptr(), kt=work["kt"].data_ptr(),
                     dot=work["dot"].data_ptr(), q_descale=descales[0].data_ptr(), k_descale=descales[1].data_ptr(),
                     v_descale=descales[2].data_ptr(), do_descale=do_descale.data_ptr(), q_cols=work["q_cols"],
                     k_cols=work["k_cols"])
    p.dout8_stride[:] = op.kernel_strides(dout8)
    with torch.cuda.device(device):
        rc = _function(defines)(ctypes.byref(p), torch.cuda.current_stream().cuda_stream)
    check_rc(rc)
    return dq, dk, dv


def check_rc(rc: int) -> None:
    """The launcher's return code as an exception: LAB_E_* (negative) as ValueError, a CUDA error as RuntimeError."""
    if rc < 0:
        raise ValueError(f"bwd {VERSION} (FP8): {ERRORS.get(rc, 'unknown launcher error')} (code {rc})")
    if rc > 0:
        raise RuntimeError(f"bwd {VERSION} (FP8): CUDA error {rc}")
