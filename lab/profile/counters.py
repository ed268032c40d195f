"""Reading an ncu report: the raw page's CSV export -> one dict per profiled launch, reduced to the metrics
row the decision tree reads (summarize); the source page's per-instruction samples -> the hot stretches of
SASS (source_regions). Pure Python: runs on the committed exports without a GPU.
"""
from __future__ import annotations

import collections
import csv
import io
import re

TENSOR_SOURCES = ("bf16_dst_fp32", "fp16", "tf32_dst_fp32", "fp8_sparsity_off")  # tensor-core ops = FLOPs


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
