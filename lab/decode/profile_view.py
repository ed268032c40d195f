"""Chapter n11's view of a paged-decode profile run (outputs/driver_logs/20261126-h100-paged-profile-d1dfb67/): where
the time goes per cell and kernel (ncu), the host's share of an eager call, and the serving view's rows. Pure
Python: reads the JSON lines a run left under outputs/driver_logs/, so a machine without a GPU shows the recorded
numbers with their GPU and commit.
"""
from __future__ import annotations

from pathlib import Path

from .. import paths, record
from ..publish.tables import Table

RUNS = "*-paged-profile-*"  # outputs/driver_logs/<date>-<gpu>-paged-profile-<commit>/


def latest_run(gpu: str = "h100") -> Path | None:
    """The newest profile folder of that GPU (by name: the date leads), or None."""
    runs = sorted(p for p in (paths.ROOT / "outputs" / "driver_logs").glob(RUNS) if f"-{gpu}-" in p.name)
    return runs[-1] if runs else None


def _lines(path: Path) -> list[dict]:
    return record.read(path)  # the one records reader: [] when the file is missing


def profile_table(run: Path) -> Table:
    """Per cell and kernel (pass 1; cuDNN's one kernel): GPU time, DRAM throughput, issue activity, warp
    instructions per MB of K and V, and the top stall reasons (share of stalled cycles per issue)."""
    rows = []
    for r in _lines(run / "ncu_profile.jsonl"):
        m = r["metrics"]
        mb = (m.get("dram_bytes") or 0) / 1e6
        stalls = ", ".join(f"{s['reason']} {s['share']:.0%}" for s in m["stalls"][:3])
        rows.append([r["cell"], r["page"] if r["impl"].startswith("paged") else "-", r["impl"],
                     f"{m['duration_us']:.1f}", f"{m['dram_pct']:.1f}", f"{m['issue_pct'] or 0:.1f}",
                     f"{(m.get('warp_inst') or 0) / mb:.0f}" if mb else "-", stalls])
    env = _lines(run / "ncu_profile.jsonl")[:1]
    caption = f"ncu --clock-control none, {env[0]['gpu']}, commit {env[0]['commit']} ({run.name})" if env else ""
    return Table(["B x L", "page", "kernel", "us", "DRAM %", "issue %", "warp inst / MB", "top stalls"], rows, caption)


def host_table(run: Path) -> Table:
    """Per cell and call, us: eager (L2 flushed, one call: host path included where longer than the flush), GPU
    time alone (a GPU sleep queued first), a CUDA-graph replay, and the host's microseconds per call."""
    rows = [[r["cell"], r["impl"], r.get("eager_us"), r.get("gpu_us"), r.get("graph_us"), r.get("host_us"),
             f"{r['copy_us_same_bytes'] / 2:.0f}"]
            for r in _lines(run / "race.jsonl") if r.get("kind") == "paged-profile-race"]
    return Table(["B x L", "call", "eager us", "GPU us", "graph us", "host us", "copy floor us"], rows, run.name)


def serving_table(rows: list[dict]) -> Table:
    """lab.decode.paged.serving_race's rows: eager and graph replay per call."""
    out = [[r["case"]["name"], r["impl"], r["mode"], f"{r['median_us']:.1f}", f"{r['gbps']:.0f}",
            f"{r['lengths']['min']}/{r['lengths']['median']}/{r['lengths']['max']}"] for r in rows]
    return Table(["batch", "call", "mode", "us", "GB/s", "lengths min/median/max"], out)


def serving_ratio(rows: list[dict], impl: str, baseline: str, mode: str = "graph") -> float | None:
    """t(baseline) / t(impl) in the serving rows of one mode (> 1: impl faster)."""
    t = {r["impl"]: r["median_us"] for r in rows if r["mode"] == mode}
    return t[baseline] / t[impl] if impl in t and baseline in t else None


def head_dim_table(rows: list[dict]) -> Table:
    """The head-dim race (lab.cases.bench_paged_head_dim_cases; paged_sweep's rows): per D and cell, microseconds of
    the paged op, our contiguous decode and SDPA-cuDNN / flash on the contiguous cache, the ratios against cuDNN
    (> 1: ours faster) and the paged op's share of the copy bandwidth."""
    from .paged import CONTIGUOUS, PUBLIC_DECODE

    by = {}
    for r in rows:
        if "timing" in r:
            by.setdefault(r["case"]["name"], {})[r["impl"]] = r
    out = []
    for name, impls in by.items():
        us = {impl: r["timing"]["median_ms"] * 1e3 for impl, r in impls.items()}
        ours, mine, cudnn = us.get(PUBLIC_DECODE), us.get(CONTIGUOUS), us.get("sdpa-cudnn")
        case = next(iter(impls.values()))["case"]
        ratio = lambda a, b: f"{a / b:.3f}" if a and b else "-"
        out.append([case["D"], f"{case['B']} x {case['kv_len']}", f"{ours:.1f}" if ours else "-",
                    f"{mine:.1f}" if mine else "-", f"{cudnn:.1f}" if cudnn else "-",
                    f"{us['sdpa-flash']:.1f}" if "sdpa-flash" in us else "-", ratio(cudnn, ours), ratio(cudnn, mine),
                    ratio(mine, ours), f"{impls[PUBLIC_DECODE]['frac_ceiling']:.2f}" if PUBLIC_DECODE in impls else "-"])
    return Table(["D", "B x L", "paged us", "contiguous us", "cuDNN us", "flash us", "paged x cuDNN",
                  "contiguous x cuDNN", "paged x contiguous", "paged / copy bw"], sorted(out, key=lambda r: (r[0], r[1])))
