"""The baselines page: our kernels against every SDPA backend, per GPU, across sessions.

Ratios, not absolute times, are the headline: a ratio to SDPA measured in the same process survives
a change of GPU clock, driver or torch version that would make two absolute times incomparable.
Only GPU rows count; CPU-mode sessions record no timings worth comparing. Per GPU the page shows a
pivot per kernel family (lab.publish.pivot), then the trend of every kernel across sessions.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from .. import backends
from ..cases import SEED_ORIGIN_L4
from ..record import slug
from . import pages, pivot

# Facts quoted from the origin's report seeds/000 (Session N+2, 2025-10-12): FP16 on an NVIDIA L4 (SM89),
# PyTorch's attention against the origin's kernel; lab.cases holds the one copy of the numbers.
ORIGIN_SOURCE = "seeds/000, Session N+2, 2025-10-12"
ORIGIN_L4 = [(name, S, torch_ms, ours_ms, speedup)  # (config, S, PyTorch ms, origin kernel ms, speedup as reported)
             for name, (S, torch_ms, ours_ms, speedup) in SEED_ORIGIN_L4.items()]
ORIGIN_MEMORY = "79.8% less memory than PyTorch"


def kernel_rows(rows: list[dict]) -> list[dict]:
    """Timed GPU measurements of our own kernels (SDPA's rows are the denominators, not entries)."""
    return [r for r in rows if r.get("kind") in ("fwd", "decode") and pages.is_gpu(r)
            and not str(r.get("impl", "")).startswith("sdpa") and isinstance(r.get("timing"), dict)
            and isinstance(r.get("ratios"), dict)]


def primary_backend(rows: list[dict]) -> str | None:
    """The backend the trend is drawn against: the first of the standard order that the rows carry."""
    available = backends.ordered({k for r in rows for k in r["ratios"]})
    return available[0] if available else None


def trend_figure(rows: list[dict], sessions: list[dict], main: str | None, target: Path) -> Path | None:
    """Geometric mean over cases of the ratio to the main backend, per kernel, per session."""
    if not main:
        return None
    from matplotlib.figure import Figure  # no pyplot: no global backend state in a library
    from matplotlib.ticker import ScalarFormatter

    order = {s["id"]: i for i, s in enumerate(sessions)}
    series = defaultdict(dict)
    for row in rows:
        value = (row.get("ratios") or {}).get(main)
        if value and value > 0 and row["session"] in order:
            series[f"{row['impl']} ({row.get('kind')})".replace("$", r"\$")].setdefault(row["session"], []).append(math.log(value))
    if not series:
        return None
    used = sorted({sid for points in series.values() for sid in points}, key=order.get)
    fig = Figure(figsize=(7, 3.6), dpi=110)
    ax = fig.add_subplot()
    for name, points in sorted(series.items()):
        xs = [used.index(sid) for sid in used if sid in points]
        ys = [math.exp(sum(points[sid]) / len(points[sid])) for sid in used if sid in points]
        ax.plot(xs, ys, marker="o", label=name)
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_xticks(range(len(used)), [sid[:15].replace("$", "") for sid in used], rotation=20, fontsize=7)
    ax.set_ylabel(f"ratio to {main} (>1: ours faster)")
    ax.set_title("Geometric mean over cases, per session")
    ax.legend(fontsize=8)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    return target


def origin_figure(target: Path) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2), dpi=110)
    ax = fig.add_subplot()
    labels = [f"{name}\nS={s}" for name, s, *_ in ORIGIN_L4]
    values = [speedup for *_, speedup in ORIGIN_L4]
    ax.bar(range(len(values)), values, color="#b55")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(range(len(values)), labels, fontsize=7)
    ax.set_ylabel("speedup vs PyTorch")
    ax.set_title(f"Origin, L4 FP16 (historical; {ORIGIN_SOURCE})", fontsize=9)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    return target


def page(outputs: Path, sessions: list[dict], rows: list[dict], log_dir: Path) -> str:
    ours = kernel_rows(rows)
    parts = ["# Baselines\n", pages.generated_note(outputs, sessions),
             "Each section is one GPU. A ratio is SDPA's time divided by ours, measured in the same process: "
             "above 1 our kernel is faster. Per kernel family, a pivot of the newest session that timed the "
             "default kernel (rows: shapes; columns: SDPA backends; green above parity, red below) and a figure "
             "of the same ratios against the sequence length; then the trend of every kernel across sessions.\n"]
    if not ours:
        parts.append("No GPU session has recorded a timed kernel yet: nothing to compare. "
                     "CPU-mode sessions compile-check and emulate; they do not time.\n")
    for gpu, gpu_rows in pivot.by_gpu(rows).items():
        mine = [r for r in ours if str(r["env"].get("gpu")) == gpu]
        if not mine:
            continue
        caps = sorted({str(r["env"].get("capability")) for r in mine})
        parts.append(f"## {pages.text(gpu)}\n\nCompute capability {pages.text(', '.join(caps))}; "
                     f"{len({r['session'] for r in mine})} session(s).\n")
        parts.append(pivot.section(gpu, gpu_rows, log_dir))
        figure = trend_figure(mine, sessions, primary_backend(mine), log_dir / "figures" / f"trend-{slug(gpu)}.png")
        if figure:
            parts.append(f"### Trend\n\n![Ratio trend on {pages.text(gpu)}](figures/{figure.name})\n")
    origin_figure(log_dir / "figures" / "origin-l4.png")
    history = [[name, s, pt, ours_ms, f"{speedup:.2f}x", ORIGIN_SOURCE] for name, s, pt, ours_ms, speedup in ORIGIN_L4]
    parts.append("## NVIDIA L4: the origin's baseline (historical)\n\n"
                 f"Quoted from the origin's session report ({ORIGIN_SOURCE}); FP16 on an L4 (SM89), "
                 f"{ORIGIN_MEMORY}. These rows were not measured here and are not comparable with the tables "
                 "above: a different GPU, kernel and PyTorch.\n\n"
                 + pages.table(["Config", "S", "PyTorch ms", "Origin kernel ms", "Speedup", "Source"], history)
                 + "\n![The origin's L4 speedups](figures/origin-l4.png)\n")
    return "\n".join(parts)
