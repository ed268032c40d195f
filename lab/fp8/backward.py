"""Training through the FP8 forward: `attention_fp8_train`, quantise inside, FP8 forward, gradients in the input dtype.

    out = attention_fp8_train(query, key, value, is_causal=False, scale=None, enable_gqa=False,
                              granularity="tensor", return_lse=False, backward="auto")

What the user passes and gets. query, key, value are the high-precision tensors the model holds (bf16, fp16 or
fp32; (B, H, S, D), D 64 or 128). The call quantises each to e4m3 with an amax descale (lab.fp8.quant's
rule, `granularity` "tensor" or "head", one per (b, h); bf16 in two passes of kernels/bwd/fp8_cast.cu), runs
the FP8 forward (lab.ops.attention_fp8, fwd v13: bf16 O, natural-log LSE) and saves the e4m3 tensors and
descales (1 byte an element, not 2), O and LSE. The gradients returned are those of attention at the
DEQUANTISED inputs, x_fp8 * descale, in each input's dtype: the quantisation is passed straight through (its
rounding has no useful derivative; the amax descale is treated as a constant), as Transformer Engine's FP8
attention does. An e4m3 tensor has no gradient of its own worth having, so
lab.ops.attention_fp8 itself (e4m3 in) stays forward-only and says so when an input requires grad.

Which backward runs (`backward=`; name it in every claim):

* "fp8": the FP8 backward kernel, bwd v22 (lab.fp8.kernel_bwd; lab.registry.FP8_BWD). All five GEMMs on e4m3
  wgmma from the saved e4m3 Q, K, V and their descales; dO quantised to e4m3 per tensor; P as e4m3(P * 448); dS
  with power-of-two scales, per key row for dK and per tile of 64 queries x 64 keys for dQ; bf16 dQ, dK, dV.
  Head dims 64 and 128, compute capability 9.0, not in deterministic mode: any other call raises
  NotImplementedError saying which (never a silent fallback).
* "bf16": dequantise-then-bf16. Q, K, V are dequantised to bf16 (e4m3 x descale, rounded once; one pass each,
  kernels/bwd/fp8_cast.cu) and the lab's bf16 backward (lab.backward.op: bwd v14 on compute capability 9.0, v18 in
  deterministic mode) runs on them with the FP8 forward's O and LSE. Its GEMMs are bf16; it is NOT an FP8
  backward and no speed claim calls it one. Its error is the bf16 backward's plus what the FP8 forward's O brings
  into Delta = rowsum(dO * O).
* "auto" (the default): "bf16" today. AUTO_TAKES_KERNEL says when "auto" takes the kernel: where it runs and only
  once it is measured faster than the dequantise-then-bf16 path; on the H200 it is not (through the public call,
  our bf16 backward's speed times 0.74-0.85 at D 128 and 0.58-0.60 at D 64, dequantise-then-bf16's 0.89-0.95 and
  0.83-0.84: Measured below), and its gradients are ~10x further from float64 (e4m3 dO, P, dS), so a default that
  took it would cost accuracy for no speed.

lab.fp8.checks_bwd measures each path against float64 on the dequantised inputs, the kernel beside its emulation
(lab.fp8.emulate_bwd.kernel_model: the same roundings on the CPU).

Design of the FP8 backward (kernels/bwd/v22_fp8.cu's header has its algorithm and launch):

* The five GEMMs. S = Q K^T (recompute) and dP = dO V^T contract over D: both operands are D-contiguous as stored,
  the layout FP8 wgmma wants (both operands K-major in shared memory). dV = P^T dO, dK = dS^T Q, dQ = dS K
  contract over a sequence axis: dV needs dO^T (D x S_q), dK needs Q^T, dQ needs K^T in FP8, K-major. P^T and
  dS^T come from registers (the accumulator re-laid as an A fragment, as fwd v13 does for P), so the operands
  to transpose are dO, Q and K: pre-passes write Q^T, K^T (from the forward's saved e4m3) and dO^T, as the
  forward's V^T pass does. Cost: 3 x B H S D bytes read and written, under 2 % of the backward at S 4k, D 128.
* Scaling. dO: one amax descale per tensor (dV sums over a GQA group's heads, so one scale serves all of them). P:
  e4m3(P * 448) as the forward. dS: its amax is not known before the main loop. dK's accumulator stays in the CTA,
  so each key row keeps a running power-of-two multiplier (the row's largest |dS q_descale| so far lands in
  [128, 256)) and the accumulator is rescaled, exactly, when a step lowers it, as the online softmax rescales O;
  dQ's partial leaves the CTA every step, so its multiplier is the step's tile amax. Format: e4m3 for dO and dS,
  against Transformer Engine's e5m2 gradients: with amax scales e5m2's range is not needed and its lost mantissa
  bit doubles the error. lab.fp8.emulate_bwd.budget, D 128, S 512, randn, dQ relative L2 against float64 (causal
  in brackets): bf16 backward 2.4e-3 (2.6e-3); e4m3 dO, P, dS 3.8e-2 (4.3e-2), the same with a scale from a bound
  known before the loop 3.8e-2 (4.2e-2); e5m2 dO, dS 7.6e-2 (8.8e-2), with the bound 7.6e-2 (9.2e-2).
* Precision. Every FP8 operand adds ~2^-4 relative rounding: FP8 dQ, dK come out ~15x further from float64 than
  bf16's. S in FP8 costs nothing (Q, K are e4m3 already; products exact in the fp32 accumulator, fp22 aside).
  dP in FP8 puts dO's e4m3 rounding into dS and so into dQ, dK (2.7e-2), while dV keeps bf16's error if it reads
  a bf16 dO. P in e4m3 costs dV alone (2.7e-2). The dequantise-then-bf16 path adds the FP8 forward's O error
  through Delta: dQ 3.7e-3 (7.3e-3 causal) against bf16's 2.4e-3 (2.6e-3); dV is untouched.
* Speed prediction. FP8 wgmma peaks at 2x bf16's rate. bwd v14 runs at 535-580 TFLOP/s at D 128, S 8k-16k on
  the H200 with the tensor pipe busy ~68 % of the kernel (outputs/experiments/20261126-bwd-stretch-bound.json).
  All five GEMMs in FP8 halve that 68 %: 1 / (0.32 + 0.34) = 1.5x at best; the converts FP8 adds (P and dS to
  e4m3, dS's scales) land on the same ALUs as the softmax gradient, so 1.2-1.35x is the expectation. The
  dequantise-then-bf16 path: 0.95-1.0x of lab.ops.attention's backward (the same kernel plus three elementwise
  passes over Q, K, V).
* Measured (H200, outputs/experiments/20261129-fp8-train-backward.json): the dequantise-then-bf16 path 0.63-0.91x
  of our bf16 backward (casts and the Python autograd node's host time; 0.91x at S 8k); cuDNN's FP8 backward
  1.13-1.18x our bf16 backward at D 128 and 1.18-1.35x its own bf16 one, with 6x our dQ error (e4m3 gradients).
  The kernel path (chapter n15, session 20261130-102049-h200-31785b4, D 128, B S = 16384, H 16, through the
  public call with dO's quantise inside): 0.74-0.85x our bf16 backward and 0.63-0.77x cuDNN's FP8 backward, where
  dequantise-then-bf16 ran at 0.89-0.95x; kernels/bwd/v22_fp8.cu's header has what bounds it (the elementwise work
  per score issues 1.67x bwd v14's instructions, with no room to overlap it with the next step's GEMMs). At D 64:
  the kernel 0.58-0.60x our bf16 backward (outputs/experiments/20261130-bwd-fp8-d64.json, -lean.json).
"""
from __future__ import annotations


import torch

from ..masks.spec import check_bools
from ..op_common import _check_heads, _scale
from . import kernel_bwd, op, quant
from .casts import dequantize_bf16, quantize_e4m3

HEAD_DIMS = (64, 128)  # dims with a backward (the FP8 forward also runs 256, forward only)
INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BACKWARDS = ("auto", "fp8", "bf16")  # the backward= choices (module notes)
AUTO_TAKES_KERNEL = False  # "auto" runs the kernel where it can (True) or dequantise-then-bf16 (module notes: why not yet)
BUGS = (None, "no_k_descale", "fp8_bwd_wrong")  # _bug: the deliberately wrong builds the checks must see fail


def _check(t, name: str):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INPUT_DTYPES:
        hint = (" (already e4m3: call lab.ops.attention_fp8, forward only)" if t.dtype == torch.float8_e4m3fn else "")
        raise TypeError(f"{name}.dtype must be one of {INPUT_DTYPES} (quantised to e4m3 here), got {t.dtype}{hint}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D (B, H, S, D), got shape {tuple(t.shape)}")


def check_args(query, key, value, is_causal, enable_gqa: bool, granularity: str, wants_grad: bool,
               backward: str = "auto"):
    """The checks that need no GPU, in order (the device's come after, in _capability_check)."""
    for t, name in ((query, "query"), (key, "key"), (value, "value")):
        _check(t, name)
    if key.shape != value.shape or key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3]:
        raise ValueError(f"key {tuple(key.shape)} and value {tuple(value.shape)} must have one shape, with the "
                         f"query's batch and head dim {tuple(query.shape)}")
    if query.shape[3] not in op.HEAD_DIMS:
        raise ValueError(f"head dim {query.shape[3]}: the FP8 forward runs D in {op.HEAD_DIMS}")
    _check_heads(query, key, enable_gqa)
    check_bools(is_causal=is_causal, enable_gqa=enable_gqa)
    if granularity not in quant.GRANULARITIES:
        raise ValueError(f"granularity must be one of {quant.GRANULARITIES}, got {granularity!r}")
    if not isinstance(backward, str) or backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if wants_grad and query.shape[-1] not in HEAD_DIMS:
        raise NotImplementedError(f"head dim {query.shape[-1]}: the FP8 attention backward runs D in {HEAD_DIMS}; "
                                  f"call with inputs that do not require grad for the forward alone")
    if wants_grad and backward == "fp8" and kernel_bwd.unavailable(query.shape[-1]):
        raise NotImplementedError(f"backward='fp8': {kernel_bwd.unavailable(query.shape[-1])}; backward='bf16' (or "
                                  f"'auto') runs the dequantise-then-bf16 backward there")


def backward_path(head_dim: int, backward: str, capability: tuple, deterministic: bool) -> str:
    """The backward a call runs: "fp8" (the kernel, bwd v22) or "bf16" (dequantise-then-bf16), for its
    backward= choice (module notes). backward="fp8" where the kernel cannot run raises NotImplementedError."""
    if backward == "bf16" or (backward == "auto" and not AUTO_TAKES_KERNEL):
        return "bf16"
    why = kernel_bwd.unavailable(head_dim, capability, deterministic)
    if why is None:
        return "fp8"
    if backward == "fp8":
        raise NotImplementedError(f"backward='fp8': {why}; backward='bf16' (or 'auto') runs the dequantise-then-bf16 "
                                  f"backward there")
    return "bf16"


def _capability_check(device):
    """The device checks, after every argument check: CUDA, compute capability 9.0."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"query must be on a CUDA device, got {device} (CPU: lab.fp8.emulate_bwd)")
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        raise NotImplementedError(f"the FP8 attention (fwd v13, wgmma e4m3) runs on compute capability 9.0 only, "
                                  f"this GPU is {capability[0]}.{capability[1]}")
    return capability


class FP8Attention(torch.autograd.Function):
    """Quantise, FP8 forward; backward by the FP8 kernel or dequantise-then-bf16 (module notes)."""

    @staticmethod
    def forward(ctx, query, key, value, is_causal, scale, enable_gqa, granularity, backward, bug):
        data, descales = zip(*(quantize_e4m3(x.detach(), granularity) for x in (query, key, value)))
        out, lse = op.run(*data, *descales, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, return_lse=True)
        ctx.save_for_backward(*data, *descales, out, lse)
        ctx.is_causal, ctx.scale, ctx.backward, ctx.bug = is_causal, _scale(scale, query.shape[-1]), backward, bug
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q8, k8, v8, dq_s, dk_s, dv_s, out, lse = ctx.saved_tensors
        if grad_out is None:
            return (None,) * 9
        if ctx.bug == "no_k_descale":  # the deliberately wrong build: K's descale dropped
            dk_s = torch.ones_like(dk_s)
        deterministic = torch.are_deterministic_algorithms_enabled()
        capability = _capability_check(q8.device)
        choice = "fp8" if ctx.bug == "fp8_bwd_wrong" else ctx.backward
        path = backward_path(q8.shape[-1], choice, capability, deterministic)
        grad_out = grad_out.to(torch.bfloat16)
        if path == "fp8":
            defines = kernel_bwd.WRONG_BUILD if ctx.bug == "fp8_bwd_wrong" else None
            dq, dk, dv = kernel_bwd.backward(grad_out, q8, k8, v8, dq_s, dk_s, dv_s, out, lse, ctx.is_causal,
                                             ctx.scale, defines)
        else:
            from ..backward.op import default_backward
            q, k, v = dequantize_bf16(q8, dq_s), dequantize_bf16(k8, dk_s), dequantize_bf16(v8, dv_s)
            dq, dk, dv = default_backward(grad_out, q, k, v, out, lse, None, ctx.is_causal, ctx.scale, capability)
        return (dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1]), dv.to(ctx.dtypes[2])) + (None,) * 6


def attention_fp8_train(query, key, value, is_causal: bool = False, scale: float | None = None,
                        enable_gqa: bool = False, granularity: str = "tensor", return_lse: bool = False,
                        backward: str = "auto", _bug=None):
    """The FP8 forward of high-precision inputs, differentiable (module notes). backward: "auto", "fp8" or "bf16".
    The LSE is returned without a gradient: training through it is not supported here."""
    wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)
                                                 if isinstance(t, torch.Tensor))
    check_args(query, key, value, is_causal, enable_gqa, granularity, wants_grad, backward)
    check_bools(return_lse=return_lse)
    if _bug not in BUGS or (_bug == "fp8_bwd_wrong" and backward == "bf16"):
        raise ValueError(f"_bug must be one of {BUGS} ('fp8_bwd_wrong' is a build of the FP8 kernel), got {_bug!r}")
    _scale(scale, query.shape[-1])  # a bad scale is named before the device check
    capability = _capability_check(query.device)
    if wants_grad and (backward == "fp8" or _bug == "fp8_bwd_wrong"):  # early: a refusal before the forward runs
        backward_path(query.shape[-1], "fp8", capability, torch.are_deterministic_algorithms_enabled())
    out, lse = FP8Attention.apply(query, key, value, is_causal, scale, enable_gqa, granularity, backward, _bug)
    return (out, lse) if return_lse else out
