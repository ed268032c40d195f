"""Nsight Compute through the lab: profile one launch, read its counters, say what bounds it.

A kernel's fraction of a ceiling (lab.bench) says which floor it is near, not why it is far from it.
Here one launch of a registered kernel (or of an SDPA backend) on a named case runs in a child
process under `ncu --clock-control none` (the clocks are left alone), with a kernel-name filter,
`--launch-skip` warm-ups and one profiled launch. The report is read through ncu's own CSV export of
the raw page (never the text page), reduced to a row of metrics, recorded with the kernel's source
hash and the case, and judged by a decision tree whose thresholds are data (TREE below).

    python -m lab.profile fwd:v04 fwd-d128-s2048        # or decode:v02, op:attention, sdpa:flash
Targets: fwd:<version> and decode:<version> (lab.ops.FWD / DECODE), op:attention and op:decode (the
public ops, default kernel), sdpa:<backend> (flash, cudnn, efficient, math; a decode case runs SDPA
on the one new token against the cache).
"""
from __future__ import annotations

import collections
import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import bench, cases as case_sets, paths, record

NVTX_RANGE = "lab.profile"
MAX_KEPT_REP_BYTES = 3 * 2**20  # a report larger than this is dropped; its record stays
RUN_REP_BUDGET = 6 * 2**20  # reports kept per run folder, in profiling order (the known answers come first)
SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
            "ComputeWorkloadAnalysis", "SchedulerStats", "WarpStateStats", "InstructionStats",
            "SpeedOfLight_RooflineChart")
TENSOR_SOURCES = ("bf16_dst_fp32", "fp16", "tf32_dst_fp32", "fp8_sparsity_off")  # tensor-core ops = FLOPs
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
SDPA_KERNELS = {  # kernel-name filters for SDPA's backends (the profiled launch is also inside an NVTX range);
    # flash's split-KV decode path also launches a combine kernel, which the filter leaves out
    "flash": "flash_fwd_(splitkv_)?kernel", "efficient": "fmha|cutlass|attention_kernel", "cudnn": "cudnn|sdpa|fprop",
    "math": ".*", "default": ".*"}


class ProfileUnavailable(RuntimeError):
    """ncu is missing or could not read the counters; the message says why and what to do."""


# ------------------------------------------------------------------ the decision tree (thresholds are data)

TREE = {
    # A launch whose kernel is this short, with every unit this idle, spends its time on the launch:
    # the driver's launch cost through the binding is a few us, so a < 10 us kernel is dominated by it.
    # Or, measured: back-to-back calls take this many times the kernel's own duration (host_us_per_call).
    "launch_us": 10.0,
    "launch_host_ratio": 1.5,
    "launch_idle_pct": 40.0,
    # A memory level at or above this % of its peak is the bound (Nsight's guidance calls 60% "high").
    # Levels are tried farthest first (DRAM, L2, shared/L1): every DRAM byte also crosses L2, so L2 is
    # busy whenever DRAM is (decode v02, H200: DRAM 83%, L2 89%); L2 is the bound only when DRAM is not.
    "memory_pct": 60.0,
    "memory_order": ["dram", "l2", "shared"],
    # 50, not 60: Hopper counts the tensor pipe's peak at wgmma's rate, and mma.sync kernels top out near
    # 56% of it (H200, fwd-d128-s2048: the FA2 reference SDPA-flash 56%, v04 56%, cuDNN's wgmma 74%).
    # At 60 every mma.sync kernel at its own ceiling would read as latency-bound.
    "compute_pct": 50.0,
    # The busiest pipe names the compute bound when at least this busy.
    "pipe_pct": 50.0,
    # The origin's rule (seeds/002): more than 30% of shared wavefronts from bank conflicts: fix those first.
    "bank_conflict_frac": 0.30,
    # Bytes moved beyond this multiple of the byte floor are traffic a kernel could cut.
    "bytes_over_floor": 1.25,
}
ACTIONS = {
    "launch": "the launch costs more than the work: batch or fuse launches (CUDA graphs), and give one launch "
              "more CTAs (split the KV loop) so it fills the GPU",
    "memory:dram:above_floor": "DRAM-bound with {over:.2f}x the byte floor: cut the re-reads (keep tiles resident, "
                               "share K/V across the query heads of a group) before anything else",
    "memory:dram": "DRAM-bound at {over:.2f}x the byte floor: only fewer bytes help (a smaller KV dtype, "
                   "compression) or overlapping this kernel with its neighbours",
    "memory:dram:no_floor": "DRAM-bound: count the bytes that must move and compare",
    "memory:shared:conflicts": "shared-memory-bound with {conflicts:.0%} bank-conflict wavefronts: fix the "
                               "conflicts first (swizzle or pad the tiles)",
    "memory:shared": "shared-memory-bound: feed the math from registers and tensor cores (ldmatrix + mma) "
                     "instead of one shared load per FMA",
    "memory:l2": "L2-bound: improve reuse in L2 (tile order, swizzled CTA order)",
    "compute:tensor": "tensor-pipe-bound: move to the faster tensor path (wgmma on Hopper) or shrink the "
                      "non-matmul work around it",
    "compute:tensor:wgmma": "tensor-pipe-bound on wgmma already: overlap the softmax with the matmuls "
                            "(ping-pong warpgroups) and shrink the non-matmul work",
    "compute:fma": "FMA-pipe-bound: the matmuls belong on the tensor cores",
    "compute:alu": "ALU-bound: cut integer, compare and conversion work (masks, index math)",
    "compute:xu": "XU-bound (exp, conversions): exp2 with a folded scale, fewer conversions",
    "compute": "compute-bound on {pipe}: cut the instructions on that pipe",
    "latency:long_scoreboard": "waiting on global memory: more bytes in flight (deeper cp.async pipeline, more warps)",
    "latency:short_scoreboard": "waiting on shared memory: fewer shared round trips (ldmatrix, keep operands in registers)",
    "latency:mio_throttle": "shared-memory instruction queue full: wider shared accesses, fewer of them",
    "latency:lg_throttle": "global-memory instruction queue full: 16-byte vector loads, fewer of them",
    "latency:barrier": "warps wait at __syncthreads: fewer barriers, warp-specialised producer/consumer",
    "latency:wait": "fixed-latency dependency chains: more independent work per warp (ILP)",
    "latency:math_pipe_throttle": "the math pipe is saturated for the warps that run: raise occupancy or "
                                  "move the math to a wider pipe",
    "latency:not_selected": "enough eligible warps: the scheduler is busy; look at the instruction count",
    "latency": "latency-bound on {stall}: hide it with more parallel work per SM",
}


def decide(m: dict, tree: dict | None = None) -> dict:
    """Measured counters (summarize's row) -> {label, bound, unit, pipe, stall, reason, action}.

    label: 'launch', 'memory:<dram|l2|shared>', 'compute:<pipe family>' or 'latency:<stall>'.
    """
    verdict = _decide(m, {**TREE, **(tree or {})})
    detail = verdict["unit"] if verdict["bound"] == "memory" else _pipe_family(verdict["pipe"] or "") \
        if verdict["bound"] == "compute" else verdict["stall"] if verdict["bound"] == "latency" else None
    return {"label": verdict["bound"] + (f":{detail}" if detail else ""), **verdict}


def _decide(m: dict, t: dict) -> dict:
    """The tree itself (see decide).

    Order: launch (nothing else matters if the launch dominates), then the busiest of memory and
    compute at or above its threshold, else latency named by the top stall reason.
    """
    pipe, pipe_pct = _top(m.get("pipes") or {})
    stall = (m.get("stalls") or [{}])[0].get("reason")
    verdict = {"pipe": pipe, "pipe_pct": pipe_pct, "stall": stall, "unit": None}
    busiest = max(m.get("sm_pct") or 0, m.get("memory_pct") or 0)
    duration, host = m.get("duration_us"), m.get("host_us_per_call")
    short = duration is not None and duration < t["launch_us"]
    host_bound = bool(duration and host and host >= t["launch_host_ratio"] * duration)
    if (short or host_bound) and busiest < t["launch_idle_pct"]:
        why = f"{duration:.1f} us < {t['launch_us']:g} us" if short else f"a call costs {host:.1f} us of host time"
        if host:
            why += f" (back-to-back calls: {host:.1f} us each)" if short else f" for a {duration:.1f} us kernel"
        return {**verdict, "bound": "launch", "action": ACTIONS["launch"],
                "reason": f"{why}, every unit below {t['launch_idle_pct']:g}% ({busiest:.0f}%)"}
    levels = {"dram": m.get("dram_pct"), "l2": m.get("l2_pct"), "shared": m.get("l1_pct")}
    unit = next((u for u in t["memory_order"] if (levels.get(u) or 0) >= t["memory_pct"]), None)
    unit_pct = levels.get(unit) if unit else max((v for v in levels.values() if v is not None), default=0)
    compute = m.get("sm_pct") or 0
    compute_ok = compute >= t["compute_pct"] and pipe is not None and pipe_pct >= t["pipe_pct"]
    if unit and (not compute_ok or unit_pct >= compute):
        return {**verdict, "bound": "memory", "unit": unit, **_memory_action(unit, unit_pct, m, t)}
    if compute_ok:
        key = f"compute:{_pipe_family(pipe)}"
        if key == "compute:tensor" and (m.get("pipes") or {}).get("tensor_op_gmma", 0) >= 1.0:
            key = "compute:tensor:wgmma"
        return {**verdict, "bound": "compute", "action": ACTIONS.get(key, ACTIONS["compute"]).format(pipe=pipe),
                "reason": f"SM throughput {compute:.0f}% >= {t['compute_pct']:g}%, busiest pipe {pipe} {pipe_pct:.0f}%"}
    key = f"latency:{stall}"
    return {**verdict, "bound": "latency", "action": ACTIONS.get(key, ACTIONS["latency"]).format(stall=stall),
            "reason": f"no unit at its threshold (SM {compute:.0f}%, busiest memory level {unit_pct:.0f}%); "
                      f"top stall {stall}"}


def _memory_action(unit: str, pct: float, m: dict, t: dict) -> dict:
    reason = f"{unit} throughput {pct:.0f}% >= {t['memory_pct']:g}%"
    if unit == "dram":
        over = m.get("bytes_over_floor")
        if over is None:
            return {"reason": reason, "action": ACTIONS["memory:dram:no_floor"]}
        key = "memory:dram:above_floor" if over > t["bytes_over_floor"] else "memory:dram"
        return {"reason": f"{reason}, {over:.2f}x the byte floor", "action": ACTIONS[key].format(over=over)}
    if unit == "shared":
        conflicts = m.get("bank_conflict_frac") or 0
        key = "memory:shared:conflicts" if conflicts > t["bank_conflict_frac"] else "memory:shared"
        return {"reason": f"{reason}, bank conflicts {conflicts:.0%} of shared wavefronts",
                "action": ACTIONS[key].format(conflicts=conflicts)}
    return {"reason": reason, "action": ACTIONS["memory:l2"]}


def _pipe_family(pipe: str) -> str:
    for family in ("tensor", "fma", "alu", "xu"):
        if family in pipe:
            return family
    return pipe


def _top(values: dict):
    values = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    if not values:
        return None, None
    key = max(values, key=values.get)
    return key, values[key]


# ------------------------------------------------------------------ reading the report

def parse_raw_csv(text: str) -> list[dict]:
    """`ncu --import R --csv --page raw --print-units base` -> one {metric: value} per profiled kernel.

    Row 1 names the columns, row 2 gives units, then one row per kernel. Numbers may carry thousands
    separators; units are kept under row['_units'].
    """
    rows = list(csv.reader(io.StringIO(text.strip())))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None or len(rows) < start + 2:
        raise ValueError("not an ncu raw-page CSV export: no header row starting with \"ID\"")
    header, units = rows[start], rows[start + 1]
    kernels = []
    for raw in rows[start + 2:]:
        if len(raw) != len(header):
            continue
        row = {name: _number(value) for name, value in zip(header, raw)}
        row["_units"] = {name: unit for name, unit in zip(header, units) if unit}
        kernels.append(row)
    return kernels


def source_regions(text: str, block: int = 40, floor: float = 0.005) -> list[dict]:
    """Where the warps stall, by stretch of SASS, from ncu's source page as CSV (`ncu -i R --page source
    --csv --print-source sass`, a report taken with `--section SourceCounters`). One dict per block of
    `block` consecutive instructions holding at least `floor` of the stall samples: first (instruction index),
    share, stalls (top 3 reasons, samples) and ops (commonest 4 opcodes)."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if start is None:
        raise ValueError('not an ncu source-page CSV export: no header row starting with "Address"')
    header, data = rows[start], rows[start + 1:]
    ix = {h: i for i, h in enumerate(header)}
    samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(samples(r) for r in data) or 1
    out = []
    for a in range(0, len(data), block):
        seg = data[a:a + block]
        n = sum(samples(r) for r in seg)
        if n < floor * total:
            continue
        why, ops = collections.Counter(), collections.Counter()
        for r in seg:
            for c in reasons:
                why[c[len("stall_"):]] += int(r[ix[c]] or 0)
            words = r[ix["Source"]].split()
            ops[(words[1] if words[0].startswith("@") else words[0]) if words else ""] += 1
        out.append({"first": a, "share": n / total, "stalls": why.most_common(3), "ops": ops.most_common(4)})
    return out


def _number(value: str):
    text = value.strip().replace(",", "")
    try:
        return float(text) if text else None
    except ValueError:
        return value


_SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
          "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


def _get(raw: dict, *names, to: float = 1.0):
    """The first of `names` present with a number, scaled from its unit (time to us, bytes to bytes)."""
    for name in names:
        value = raw.get(name)
        if isinstance(value, float):
            unit = raw.get("_units", {}).get(name, "")
            return value * _SCALE.get(unit, 1.0) / to
    return None


_STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_PIPE = re.compile(r"^sm__(?:inst_executed_pipe_|pipe_)(\w+?)(?:_cycles_active)?\.avg\.pct_of_peak_sustained_active$")


def summarize(raw: dict) -> dict:
    """The lab's metrics from one kernel's raw counters (None where this ncu did not collect one)."""
    m = {
        "kernel": raw.get("Kernel Name"), "grid": raw.get("Grid Size"), "block": raw.get("Block Size"),
        "duration_us": _get(raw, "gpu__time_duration.sum"),
        "sm_pct": _get(raw, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "memory_pct": _get(raw, "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_pct": _get(raw, "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                         "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "l1_pct": _get(raw, "l1tex__throughput.avg.pct_of_peak_sustained_active"),
        "l2_pct": _get(raw, "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        "occupancy_pct": _get(raw, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "occupancy_theoretical_pct": _get(raw, "sm__maximum_warps_per_active_cycle_pct"),
        "issue_pct": _get(raw, "smsp__issue_active.avg.pct_of_peak_sustained_active",
                          "sm__inst_issued.avg.pct_of_peak_sustained_active"),
        "l2_hit_pct": _get(raw, "lts__t_sector_hit_rate.pct"),
        "registers": _get(raw, "launch__registers_per_thread"),
        "smem_bytes": sum(filter(None, (_get(raw, "launch__shared_mem_per_block_static"),
                                        _get(raw, "launch__shared_mem_per_block_dynamic")))),
        "local_bytes": _sum(raw, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),
        "waves": _get(raw, "launch__waves_per_multiprocessor"),
        "dram_bytes": _sum(raw, "dram__bytes_read.sum", "dram__bytes_write.sum"),
        "bank_conflicts_ld": _get(raw, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
        "bank_conflicts_st": _get(raw, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
        "fp32_flops": _fp32_flops(raw),
        "tensor_flops": _sum(raw, *(f"sm__ops_path_tensor_src_{s}.sum" for s in TENSOR_SOURCES)),
    }
    if m["fp32_flops"] is not None or m["tensor_flops"] is not None:
        m["measured_flops"] = (m["fp32_flops"] or 0) + (m["tensor_flops"] or 0)
    wavefronts = _sum(raw, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                      "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum")
    conflicts = (m["bank_conflicts_ld"] or 0) + (m["bank_conflicts_st"] or 0)
    m["bank_conflict_frac"] = conflicts / wavefronts if wavefronts else None
    pipes = {}
    for name, value in raw.items():
        if (match := _PIPE.match(name)) and isinstance(value, float):
            pipe = {"shared": "fp16_tensor_shared"}.get(match.group(1), match.group(1))  # not shared memory
            pipes[pipe] = max(value, pipes.get(pipe, 0.0))
    m["pipes"] = pipes
    m["tensor_pct"] = max((v for k, v in pipes.items() if "tensor" in k), default=None)
    stalls = [(match.group(1), value) for name, value in raw.items()
              if (match := _STALL.match(name)) and isinstance(value, float) and match.group(1) != "selected"]
    total = sum(v for _, v in stalls) or 1.0
    m["stalls"] = [{"reason": k, "cycles_per_issue": v, "share": v / total}
                   for k, v in sorted(stalls, key=lambda kv: -kv[1])[:5]]
    m["stall_total_cycles_per_issue"] = total if stalls else None
    return m


def _sum(raw: dict, *names):
    values = [_get(raw, n) for n in names]
    return sum(v for v in values if v is not None) if any(v is not None for v in values) else None


def _fp32_flops(raw: dict):
    ops = {"ffma": 2, "fadd": 1, "fmul": 1}
    values = {k: _get(raw, f"smsp__sass_thread_inst_executed_op_{k}_pred_on.sum") for k in ops}
    if all(v is None for v in values.values()):
        return None
    return sum(ops[k] * (v or 0) for k, v in values.items())


# ------------------------------------------------------------------ targets and cases

def find_case(name: str, dtype: str | None = None):
    """A case by name from any published case set; dtype re-types the bench sets (seed sizes stay fp16)."""
    for set_name in ("seed", "bench-fwd", "bench-decode", "tests", "decode-tests"):
        kwargs = {"dtype": dtype} if dtype and set_name.startswith("bench") else {}
        for case in case_sets.by_name(set_name, **kwargs):
            if case.name == name:
                return case
    raise ValueError(f"case {name!r} is in no case set of lab.cases")


def parse_target(target: str) -> tuple[str, str]:
    family, _, name = target.partition(":")
    if family not in ("fwd", "decode", "op", "sdpa") or not name:
        raise ValueError(f"target {target!r}: use fwd:<version>, decode:<version>, op:attention, op:decode "
                         f"or sdpa:<backend>")
    from . import ops

    table = {"fwd": ops.FWD, "decode": ops.DECODE, "op": {"attention": 1, "decode": 1},
             "sdpa": {b: 1 for b in bench.BACKENDS}}[family]
    if name not in table:
        raise ValueError(f"target {target!r}: {name!r} is not one of {sorted(table)}")
    return family, name


def kernel_source(target: str, case) -> str | None:
    """The .cu file whose kernel the target launches (None for SDPA)."""
    from . import ops

    family, name = parse_target(target)
    if family == "fwd":
        return ops.FWD[name].source
    if family == "decode":
        return ops.DECODE[name].source
    if family == "op" and name == "attention":  # the kernel lab.ops.attention picks on this GPU
        import torch

        capability = tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else (0, 0)
        return ops.FWD[ops.default_attention_version(case.D, case.Sq, case.causal, capability)].source
    if family == "op":
        return ops.DECODE[ops.default_decode_version(case.Hq, case.Hkv, case.q_len)].source
    return None


_GLOBAL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


def kernel_regex(target: str, case) -> str:
    """The name filter: the __global__ functions defined in the target's own .cu (not its headers)."""
    source = kernel_source(target, case)
    if source is None:
        return SDPA_KERNELS[parse_target(target)[1]]
    names = _GLOBAL.findall((paths.KERNELS / source).read_text())
    if not names:
        raise ValueError(f"{source} defines no __global__ function to profile")
    return "|".join(sorted(set(names)))


def make_call(target: str, case):
    """A zero-argument call launching the target on fresh inputs for the case (CUDA needed)."""
    from . import ops, sweep

    family, name = parse_target(target)
    q, k, v, arg = sweep.case_inputs(case)  # arg: is_causal (forward) or cache_seqlens (decode)
    if family == "fwd":
        return ops.fwd_call_factory(name)(q, k, v, arg)
    if family == "decode":
        return ops.decode_call_factory(name)(q, k, v, arg)
    if family == "op":
        return (sweep.public_attention() if name == "attention" else sweep.public_decode())(q, k, v, arg)
    runner = bench.sdpa_runner("default", q, k, v, arg if isinstance(arg, bool) else False)

    def sdpa():
        with bench.sdpa_backend(name):
            return runner()
    return sdpa


def byte_floor(case) -> int:
    """Bytes that must move: Q, K, V read once and O written once (decode: bench.decode_bytes)."""
    if isinstance(case, case_sets.DecodeCase):
        return bench.decode_bytes(case.lengths(), case.Hq, case.Hkv, case.q_len, case.D)
    return 2 * 2 * case.D * (case.B * case.Hq * case.Sq + case.B * case.Hkv * case.Sk)


def work_flops(case) -> float:
    if isinstance(case, case_sets.DecodeCase):
        return sum(bench.attention_flops(1, case.Hq, case.q_len, n, case.D, False) for n in case.lengths())
    return bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal)


# ------------------------------------------------------------------ running ncu

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
                full: bool = False) -> list[str]:
    cmd = [ncu, "--clock-control", "none", "--cache-control", "all", "-k", f"regex:{regex}",
           "--launch-skip", str(skip), "--launch-count", "1", "-f", "-o", str(out_base)]
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
        cmd = ncu_command(ncu, child, regex, warmup, base, nvtx=target.startswith("sdpa:"), full=full)
        proc = subprocess.run(cmd, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        log = proc.stdout + proc.stderr
        rep = base.with_suffix(".ncu-rep")
        if proc.returncode == 0 and rep.exists() and "No kernels were profiled" not in log:
            return rep, "full" if full else "sections"
        if not re.search(r"[Ff]ailed to find (metric|section)|[Ii]nvalid (metric|section)|not found", log):
            break
    raise ProfileUnavailable(explain_failure(log, regex, warmup))


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


# ------------------------------------------------------------------ one profile -> one record

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
    row = row_from_raw(kernels[0], target, case, source, host_us)
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
    from . import build

    m = summarize(raw)
    m["host_us_per_call"] = host_us
    floor = byte_floor(case)
    m["byte_floor"] = floor
    m["bytes_over_floor"] = m["dram_bytes"] / floor if m.get("dram_bytes") and floor else None
    m["flops"] = work_flops(case)
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


# ------------------------------------------------------------------ what the chapter profiles and shows

# The four known answers: (target, case, label the tree must reach). The tree never reads this.
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

    from .plot import save_figure

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

    from .plot import save_figure

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


# ------------------------------------------------------------------ the child and the command line

def child_main(target: str, case_name: str, warmup: int, dtype: str | None = None) -> int:
    """Inside ncu: warm-up launches, then the profiled one, all inside one NVTX range."""
    import torch

    fn = make_call(target, find_case(case_name, dtype))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    for _ in range(warmup + 1):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.profile", description=__doc__.split("\n")[0])
    parser.add_argument("target", help="child | fwd:v04 | decode:v02 | op:attention | op:decode | sdpa:flash ...")
    parser.add_argument("rest", nargs="+", help="case name (after 'child': target and case)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dtype", help="dtype of a bench case (default: the case set's own)")
    args = parser.parse_args(argv)
    if args.target == "child":
        return child_main(args.rest[0], args.rest[1], args.warmup, args.dtype)
    try:
        row = measure(args.target, args.rest[0], args.warmup, dtype=args.dtype)
    except ProfileUnavailable as err:
        print(f"no profile: {err}", file=sys.stderr)
        return 1
    m, v = row["metrics"], row["verdict"]
    print(f"{row['impl']} on {args.rest[0]}: {m['kernel']} {m['duration_us']:.1f} us; {v['bound']}-bound "
          f"({v['reason']}); next: {v['action']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
