"""lab/plot.py: every plot renders to a PNG from record-shaped rows (made by lab.sweep._row), headless (Agg)."""
from __future__ import annotations

import matplotlib
import pytest
import torch.nn.functional as F

from lab import bench, cases, check, plot, sweep
from lab.bench import Timing
from lab.cases import Case, DecodeCase

CEILINGS = {"bf16_matmul_tflops": 800.0, "copy_gbps": 3000.0}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _figures_closed(close_figures):
    assert matplotlib.get_backend().lower() == "agg"


def _png(path):
    assert path.exists() and path.stat().st_size > 1000, path
    assert path.read_bytes()[:8] == PNG_MAGIC


def _timing(ms):
    return Timing(ms, ms * 0.98, ms * 1.03, 20)


@pytest.fixture
def fwd_rows():
    rows = []
    for case in cases.bench_fwd_cases(seqlens=(512, 2048, 8192)):
        flops = bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal)
        times = {"flash": _timing(1.0 + case.Sq / 4096), "default": _timing(1.1 + case.Sq / 4096),
                 "cudnn": "unsupported: no cuDNN"}
        for backend, t in times.items():
            rows.append(sweep._row("fwd", f"sdpa-{backend}", case, t, flops, CEILINGS))
        ours = _timing(0.9 + case.Sq / 4096)
        ratios = bench.ratios(ours, times)
        rows.append(sweep._row("fwd", "v02", case, ours, flops, CEILINGS,
                               {"ratios": ratios, "flags": bench.flagged(ratios)}))
    return rows


@pytest.fixture
def decode_rows():
    rows = []
    for case in cases.bench_decode_cases(kv_lens=(4096, 16384), batches=(1, 8)):
        work = bench.decode_bytes(case.lengths(), case.Hq, case.Hkv, case.q_len, case.D)
        for impl, ms in (("sdpa-default", 0.05 * case.kv_len / 4096), ("v01", 0.03 * case.kv_len / 4096)):
            rows.append(sweep._row("decode", impl, case, _timing(ms), work, CEILINGS))
    return rows


def test_rows_from_sweep_row_have_the_plotted_fields(fwd_rows, decode_rows):
    timed = [r for r in fwd_rows if "timing" in r]
    assert len(timed) == 3 * len(fwd_rows) // 4  # cudnn rows are "unsupported", untimed
    v02 = next(r for r in fwd_rows if r["impl"] == "v02")
    assert v02["tflops"] == pytest.approx(bench.attention_flops(v02["case"]["B"], v02["case"]["Hq"], v02["case"]["Sq"],
                                                                v02["case"]["Sk"], v02["case"]["D"], v02["case"]["causal"])
                                          / v02["timing"]["median_ms"] / 1e9)
    assert v02["frac_ceiling"] == pytest.approx(v02["tflops"] / 800.0)
    assert set(v02["ratios"]) == {"sdpa-flash", "sdpa-default"}
    assert all("gbps" in r and r["frac_ceiling"] == pytest.approx(r["gbps"] / 3000.0) for r in decode_rows)
    assert "unsupported" in next(r for r in fwd_rows if r["impl"] == "sdpa-cudnn")
    from lab.publish import tables

    text = tables.backends(fwd_rows).markdown()
    header = text.splitlines()[2]
    assert header.startswith("| case | sdpa-flash") and "unsupported" in text


def test_metric_vs_length(fwd_rows, tmp_path):
    path = tmp_path / "sub" / "tflops.png"
    fig = plot.metric_vs_length(fwd_rows, title="fwd", ceiling=800.0, path=path)
    _png(path)
    assert len(fig.axes) == 4  # (D, causal) panels: 2 x 2
    assert {line.get_label() for line in fig.axes[0].lines} >= {"v02", "sdpa-flash", "sdpa-default"}


def test_metric_vs_length_decode_bandwidth(decode_rows, tmp_path):
    path = tmp_path / "gbps.png"
    fig = plot.metric_vs_length(decode_rows, metric="gbps", length_key="kv_len", split_keys=("Hkv", "B"),
                                ylabel="GB/s", ceiling=3000.0, path=path)
    _png(path)
    assert len(fig.axes) == 4  # Hkv in {32, 8} x B in {1, 8}


def test_speedup_bars(fwd_rows, tmp_path):
    path = tmp_path / "speedup.png"
    fig = plot.speedup_bars(fwd_rows, "v02", path=path)
    _png(path)
    bars = [p for p in fig.axes[0].patches]
    n_cases = len({r["case"]["name"] for r in fwd_rows})
    assert len(bars) == 3 * n_cases  # one bar per case and baseline (cudnn's are NaN, still placed)


def test_ceiling_position(fwd_rows, decode_rows, tmp_path):
    path = tmp_path / "ceiling.png"
    plot.ceiling_position(fwd_rows + decode_rows, path=path)
    _png(path)


def test_latency_vs_length_with_historical_points(tmp_path):
    rows = []
    for case in cases.seed_cases():
        for impl, ms in (("sdpa-default", 0.04), ("v01", 0.01 * case.Sq / 32)):
            rows.append(sweep._row("fwd", impl, case, _timing(ms), 1.0, CEILINGS))
    historical = {"origin (L4)": [(S, ours) for S, _torch, ours, _speedup in cases.SEED_ORIGIN_L4.values()]}
    path = tmp_path / "latency.png"
    fig = plot.latency_vs_length(rows, historical=historical, title="seed", path=path)
    _png(path)
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "origin (L4)" in labels and "v01" in labels


def _run_with_hole(q, k, v, is_causal, scale, out):
    out.copy_(F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal,
                                             scale=scale).to(out.dtype))
    out[:, 1, 3] = float("nan")


def test_error_heatmap_from_a_real_check_result(tmp_path):
    result = check.check_forward(_run_with_hole, Case("hole", 1, 3, 3, 8, 8, 16, "bfloat16", True), "hole",
                                 trials=1, device="cpu", save=False)
    assert not result.passed and result.heatmap.shape == (3, 8)
    path = tmp_path / "heatmap.png"
    fig = plot.error_heatmap(result, path=path)
    _png(path)
    title = fig.axes[0].get_title()
    assert title.startswith("FAIL hole") and "unwritten" in title
    shown = fig.axes[0].images[0].get_array()
    assert shown.shape == (3, 8) and float(shown[1, 3]) == float(shown.max()) > 0  # the hole is the brightest


def test_error_heatmap_of_a_passing_decode_check(tmp_path):
    def run(q, k, v, seqlens, scale, out):
        out.copy_(check.reference(q, k, v, seqlens=seqlens.tolist()).to(out.dtype))

    result = check.check_decode(run, DecodeCase("d", 2, 4, 2, 3, 16, 64, "float16", (5, 16)), "dec", trials=1,
                                device="cpu", save=False)
    assert result.passed
    path = tmp_path / "pass.png"
    fig = plot.error_heatmap(result, path=path)
    _png(path)
    assert fig.axes[0].get_title().startswith("PASS dec") and "unwritten" not in fig.axes[0].get_title()


def test_plots_without_path_return_the_figure_and_write_nothing(fwd_rows, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fig = plot.speedup_bars(fwd_rows, "v02")
    assert fig.axes and list(tmp_path.iterdir()) == []


def test_tile_cost_labels_its_lengths_and_its_tile_kinds(close_figures):
    import numpy as np

    kind = np.array([[2, 0], [1, 2]])
    fig = plot.tile_cost(kind, 64, [2048, 4096, 8192, 32768], [150, 310, 630, 2550], [528, 2080, 8256, 131328], 256)
    tiles, cost = fig.axes
    assert [t.get_text() for t in cost.get_xticklabels()] == ["2k", "4k", "8k", "32k"]
    assert not cost.xaxis.get_minor_ticks() or not any(t.label1.get_text() for t in cost.xaxis.get_minor_ticks())
    assert [t.get_text() for t in tiles.get_legend().get_texts()] == ["skipped", "masked", "full"]
    assert [t.get_text() for t in cost.get_legend().get_texts()] == ["window 256", "causal, no window"]
