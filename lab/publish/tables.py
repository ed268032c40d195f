"""Markdown tables for chapters: rendered by JupyterLab and the book (myst), readable as plain text too.

Rendered by the log's one table renderer (lab.publish.pages.table), so a chapter's table and a log
page's table format numbers and escape text the same way.
"""
from __future__ import annotations

from ..backends import SDPA
from . import pages


class Table:
    """A markdown table that displays as a table in notebooks and prints as text."""

    def __init__(self, headers: list[str], rows: list[list], caption: str = ""):
        self.headers, self.rows, self.caption = headers, rows, caption

    def markdown(self) -> str:
        body = pages.table(self.headers, self.rows).rstrip("\n")
        return (f"**{pages.text(self.caption)}**\n\n" if self.caption else "") + body

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        return self.markdown()


def _by(rows, impl):
    return {r["case"]["name"]: r for r in rows if r["impl"] == impl}


def _ms(row):
    return row["timing"]["median_ms"] if row and "timing" in row else float("nan")


def checks(results) -> Table:
    rows = [[r.impl, r.case.label, "PASS" if r.passed else "FAIL", r.worst["max_abs"], r.worst["sdpa_max_abs"],
             r.worst["rel_l2"], r.worst["nan"]] for r in results]
    passed = sum(r.passed for r in results)
    return Table(["impl", "case", "verdict", "max abs err", "SDPA max abs err", "rel L2", "NaN"], rows,
                 f"{passed}/{len(results)} cases pass")


def versus(rows: list[dict], impl: str, metric: str = "tflops",
           backends=tuple(b for b in SDPA if b != "sdpa-math")) -> Table:
    """Per case: our metric and time, then each backend's metric and our speedup over it."""
    ours = _by(rows, impl)
    others = {b: _by(rows, b) for b in backends}
    out = []
    for name, r in ours.items():
        line = [name, r.get(metric, float("nan")), _ms(r), r.get("frac_ceiling", float("nan"))]
        for b in backends:
            line += [others[b].get(name, {}).get(metric, float("nan")), r.get("ratios", {}).get(b, float("nan"))]
        out.append(line)
    unit = "TFLOP/s" if metric == "tflops" else "GB/s"
    headers = ["case", f"{impl} {unit}", f"{impl} ms", "of ceiling"]
    for b in backends:
        headers += [f"{b} {unit}", f"x vs {b}"]
    return Table(headers, out, f"{impl}: speedup = time of backend / time of {impl} (>1: {impl} faster)")


def _memory_words(ratio) -> str:
    """ours / SDPA peak bytes as words: '80% less' or '25% more'."""
    if not ratio:
        return "n/a"
    return f"{1 - ratio:.0%} less" if ratio <= 1 else f"{ratio - 1:.0%} more"


def seed_baseline(rows: list[dict], checks_by_case: dict, impl: str, historical: dict) -> Table:
    """The origin's table on our GPU: latency, speedup and peak memory per backend, with L4 rows below."""
    ours = _by(rows, impl)
    backends = [b for b in SDPA if any(r["impl"] == b for r in rows)]
    table = []
    for name, r in ours.items():
        mem = r.get("peak_extra_bytes")
        default_mem = r.get("memory_ratios", {}).get("sdpa-default")
        line = [name, f"S={r['case']['Sq']}", _ms(r), mem / 2**20 if mem is not None else float("nan"),
                _memory_words(default_mem)]
        for b in backends:
            other = _by(rows, b).get(name)
            line += [_ms(other), r.get("ratios", {}).get(b, float("nan"))]
        line.append(checks_by_case.get(name, "not checked"))
        table.append(line)
    for name, (S, torch_ms, ours_ms, speedup) in historical.items():
        line = [f"{name} (L4, historical)", f"S={S}", ours_ms, float("nan"), "79.8% less (reported)"]
        for b in backends:
            line += [torch_ms, speedup] if b == "sdpa-default" else ["", ""]
        line.append("origin: seeds/000")
        table.append(line)
    headers = ["config", "S", f"{impl} ms", f"{impl} peak MiB", "memory vs sdpa-default"]
    for b in backends:
        headers += [f"{b} ms", f"x vs {b}"]
    headers.append("correct")
    return Table(headers, table, "x = time of backend / time of ours; historical rows: the origin's L4 report, "
                                 "PyTorch column shown under sdpa-default")


def backends(rows: list[dict], metric: str = "tflops") -> Table:
    """One row per case, one column per implementation: the metric, or why it did not run."""
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    by = {(r["case"]["name"], r["impl"]): r for r in rows}
    table = []
    for name in dict.fromkeys(r["case"]["name"] for r in rows):
        line = [name]
        for impl in impls:
            r = by.get((name, impl), {})
            line.append(r[metric] if metric in r else ("unsupported" if "unsupported" in r else "n/a"))
        table.append(line)
    unit = {"tflops": "TFLOP/s", "gbps": "GB/s"}.get(metric, metric)
    return Table(["case"] + impls, table, f"{unit} per implementation")


def gradient_checks(results_by_case) -> Table:
    """One row per (label, {"dq": CheckResult, "dk": ..., "dv": ...}): the verdict and each gradient's worst
    max abs error beside SDPA's own."""
    rows = []
    for label, results in results_by_case:
        worst = {name: r.worst for name, r in results.items()}
        rows.append([label, all(r.passed for r in results.values()),
                     *[f"{worst[n]['max_abs']:.2e} / {worst[n]['sdpa_max_abs']:.2e}" for n in ("dq", "dk", "dv")]])
    passed = sum(row[1] for row in rows)
    return Table(["case", "passed", "dQ max abs (ours / SDPA)", "dK", "dV"], rows, f"{passed}/{len(rows)} checks pass")


def race(rows: list[dict], impl: str = "lab.ops.attention", backends=("flash", "cudnn", "efficient")) -> Table:
    """Per case: our TFLOP/s and time, then our speedup over each SDPA backend (and "flex": FlexAttention)."""
    ours = [r for r in rows if r["impl"] == impl and "timing" in r]
    key = {b: b if b == "flex" else f"sdpa-{b}" for b in backends}
    table = [[r["case"]["name"], r["tflops"], _ms(r), *[r.get("ratios", {}).get(key[b], float("nan"))
                                                        for b in backends]] for r in ours]
    names = {"flash": "SDPA-flash", "cudnn": "SDPA-cuDNN", "efficient": "SDPA-efficient", "flex": "FlexAttention"}
    return Table(["case", "TFLOP/s", "ms", *[f"x {names.get(b, b)}" for b in backends]], table)


def versions(rows: list[dict], baseline: str = "sdpa-cudnn") -> Table:
    """Per case: the baseline's TFLOP/s (the impl whose name starts with `baseline`), then each other impl's
    TFLOP/s and its speedup over the baseline (the rows' ratios[baseline])."""
    names_all = list(dict.fromkeys(r["impl"] for r in rows))
    base = next((n for n in names_all if n.startswith(baseline)), baseline)
    impls = [n for n in names_all if n != base]
    cases = list(dict.fromkeys(r["case"]["name"] for r in rows))
    by = {(r["case"]["name"], r["impl"]): r for r in rows if "tflops" in r or "ratios" in r}
    table = []
    for name in cases:
        line = [name, by.get((name, base), {}).get("tflops", float("nan"))]
        for impl in impls:
            row = by.get((name, impl), {})
            line += [row.get("tflops", float("nan")), row.get("ratios", {}).get(baseline, float("nan"))]
        table.append(line)
    headers = ["case", f"{base} TFLOP/s"] + [h for impl in impls for h in (f"{impl} TFLOP/s", f"x {baseline}")]
    return Table(headers, table)
