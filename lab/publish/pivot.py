"""Our default kernel of each family against every SDPA backend, read at a glance.

The families: the forward pass, the backward pass, decode, paged decode and the ring (context-parallel
attention over several GPUs). Each is measured against its own SDPA yardstick (YARDSTICK).

- `pivot_html`: per GPU and family, one row per shape (D, causal, S for the forward and backward passes;
  H, B, L for decode, and the page size for paged decode; S and GPUs for the ring), one column per backend, each cell our ratio (SDPA's time / ours, >1: ours faster), coloured
  on a log scale from red (0.5x or worse) through white (parity) to green (2x or better);
- `family_figure`: the same ratios against S (or L), one line per backend;

"Ours" is the public op as users call it: rows whose impl is exactly `lab.ops.attention`, `lab.ops.decode`
or `lab.dist.ring_attention`. Older sessions named their rows by version (v04) or, for decode, `auto`
(lab.ops.decode's own choice); for those, the newest version in the session stands in, and the page
says which impl it shows.
"""
from __future__ import annotations

import html
import math
import re
from collections import defaultdict
from pathlib import Path

from .. import backends
from ..record import slug
from . import pages
from .pages import Markdown

# record kind -> (our public op, the family's name)
FAMILIES = {"fwd": ("lab.ops.attention", "forward"), "bwd": ("lab.ops.attention", "backward"),
            "decode": ("lab.ops.decode", "decode"), "paged": ("lab.ops.decode", "paged decode"),
            "ring-scale": ("lab.dist.ring_attention", "ring")}
YARDSTICK = {"fwd": "SDPA's forward, same shape", "bwd": "SDPA's backward (dQ, dK, dV), same shape",
             "decode": "SDPA on the same cache", "paged": "SDPA on the same cache, contiguous",
             "ring-scale": "SDPA on one GPU over the whole sequence"}
LEGACY = {"decode": ("auto",)}  # n7 timed lab.ops.decode as "auto" before the public-op rows
# lab.cases' head-dim sets (head_dim_cases, wide_head_dim_cases): chapter n14 races them itself; a session that timed
# only those must not stand for a family's headline shapes (D 64 and 128) on the front page or the baselines page
SIDE_CASE_SETS = ("hd-", "hdw-")
_VERSION = re.compile(r"^v(\d+)$")
_PAD = "padding:2px 8px;text-align:right"
# sdpa-math materialises the scores (10-30x slower): on a shared log axis it flattens every other line;
# its ratios stay in the pivot table
FIGURE_SKIPS = ("sdpa-math",)


def _plain(label: str) -> str:
    """Text for matplotlib: a '$' from a record must not start mathtext."""
    return str(label).replace("$", r"\$")


def timed(rows: list[dict], family: str) -> list[dict]:
    """GPU rows of the family with a timing, outside the head-dim sets; ratios {} where a row has none (a ring
    session that timed no SDPA yardstick still shows on the front page, with its yardstick cells empty)."""
    return [{**r, "ratios": r.get("ratios") if isinstance(r.get("ratios"), dict) else {}} for r in rows
            if r.get("kind") == family and pages.is_gpu(r) and isinstance(r.get("timing"), dict)
            and isinstance(r.get("case"), dict) and not str(r["case"].get("name", "")).startswith(SIDE_CASE_SETS)]


def _legacy_impl(family: str, impls: set) -> str | None:
    """What a session from before the public-op rows timed as the default: decode's `auto`, else the newest vNN."""
    for name in LEGACY.get(family, ()):
        if name in impls:
            return name
    versions = [i for i in impls if isinstance(i, str) and _VERSION.match(i)]
    return max(versions, key=lambda v: int(v[1:])) if versions else None


def ours(rows: list[dict], family: str) -> tuple[str | None, str | None, list[dict]]:
    """(impl, session, rows): the family's default kernel in the newest session that timed it.

    The public op wins wherever any session timed it: a newer session that timed only some versions
    (a chapter trying v05) does not make its newest version "the default"."""
    by_session = defaultdict(list)
    for row in timed(rows, family):
        by_session[row["session"]].append(row)
    newest = sorted(by_session, key=lambda s: max(str(r.get("timestamp", "")) for r in by_session[s]), reverse=True)
    public = FAMILIES[family][0]
    picks = [(public, s) for s in newest if any(r.get("impl") == public for r in by_session[s])][:1]
    if not picks:
        picks = [(impl, s) for s in newest if (impl := _legacy_impl(family, {r.get("impl") for r in by_session[s]}))][:1]
    for impl, session in picks:
        chosen = {}
        for row in sorted(by_session[session], key=lambda r: str(r.get("timestamp", ""))):
            if row.get("impl") == impl:
                chosen[shape_key(row, family)] = row  # a shape measured twice: the later row
        return impl, session, list(chosen.values())
    return None, None, []


def _heads(case: dict) -> str:
    hq, hkv = case.get("Hq"), case.get("Hkv", case.get("Hq"))
    return f"{hq}" if hq == hkv else f"{hq}/{hkv}"


def shape_key(row: dict, family: str) -> tuple:
    c = row["case"]
    if family == "decode":
        return (c.get("D"), _heads(c), c.get("B"), c.get("kv_len"), bool(c.get("seqlens")), str(c.get("dtype")))
    if family == "paged":
        return (c.get("D"), _heads(c), c.get("B"), c.get("kv_len"), c.get("page_size"), c.get("q_len"),
                bool(c.get("causal")), str(c.get("dtype")))
    if family == "ring-scale":
        return (c.get("D"), bool(c.get("causal")), c.get("S"), row.get("world_size"), str(c.get("dtype")))
    s = c.get("Sq") if c.get("Sq") == c.get("Sk") else f"{c.get('Sq')}/{c.get('Sk')}"
    return (c.get("D"), bool(c.get("causal")), s, f"{c.get('B')}×{_heads(c)}", str(c.get("dtype")))


SHAPE_COLUMNS = {"fwd": ["D", "causal", "S", "B×H", "dtype"], "bwd": ["D", "causal", "S", "B×H", "dtype"],
                 "decode": ["D", "H q/kv", "B", "L (kv)", "ragged", "dtype"],
                 "paged": ["D", "H q/kv", "B", "L (kv)", "page", "q_len", "causal", "dtype"],
                 "ring-scale": ["D", "causal", "S", "GPUs", "dtype"]}
_PANELS = {"fwd": "head dim and masking", "bwd": "head dim and masking", "decode": "head layout and batch",
           "paged": "page size, head layout, batch and query length"}
RATE = {"fwd": "tflops", "bwd": "tflops", "ring-scale": "tflops", "decode": "gbps", "paged": "gbps"}


def _sort_key(key: tuple):
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in key)


def colour(ratio) -> str:
    """Background for a ratio: green above parity, red below, saturating at 2x and 0.5x."""
    if not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0:
        return "background:#eee"
    t = max(-1.0, min(1.0, math.log2(ratio)))
    rgb = "46,160,67" if t >= 0 else "215,58,73"
    return f"background:rgba({rgb},{0.12 + 0.6 * abs(t):.2f})"


def _shape_text(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return "–" if value is None or value == "None" else str(value)


def pivot_html(family: str, chosen: list[dict]) -> Markdown:
    """The pivot as an HTML table (a Markdown table cannot colour its cells); every value is escaped."""
    present = backends.ordered({b for r in chosen for b in r["ratios"]})
    metric = "TFLOP/s" if RATE[family] == "tflops" else "GB/s"
    head = SHAPE_COLUMNS[family] + [f"vs {b}" for b in present] + ["ours ms", metric, "check"]
    lines = ['<table class="pivot" style="border-collapse:collapse;font-size:0.9em">',
             "<thead><tr>" + "".join(f'<th style="{_PAD}">{html.escape(h)}</th>' for h in head) + "</tr></thead>",
             "<tbody>"]
    for row in sorted(chosen, key=lambda r: _sort_key(shape_key(r, family))):
        cells = [f'<td style="{_PAD}">{html.escape(_shape_text(v))}</td>' for v in shape_key(row, family)]
        for b in present:
            value = row["ratios"].get(b)
            shown = f"{value:.2f}" if isinstance(value, (int, float)) else "–"
            cells.append(f'<td style="{_PAD};{colour(value)}">{html.escape(shown)}</td>')
        ms = row["timing"].get("median_ms")
        rate = row.get(RATE[family])
        check = row.get("check") if isinstance(row.get("check"), dict) else {}
        verdict = {True: "pass", False: "FAIL"}.get(check.get("passed"), "–")
        cells += [f'<td style="{_PAD}">{html.escape(pages.fmt_number(float(v)) if isinstance(v, (int, float)) else "–")}</td>'
                  for v in (ms, rate)] + [f'<td style="{_PAD}">{verdict}</td>']
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines += ["</tbody>", "</table>"]
    return Markdown("\n".join(lines) + "\n")


def _x(row: dict, family: str):
    c = row["case"]
    return c.get("kv_len") if family in ("decode", "paged") else c.get("Sq")


def _panel(row: dict, family: str) -> str:
    c = row["case"]
    if family == "decode":
        return f"D={c.get('D')}, H={_heads(c)}, B={c.get('B')}"
    if family == "paged":
        return f"page {c.get('page_size')}, H={_heads(c)}, B={c.get('B')}, q_len {c.get('q_len')}"
    return f"D={c.get('D')}, {'causal' if c.get('causal') else 'non-causal'}"


def family_figure(family: str, chosen: list[dict], impl: str, gpu: str, target: Path) -> Path | None:
    """Ratio against S (or L) per panel, one line per backend; shapes sharing an x are averaged (geometric)."""
    points = [r for r in chosen if isinstance(_x(r, family), (int, float)) and not r["case"].get("seqlens")]
    if not points or family == "ring-scale":  # the ring times one length: its pivot row says it all
        return None
    from matplotlib.figure import Figure  # no pyplot: no global backend state in a library
    from matplotlib.ticker import ScalarFormatter

    panels = defaultdict(list)
    for row in points:
        panels[_panel(row, family)].append(row)
    present = [b for b in backends.ordered({b for r in points for b in r["ratios"]}) if b not in FIGURE_SKIPS]
    names = sorted(panels, key=lambda p: _sort_key(tuple(re.findall(r"\d+|\D+", p))))
    cols = min(len(names), 2)
    rows = math.ceil(len(names) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.0 * rows + 0.4), dpi=100)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(names):]:
        ax.set_visible(False)
    for ax, name in zip(axes, names):
        for b in present:
            by_x = defaultdict(list)
            for row in panels[name]:
                value = row["ratios"].get(b)
                if isinstance(value, (int, float)) and value > 0:
                    by_x[_x(row, family)].append(math.log(value))
            xs = sorted(by_x)
            if xs:
                ax.plot(xs, [math.exp(sum(by_x[x]) / len(by_x[x])) for x in xs], marker="o", ms=3, label=b)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.tick_params(axis="y", which="both", labelsize=7)
        ax.set_title(_plain(name), fontsize=8)
        ax.set_xlabel("L (kv)" if family in ("decode", "paged") else "S", fontsize=8)
        ax.grid(alpha=0.3)
    for ax in axes[::cols]:
        ax.set_ylabel("SDPA time / ours", fontsize=8)
    axes[0].legend(fontsize=7)
    fig.suptitle(_plain(f"{impl} ({FAMILIES[family][1]}) on {gpu}: >1 means ours is faster"), fontsize=9)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target)
    return target


def geomean(values: list[float]) -> float | None:
    good = [v for v in values if isinstance(v, (int, float)) and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else None


def by_gpu(rows: list[dict]) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for row in rows:
        if pages.is_gpu(row):
            groups[str((row.get("env") or {}).get("gpu"))].append(row)
    return dict(sorted(groups.items()))


def section(gpu: str, gpu_rows: list[dict], log_dir: Path) -> str:
    """The baselines page's part for one GPU: a pivot and a figure per family."""
    parts = []
    for family, (public, title) in FAMILIES.items():
        impl, session, chosen = ours(gpu_rows, family)
        if not chosen:
            continue
        note = "" if impl == public else (f" (this session predates the `{public}` rows: `{impl}` is what it "
                                          f"timed as the default)")
        parts.append(f"### {title.capitalize()}: {pages.text(impl)}\n\n"
                     f"{len(chosen)} shapes from session {pages.session_ref(session)}{note}. Each cell: SDPA's "
                     "time / ours (>1: ours faster).\n\n" + pivot_html(family, chosen))
        figure = family_figure(family, chosen, impl, gpu, log_dir / "figures" / f"pivot-{family}-{slug(gpu)}.png")
        if figure:
            parts.append(f"![{title} ratios on {pages.text(gpu)}](figures/{figure.name})\n\n"
                         f"*The same ratios against {'L' if family in ('decode', 'paged') else 'S'}, one panel "
                         f"per {_PANELS[family]}; shapes "
                         "that share a length are averaged (geometric mean); sdpa-math is in the table only.*\n")
    return "\n".join(parts)
