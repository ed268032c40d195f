"""Running Nsight Compute: one launch of a target in a child process under `ncu --clock-control none` (the
clocks are left alone), with a kernel-name filter, `--launch-skip` warm-ups and one profiled launch; the
report read back through ncu's CSV export of the raw page, reduced to a record with the kernel's source hash
and the tree's verdict.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .. import paths, record
from .counters import TENSOR_SOURCES, parse_raw_csv, summarize
from .targets import byte_floor, find_case, kernel_regex, kernel_source, make_call, work_flops
from .tree import TREE, decide

NVTX_RANGE = "lab.profile"
MAX_KEPT_REP_BYTES = 3 * 2**20  # a report larger than this is dropped; its record stays
RUN_REP_BUDGET = 6 * 2**20  # reports kept per run folder, in profiling order (the known answers come first)
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
            "ComputeWorkloadAnalysis", "SchedulerStats", "WarpStateStats", "InstructionStats",
            "SpeedOfLight_RooflineChart")
# Counters the sections may not collect on every ncu version; a missing name makes ncu fail, and then
# the run is repeated with `--set full` alone (see run_ncu).
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                 "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                 "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
                 "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
                 "smsp__issue_active.avg.pct_of_peak_sustained_active",
                 *(f"sm__ops_path_tensor_src_{s}.sum" for s in TENSOR_SOURCES),
                 *(f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum" for op in ("ffma", "fadd", "fmul")))


class ProfileUnavailable(RuntimeError):
    """ncu is missing or could not read the counters; the message says why and what to do."""


def find_ncu() -> str | None:
    """ncu on PATH, in the CUDA toolkit, or the newest Nsight Compute under /opt/nvidia."""
    candidates = [shutil.which("ncu"), "/usr/local/cuda/bin/ncu",
                  *sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


_FAILURES = {  # what ncu prints -> what it means here
    "ERR_NVGPUCTRPERM": "the driver does not let this user read GPU performance counters (ERR_NVGPUCTRPERM); "
                        "an administrator must allow it (NVreg_RestrictProfilingToAdminUsers=0) or run as root",
    "LibraryNotLoaded": "ncu could not load its profiling library on this machine (seen on gVisor-sandboxed GPUs)",
    "No kernels were profiled": "no kernel matched the name filter {regex!r} after {skip} skipped launches",
    "Device not supported": "ncu does not support this GPU",
}


def explain_failure(log: str, regex: str = "", skip: int = 0) -> str:
    for needle, meaning in _FAILURES.items():
        if needle in log:
            return meaning.format(regex=regex, skip=skip)
    errors = [line for line in log.splitlines() if "==ERROR==" in line or "Error" in line]
    return "ncu failed: " + ("; ".join(errors[:3]) if errors else log.strip()[-300:])


def ncu_command(ncu: str, child: list[str], regex: str, skip: int, out_base: Path, nvtx: bool,
                full: bool = False, count: int = 1) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "-k", f"regex:{regex}",
           "--launch-skip", str(skip), "--launch-count", str(count), "-f", "-o", str(out_base)]
    if nvtx:  # SDPA's kernels are not ours: only launches inside the child's range count
        cmd += ["--nvtx", "--nvtx-include", f"{NVTX_RANGE}/"]
    if full:
        cmd += ["--set", "full"]
    else:
        for section in SECTIONS:
            cmd += ["--section", section]
        cmd += ["--metrics", ",".join(EXTRA_METRICS)]
    return cmd + child


def run_ncu(target: str, case_name: str, out_dir: Path, warmup: int = 3, timeout: int = 300,
            dtype: str | None = None) -> tuple[Path, str]:
    """Profile one launch in a child process; returns the .ncu-rep and the metric set used ('sections'
    or 'full'). Raises ProfileUnavailable."""
    ncu = find_ncu()
    if ncu is None:
        raise ProfileUnavailable("ncu (Nsight Compute) is not installed here: not on PATH, not in "
                                 "/usr/local/cuda/bin, not under /opt/nvidia/nsight-compute")
    case = find_case(case_name, dtype)
    regex = kernel_regex(target, case)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = out_dir / re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{target}-{case_name}")
    child = [sys.executable, "-m", "lab.profile", "child", target, case_name, "--warmup", str(warmup),
             "--dtype", case.dtype]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    log = ""
    for full in (False, True):  # sections + named counters first; `--set full` if this ncu lacks a name
        cmd = ncu_command(ncu, child, regex, warmup, base, nvtx=target.startswith("sdpa:"), full=full,
                          count=launches_per_call(target))
        proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
        rep = base.with_suffix(".ncu-rep")
        if proc.returncode == 0 and rep.exists() and "No kernels were profiled" not in log:
            return rep, "full" if full else "sections"
        if not re.search(r"[Ff]ailed to find (metric|section)|[Ii]nvalid (metric|section)|not found", log):
            break
    raise ProfileUnavailable(explain_failure(log, regex, warmup))


def launches_per_call(target: str) -> int:
    """Launches profiled: SDPA's backward is several kernels (pre-pass, main, dQ convert) that one name filter
    cannot tell apart, so a whole call's worth is taken and main_kernel keeps the longest."""
    return 4 if target.startswith("sdpa-bwd:") else 1


def main_kernel(kernels: list[dict]) -> dict:
    """The profiled launch that took longest (the only one, for a target whose filter names one kernel)."""
    return max(kernels, key=lambda raw: summarize(raw).get("duration_us") or 0.0)


def export_raw(rep: Path) -> str:
    ncu = find_ncu()
    if ncu is None:
        raise ProfileUnavailable("ncu is not installed here: cannot read " + str(rep))
    proc = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw", "--print-units", "base"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ProfileUnavailable(explain_failure(proc.stdout + proc.stderr))
    return proc.stdout


def ncu_version() -> str | None:
    ncu = find_ncu()
    if ncu is None:
        return None
    out = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    match = re.search(r"Version (\S+)", out)
    return match.group(1) if match else out.strip()[-40:]


def host_call_us(fn, budget_s: float = 0.2, max_calls: int = 200) -> float:
    """Wall time per call of back-to-back launches: the launch cost, when it exceeds the kernel's time."""
    import time

    import torch

    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(3, min(max_calls, int(budget_s / max(time.perf_counter() - start, 1e-6))))
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(target: str, case_name: str, warmup: int = 3, keep_report: bool = True, dtype: str | None = None) -> dict:
    """Profile one launch of the target on the case, record the row and return it."""
    case = find_case(case_name, dtype)
    source = kernel_source(target, case)
    host_us = None
    try:
        import torch

        if torch.cuda.is_available():  # builds the kernel here, so the child only loads it
            host_us = host_call_us(make_call(target, case))
    except ImportError:
        pass
    folder = record.run_dir() / "ncu"
    rep, metric_set = run_ncu(target, case_name, folder, warmup, dtype=case.dtype)
    kernels = parse_raw_csv(export_raw(rep))
    if not kernels:
        raise ProfileUnavailable(f"{rep.name} holds no kernel")
    row = row_from_raw(main_kernel(kernels), target, case, source, host_us)
    row["ncu"] = {"version": ncu_version(), "report": None, "metric_set": metric_set, "launch_skip": warmup}
    kept = sum(f.stat().st_size for f in folder.glob("*.ncu-rep") if f != rep)
    size = rep.stat().st_size
    if keep_report and size <= MAX_KEPT_REP_BYTES and kept + size <= RUN_REP_BUDGET:
        row["ncu"]["report"] = paths.relative(rep)
    else:
        rep.unlink()
    return record.append(row)


def row_from_raw(raw: dict, target: str, case, source: str | None, host_us: float | None = None) -> dict:
    """A profile record: the case, the kernel's source hash, the metrics and the tree's verdict."""
    from .. import build

    m = summarize(raw)
    m["host_us_per_call"] = host_us
    floor = byte_floor(case, target)
    m["byte_floor"] = floor
    m["bytes_over_floor"] = m["dram_bytes"] / floor if m.get("dram_bytes") and floor else None
    m["flops"] = work_flops(case, target)
    return {"kind": "profile", "impl": target, "case": case.as_dict(), "source": source,
            "source_hash": build.source_hash(source) if source else None, "metrics": m, "verdict": decide(m),
            "tree": dict(TREE)}


def recorded(**match) -> list[dict]:
    """The latest GPU session's profile rows (what a machine without ncu shows), session named."""
    rows = record.latest_gpu_rows(record.load(kind="profile", **match))
    if rows:
        print(f"recorded profiles: session {rows[0]['session']}, {rows[0]['env']['gpu']}, commit {rows[0]['commit']}")
    else:
        print("no profile recorded yet")
    return rows
