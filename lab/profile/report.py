"""Chapter n8's side: what it profiles (the known answers first), the tree checked on the committed GPU
exports, and the tables and figures of the profiled launches (stalls, roofline).
"""
from __future__ import annotations

import json

from .. import paths, record
from .counters import parse_raw_csv, summarize
from .ncu import ProfileUnavailable, measure
from .targets import find_case, kernel_source
from .tree import decide

# Four launches whose bound was known before the tree existed: (target, case, label the tree must reach). The
# tree never reads this; the chapter checks the tree against it.
KNOWN_ANSWERS = (("fwd:v01", "fwd-d128-s2048", "memory:shared"),   # a shared-memory-bound FFMA chain
                 ("fwd:v04", "fwd-d128-s2048", "compute:tensor"),  # bound by the tensor pipe
                 ("decode:v02", "dec-h8-b8-kv16384", "memory:dram"),
                 ("op:attention", "Small", "launch"))                 # a seed size
FIXTURES = paths.ROOT / "tests" / "fixtures"


def plan(cases: str = "quick") -> list[tuple[str, str]]:
    """(target, case) pairs: the known answers, each family's default op and SDPA beside them."""
    fwd, dec = KNOWN_ANSWERS[1][1], KNOWN_ANSWERS[2][1]
    pairs = [(t, c) for t, c, _ in KNOWN_ANSWERS] + [("op:attention", fwd), ("op:decode", dec),
                                                      ("sdpa:flash", fwd), ("sdpa:cudnn", dec)]
    if cases == "full":
        pairs += [("sdpa:cudnn", fwd), ("sdpa:flash", dec), ("op:attention", "Tiny"), ("op:attention", "Medium")]
    seen, out = set(), []
    for target, case in pairs:  # the default op is profiled once when it is a version already listed
        key = (kernel_source(target, find_case(case)) or target, case)
        if key not in seen:
            seen.add(key)
            out.append((target, case))
    return out


def measure_all(pairs, warmup: int = 3, dtype: str | None = None) -> list[dict]:
    """Profile each pair; stop with one clear message when ncu cannot profile at all (then: []);
    a target that fails on its own is reported and skipped."""
    rows = []
    for target, case in pairs:
        try:
            rows.append(measure(target, case, warmup, dtype=dtype))
        except ProfileUnavailable as err:
            print(f"no profile of {target} on {case}: {err}")
            if "matched" not in str(err):
                print("ncu cannot profile here: showing the recorded profile instead")
                return []
    return rows


def check_fixtures() -> list[dict]:
    """The tree on the committed GPU exports (tests/fixtures): runs anywhere, recorded as tree_check rows."""
    about = json.loads((FIXTURES / "ncu_fixtures.json").read_text())
    rows = []
    for name, info in about["files"].items():
        m = summarize(parse_raw_csv((FIXTURES / name).read_text())[0])
        m["host_us_per_call"] = info["host_us_per_call"]
        verdict = decide(m)
        rows.append(record.append({"kind": "tree_check", "impl": info["target"], "fixture": name,
                                   "case": {"name": info["case"]}, "gpu_of_fixture": about["gpu"],
                                   "expected": info["known"], "label": verdict["label"],
                                   "passed": None if info["known"] is None else verdict["label"] == info["known"]}))
    return rows


def table(rows: list[dict]):
    """One line per profiled launch: the counters the tree reads, and its verdict (a Markdown table)."""
    lines = []
    for r in rows:
        m, v = r["metrics"], r["verdict"]
        lines.append({"target": r["impl"], "case": r["case"]["name"], "us": m["duration_us"],
                      "host us/call": m.get("host_us_per_call"), "SM %": m["sm_pct"], "DRAM %": m["dram_pct"],
                      "L2 %": m["l2_pct"], "L1/shared %": m["l1_pct"], "occupancy %": m["occupancy_pct"],
                      "tensor %": m["tensor_pct"], "issue %": m["issue_pct"], "L2 hit %": m["l2_hit_pct"],
                      "bank confl. ld/st": f"{m['bank_conflicts_ld'] or 0:.0f}/{m['bank_conflicts_st'] or 0:.0f}",
                      "regs": m["registers"], "smem KiB": (m["smem_bytes"] or 0) / 1024,
                      "local B": m["local_bytes"], "bytes/floor": m.get("bytes_over_floor"),
                      "top stall": v["stall"], "verdict": v["label"]})
    return markdown(lines)


def known_answers(rows: list[dict]) -> list[dict]:
    lines = []
    for target, case, expected in KNOWN_ANSWERS:
        found = [r for r in rows if r["impl"] == target and r["case"]["name"] == case]
        label = found[-1]["verdict"]["label"] if found else "not profiled"
        lines.append({"target": target, "case": case, "known answer": expected, "tree says": label,
                      "agrees": label == expected if found else None})
    return lines


def markdown(lines: list[dict]):
    """A list of dicts as a Markdown table (numbers to 3 significant digits), shown by Jupyter."""
    from IPython.display import Markdown

    def cell(value):
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
        return "–" if value is None else str(value)

    if not lines:
        return Markdown("(nothing to show)")
    head = list(lines[0])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows += ["| " + " | ".join(cell(line.get(k)) for k in head) + " |" for line in lines]
    return Markdown("\n".join(rows))


def stall_chart(rows: list[dict], path=None):
    """Stacked bars: each launch's top-5 stall reasons, in cycles per issued instruction."""
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    reasons = list(dict.fromkeys(s["reason"] for r in rows for s in r["metrics"]["stalls"]))
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.5))
    labels = [f"{r['impl']} @ {r['case']['name']}" for r in rows]
    left = [0.0] * len(rows)
    for i, reason in enumerate(reasons):
        widths = [next((s["cycles_per_issue"] for s in r["metrics"]["stalls"] if s["reason"] == reason), 0.0)
                  for r in rows]
        ax.barh(labels, widths, left=left, label=reason, color=plt.cm.tab20(i % 20))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("warp stall, cycles per issued instruction (top 5 reasons per launch)")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save_figure(fig, path)


def recorded_ceilings(rows: list[dict]) -> dict | None:
    """The ceilings measured in the same session as the profile rows (CPU mode's roofline)."""
    if not rows:
        return None
    found = record.load(kind="ceiling", session=rows[0]["session"])
    values = {r["name"]: r["value"] for r in found}
    return values if {"copy_gbps", "bf16_matmul_tflops"} <= values.keys() else None


def roofline(rows: list[dict], ceilings: dict | None, path=None):
    """Every launch by its measured FLOPs (tensor + FP32 counters) over its measured DRAM bytes."""
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    if not ceilings:
        print("no ceilings measured in this session: no roofline")
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    bw, peak = ceilings["copy_gbps"] / 1e3, ceilings["bf16_matmul_tflops"]  # TB/s, TFLOP/s
    x = [0.5, peak / bw, 1e5]  # the roof bends at the ridge point
    ax.plot(x, [min(peak, xi * bw) for xi in x], "k-", lw=1)
    ax.plot([peak / bw] * 2, [peak / 1e3, peak], "k:", lw=0.5)
    ax.annotate(f"copy {ceilings['copy_gbps']:.0f} GB/s, bf16 matmul {peak:.0f} TFLOP/s", (0.6, peak * 1.15), fontsize=8)
    for r in rows:
        m = r["metrics"]
        flops = m.get("measured_flops") or m["flops"]
        if not (flops and m.get("dram_bytes") and m.get("duration_us")):
            continue
        xi, yi = flops / m["dram_bytes"], flops / m["duration_us"] / 1e6
        ax.scatter(xi, yi, marker="o" if r["impl"].startswith(("fwd", "decode", "op")) else "s")
        ax.annotate(f"{r['impl']} @ {r['case']['name']}", (xi, yi), fontsize=7, xytext=(4, -8), textcoords="offset points")
    ax.grid(True, which="major", lw=0.3)
    ax.set(xscale="log", yscale="log", xlabel="FLOP per DRAM byte (measured)", ylabel="TFLOP/s (measured)",
           title="roofline: measured counters against this session's measured ceilings")
    fig.tight_layout()
    return save_figure(fig, path)
