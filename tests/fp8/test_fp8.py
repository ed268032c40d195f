"""lab.fp8 on the CPU: the formats, quantisation round trips and saturation, the emulation's error ordering and
accuracy rule (a wrong emulation must fail), and the cuDNN peer's ImportError when `cudnn` is missing."""
from __future__ import annotations

import sys

import pytest
import torch

from lab.fp8 import emulate, peer, quant, race, report


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------ formats and quantisation

def test_formats_are_read_from_torch():
    e4m3, e5m2 = quant.FORMATS["e4m3"], quant.FORMATS["e5m2"]
    assert (e4m3.exponent_bits, e4m3.mantissa_bits, e4m3.max) == (4, 3, 448.0)
    assert (e4m3.min_normal, e4m3.min_subnormal) == (2.0**-6, 2.0**-9)
    assert (e5m2.exponent_bits, e5m2.mantissa_bits, e5m2.max) == (5, 2, 57344.0)
    assert (e5m2.min_normal, e5m2.min_subnormal) == (2.0**-14, 2.0**-16)
    assert e4m3.binades < e5m2.binades and e4m3.relative_step < e5m2.relative_step
    spacing = e4m3.spacing(torch.tensor([1.0, 1.9, 2.0, 448.0, 1e-4]))
    assert spacing.tolist() == [0.125, 0.125, 0.25, 32.0, 2.0**-9]
    assert len(report.formats_table().rows) == 3


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_every_finite_value_round_trips_exactly(name):
    f = quant.FORMATS[name]
    values = torch.arange(256, dtype=torch.uint8).view(f.dtype).float()
    values = values[torch.isfinite(values)].reshape(1, 1, 1, -1)
    q = quant.quantize(values, name, descale=1.0)
    assert torch.equal(q.dequantize(), values)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("granularity", ["tensor", "head"])
def test_round_trip_error_is_at_most_half_a_step(name, granularity):
    x = randn(2, 3, 65, 64) * torch.tensor([1.0, 30.0, 0.01], dtype=torch.float64)[None, :, None, None]
    q = quant.quantize(x, name, granularity)
    assert q.data.dtype == quant.FORMATS[name].dtype and q.descale.shape == (2, 3)
    scaled = x / q.descale.double()[..., None, None]
    bound = 0.5 * quant.FORMATS[name].spacing(scaled) * q.descale.double()[..., None, None]
    assert ((q.dequantize(torch.float64) - x).abs() <= bound * (1 + 1e-6)).all()
    assert q.per_tensor == (granularity == "tensor")
    amax = x.abs().amax(dim=(2, 3)) if granularity == "head" else x.abs().amax().expand(2, 3)
    assert torch.allclose(q.descale.double() * quant.FORMATS[name].max, amax.double(), rtol=1e-6)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_conversion_saturates_and_keeps_nan(name):
    f = quant.FORMATS[name]
    x = torch.tensor([2 * f.max, -1e30, f.max, float("nan"), 0.0]).reshape(1, 1, 1, -1)
    q = quant.quantize(x, name, descale=1.0).dequantize()[0, 0, 0]
    assert q[:3].tolist() == [f.max, -f.max, f.max] and q[3].isnan() and q[4] == 0
    assert quant.round_to(torch.tensor([1e9]), name).item() == f.max


def test_zero_tensor_and_per_tensor_descale():
    q = quant.quantize(torch.zeros(1, 2, 4, 8), "e4m3", "head")
    assert torch.equal(q.descale, torch.ones(1, 2)) and not q.dequantize().isnan().any()
    with pytest.raises(ValueError, match="one per tensor"):
        quant.quantize(randn(1, 2, 4, 8) * torch.tensor([1.0, 9.0]).double()[None, :, None, None], "e4m3",
                       "head").scalar_descale()
    with pytest.raises(ValueError, match="granularity"):
        quant.quantize(randn(1, 1, 2, 2), "e4m3", "channel")


def test_relative_error_curve_shape():
    x, rel = quant.relative_error_curve("e4m3")
    f = quant.FORMATS["e4m3"]
    normal = (x >= f.min_normal) & (2 * x <= f.max)  # whole powers of two inside the normal range
    assert rel[normal].max() <= f.relative_step / 2 + 1e-6  # round to nearest: half a step at most
    assert rel[x < f.min_subnormal / 4].min() == 1.0  # rounds to zero
    assert rel[x > 4 * f.max].min() > 0.5  # saturated


# ------------------------------------------------------------------ the emulation

def _exact(x):  # float32 "quantised" tensors with descale 1: the emulation's arithmetic alone
    return quant.Quantized(x.float(), torch.ones(x.shape[:2]), "fp32", "tensor")


@pytest.mark.parametrize("causal", [False, True])
def test_tiled_forward_matches_the_reference_without_rounding(causal):
    q, k, v = randn(2, 4, 65, 32, seed=1), randn(2, 2, 130, 32, seed=2), randn(2, 2, 130, 32, seed=3)
    rows = [0, 1, 33, 64]
    got = emulate.forward(_exact(q), _exact(k), _exact(v), causal, rows=rows, block_n=16, p_format=None,
                          out_format="fp32")
    assert float((got - emulate.reference(q, k, v, causal, rows=rows)).abs().max()) < 1e-5
    full = emulate.reference(q, k, v, causal)
    assert torch.equal(full[:, :, rows], emulate.reference(q, k, v, causal, rows=rows))


@pytest.fixture(scope="module")
def budget():
    q, k, v = emulate.draw((1, 2, 128, 64), seed=0)
    return {r["variant"]: r for r in emulate.error_budget(q, k, v, True, block_n=32)}


def test_fp8_error_exceeds_bf16_error_which_exceeds_zero(budget):
    bf16 = budget["bf16 (a 16-bit kernel)"]
    for name, row in budget.items():
        if row["format"] == "bf16":
            continue
        for part in ("total", "kernel"):
            assert row[part]["rel_l2"] > 2 * bf16[part]["rel_l2"] > 0, (name, part)
        assert row["total"]["rel_l2"] > row["kernel"]["rel_l2"]  # the inputs' quantisation adds
    e4m3 = budget["e4m3 per tensor, P x 448, O bf16"]
    assert budget["e5m2 per tensor, P x 448, O bf16"]["inputs_rel_l2"] > e4m3["inputs_rel_l2"]
    assert budget["e4m3 per tensor, P x 448, O e4m3"]["kernel"]["rel_l2"] > e4m3["kernel"]["rel_l2"]


def test_outliers_cost_more_under_a_per_tensor_scale_than_per_head():
    q, k, v = emulate.draw((1, 3, 128, 64), seed=4)
    rows = emulate.outlier_sweep(q, k, v, [1, 1e5], block_n=64)
    clean = {(r["magnitude"], r["granularity"]): r["clean"]["rel_l2"] for r in rows}
    assert clean[(1e5, "tensor")] > 2 * clean[(1e5, "head")]
    assert abs(clean[(1, "tensor")] / clean[(1, "head")] - 1) < 0.1  # no outliers: the same scale, near enough
    assert abs(clean[(1e5, "head")] / clean[(1, "head")] - 1) < 0.1  # per head: the clean heads never notice
    assert report.sweep_table(rows).rows[-1][3] > 2


def test_a_wrong_emulation_without_descale_fails_the_accuracy_rule():
    q, k, v = emulate.draw((1, 2, 96, 64), seed=5)
    qq, kq, vq = (quant.quantize(x, "e4m3") for x in (q, k, v))
    ref = emulate.reference(*(x.dequantize(torch.float64) for x in (qq, kq, vq)))
    yardstick = emulate.errors(emulate.forward(qq, kq, vq, block_n=64), ref)
    other_tiles = emulate.errors(emulate.forward(qq, kq, vq, block_n=32), ref)
    wrong = emulate.errors(emulate.forward(qq, kq, vq, block_n=64, descale=False), ref)
    assert emulate.passes(other_tiles, yardstick)
    assert not emulate.passes(wrong, yardstick)
    nan = dict(yardstick, nan=1)
    assert not emulate.passes(nan, yardstick)


def test_accuracy_block_of_a_race_row_on_the_cpu():
    """race.accuracy with the emulation standing in for cuDNN: fold 1, and every field present."""
    q, k, v = (x.to(torch.bfloat16) for x in emulate.draw((1, 2, 80, 64), seed=6))
    quantized = [quant.quantize(x, "e4m3") for x in (q, k, v)]
    d_o = quantized[2].scalar_descale()
    out = emulate.forward(*quantized, True, out_format="e4m3", out_descale=d_o)
    rows = race.checked_rows(80, 16)
    assert rows[0] == 0 and rows[-1] == 79 and len(rows) == 16
    block = race.accuracy(q, k, v, quantized, out, None, True, rows, d_o)
    assert block["emulation_fold"] == pytest.approx(1.0) and block["rows_checked"] == 16
    assert 0 < block["rel_l2"] < block["vs_bf16_inputs"]["rel_l2"] < 0.2
    case = {"name": "fp8-x", "B": 1, "Hq": 2, "Hkv": 2, "Sq": 80, "D": 64, "causal": True}
    fake = [{"impl": "cudnn-fp8", "case": case,
             "accuracy": block, "tflops": 900.0, "timing": {"median_ms": 1.0, "iqr_ms": 0.01},
             "ratios": {"sdpa-cudnn": 1.5}},
            {"impl": "sdpa-cudnn", "case": {"name": "fp8-x"}, "tflops": 600.0}]
    text = "\n".join(report.findings([], [], fake))
    assert "900-900 TFLOP/s over 1 cells" in text and "1.50-1.50x" in text and "fold 1.00-1.00" in text
    assert report.accuracy_table(fake).rows[0][2] == block["rel_l2"]


def test_race_cells_hold_16k_tokens_and_2048_wide_heads():
    cells = race.cases()
    assert all(c.B * c.Sq == 16384 and c.Hq * c.D == 2048 and c.dtype == "bfloat16" for c in cells)
    assert {(c.D, c.Sq, c.causal) for c in cells} >= {(128, 4096, False), (128, 16384, False), (128, 8192, True),
                                                      (64, 8192, False), (256, 8192, False)}


# ------------------------------------------------------------------ the peer without cudnn

def test_the_peer_names_how_to_install_itself_when_cudnn_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    with pytest.raises(ImportError, match="nvidia-cudnn-frontend") as err:
        peer.require()
    assert ".peers/*.whl" in str(err.value) and "PYTHONPATH=/tmp/peers" in str(err.value)
    q = quant.quantize(randn(1, 1, 8, 16), "e4m3")
    with pytest.raises(ImportError, match="nvidia-cudnn-frontend"):
        peer.FP8Attention(q, q, q)
    with pytest.raises(ImportError, match="nvidia-cudnn-frontend"):
        race.race()
    assert peer.unavailable()  # no GPU here, or no cudnn: either way a reason
