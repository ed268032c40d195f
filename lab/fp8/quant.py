"""FP8 formats as data, and quantisation with amax scales per tensor or per head.

The convention is FlashAttention-3's descale: a tensor x of shape (B, H, S, D) is stored as x_fp8 (B, H, S, D)
and a float32 descale (B, H), with

    x ~= x_fp8 * descale[b, h],     descale = amax / format max     (amax over the tensor, or over each head)

so the largest magnitude lands on the format's largest finite value and nothing saturates. FA3 takes these as
`q_descale`, `k_descale`, `v_descale` of shape (B, H_kv); a per-tensor scale is the same number in every entry
(cuDNN's `sdpa_fp8` takes that one number as a 1x1x1x1 tensor).

Every number about a format comes from torch.finfo of its dtype (`torch.float8_e4m3fn`, `torch.float8_e5m2`,
present in the CPU build too); nothing is typed in. Conversion saturates: torch's cast already clamps e4m3 at
+-448 but sends e5m2 past 57344 to inf, so `round_to` clamps first and both formats saturate alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GRANULARITIES = ("tensor", "head")


@dataclass(frozen=True)
class Format:
    """A floating-point format's range and spacing, read from torch.finfo."""

    name: str
    dtype: torch.dtype

    @property
    def finfo(self):
        return torch.finfo(self.dtype)

    @property
    def bits(self) -> int:
        return self.finfo.bits

    @property
    def mantissa_bits(self) -> int:
        return round(-math.log2(self.finfo.eps))

    @property
    def exponent_bits(self) -> int:
        return self.bits - 1 - self.mantissa_bits

    @property
    def max(self) -> float:
        return float(self.finfo.max)

    @property
    def min_normal(self) -> float:
        return float(self.finfo.smallest_normal)

    @property
    def min_subnormal(self) -> float:
        return self.min_normal * float(self.finfo.eps)

    @property
    def relative_step(self) -> float:
        """Spacing over magnitude within the normal range: between 2^-m (at 2^e) and 2^-(m+1) (just below 2^(e+1))."""
        return float(self.finfo.eps)

    @property
    def binades(self) -> int:
        """Powers of two covered at full relative precision (the normal range)."""
        return math.floor(math.log2(self.max / self.min_normal)) + 1

    def spacing(self, x: torch.Tensor) -> torch.Tensor:
        """The gap between neighbouring representable values at |x| (the subnormal gap below min_normal)."""
        mag = x.abs().double().clamp(min=self.min_normal)
        return torch.exp2(torch.floor(torch.log2(mag))) * self.relative_step

    def as_row(self) -> list:
        power = lambda v: f"2^{round(math.log2(v))}"  # noqa: E731 (every one of them is a power of two)
        return [self.name, f"1 / {self.exponent_bits} / {self.mantissa_bits}", f"{self.max:g}", power(self.min_normal),
                power(self.min_subnormal), power(self.relative_step), self.binades]


FORMATS = {"e4m3": Format("e4m3", torch.float8_e4m3fn), "e5m2": Format("e5m2", torch.float8_e5m2)}
WIDER = {"bf16": Format("bf16", torch.bfloat16), "fp16": Format("fp16", torch.float16)}  # for comparison only


def fmt(name) -> Format:
    if isinstance(name, Format):
        return name
    try:
        return {**FORMATS, **WIDER}[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}: one of {sorted({**FORMATS, **WIDER})}") from None


def round_to(x: torch.Tensor, name="e4m3") -> torch.Tensor:
    """x rounded to the format (nearest, saturating at +-max), returned in x's dtype; NaN stays NaN."""
    f = fmt(name)
    return x.clamp(-f.max, f.max).to(f.dtype).to(x.dtype)


def amax_descale(x: torch.Tensor, name="e4m3", granularity: str = "tensor") -> torch.Tensor:
    """float32 descale of shape (B, H) from x's amax: over the whole tensor, or over each (b, h)'s S x D.

    An all-zero tensor (or head) gets descale 1, so quantising it divides by 1, not 0."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if x.ndim != 4:
        raise ValueError(f"expected (B, H, S, D), got shape {tuple(x.shape)}")
    mag = x.detach().abs().float()
    amax = mag.amax(dim=(2, 3)) if granularity == "head" else mag.amax().expand(x.shape[:2])
    descale = amax / fmt(name).max
    return torch.where(descale > 0, descale, torch.ones_like(descale)).contiguous()


@dataclass
class Quantized:
    """x ~= data * descale[..., None, None]: data in an FP8 dtype (B, H, S, D), descale float32 (B, H)."""

    data: torch.Tensor
    descale: torch.Tensor
    format: str
    granularity: str

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return self.data.to(dtype) * self.descale.to(dtype)[..., None, None]

    @property
    def per_tensor(self) -> bool:
        return bool((self.descale == self.descale.flatten()[0]).all())

    def scalar_descale(self) -> float:
        """The one descale of a per-tensor quantisation (what cuDNN's sdpa_fp8 takes)."""
        if not self.per_tensor:
            raise ValueError("this tensor has one descale per head; cuDNN's sdpa_fp8 takes one per tensor")
        return float(self.descale.flatten()[0])


def quantize(x: torch.Tensor, name="e4m3", granularity: str = "tensor", descale=None) -> Quantized:
    """x -> Quantized, with the amax descale (or the given one, (B, H) or a scalar); saturating."""
    f = fmt(name)
    if f.name not in FORMATS:
        raise ValueError(f"quantize makes FP8 tensors: {sorted(FORMATS)}, not {f.name}")
    if descale is None:
        descale = amax_descale(x, f, granularity)
    descale = torch.as_tensor(descale, dtype=torch.float32, device=x.device).expand(x.shape[:2]).contiguous()
    scaled = x.float() / descale[..., None, None]
    return Quantized(scaled.clamp(-f.max, f.max).to(f.dtype), descale, f.name, granularity)


def relative_error_curve(name, lowest_exp: int = -20, highest_exp: int = 20, per_binade: int = 256, bins: int = 1):
    """(magnitudes, worst |round(x) - x| / x) over 2^lowest_exp..2^highest_exp, unscaled: where the format keeps
    precision: the worst error in each of `bins` bins per power of two (within one it is a sawtooth).

    At most relative_step / 2 through the normal range, rising through the subnormals to 1 where values round
    to zero, and rising past max where they saturate."""
    x = torch.exp2(torch.linspace(lowest_exp, highest_exp, (highest_exp - lowest_exp) * per_binade + 1,
                                  dtype=torch.float64))[:-1]
    rel = (round_to(x.float(), name).double() - x).abs() / x
    step = per_binade // bins
    return x.reshape(-1, step)[:, 0], rel.reshape(-1, step).amax(dim=1)
