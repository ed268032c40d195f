"""Chapter n15's tables and findings for the FP8 backward, from lab.fp8's rows (no measurement happens here):
emulate_bwd.kernel_budget's rows, checks_bwd.kernel_rows' records (kind "fp8-bwd-check") and race_bwd's
(kind "fp8-bwd-race")."""
from __future__ import annotations

import math

from ..findings import geomean
from ..publish.tables import Table
from .emulate_bwd import YARDSTICK
from .report import _span

NAN = float("nan")
GRADS = ("dq", "dk", "dv")
# the race's rows the chapter shows, in order, with the name the table gives each
RACE_ROWS = {"lab-fp8-kernel": "FP8 backward kernel (bwd v22)", "lab-bf16": "our bf16 backward (lab.ops.attention)",
             "lab-fp8-train": "dequantise-then-bf16", "cudnn-fp8": "cuDNN FP8 backward"}
BASELINE = "lab-bf16"


def _triple(errors: dict | None) -> str:
    """'dQ / dK / dV' relative L2 errors as one cell."""
    if not errors:
        return "n/a"
    return " / ".join(f"{errors[g]['rel_l2']:.2e}" for g in GRADS)


def budget_table(rows: list[dict]) -> Table:
    """emulate_bwd.kernel_budget's rows: each variant's error, and its dQ's against bf16 eager's."""
    bf16 = {r["causal"]: r["error"]["dq"]["rel_l2"] for r in rows if r["variant"] == YARDSTICK}
    out = [[r["variant"], r["causal"], *(r["error"][g]["rel_l2"] for g in GRADS),
            r["error"]["dq"]["rel_l2"] / bf16.get(r["causal"], NAN)] for r in rows]
    shape = tuple(rows[0]["shape"]) if rows else "?"
    return Table(["operands", "causal", "dQ rel L2", "dK rel L2", "dV rel L2", "dQ / bf16 eager's dQ"], out,
                 f"relative L2 against float64 on the dequantised e4m3 inputs, (B, H, S, D) = {shape}, "
                 "O and LSE float64")


def kernel_checks(rows: list[dict]) -> list[dict]:
    """The FP8 backward kernel's check rows (backward "fp8"), the wrong build last."""
    rows = [r for r in rows if r.get("backward") == "fp8"]
    return sorted(rows, key=lambda r: r.get("bug") is not None)


def _verdict(row: dict) -> str:
    if "error_raised" in row:
        return "raised: " + row["error_raised"]
    return "PASS" if row["pass"] else "FAIL"


def checks_table(rows: list[dict]) -> Table:
    """checks_bwd.kernel_rows' records: the kernel's dQ / dK / dV error against float64 beside its model's and
    bf16 eager's, and the verdict (the wrong build must FAIL)."""
    rows = kernel_checks(rows)
    out = [[r["check"] + (" (must fail)" if r.get("bug") else ""), _triple(r.get("error")), _triple(r.get("model")),
            _triple(r.get("bf16_eager")), _triple(r.get("dequantise_bf16")), _verdict(r)] for r in rows]
    good = [r for r in rows if not r.get("bug")]
    return Table(["check", "kernel dQ / dK / dV", "model (kernel_model)", "bf16 eager", "dequantise-then-bf16",
                  "verdict"], out,
                 f"{sum(bool(r['pass']) for r in good)}/{len(good)} kernel cells pass; relative L2 against float64 on "
                 "the dequantised inputs; pass: no NaN or inf, and within the rule's multiple of the model's error")


def _ms(row: dict | None) -> float:
    return row["timing"]["median_ms"] if row and "timing" in row else NAN


def race_table(rows: list[dict]) -> Table:
    """race_bwd's rows per cell: the kernel, our bf16 backward, dequantise-then-bf16 and cuDNN FP8's backward,
    with ms, TFLOP/s and the ratio to our bf16 backward timed in the same rounds."""
    by_case: dict[str, dict] = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["impl"]] = r
    out = []
    for case, impls in by_case.items():
        baseline = _ms(impls.get(BASELINE))
        for impl, label in RACE_ROWS.items():
            r = impls.get(impl)
            if r is None:
                continue
            out.append([case, label, _ms(r), r["timing"]["iqr_ms"] if "timing" in r else NAN,
                        r.get("tflops", r.get("unsupported", NAN)), baseline / _ms(r),
                        r.get("speed_vs_cudnn-fp8", NAN)])
    return Table(["case", "backward", "ms", "IQR ms", "TFLOP/s", "x vs our bf16 backward", "x vs cuDNN FP8"], out,
                 "time of dO -> dQ, dK, dV through each public call (L2 flushed, median of interleaved rounds); "
                 "FLOPs 2.5 x 4 B H S^2 D (halved causal); x vs = t(other) / t(row), > 1: the row is faster")


def _worst(rows: list[dict], key: str) -> tuple[float, str] | None:
    found = [(r[key], r["case"]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return min(found) if found else None


def findings(budget: list[dict], checks: list[dict], race: list[dict]) -> list[str]:
    """Sentences for the FP8 backward, built from the rows the chapter's cells printed."""
    lines = []
    model = [r for r in budget if r["variant"].startswith("kernel model (")]
    bf16 = {r["causal"]: r["error"]["dq"]["rel_l2"] for r in budget if r["variant"] == YARDSTICK}
    if model and bf16:
        folds = [r["error"]["dq"]["rel_l2"] / bf16[r["causal"]] for r in model]
        lines.append(f"- FP8 backward, emulated: the kernel's rounding gives dQ "
                     f"{_span([r['error']['dq']['rel_l2'] for r in model])} relative L2 against float64, "
                     f"{_span(folds, '{:.1f}')}x bf16 eager's.")
    rows = kernel_checks(checks)
    good, wrong = [r for r in rows if not r.get("bug")], [r for r in rows if r.get("bug")]
    if good:
        errors = [r["error"][g]["rel_l2"] for r in good if r.get("error") for g in GRADS]
        lines.append(f"- FP8 backward kernel checks: {sum(bool(r['pass']) for r in good)}/{len(good)} cells pass "
                     f"(dQ, dK, dV relative L2 {_span(errors)} against float64).")
    lines += [f"- Raised: {r['check']}: {r['error_raised']}" for r in good if "error_raised" in r]
    for r in wrong:
        lines.append(f"- Its wrong build ({r['check']}): {_verdict(r)}"
                     + (", as it must." if r["pass"] is False else " (it must FAIL)."))
    lines += _speed(race)
    return lines or ["- FP8 backward: nothing measured yet"]


def _speed(race: list[dict]) -> list[str]:
    key = "speed_vs_" + BASELINE
    kernel = [r for r in race if r["impl"] == "lab-fp8-kernel" and key in r]
    lines = []
    if kernel:
        low = _worst(kernel, key)
        lines.append(f"- FP8 backward kernel speed: {_span([r[key] for r in kernel], '{:.2f}')}x our bf16 backward "
                     f"over {len(kernel)} cells (geomean {geomean([r[key] for r in kernel]):.2f}x; worst "
                     f"{low[0]:.2f}x at {low[1]}), {_span([r.get('tflops', NAN) for r in kernel], '{:.0f}')} TFLOP/s.")
    cudnn = [r for r in kernel if "speed_vs_cudnn-fp8" in r]
    if cudnn:
        low = _worst(cudnn, "speed_vs_cudnn-fp8")
        lines.append(f"- Against cuDNN FP8's backward: {_span([r['speed_vs_cudnn-fp8'] for r in cudnn], '{:.2f}')}x "
                     f"over {len(cudnn)} cells (worst {low[0]:.2f}x at {low[1]}).")
    train = [r[key] for r in race if r["impl"] == "lab-fp8-train" and key in r]
    if train:
        lines.append(f"- Dequantise-then-bf16: {_span(train, '{:.2f}')}x our bf16 backward.")
    for impl, what in (("lab-fp8-kernel", "The FP8 backward kernel"), ("cudnn-fp8", "cuDNN FP8's backward")):
        rows = [r for r in race if r["impl"] == impl]
        cells: dict[str, list[str]] = {}
        for r in rows:
            if "unsupported" in r:
                cells.setdefault(str(r["unsupported"]), []).append(str(r.get("case", "?")))
        lines += [f"- {what} did not run in {len(names)} of {len(rows)} cells ({', '.join(names)}): {why}"
                  for why, names in sorted(cells.items())]
    return lines
