"""Plots from records: TFLOP/s against S, speedup bars, decode bandwidth, position against ceilings.

Each function takes record rows (dicts), returns the matplotlib Figure and, given `path`, saves a PNG.
No backend is forced here: in a notebook the figure shows inline.
"""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib.pyplot as plt


def save_figure(fig, path):
    """Write fig to path (its folder made) when a path is given; return fig for the notebook to show."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    return fig


def _timed(rows):
    return [r for r in rows if "timing" in r]


def metric_vs_length(rows, metric: str = "tflops", length_key: str = "Sq", split_keys=("D", "causal"),
                     title: str = "", ylabel: str = "TFLOP/s", ceiling: float | None = None, path=None):
    """One panel per (D, causal) group; one line per impl; x = sequence (or KV) length."""
    groups = defaultdict(list)
    for r in _timed(rows):
        groups[tuple(r["case"].get(k) for k in split_keys)].append(r)
    keys = sorted(groups, key=str)
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(4.2 * max(len(keys), 1), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        lines = defaultdict(list)
        for r in groups[key]:
            lines[r["impl"]].append((r["case"][length_key], r[metric]))
        for impl, pts in sorted(lines.items()):
            pts.sort()
            style = "-o" if not impl.startswith("sdpa") else "--."
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl, lw=2 if style == "-o" else 1)
        if ceiling:
            ax.axhline(ceiling, color="gray", lw=0.8, ls=":", label="measured ceiling")
        ax.set_xscale("log", base=2)
        ax.set_title(", ".join(f"{k}={v}" for k, v in zip(split_keys, key)), fontsize=9)
        ax.set_xlabel(length_key)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def speedup_bars(rows, impl: str, baselines=("sdpa-flash", "sdpa-cudnn", "sdpa-default"), title: str = "",
                 path=None):
    """Ratio t_backend / t_ours per case and backend; the 1.0 line is parity."""
    mine = [r for r in _timed(rows) if r["impl"] == impl and r.get("ratios")]
    labels = [r["case"]["name"] for r in mine]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(labels) + 2), 3.6))
    width = 0.8 / max(len(baselines), 1)
    for j, base in enumerate(baselines):
        values = [r["ratios"].get(base, float("nan")) for r in mine]
        ax.bar([i + j * width for i in range(len(mine))], values, width, label=f"vs {base}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(mine))], labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"speedup of {impl} (x)")
    ax.legend(fontsize=7)
    ax.set_title(title or f"{impl}: time of SDPA backend / time of ours")
    fig.tight_layout()
    return save_figure(fig, path)


def ceiling_position(rows, metric: str = "frac_ceiling", title: str = "", path=None):
    """Fraction of the measured ceiling (bf16 matmul or copy bandwidth), per impl, across cases."""
    by_impl = defaultdict(list)
    for r in _timed(rows):
        if metric in r:
            by_impl[r["impl"]].append(r[metric])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = sorted(by_impl)
    ax.boxplot([by_impl[n] for n in names], tick_labels=names, orientation="horizontal")
    ax.axvline(1.0, color="gray", ls=":")
    ax.set_xlabel("fraction of measured ceiling")
    ax.set_title(title or "position against the measured ceiling")
    fig.tight_layout()
    return save_figure(fig, path)


def latency_vs_length(rows, length_key: str = "Sq", title: str = "", path=None, historical: dict | None = None):
    """Median latency (ms) per impl against length; `historical` adds labelled points (e.g. origin L4)."""
    lines = defaultdict(list)
    for r in _timed(rows):
        lines[r["impl"]].append((r["case"][length_key], r["timing"]["median_ms"]))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for impl, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o" if not impl.startswith("sdpa") else "--.", label=impl)
    for label, pts in (historical or {}).items():
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ":x", color="gray", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(length_key)
    ax.set_ylabel("median latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    return save_figure(fig, path)


def error_heatmap(result, path=None):
    """Max abs error by head x query position of a check's worst trial; NaN (unwritten) shows as inf."""
    import numpy as np

    data = np.asarray(result.heatmap, dtype=float)
    finite = np.isfinite(data)
    shown = np.where(finite, data, (data[finite].max() * 2 if finite.any() else 1.0))
    fig, ax = plt.subplots(figsize=(7, 2.2 + 0.15 * data.shape[0]))
    im = ax.imshow(shown, aspect="auto", interpolation="nearest", cmap="magma")
    fig.colorbar(im, ax=ax, label="max |error|")
    ax.set_xlabel("query position")
    ax.set_ylabel("head")
    verdict = "PASS" if result.passed else "FAIL"
    ax.set_title(f"{verdict} {result.impl}: {result.case.label}" + ("" if finite.all() else "  (unwritten = brightest)"),
                 fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def _length_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def tile_cost(kind, block: int, lengths, windowed, causal, window: int, path=None):
    """A masked kernel's tiles and their cost. Left: each (query tile, key tile) of one sequence as skipped,
    masked or full (kind: 0, 1, 2), with a legend for the three. Right: key tiles computed against S at a fixed
    window and causal without one, on log axes whose ticks are the lengths themselves (2k, 4k, ...)."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = ["white", "tab:orange", "tab:blue"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4.2))
    tiles = np.asarray(kind)
    ax[0].imshow(tiles, cmap=ListedColormap(colours), vmin=0, vmax=2, interpolation="nearest")
    ax[0].set(title=f"S = {tiles.shape[0] * block}: {block} x {block} tiles", xlabel="key tile", ylabel="query tile")
    ax[0].legend(handles=[Patch(facecolor=c, edgecolor="0.4", label=name) for c, name in
                          zip(colours, ("skipped", "masked", "full"))], loc="upper right", fontsize=9)
    ax[1].plot(lengths, windowed, "o-", label=f"window {window}")
    ax[1].plot(lengths, causal, "s-", label="causal, no window")
    ax[1].set_xscale("log", base=2)
    ax[1].set_yscale("log")
    ax[1].set_xticks(list(lengths), [_length_label(n) for n in lengths])
    ax[1].xaxis.set_minor_locator(plt.NullLocator())
    ax[1].set(xlabel="sequence length S", ylabel="key tiles computed", title="cost at a fixed window")
    ax[1].legend()
    fig.tight_layout()
    return save_figure(fig, path)
