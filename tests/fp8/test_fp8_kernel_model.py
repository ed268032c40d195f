"""lab.fp8.emulate_bwd.kernel_model, the FP8 backward kernel's rounding on the CPU: near float64 autograd, its
per-key-row (dK) and per-tile (dQ) dS scales really applied, and the deliberately wrong model (dK without its row
multiplier) rejected by the rule the GPU checks use (lab.fp8.checks_bwd.passes)."""
from __future__ import annotations

import math

import pytest
import torch

from lab.check import reference_grads
from lab.fp8 import checks_bwd, emulate, emulate_bwd, quant


def draw(B=1, Hq=4, Hkv=2, Sq=96, Sk=96, D=128, granularity="tensor", seed=0, causal=False):
    """e4m3 q, k, v (Quantized), the float64 forward's bf16 O and natural-log LSE on them, a bf16 dO."""
    gen = torch.Generator().manual_seed(seed)
    quantized = [quant.quantize(torch.randn(B, H, S, D, generator=gen), "e4m3", granularity)
                 for H, S in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk))]
    grad_out = torch.randn(B, Hq, Sq, D, generator=gen).to(torch.bfloat16)
    q, k, v = (x.dequantize(torch.float64) for x in quantized)
    s = (q @ emulate._expand(k, Hq).transpose(-1, -2)) / math.sqrt(D)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    out, *ref = reference_grads(q, k, v, grad_out, causal)
    return quantized, out.to(torch.bfloat16), torch.logsumexp(s, dim=-1).float(), grad_out, ref


def model(quantized, out, lse, grad_out, causal, **options):
    return emulate_bwd.kernel_model(*(x.data for x in quantized), *(x.descale for x in quantized), out, lse,
                                    grad_out, causal, **options)


@pytest.mark.parametrize("Hq, Hkv, Sq, Sk, causal, granularity", [
    (4, 4, 96, 96, False, "tensor"), (4, 4, 130, 130, True, "head"), (8, 2, 70, 70, True, "tensor"),
    (4, 1, 65, 300, False, "head"), (4, 4, 300, 65, True, "tensor"), (2, 2, 1, 1, False, "tensor")])
def test_the_kernel_model_is_near_float64(Hq, Hkv, Sq, Sk, causal, granularity):
    quantized, out, lse, grad_out, ref = draw(Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, granularity=granularity, causal=causal)
    errors = emulate_bwd.errors(model(quantized, out, lse, grad_out, causal), ref)
    for name, e in errors.items():
        limit = 1e-3 if Sk == 1 and name != "dv" else 6e-2  # S_k 1: dS = 0 exactly, dQ = dK = 0
        assert e["nan"] == 0 and (e["rel_l2"] < limit or float(ref[("dq", "dk", "dv").index(name)].abs().max()) == 0), \
            (name, e)


def test_the_multiplier_lands_the_amax_in_the_top_binades():
    a = torch.tensor([1.0, 2.0 ** -20, 3.0, 255.9, 256.0, 1 - 2.0 ** -52, 7e-3, 448.0], dtype=torch.float64)
    scaled = a * emulate_bwd.pow2_multiplier(a)
    assert bool(((scaled >= 128) & (scaled < 256)).all()), scaled
    assert float(emulate_bwd.pow2_multiplier(torch.zeros(1))[0]) == 1.0
    assert bool((torch.log2(emulate_bwd.pow2_multiplier(a)) % 1 == 0).all())  # powers of two: rescales are exact


def _rows_of_magnitudes(Sk=8, Sq=64):
    """dS (1, 1, Sq, Sk) whose key rows shrink by 2^-3 each: a per-tensor scale leaves the small ones among e4m3's
    subnormals or below, a per-row one does not."""
    gen = torch.Generator().manual_seed(4)
    ds = torch.randn(1, 1, Sq, Sk, generator=gen, dtype=torch.float64)
    return ds * torch.exp2(-3.0 * torch.arange(Sk, dtype=torch.float64))


def test_dk_rounding_is_per_key_row():
    ds = _rows_of_magnitudes()
    q_descale = torch.full((1, 1), 0.37)
    got = emulate_bwd.round_rows(ds, q_descale, 1)
    rel = ((got - ds).norm(dim=2) / ds.norm(dim=2)).flatten()
    assert float(rel.max()) < 2.0 ** -4, rel  # every row keeps e4m3's relative precision
    per_tensor = quant.quantize(ds * 0.37, "e4m3").dequantize(torch.float64) / 0.37
    assert float(((per_tensor - ds).norm(dim=2) / ds.norm(dim=2)).max()) > 0.5  # the smallest rows are lost
    scaled = ds * 0.37 * emulate_bwd.pow2_multiplier((ds * 0.37).abs().amax(dim=2))[:, :, None, :]
    assert torch.equal(quant.round_to(scaled, "e4m3"), quant.round_to(quant.round_to(scaled, "e4m3"), "e4m3"))


def test_dk_rows_share_a_multiplier_across_a_gqa_group():
    ds = _rows_of_magnitudes().expand(1, 2, 64, 8).clone()
    ds[:, 1] *= 2.0 ** -12  # the group's second head is small: the row's multiplier is the first head's
    got = emulate_bwd.round_rows(ds, torch.ones(1, 2), 1)
    apart = torch.cat([emulate_bwd.round_rows(ds[:, h:h + 1], torch.ones(1, 1), 1) for h in range(2)], dim=1)
    assert torch.equal(got[:, 0], apart[:, 0]) and not torch.equal(got[:, 1], apart[:, 1])


def test_dq_rounding_is_per_tile():
    rows, cols = emulate_bwd.DQ_TILE
    gen = torch.Generator().manual_seed(5)
    ds = torch.randn(1, 1, 2 * rows + 2, 2 * cols, generator=gen, dtype=torch.float64)  # a partial last query block
    tiles = [(q0, k0) for q0 in (0, rows, 2 * rows) for k0 in (0, cols)]
    for i, (q0, k0) in enumerate(tiles):  # each tile 2^-4 of the one before: six sizes from 1 to 2^-20
        ds[..., q0:q0 + rows, k0:k0 + cols] *= 2.0 ** (-4 * i)
    got = emulate_bwd.round_tiles(ds)
    per_tensor = quant.quantize(ds, "e4m3").dequantize(torch.float64)
    for q0, k0 in tiles:
        tile = (..., slice(q0, q0 + rows), slice(k0, k0 + cols))
        assert float((got[tile] - ds[tile]).norm() / ds[tile].norm()) < 2.0 ** -4, (q0, k0)
    last = (..., slice(2 * rows, 2 * rows + 2), slice(cols, 2 * cols))
    assert float((per_tensor[last] - ds[last]).norm() / ds[last].norm()) > 0.5  # one scale loses the smallest tile


def test_each_rounding_is_applied_to_its_own_gradient():
    quantized, out, lse, grad_out, ref = draw(Sq=200, Sk=200, causal=True)
    full = model(quantized, out, lse, grad_out, True)
    no_rows = model(quantized, out, lse, grad_out, True, dk_rows=False)
    no_tiles = model(quantized, out, lse, grad_out, True, dq_tiles=False)
    same = [[torch.equal(a, b) for a, b in zip(full, other)] for other in (no_rows, no_tiles)]
    assert same == [[True, False, True], [False, True, True]]  # (dq, dk, dv): rows touch dK alone, tiles dQ alone
    error = emulate_bwd.errors(full, ref)
    assert error["dk"]["rel_l2"] > 1.2 * emulate_bwd.errors(no_rows, ref)["dk"]["rel_l2"]  # dS's e4m3 costs dK
    assert error["dq"]["rel_l2"] > 1.2 * emulate_bwd.errors(no_tiles, ref)["dq"]["rel_l2"]  # and dQ error


@pytest.mark.parametrize("causal", [False, True])
def test_the_rule_rejects_dk_without_its_row_multiplier(causal):
    quantized, out, lse, grad_out, ref = draw(Hq=4, Hkv=2, Sq=150, Sk=150, causal=causal)
    right = emulate_bwd.errors([g.to(torch.bfloat16).float() for g in model(quantized, out, lse, grad_out, causal)],
                               ref)
    wrong = emulate_bwd.errors(model(quantized, out, lse, grad_out, causal, wrong=True), ref)
    ref_max = max(float(r.abs().max()) for r in ref)
    assert all(checks_bwd.passes(right[g], right[g], ref_max) for g in right)
    assert not checks_bwd.passes(wrong["dk"], right["dk"], ref_max)
    assert checks_bwd.passes(wrong["dq"], right["dq"], ref_max) and checks_bwd.passes(wrong["dv"], right["dv"], ref_max)
