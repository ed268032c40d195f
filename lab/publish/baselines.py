"""The baselines page: our kernels against every SDPA backend, per GPU, across sessions.

Ratios, not absolute times, are the headline: a ratio to SDPA measured in the same process survives
a change of GPU clock, driver or torch version that would make two absolute times incomparable.
Only GPU rows count; CPU-mode sessions record no timings worth comparing.
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from . import pages
from .record import slug

# Facts quoted from the origin's report seeds/000 (Session N+2, 2025-10-12): FP16 on an NVIDIA L4 (SM89),
# PyTorch's attention against the origin's kernel. The report also states 79.8% less memory than PyTorch.
ORIGIN_SOURCE = "seeds/000, Session N+2, 2025-10-12"
ORIGIN_L4 = [  # (config, S, PyTorch ms, origin kernel ms, speedup as reported)
    ("Tiny", 32, 0.043, 0.155, 0.28),
    ("Small", 64, 0.044, 0.286, 0.15),
    ("Medium", 128, 0.044, 0.743, 0.06),
    ("Large", 256, 0.044, 2.801, 0.02),
    ("XLarge", 512, 0.052, 8.290, 0.01),
    ("Multi-head", 128, 0.043, 0.746, 0.06),
]
ORIGIN_MEMORY = "79.8% less memory than PyTorch"


def kernel_rows(rows: list[dict]) -> list[dict]:
    """Timed GPU measurements of our own kernels (SDPA's rows are the denominators, not entries)."""
    return [r for r in rows if r.get("kind") in ("fwd", "decode") and pages.is_gpu(r)
            and not str(r.get("impl", "")).startswith("sdpa") and r.get("timing")]


def _case_key(row: dict) -> str:
    case = row.get("case") or {}
    return pages.case_label(case)


def backends(rows: list[dict]) -> list[str]:
    seen = {k for r in rows for k in (r.get("ratios") or {})}
    return [b for b in pages.SDPA_BACKENDS if b in seen] + sorted(seen - set(pages.SDPA_BACKENDS))


def primary_backend(available: list[str]) -> str | None:
    return available[0] if available else None


def _latest_per_session(group: list[dict]) -> list[dict]:
    """One row per session (its last), in session order."""
    by_session = {}
    for row in sorted(group, key=lambda r: r.get("timestamp", "")):
        by_session[row["session"]] = row
    return sorted(by_session.values(), key=lambda r: r.get("timestamp", ""))


def _throughput(row: dict) -> str:
    """TFLOP/s (forward) or GB/s (decode), with the fraction of the measured ceiling when known."""
    if row.get("tflops") is not None:
        text = f"{pages.fmt_number(row['tflops'])} TFLOP/s"
    elif row.get("gbps") is not None:
        text = f"{pages.fmt_number(row['gbps'])} GB/s"
    else:
        return "–"
    frac = row.get("frac_ceiling")
    return text + (f" ({frac:.0%} of ceiling)" if isinstance(frac, (int, float)) else "")


def _correct(row: dict) -> str:
    check = row.get("check") or {}
    if check.get("passed") is None:
        return "not checked"
    text = "pass" if check["passed"] else "FAIL"
    if check.get("max_abs") is not None:
        text += f" (max {pages.fmt_number(float(check['max_abs']))})"
    return text


def gpu_table(rows: list[dict]) -> tuple[str, list[str]]:
    """Markdown table for one GPU: kernel version x case, latest values, and the ratio trend."""
    available = backends(rows)
    main = primary_backend(available)
    groups = defaultdict(list)
    for row in rows:
        groups[(row.get("kind"), row["impl"], _case_key(row))].append(row)
    header = ["Kernel", "Case", *[f"vs {b}" for b in available], "Throughput", "Correct", "Median ms", f"Trend vs {main}" if main else "Trend", "Sessions", "Latest"]
    body = []
    for (kind, impl, case), group in sorted(groups.items()):
        series = _latest_per_session(group)
        last = series[-1]
        ratios = last.get("ratios") or {}
        trend = " → ".join(pages.fmt_number(r["ratios"][main]) for r in series[-5:]
                           if main and (r.get("ratios") or {}).get(main) is not None)
        body.append([f"{impl} ({kind})", case, *[ratios.get(b) for b in available], _throughput(last), _correct(last),
                     (last.get("timing") or {}).get("median_ms"), trend, len(series),
                     pages.session_ref(last["session"])])
    return pages.table(header, body), available


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
            series[f"{row['impl']} ({row.get('kind')})"].setdefault(row["session"], []).append(math.log(value))
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
    ax.set_xticks(range(len(used)), [sid[:15] for sid in used], rotation=20, fontsize=7)
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
             "Each table is one GPU. A ratio is SDPA's time divided by ours, measured in the same process: "
             "above 1 our kernel is faster. *Latest* names the session of the values shown; *Trend* lists the "
             "ratio over the last five sessions that measured the case.\n"]
    by_gpu = defaultdict(list)
    for row in ours:
        by_gpu[row["env"]["gpu"]].append(row)
    if not by_gpu:
        parts.append("No GPU session has recorded a timed kernel yet: nothing to compare. "
                     "CPU-mode sessions compile-check and emulate; they do not time.\n")
    for gpu, gpu_rows in sorted(by_gpu.items()):
        table, available = gpu_table(gpu_rows)
        caps = sorted({str(r["env"].get("capability")) for r in gpu_rows})
        parts.append(f"## {gpu}\n\nCompute capability {', '.join(caps)}; "
                     f"{len({r['session'] for r in gpu_rows})} session(s).\n\n{table}")
        figure = trend_figure(gpu_rows, sessions, primary_backend(available),
                              log_dir / "figures" / f"trend-{slug(gpu)}.png")
        if figure:
            parts.append(f"![Ratio trend on {gpu}](figures/{figure.name})\n")
    origin_figure(log_dir / "figures" / "origin-l4.png")
    history = [[name, s, pt, ours_ms, f"{speedup:.2f}x", ORIGIN_SOURCE] for name, s, pt, ours_ms, speedup in ORIGIN_L4]
    parts.append("## NVIDIA L4: the origin's baseline (historical)\n\n"
                 f"Quoted from the origin's session report ({ORIGIN_SOURCE}); FP16 on an L4 (SM89), "
                 f"{ORIGIN_MEMORY}. These rows were not measured here and are not comparable with the tables "
                 "above: a different GPU, kernel and PyTorch.\n\n"
                 + pages.table(["Config", "S", "PyTorch ms", "Origin kernel ms", "Speedup", "Source"], history)
                 + "\n![The origin's L4 speedups](figures/origin-l4.png)\n")
    return "\n".join(parts)
