"""Chapter n15's tables, figures and findings, from lab.fp8's rows (no measurement happens here)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt

from ..findings import geomean
from ..plot import save_figure
from ..publish.tables import Table
from . import quant

NAN = float("nan")


def formats_table() -> Table:
    rows = [f.as_row() for f in (*quant.FORMATS.values(), quant.WIDER["bf16"])]
    return Table(["format", "sign / exponent / mantissa bits", "max", "min normal", "min subnormal",
                  "relative step (2^-m)", "normal binades"], rows, "from torch.finfo of each dtype")


def error_curve(path=None):
    """Relative rounding error against magnitude, unscaled, for e4m3, e5m2 and bf16."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for name, colour in (("e4m3", "tab:red"), ("e5m2", "tab:blue"), ("bf16", "tab:gray")):
        x, rel = quant.relative_error_curve(name)
        ax.loglog(x.numpy(), rel.clamp(min=1e-6).numpy(), lw=1.2, color=colour, label=name, drawstyle="steps-post")
        f = quant.fmt(name)
        for edge, style in ((f.min_normal, ":"), (f.max, "--")):
            if float(x[0]) < edge < float(x[-1]):
                ax.axvline(edge, color=colour, lw=0.8, ls=style)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("|x| (no scale)")
    ax.set_ylabel("worst |round(x) - x| / |x|")
    ax.set_ylim(1e-4, 10)
    ax.set_title("where precision goes: dotted = smallest normal, dashed = largest finite (saturation beyond)",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return save_figure(fig, path)


def budget_table(rows: list[dict]) -> Table:
    """lab.fp8.emulate.error_budget rows (with an `outliers` field): relative L2 against float64."""
    out = [[r["outliers"], r["variant"], r["inputs_rel_l2"], r["total"]["rel_l2"], r["kernel"]["rel_l2"],
            r["clean"]["rel_l2"], r["total"]["max_abs"]] for r in rows]
    return Table(["outliers (x)", "variant", "inputs' quantisation", "total (vs float64, original inputs)",
                  "kernel (vs float64, dequantised inputs)", "total, heads without outliers", "total max abs"],
                 out, "relative L2 errors of O (inputs' column: over Q, K and V)")


def sweep_table(rows: list[dict]) -> Table:
    by = {}
    for r in rows:
        by.setdefault(r["magnitude"], {})[r["granularity"]] = r["clean"]["rel_l2"]
    out = [[m, g.get("tensor", NAN), g.get("head", NAN), g.get("tensor", NAN) / g.get("head", NAN)]
           for m, g in by.items()]
    return Table(["outlier magnitude", "per-tensor scale", "per-head scale", "per-tensor / per-head"], out,
                 "e4m3, P x 448, O bf16: relative L2 error of the heads without outliers")


def _by_case(rows, impl):
    return {r["case"]["name"]: r for r in rows if r["impl"] == impl}


def race_table(rows: list[dict]) -> Table:
    fp8, bf16 = _by_case(rows, "cudnn-fp8"), _by_case(rows, "sdpa-cudnn")
    out = []
    for name, r in fp8.items():
        b = bf16.get(name, {})
        out.append([name, r["case"]["B"], f"{r['case']['Hq']}/{r['case']['Hkv']}", r["case"]["Sq"], r["case"]["D"],
                    r["case"]["causal"], r.get("tflops", r.get("unsupported", NAN)),
                    r["timing"]["median_ms"] if "timing" in r else NAN,
                    r["timing"]["iqr_ms"] if "timing" in r else NAN, b.get("tflops", b.get("unsupported", NAN)),
                    r.get("ratios", {}).get("sdpa-cudnn", NAN)])
    return Table(["case", "B", "H q/kv", "S", "D", "causal", "cuDNN FP8 TFLOP/s", "ms", "IQR ms",
                  "bf16 SDPA-cuDNN TFLOP/s", "FP8 speedup"], out,
                 "FLOPs 4 B H S^2 D (halved causal); speedup = t(bf16 SDPA-cuDNN) / t(cuDNN FP8)")


def lab_table(rows: list[dict]) -> Table:
    """The lab's FP8 forward (lab.ops.attention_fp8, fwd v13) per cell: speed against cuDNN FP8 and bf16
    SDPA-cuDNN timed in the same rounds, and its error beside its emulation's (O bf16)."""
    out = []
    for name, r in _by_case(rows, "lab-fp8").items():
        a, ratios = r.get("accuracy") or {}, r.get("ratios", {})
        out.append([name, r.get("tflops", r.get("unsupported", NAN)), r["timing"]["median_ms"] if "timing" in r else NAN,
                    ratios.get("cudnn-fp8", NAN), ratios.get("sdpa-cudnn", NAN), a.get("rel_l2", NAN),
                    (a.get("emulation") or {}).get("rel_l2", NAN), a.get("vs_cudnn_fp8", NAN)])
    return Table(["case", "lab FP8 TFLOP/s", "ms", "vs cuDNN FP8 (gate >= 1)", "vs bf16 SDPA-cuDNN", "rel L2",
                  "emulation", "rel L2 / cuDNN FP8's (gate <= 1)"], out,
                 "lab.ops.attention_fp8 (V^T pass included); vs = t(other) / t(lab), > 1: the lab's is faster; "
                 "relative L2 against float64 on the dequantised inputs, O bf16 (cuDNN FP8's: its e4m3 O, the same rows)")


def accuracy_table(rows: list[dict]) -> Table:
    out = []
    for name, r in _by_case(rows, "cudnn-fp8").items():
        a = r.get("accuracy")
        if not a:
            out.append([name] + [NAN] * 7)
            continue
        bf16 = a.get("bf16_sdpa_cudnn") or {}
        out.append([name, a["rows_checked"], a["rel_l2"], a["max_abs"], a["emulation"]["rel_l2"], a["emulation_fold"],
                    a["vs_bf16_inputs"]["rel_l2"], bf16.get("rel_l2", NAN)])
    return Table(["case", "rows", "cuDNN FP8", "cuDNN FP8 max abs", "emulation", "fold (<= 2 passes)",
                  "cuDNN FP8 vs bf16 inputs", "bf16 SDPA-cuDNN"], out,
                 "relative L2 of O against float64 on the dequantised e4m3 inputs (last two: on the bf16 inputs)")


def v_mean_table(rows: list[dict]) -> Table:
    """lab.fp8.checks.v_mean_sweep's records: O's relative L2 per implementation, V = randn + mu."""
    names = ("lab-fp8", "lab-fp8 unpromoted", "cudnn-fp8", "emulation")
    out = [[f"D {r['shape'][3]} S {r['shape'][2]}{' causal' if r['causal'] else ''}", r["v_mean"],
            *(r["rel_l2"].get(n, NAN) for n in names)] for r in rows]
    return Table(["case", "mean of V", "lab FP8", "lab FP8, P V unpromoted", "cuDNN FP8", "float32 emulation"], out,
                 "relative L2 of O against float64 on the dequantised e4m3 inputs, V = randn + mean")


def tflops_plot(rows: list[dict], path=None):
    fp8, bf16 = _by_case(rows, "cudnn-fp8"), _by_case(rows, "sdpa-cudnn")
    names = list(fp8)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names) + 2), 3.6))
    width = 0.38
    for shift, impl, table, colour in ((-width / 2, "cuDNN FP8 (e4m3)", fp8, "tab:red"),
                                       (width / 2, "bf16 SDPA-cuDNN", bf16, "tab:gray")):
        ax.bar([i + shift for i in range(len(names))], [table.get(n, {}).get("tflops", 0) for n in names], width,
               label=impl, color=colour)
    ax.set_xticks(range(len(names)), [n.removeprefix("fp8-") for n in names], fontsize=8, rotation=15)
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return save_figure(fig, path)


def _span(values, fmt: str = "{:.3g}") -> str:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return f"{fmt.format(min(values))}-{fmt.format(max(values))}" if values else "n/a"


def findings(budget: list[dict], sweep: list[dict], race: list[dict]) -> list[str]:
    """Sentences built from the rows the chapter's cells printed."""
    lines = []
    plain = {r["variant"]: r for r in budget if r["outliers"] == 1}
    bf16 = next((r for r in plain.values() if r["format"] == "bf16"), None)
    e4m3 = next((r for r in plain.values() if r["format"] == "e4m3" and r["granularity"] == "tensor"), None)
    if bf16 and e4m3:
        lines.append(f"- Emulation, no outliers: e4m3 (per tensor, P x 448, O bf16) has relative L2 error "
                     f"{e4m3['total']['rel_l2']:.2e} against float64 on the original inputs and "
                     f"{e4m3['kernel']['rel_l2']:.2e} on its dequantised inputs (the kernel's arithmetic alone); "
                     f"bf16: {bf16['total']['rel_l2']:.2e} and {bf16['kernel']['rel_l2']:.2e}.")
    pairs = sweep_table(sweep).rows if sweep else []
    worse = [row for row in pairs if row[3] > 1.1]
    if pairs:
        lines.append(f"- Outliers: a per-tensor scale costs the heads without outliers more than 10% extra error from "
                     f"magnitude {worse[0][0]:g} on (per-tensor / per-head {worse[0][3]:.2f})." if worse else
                     f"- Outliers up to {pairs[-1][0]:g}x: per-tensor and per-head scales within 10% of each other.")
    fp8 = [r for r in race if r["impl"] == "cudnn-fp8"]
    timed = [r for r in fp8 if "tflops" in r]
    if timed:
        ratios = [r["ratios"]["sdpa-cudnn"] for r in timed if "sdpa-cudnn" in r.get("ratios", {})]
        lines.append(f"- cuDNN FP8: {_span([r['tflops'] for r in timed], '{:.0f}')} TFLOP/s over {len(timed)} cells, "
                     f"{_span(ratios, '{:.2f}')}x bf16 SDPA-cuDNN (geomean {geomean(ratios):.2f}x).")
    checked = [r["accuracy"] for r in fp8 if r.get("accuracy")]
    if checked:
        lines.append(f"- Its error against float64 on the dequantised inputs: {_span([a['rel_l2'] for a in checked])} "
                     f"relative L2; the emulation's {_span([a['emulation']['rel_l2'] for a in checked])} "
                     f"(fold {_span([a['emulation_fold'] for a in checked], '{:.2f}')}).")
    untimed = [r["case"]["name"] + ": " + r["unsupported"] for r in fp8 if "unsupported" in r]
    lines += [f"- Not run: {u}" for u in untimed]
    return lines or ["- nothing measured yet"]
