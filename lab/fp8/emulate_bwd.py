"""An FP8 attention backward in float32 torch, operand by operand, and the float64 gradients it is held to.

The backward's five GEMMs (FA2 notation; P recomputed from the forward's LSE, Delta_i = rowsum(dO_i * O_i)):

    S  = scale Q K^T           P = exp(S - LSE)
    dP = dO V^T                dS = P * (dP - Delta)
    dV = P^T dO                dK = scale dS^T Q          dQ = scale dS K

`backward` runs them with each GEMM operand rounded to a chosen format, as a kernel would store it before the
tensor core reads it: Q, K, V are the e4m3 forward inputs (exact in float32); dO goes to `do_format`, P to
`p_format` (as e4m3(P * 448), the forward's convention), dS to `ds_format`, each FP8 operand with an amax scale
per (b, h) (`granularity="head"`) or over the tensor. None keeps float32 (each GEMM summed in float32).
The formats say where precision goes (lab.fp8.backward's design note quotes `budget`):

    everything None     the float32 backward of the dequantised inputs: error ~1e-6 (the float64 yardstick)
    "bf16" everywhere   a bf16 backward (lab.ops.attention's kernels store P, dS, dO as bf16)
    e4m3 / e5m2         an FP8 backward: dO and dS each lose 4 (e4m3) or 5 (e5m2) more mantissa bits than bf16

`kernel_model` is the FP8 backward kernel's own rounding (bwd v22, lab.fp8.kernel_bwd), the model its checks hold
it to: dO per tensor, P as e4m3(P * 448), and dS with power-of-two multipliers, per key row for dK (over every
query of the row's GQA group) and per tile of 64 queries x 64 keys for dQ.

The gradients the GPU checks compare against are lab.check.reference_grads (float64 autograd) on the dequantised
inputs. All take (B, H, S, D) tensors, GQA by head groups, top-left causal.
"""
from __future__ import annotations

import math

import torch

from ..check import reference_grads
from . import quant
from .emulate import P_SCALE, _expand

FORMATS = (None, "bf16", "e4m3", "e5m2")
# bwd v22's dQ scale tile: a step's 64 queries (blocks from 0) x one consumer warpgroup's 64 keys (from 0): each
# warpgroup scales its half of the CTA's 128 keys by its own amax
DQ_TILE = (64, 64)


def eager(q, k, v, grad_out, is_causal: bool = False, scale: float | None = None, dtype=torch.bfloat16):
    """(dq, dk, dv) of the same math run eagerly in `dtype` (SDPA's math backend, as bf16 autograd): the yardstick
    of a 16-bit backward's error."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    heads = q.shape[1]
    s = (q @ _expand(k, heads).transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    out = torch.softmax(s.float(), dim=-1).to(dtype) @ _expand(v, heads)
    return torch.autograd.grad(out, (q, k, v), grad_out.to(dtype))


def _round(x: torch.Tensor, name, granularity: str) -> torch.Tensor:
    """x as the GEMM reads it: rounded to `name`, with an amax scale for the FP8 formats; float32 out."""
    if name is None:
        return x
    if name == "bf16":
        return x.to(torch.bfloat16).float()
    if name not in quant.FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {name!r}")
    return quant.quantize(x, name, granularity).dequantize()


def _group_sum(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    B, H, S, D = x.shape
    return x.view(B, heads_kv, H // heads_kv, S, D).sum(dim=2)


def backward(q, k, v, out, lse, grad_out, is_causal: bool = False, scale: float | None = None,
             do_format=None, p_format=None, ds_format=None, granularity: str = "head", descale_k: bool = True,
             dv_do_format="same", ds_scale: str = "amax", q_descale=None, dk_rows: bool = True,
             dq_tiles: bool = True, wrong_dk: bool = False):
    """(dq, dk, dv) float32 of the backward above on float32 (dequantised) q, k, v, the forward's out and
    natural-log lse (B, H, S). dv_do_format: dO's format in dV = P^T dO when it differs from dP's ("same": one
    copy). ds_scale "amax": dS's FP8 scale from its own amax (an oracle a kernel does not have before the tile);
    "bound": from max ||dO_i|| max ||V_j|| + max |Delta_i| per (b, h), known before the main loop (P <= 1);
    "kernel": bwd v22's power-of-two multipliers, e4m3 per key row for dK (round_rows, with q_descale (B, H)) and per
    tile for dQ (round_tiles); dk_rows / dq_tiles False leave that GEMM's dS unrounded, wrong_dk is the kernel's
    wrong build (dK without its row multiplier: m_j times too large). descale_k=False is the wrong kernel that reads K's e4m3 values in dQ without their
    (per-tensor amax) descale: the rule must reject it."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32: the emulation's own error stays ~1e-6
    try:
        heads, heads_kv = q.shape[1], k.shape[1]
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        q, k, v, out, grad_out = (x.float() for x in (q, k, v, out, grad_out))
        ke, ve = _expand(k, heads), _expand(v, heads)
        s = (q @ ke.transpose(-1, -2)) * scale
        if is_causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        p = torch.exp(s - lse.float()[..., None])
        delta = (grad_out * out).sum(dim=-1, keepdim=True)
        d_o = _round(grad_out, do_format, granularity)
        dp = d_o @ ve.transpose(-1, -2)  # V is the forward's e4m3 input: exact in either GEMM width
        ds = p * (dp - delta)
        if ds_scale not in ("amax", "bound", "kernel"):
            raise ValueError(f"ds_scale must be 'amax', 'bound' or 'kernel', got {ds_scale!r}")
        p_q = p if p_format is None else (p.to(torch.bfloat16).float() if p_format == "bf16"
                                          else quant.round_to(p * P_SCALE, p_format) / P_SCALE)
        if ds_scale == "kernel":
            ds_dk = round_rows(ds, q_descale, heads_kv) if dk_rows else ds
            ds_dq = round_tiles(ds) if dq_tiles else ds
        elif ds_scale == "bound" and ds_format in quant.FORMATS:
            bound = (grad_out.norm(dim=-1).amax(dim=-1) * ve.norm(dim=-1).amax(dim=-1)
                     + delta.abs().amax(dim=(-1, -2)))
            ds_dk = ds_dq = quant.quantize(ds, ds_format, descale=bound / quant.fmt(ds_format).max).dequantize()
        else:
            ds_dk = ds_dq = _round(ds, ds_format, granularity)
        d_o_dv = d_o if dv_do_format == "same" else _round(grad_out, dv_do_format, granularity)
        dv = _group_sum(p_q.transpose(-1, -2) @ d_o_dv, heads_kv)
        k_used = ke if descale_k else ke / ke.abs().amax() * quant.fmt("e4m3").max  # K's e4m3 values, undescaled
        dq = (ds_dq @ k_used) * scale
        dk = _group_sum(ds_dk.transpose(-1, -2) @ q, heads_kv) * scale
        if wrong_dk:
            dk = dk * row_multipliers(ds, q_descale, heads_kv)[..., None]
        return dq, dk, dv
    finally:
        torch.set_float32_matmul_precision(precision)


def errors(grads, ref) -> dict:
    """{"dq": {...}, "dk": {...}, "dv": {...}}: lab.fp8.emulate.errors of each gradient against float64."""
    from .emulate import errors as one
    return {name: one(g, r) for name, g, r in zip(("dq", "dk", "dv"), grads, ref)}


# (name, do_format, p_format, ds_format[, options]): the operand formats the design note weighs
BUDGET = (
    ("float32", None, None, None),
    ("bf16 (a 16-bit backward)", "bf16", "bf16", "bf16"),
    ("S, dP in FP8 (e4m3 dO in dP only)", "e4m3", "bf16", "bf16", {"dv_do_format": "bf16"}),
    ("e4m3 P, bf16 dO / dS", "bf16", "e4m3", "bf16"),
    ("e4m3 dO, P; bf16 dS", "e4m3", "e4m3", "bf16"),
    ("e5m2 dO, e4m3 P; bf16 dS", "e5m2", "e4m3", "bf16"),
    ("e4m3 dO, P, dS", "e4m3", "e4m3", "e4m3"),
    ("e5m2 dO, dS; e4m3 P", "e5m2", "e4m3", "e5m2"),
    ("e4m3 dO, P, dS; dS scale from a bound", "e4m3", "e4m3", "e4m3", {"ds_scale": "bound"}),
    ("e5m2 dO, dS; e4m3 P; dS scale from a bound", "e5m2", "e4m3", "e5m2", {"ds_scale": "bound"}),
)


def budget(q, k, v, grad_out, is_causal: bool = False, out=None, lse=None, variants=BUDGET) -> list[dict]:
    """Each variant's gradient error (relative L2, max abs) against float64, on the given float32 inputs.
    out / lse default to float64's (the forward's own error left out); pass the FP8 forward's to include it."""
    ref_out, *ref = reference_grads(q, k, v, grad_out, is_causal)
    if out is None:
        out = ref_out.float()
    if lse is None:
        lse = _reference_lse(q, k, is_causal).float()
    rows = []
    for name, do_f, p_f, ds_f, *options in variants:
        got = backward(q, k, v, out, lse, grad_out, is_causal, do_format=do_f, p_format=p_f, ds_format=ds_f,
                       **(options[0] if options else {}))
        rows.append({"variant": name, "do": do_f, "p": p_f, "ds": ds_f, "error": errors(got, ref)})
    return rows


def _reference_lse(q, k, is_causal: bool) -> torch.Tensor:
    """float64 natural-log LSE (B, H_q, S_q) of the default-scaled scores, top-left causal."""
    s = (q.double() @ _expand(k, q.shape[1]).double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return torch.logsumexp(s, dim=-1)


def recorded_budget(B=1, H=4, S=1024, D=128, is_causal=True, seed: int = 0, device="cpu") -> list[dict]:
    """budget on seeded randn inputs quantised to e4m3 (per tensor), plus the path that runs today: the bf16
    backward given the FP8 forward's O (lab.fp8.emulate.forward: P as e4m3(P * 448), O bf16)."""
    from . import emulate
    gen = torch.Generator(device=device).manual_seed(seed)
    quantized = [quant.quantize(torch.randn(B, H, S, D, generator=gen, device=device), "e4m3") for _ in range(3)]
    grad_out = torch.randn(B, H, S, D, generator=gen, device=device)
    q, k, v = (x.dequantize() for x in quantized)
    rows = budget(q, k, v, grad_out, is_causal)
    fp8_out = emulate.forward(*quantized, is_causal)
    fp8_row = budget(q, k, v, grad_out, is_causal, out=fp8_out, variants=(("fp8 forward's O, bf16 backward",
                                                                          "bf16", "bf16", "bf16"),))
    return [dict(r, shape=[B, H, S, D], causal=is_causal, seed=seed) for r in rows + fp8_row]


# ---------------------------------------------------------------- the FP8 backward kernel's rounding (bwd v22)

def pow2_multiplier(amax: torch.Tensor) -> torch.Tensor:
    """2^(7 - floor(log2 a)), so that a times it lies in [128, 256): e4m3's top binades below its 448 (1 where a
    is 0). frexp gives floor(log2 a) exactly, where log2 rounds up just below a power of two."""
    _, exponent = torch.frexp(amax)
    return torch.where(amax > 0, torch.exp2(8.0 - exponent.to(amax.dtype)), torch.ones_like(amax))


def row_multipliers(ds: torch.Tensor, q_descale: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """dK's multiplier m_j (B, H_kv, S_k) from the largest |dS q_descale| of key j over every query of its GQA group
    (the kernel's running minimum of m_j ends there; the rounding differs only where an earlier step's values sit
    among e4m3's subnormals)."""
    B, H, Sq, Sk = ds.shape
    scaled = ds * q_descale.to(ds.dtype).expand(B, H)[..., None, None]
    return pow2_multiplier(scaled.abs().amax(dim=2).view(B, heads_kv, H // heads_kv, Sk).amax(dim=2))


def round_rows(ds: torch.Tensor, q_descale: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """dS as dK's GEMM reads it: e4m3(dS q_descale m_j) / (m_j q_descale), m_j = row_multipliers."""
    B, H = ds.shape[:2]
    qd = q_descale.to(ds.dtype).expand(B, H)[..., None, None]
    m = _expand(row_multipliers(ds, q_descale, heads_kv)[:, :, None, :], H)
    return quant.round_to(ds * qd * m, "e4m3") / m / qd


def round_tiles(ds: torch.Tensor, tile=DQ_TILE) -> torch.Tensor:
    """dS as dQ's GEMM reads it: e4m3(dS m_t) / m_t, m_t from the largest |dS| of each (b, h) tile of tile[0]
    queries x tile[1] keys."""
    B, H, Sq, Sk = ds.shape
    rq, rk = -(-Sq // tile[0]), -(-Sk // tile[1])
    padded = torch.nn.functional.pad(ds.abs(), (0, rk * tile[1] - Sk, 0, rq * tile[0] - Sq))
    amax = padded.view(B, H, rq, tile[0], rk, tile[1]).amax(dim=(3, 5))
    m = pow2_multiplier(amax).repeat_interleave(tile[0], 2).repeat_interleave(tile[1], 3)[..., :Sq, :Sk]
    return quant.round_to(ds * m, "e4m3") / m


def kernel_model(q8, k8, v8, q_descale, k_descale, v_descale, out, lse, grad_out, is_causal: bool = False,
                 scale: float | None = None, dk_rows: bool = True, dq_tiles: bool = True, wrong: bool = False):
    """(dq, dk, dv) float32 of the FP8 backward kernel's math (module notes): `backward` on the dequantised e4m3
    q8, k8, v8 (descales (B, H) or one element) with the forward's O and natural-log LSE (B, H_q, S_q): dO as bf16
    (the kernel reads it so) in Delta and per tensor e4m3 in dP and dV, P as e4m3(P * 448), dS by the kernel's
    multipliers (ds_scale "kernel"). dk_rows / dq_tiles False: dS unrounded in that GEMM (the rounding's own
    cost). wrong: the deliberately wrong build, dK without its row multiplier."""
    heads, heads_kv, B = q8.shape[1], k8.shape[1], q8.shape[0]
    q_descale, k_descale, v_descale = (d.float().expand(B, h) for d, h in ((q_descale, heads), (k_descale, heads_kv),
                                                                            (v_descale, heads_kv)))
    q, k, v = (x.float() * d[..., None, None] for x, d in ((q8, q_descale), (k8, k_descale), (v8, v_descale)))
    grad_out = grad_out.to(torch.bfloat16)
    return backward(q, k, v, out, lse, grad_out, is_causal, scale, do_format="e4m3", p_format="e4m3",
                    granularity="tensor", ds_scale="kernel", q_descale=q_descale, dk_rows=dk_rows,
                    dq_tiles=dq_tiles, wrong_dk=wrong)


YARDSTICK = "bf16 eager (the checks' bf16 yardstick)"  # kernel_budget's row the others are compared with


def kernel_budget(B=1, H=4, S=512, D=128, seed: int = 2, causal=(False, True)) -> list[dict]:
    """The FP8 backward kernel's rounding beside its yardsticks, relative L2 and max abs against float64 on the
    dequantised inputs (seeded randn Q, K, V in e4m3 per tensor, dO randn as bf16; O and LSE float64, so the FP8
    forward's own error is left out): bf16 eager (the checks' bf16 column), e4m3 and e5m2 operands with amax
    scales (`backward`), kernel_model (bwd v22's scales), and kernel_model of the deliberately wrong build."""
    gen = torch.Generator().manual_seed(seed)
    quantized = [quant.quantize(torch.randn(B, H, S, D, generator=gen), "e4m3") for _ in range(3)]
    grad_out = torch.randn(B, H, S, D, generator=gen).to(torch.bfloat16)
    q, k, v = (x.dequantize(torch.float64) for x in quantized)
    eights = [x.data for x in quantized] + [x.descale for x in quantized]
    rows = []
    for is_causal in causal:
        out, *ref = reference_grads(q, k, v, grad_out, is_causal)
        lse = _reference_lse(q, k, is_causal)
        fp8 = lambda do, ds: backward(q, k, v, out, lse, grad_out, is_causal, do_format=do,  # noqa: E731
                                      p_format="e4m3", ds_format=ds)
        runs = {YARDSTICK: lambda: eager(q, k, v, grad_out, is_causal),
                "bf16 dO, P, dS (a 16-bit backward kernel's operands)":
                    lambda: backward(q, k, v, out, lse, grad_out, is_causal, do_format="bf16", p_format="bf16",
                                     ds_format="bf16"),
                "e4m3 dO, P, dS, amax scales": lambda: fp8("e4m3", "e4m3"),
                "e5m2 dO, dS; e4m3 P, amax scales": lambda: fp8("e5m2", "e5m2"),
                "kernel model (bwd v22's scales)": lambda: kernel_model(*eights, out, lse, grad_out, is_causal),
                "kernel model, wrong build (dK without its row multiplier)":
                    lambda: kernel_model(*eights, out, lse, grad_out, is_causal, wrong=True)}
        rows += [{"variant": name, "causal": is_causal, "shape": [B, H, S, D], "seed": seed,
                  "error": errors([g.float() for g in run()], ref)} for name, run in runs.items()]
    return rows
