"""An FP8 attention forward, emulated in float32 torch (CPU or GPU), and the error budget it gives.

What an FP8 forward kernel (FlashAttention-3's, cuDNN's) computes, tile by tile over the keys:

    S    = (Q8 K8^T) * (scale * dq * dk)                 Q8, K8 the e4m3 tensors, dq, dk their descales
    m    = running row max,  P = exp(S - m),  l = running sum of P (float32, before any rounding)
    P8   = e4m3(P * p_scale)                              P in [0, 1] quantised with its own scale (cuDNN: 448)
    acc  = acc * exp(m_old - m) + P8 V8                   float32 accumulator
    O    = acc / l * dv / p_scale                         then bf16 (FA3), or e4m3(O * scale_o) (cuDNN on Hopper)

`emulate.forward(..., descale=False)` forgets the descales (a deliberately wrong kernel: it must fail).

s_accumulator="fp22" models Hopper's FP8 tensor cores: wgmma e4m3 keeps its accumulator to 13 mantissa bits
(an "FP22": SageAttention2 and DeepSeek-V3's reports, about 14 bits), so S = Q8 K8^T is summed 32 columns of D
(one k32 instruction) at a time, the running sum rounded to 13 mantissa bits after each (toward zero with
"fp22", to nearest with "fp22-rn"); "fp22-align" cuts each product and the running sum to the 13 bits below the largest of them
(an adder tree that aligns to the largest exponent). Invisible beside P's e4m3 rounding for ordinary inputs;
with outlier channels S's large terms cancel and this rounding decides how much of the small ones survives
(lab.fp8.checks measures which model the kernel follows).

The error budget separates where precision goes: the error against float64 attention on the ORIGINAL inputs is
the inputs' quantisation plus the kernel's arithmetic; against float64 on the DEQUANTISED inputs (x_fp8 *
descale) it is the arithmetic alone (P's and O's rounding). Outliers (a few channels of a few heads scaled up)
show what a per-tensor amax scale costs the heads without them, against a per-head scale.
"""
from __future__ import annotations

import math

import torch

from .. import record
from . import quant

P_SCALE = 448.0  # cuDNN's scale_s for E4M3 without dropout: P <= 1 lands on e4m3's max
MULTIPLIER = 2.0  # the accuracy rule: an FP8 forward's error at most this times the yardstick's


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat KV heads (dim 1) so query head h reads KV head h // group (GQA)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _rows(seqlen: int, rows, device) -> torch.Tensor:
    return torch.arange(seqlen, device=device) if rows is None else torch.as_tensor(rows, device=device).long()


def reference(q, k, v, is_causal: bool = False, scale: float | None = None, rows=None) -> torch.Tensor:
    """softmax(scale Q K^T) V in float64 for the query rows `rows` (all when None): (B, Hq, len(rows), D_v).

    Top-left causal (query i sees key j <= i); GQA by head groups; one batch element at a time."""
    B, Hq, Sq, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    idx = _rows(Sq, rows, q.device)
    out = torch.empty(B, Hq, len(idx), v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(B):
        s = (q[b][:, idx].double() @ _expand(k[b:b + 1], Hq)[0].double().transpose(-1, -2)) * scale
        if is_causal:
            s = s.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > idx[:, None], float("-inf"))
        out[b] = torch.softmax(s, dim=-1) @ _expand(v[b:b + 1], Hq)[0].double()
    return out


def forward(q: quant.Quantized, k: quant.Quantized, v: quant.Quantized, is_causal: bool = False,
            scale: float | None = None, rows=None, block_n: int = 128, p_format: str | None = "e4m3",
            p_scale: float = P_SCALE, out_format: str = "bf16", out_descale: float | None = None,
            descale: bool = True, s_accumulator: str = "fp32") -> torch.Tensor:
    """The FP8 forward above for query rows `rows` (all when None); float32 on q's device.

    p_format: the format P is rounded to before P V ("e4m3"; "bf16" as a 16-bit kernel does; None keeps
    float32), after multiplying by p_scale (undone in the epilogue). out_format "bf16" rounds O to bf16; "e4m3"
    stores it as e4m3 with scale_o = 1 / out_descale (default V's descale: |O| <= amax(V) then fits) and returns
    it dequantised; "fp32" leaves it. descale=False is the wrong kernel that multiplies the FP8 values as if they
    were the inputs.
    float32 matmuls run at full precision (no TF32 on a GPU) whatever the process set."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return _forward(q, k, v, is_causal, scale, rows, block_n, p_format, p_scale, out_format, out_descale, descale,
                        s_accumulator)
    finally:
        torch.set_float32_matmul_precision(precision)


S_ACCUMULATORS = ("fp32", "fp22", "fp22-rn", "fp22-align")


def round_mantissa(x: torch.Tensor, bits: int, nearest: bool = False) -> torch.Tensor:
    """float32 x with its mantissa cut to `bits` bits: toward zero, or to nearest (ties away from zero)."""
    drop = 23 - bits
    i = x.contiguous().view(torch.int32)
    if nearest:
        i = i + (1 << (drop - 1))  # a carry into the exponent is the correct rounding up
    return (i & ~((1 << drop) - 1)).view(torch.float32)


def _scores(q8, k8, s_accumulator: str) -> torch.Tensor:
    """Q8 K8^T in float32 (exact for e4m3 products), or summed as an FP22 accumulator (module notes)."""
    if s_accumulator == "fp32":
        return q8 @ k8.transpose(-1, -2)
    if s_accumulator not in S_ACCUMULATORS:
        raise ValueError(f"s_accumulator must be one of {S_ACCUMULATORS}, got {s_accumulator!r}")
    acc = None
    for c in range(0, q8.shape[-1], 32):
        if s_accumulator == "fp22-align":
            terms = q8[..., :, None, c:c + 32] * k8[..., None, :, c:c + 32]  # exact: e4m3 x e4m3 fits float32
            if acc is not None:
                terms = torch.cat([terms, acc[..., None]], dim=-1)
            top = terms.abs().amax(dim=-1, keepdim=True)
            ulp = torch.exp2(torch.floor(torch.log2(top.clamp(min=2.0**-100))) - 13)
            acc = (torch.trunc(terms / ulp) * ulp).sum(dim=-1)
            continue
        part = q8[..., c:c + 32] @ k8[..., c:c + 32].transpose(-1, -2)
        acc = round_mantissa(part if acc is None else acc + part, 13, s_accumulator == "fp22-rn")
    return acc


def _forward(q, k, v, is_causal, scale, rows, block_n, p_format, p_scale, out_format, out_descale, descale,
             s_accumulator="fp32"):
    B, Hq, Sq, D = q.data.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    one = lambda t: t if descale else torch.ones_like(t)  # noqa: E731
    dq, dk, dv = (one(x.descale.float())[..., None, None] for x in (q, k, v))
    dk, dv = _expand(dk, Hq), _expand(dv, Hq)
    idx = _rows(Sq, rows, q.data.device)
    q8 = q.data[:, :, idx].float()
    k8, v8 = _expand(k.data.float(), Hq), _expand(v.data.float(), Hq)  # exact: every FP8 value is a float32
    m = torch.full((B, Hq, len(idx), 1), float("-inf"), device=q8.device)
    l = torch.zeros_like(m)
    acc = torch.zeros(B, Hq, len(idx), v8.shape[-1], device=q8.device)
    for j0 in range(0, k8.shape[2], block_n):
        j1 = min(j0 + block_n, k8.shape[2])
        s = _scores(q8, k8[:, :, j0:j1], s_accumulator) * (scale * dq * dk)
        if is_causal:
            s = s.masked_fill(torch.arange(j0, j1, device=s.device)[None, :] > idx[:, None], float("-inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a row with no key yet
        p = torch.exp(s - m_safe)
        alpha = torch.exp(m - m_safe)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        p_rounded = p * p_scale if p_format is None else quant.round_to(p * p_scale, p_format)
        acc = acc * alpha + p_rounded @ v8[:, :, j0:j1]
        m = m_new
    out = acc / l * dv / p_scale
    if out_format == "bf16":
        return out.to(torch.bfloat16).float()
    if out_format == "e4m3":
        d_o = float(v.descale.float().max()) if out_descale is None else out_descale
        return quant.round_to(out / d_o, "e4m3") * d_o
    if out_format == "fp32":
        return out
    raise ValueError(f"out_format must be 'bf16', 'e4m3' or 'fp32', got {out_format!r}")


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """max abs and relative L2 of out against the float64 ref, and its NaN / inf count."""
    diff = out.double() - ref
    finite = torch.isfinite(diff)
    ref_norm = float(ref.norm()) or 1.0
    return {"max_abs": float(diff[finite].abs().max()) if finite.any() else float("nan"),
            "rel_l2": float(diff[finite].norm()) / ref_norm if finite.any() else float("nan"),
            "nan": int(out.isnan().sum()), "inf": int(out.isinf().sum())}


def passes(error: dict, yardstick: dict, multiplier: float = MULTIPLIER) -> bool:
    """The accuracy rule: relative L2 and max abs at most multiplier x the yardstick's, and no NaN or inf."""
    return (error["nan"] == 0 and error["inf"] == 0 and error["rel_l2"] <= multiplier * yardstick["rel_l2"]
            and error["max_abs"] <= multiplier * yardstick["max_abs"])


def with_outliers(x: torch.Tensor, magnitude: float, channels=(3, 17, 42, 99), heads=(0,)) -> torch.Tensor:
    """x with the given channels (head-dim columns, taken mod D) of the given heads multiplied by magnitude:
    what activation outliers look like in Q and K, a few channels large across every token."""
    y = x.clone()
    cols = sorted({c % x.shape[-1] for c in channels})
    for h in heads:
        y[:, h, :, cols] *= magnitude
    return y


# (name, input format, granularity, P's format, P's scale, O's format): the variants of the error table
VARIANTS = (
    ("bf16 (a 16-bit kernel)", "bf16", "tensor", "bf16", 1.0, "bf16"),
    ("e4m3 per tensor, P x 448, O bf16", "e4m3", "tensor", "e4m3", P_SCALE, "bf16"),
    ("e4m3 per head, P x 448, O bf16", "e4m3", "head", "e4m3", P_SCALE, "bf16"),
    ("e4m3 per tensor, P unscaled, O bf16", "e4m3", "tensor", "e4m3", 1.0, "bf16"),
    ("e4m3 per tensor, P x 448, O e4m3", "e4m3", "tensor", "e4m3", P_SCALE, "e4m3"),
    ("e5m2 per tensor, P x 448, O bf16", "e5m2", "tensor", "e4m3", P_SCALE, "bf16"),
)


def _inputs(x: torch.Tensor, fmt_name: str, granularity: str) -> quant.Quantized:
    if fmt_name in quant.FORMATS:
        return quant.quantize(x, fmt_name, granularity)
    ones = torch.ones(x.shape[:2], dtype=torch.float32, device=x.device)
    return quant.Quantized(x.to(quant.fmt(fmt_name).dtype), ones, fmt_name, granularity)  # bf16: descale 1


def error_budget(q, k, v, is_causal: bool = False, variants=VARIANTS, block_n: int = 128,
                 outlier_heads=()) -> list[dict]:
    """For each variant: its error against float64 on the original inputs (`total`), on its own dequantised
    inputs (`kernel`), and `total` over the heads outside `outlier_heads` only (`clean`: what a shared scale
    costs the heads without outliers); and the inputs' own quantisation error (`inputs_rel_l2` over Q, K, V)."""
    original = reference(q, k, v, is_causal)
    clean = [h for h in range(q.shape[1]) if h not in set(outlier_heads)]
    rows = []
    for name, fmt_name, granularity, p_format, p_scale, out_format in variants:
        qq, kq, vq = (_inputs(x, fmt_name, granularity) for x in (q, k, v))
        deq = [x.dequantize(torch.float64) for x in (qq, kq, vq)]
        out = forward(qq, kq, vq, is_causal, block_n=block_n, p_format=p_format, p_scale=p_scale, out_format=out_format)
        inputs = math.sqrt(sum(float((d - x.double()).norm()) ** 2 for d, x in zip(deq, (q, k, v)))
                           / sum(float(x.double().norm()) ** 2 for x in (q, k, v)))
        rows.append({"variant": name, "format": fmt_name, "granularity": granularity, "p_format": p_format,
                     "p_scale": p_scale, "out_format": out_format, "inputs_rel_l2": inputs,
                     "total": errors(out, original), "kernel": errors(out, reference(*deq, is_causal)),
                     "clean": errors(out[:, clean], original[:, clean])})
    return rows


def outlier_sweep(q, k, v, magnitudes, is_causal: bool = False, heads=(0,), block_n: int = 128) -> list[dict]:
    """Per outlier magnitude (in Q and K, `with_outliers`): the e4m3 error of the heads without outliers,
    per-tensor scale against per-head, P x 448, O bf16."""
    pair = [row for row in VARIANTS if row[0].startswith("e4m3 per") and row[3:] == ("e4m3", P_SCALE, "bf16")]
    out = []
    for magnitude in magnitudes:
        qo, ko = with_outliers(q, magnitude, heads=heads), with_outliers(k, magnitude, heads=heads)
        for row in error_budget(qo, ko, v, is_causal, pair, block_n, outlier_heads=heads):
            out.append({"magnitude": magnitude, **row})
    return out


def draw(shape, seed: int, device="cpu") -> list[torch.Tensor]:
    """Q, K, V: float64 randn of shape (B, H, S, D), seeded."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(shape, generator=gen, dtype=torch.float64, device=device) for _ in range(3)]


def recorded_budget(shape, magnitude: float, is_causal: bool = False, seed: int = 0, heads=(0,)) -> list[dict]:
    """error_budget of fresh inputs without outliers, then with Q and K outliers of `magnitude` in `heads`;
    every row appended to the run's records (kind "fp8", impl "lab.fp8.emulate") and returned."""
    q, k, v = draw(shape, seed)
    rows = [{"outliers": 1, **r} for r in error_budget(q, k, v, is_causal, outlier_heads=heads)]
    q, k = with_outliers(q, magnitude, heads=heads), with_outliers(k, magnitude, heads=heads)
    rows += [{"outliers": magnitude, **r} for r in error_budget(q, k, v, is_causal, outlier_heads=heads)]
    return [record.append({"kind": "fp8", "impl": "lab.fp8.emulate", "shape": list(shape), "causal": is_causal,
                           "seed": seed, **r}) for r in rows]
