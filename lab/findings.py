"""Findings computed from a chapter's rows: the sentences a chapter ends with, as functions (no torch).

Each returns lines of text; the chapters print them and tests check them on fixed rows.
"""
from __future__ import annotations

import math


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def ratio_summary(rows: list[dict], impl: str, backends=("sdpa-flash", "sdpa-cudnn", "sdpa-default"),
                  label: str | None = None) -> list[str]:
    """Per backend: min, geometric mean and max of `impl`'s speedups, and how many cells are >= 1.0x."""
    mine = [r for r in rows if r.get("impl") == impl and r.get("ratios")]
    lines = []
    for backend in backends:
        values = [r["ratios"][backend] for r in mine if backend in r["ratios"]]
        if values:
            lines.append(f"{label or impl} vs {backend:<14} min {min(values):.2f}x, geometric mean "
                         f"{geomean(values):.2f}x, max {max(values):.2f}x over {len(values)} cells; "
                         f"cells >= 1.0x: {sum(v >= 1 for v in values)}")
    return lines


def ceiling_summary(rows: list[dict], impl: str, what: str) -> list[str]:
    """The range of `impl`'s fraction of the measured ceiling (matmul rate or copy bandwidth)."""
    fracs = [r["frac_ceiling"] for r in rows if r.get("impl") == impl and "frac_ceiling" in r and r.get("ratios")]
    return [f"{impl}: {min(fracs):.0%}-{max(fracs):.0%} of the measured {what}"] if fracs else []


def host_summary(host_rows: list[dict]) -> list[str]:
    """The worst excess of our host cost over SDPA's, and how many shapes meet the target."""
    if not host_rows:
        return []
    worst = max(host_rows, key=lambda r: r["max_excess_us"])
    met = sum(r["max_excess_us"] <= r["target_excess_us"] for r in host_rows)
    return [f"host cost: worst excess over SDPA {worst['max_excess_us']:.1f} us ({worst['case']['name']}); "
            f"shapes within SDPA + {worst['target_excess_us']:g} us: {met}/{len(host_rows)}"]


def split_gain(rows: list[dict], impl: str, one_split: str, batch: int = 1) -> list[str]:
    """Time with one split over time with the planned splits, per case at the given batch size."""
    def times(name):
        return {r["case"]["name"]: r["timing"]["median_ms"] for r in rows
                if r.get("impl") == name and r.get("case", {}).get("B") == batch and "timing" in r}
    base, single = times(impl), times(one_split)
    gains = [single[n] / base[n] for n in single if n in base]
    if not gains:
        return []
    return [f"split-K gain at batch {batch} (one split / planned): {min(gains):.1f}x-{max(gains):.1f}x over "
            f"{len(gains)} cells; the origin predicted 10x"]


def below(rows: list[dict], impl: str, backend: str, bar: float = 1.0) -> list[str]:
    """The cells where `impl`'s speedup over `backend` is under `bar`, named with their ratio."""
    missed = [f"{r['case']['name']} {r['ratios'][backend]:.2f}x" for r in rows
              if r.get("impl") == impl and r.get("ratios", {}).get(backend, bar) < bar]
    return [f"{impl} below {bar:g}x {backend}: " + (", ".join(missed) or "none")]
