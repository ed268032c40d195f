"""Where the paged decode's time goes, on the serving cells (GPU only): a race, a copy ceiling and Nsight Compute.

Cells: Hq 32 over Hkv 8, D 128, bf16, one new token, every sequence full, B x L in lab.cases.PAGED_CELLS, pages
16/64/256 shuffled in the pool (lab.decode.paged). Every call is the public op, lab.ops.decode, with the version
named (`version=`), the graph-safe paged call (page_errors given), beside SDPA-cuDNN on the contiguous cache.

    python tools/gpu/paged_profile.py race OUT.jsonl   # per impl: eager, GPU-only, graph replay (us), host (us)
    python tools/gpu/paged_profile.py ncu OUT_DIR      # one ncu process, one launch per (cell, impl)
    python tools/gpu/paged_profile.py child            # what ncu runs (NVTX range around each profiled launch)

Timers (lab.bench): eager = CudaTimer (L2 flushed, one call between events: host path included where it is
longer than the flush); gpu = GpuTimeTimer (a GPU sleep queued first: the call's GPU work alone); graph = the
call captured once (lab.graphs.capture), a replay timed by CudaTimer; host = lab.hostcost.host_us with the GPU
busy. copy: a device-to-device copy of the cell's K and V bytes (read + written), the cell's own ceiling.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import torch

from lab import bench, graphs, hostcost, ops
from lab.cases import PAGED_CELLS, PagedCase
from lab.decode import paged

PAGES = (16, 64, 256)
VERSIONS = tuple(os.environ.get("PAGED_PROFILE_VERSIONS", "v03 v04").split())
CONTIGUOUS = tuple(os.environ.get("PAGED_PROFILE_CONTIGUOUS", "v02 v04").split())
KERNELS = "regex:partial_kernel|cudnn|sdpa|fmha|flash_fprop"  # pass 1 of ours (not the combine), cuDNN's kernel
NCU_SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "MemoryWorkloadAnalysis", "SchedulerStats",
                "WarpStateStats", "InstructionStats")


def env() -> dict:
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT"),
            "sms": torch.cuda.get_device_properties(0).multi_processor_count}


HEAD_DIM = int(os.environ.get("PAGED_PROFILE_D", "128"))  # the cells' D (ncu and child; the race keeps 128)


def cell_inputs(B: int, L: int, page: int, seed: int = 0, D: int = 128):
    case = PagedCase(f"pg-p{page}-b{B}-kv{L}", B, 32, 8, 1, L, D, "bfloat16", (), page)
    return case, paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(seed), "cuda")


def calls(a: dict, page_tag: str, with_contiguous: bool) -> dict:
    """{impl: zero-argument call}: the paged public op per version, and (once per cell) the contiguous ones."""
    q, flags = a["q"], torch.zeros(a["q"].shape[0], dtype=torch.int32, device="cuda")
    out = {}
    if with_contiguous:
        runner = bench.sdpa_runner("default", q, a["k"], a["v"])

        def cudnn():
            with bench.sdpa_backend("cudnn"):
                return runner()
        out["sdpa-cudnn"] = cudnn
        for v in CONTIGUOUS:
            out[f"contiguous {v}"] = (lambda v=v: ops.decode(q, a["k"], a["v"], version=v))
    for v in VERSIONS:
        out[f"paged {v} {page_tag}"] = (lambda v=v: ops.decode(q, a["k_pages"], a["v_pages"], a["seqlens"],
                                                               block_table=a["table"], page_errors=flags, version=v))
    out[f"paged default+eager-check {page_tag}"] = lambda: ops.decode(q, a["k_pages"], a["v_pages"], a["seqlens"],
                                                                       block_table=a["table"])
    return out


def copy_us(nbytes: int) -> float:
    """GPU time of a device-to-device copy of nbytes (read nbytes + write nbytes), L2 flushed."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    return bench.time_fn(lambda: dst.copy_(src), timer=bench.GpuTimeTimer(), min_reps=10).median_ms * 1e3


def race(path: str) -> None:
    e = env()
    ceil = bench.ceilings()
    gpu_timer, eager_timer = bench.GpuTimeTimer(), bench.CudaTimer()
    with open(path, "a") as f:
        f.write(json.dumps({"kind": "ceiling", **ceil, **e}) + "\n")
        for B, L in PAGED_CELLS:
            kv_bytes = 2 * B * 8 * L * 128 * 2
            copy = copy_us(kv_bytes)
            for i, page in enumerate(PAGES):
                case, a = cell_inputs(B, L, page)
                fns = calls(a, f"p{page}", i == 0)
                eager = bench.time_interleaved({k: (fn, None) for k, fn in fns.items()}, eager_timer)
                gpu = bench.time_interleaved({k: (fn, None) for k, fn in fns.items()}, gpu_timer)
                graph = {}
                for k, fn in fns.items():
                    if "eager-check" in k:
                        continue
                    g, _ = graphs.capture(fn)
                    graph[k] = bench.time_fn(g.replay, timer=eager_timer)
                for k, fn in fns.items():
                    row = {"kind": "paged-profile-race", "cell": f"{B}x{L}", "B": B, "L": L, "page_size": page,
                           "impl": k, "kv_bytes": kv_bytes, "copy_us_same_bytes": copy,
                           "copy_gbps_same_bytes": 2 * kv_bytes / copy / 1e3, **e}
                    for name, t in (("eager", eager.get(k)), ("gpu", gpu.get(k)), ("graph", graph.get(k))):
                        if isinstance(t, bench.Timing):
                            row[f"{name}_us"] = round(t.median_ms * 1e3, 2)
                            row[f"{name}_gbps"] = round(kv_bytes / t.median_ms / 1e6, 1)
                        elif t is not None:
                            row[f"{name}_error"] = str(t)
                    row["host_us"] = round(hostcost.host_us(fn, calls=50, busy=True), 2)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    print(f"{B}x{L} p{page} {k:34s} eager {row.get('eager_us')} gpu {row.get('gpu_us')} "
                          f"graph {row.get('graph_us')} host {row['host_us']} (copy of the same bytes {copy:.1f} us)",
                          flush=True)
                del a, fns
                torch.cuda.empty_cache()


PROFILE_PAGES = tuple(int(p) for p in os.environ.get("PAGED_PROFILE_PAGES", "16 256").split())
# B x L cells to profile (PAGED_PROFILE_CELLS="64x1024 1x131072"; all of PAGED_CELLS by default)
PROFILE_CELLS = tuple(tuple(int(x) for x in c.split("x")) for c in os.environ.get("PAGED_PROFILE_CELLS", "").split()) \
    or PAGED_CELLS


def child() -> None:
    """Warm every target up, then one launch each inside an NVTX range (ncu --nvtx-include lab.profile/); the
    targets' order is printed so the report's kernels can be matched (one pass-1 kernel per target)."""
    order = []
    for B, L in PROFILE_CELLS:
        for i, page in enumerate(PROFILE_PAGES):
            _, a = cell_inputs(B, L, page, D=HEAD_DIM)
            fns = {k: fn for k, fn in calls(a, f"p{page}", i == 0).items() if "eager-check" not in k}
            for k, fn in fns.items():
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push("lab.profile")
                fn()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_pop()
                order.append(f"{B}x{L}|p{page}|{k}")
            del a, fns
            torch.cuda.empty_cache()
    print("ORDER " + json.dumps(order), flush=True)


def ncu(out_dir: str) -> None:
    from lab.profile import counters, find_ncu

    os.makedirs(out_dir, exist_ok=True)
    rep = os.path.join(out_dir, "paged_profile")
    cmd = [find_ncu(), "--clock-control", "none", "--cache-control", "all", "--nvtx", "--nvtx-include", "lab.profile/",
           "-k", KERNELS, "-f", "-o", rep]
    for s in NCU_SECTIONS:
        cmd += ["--section", s]
    cmd += ["--metrics", "dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed.sum,"
            "smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct",
            sys.executable, __file__, "child"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    open(os.path.join(out_dir, "ncu.log"), "w").write(log[-20000:])
    order = json.loads(next(line for line in log.splitlines() if line.startswith("ORDER "))[6:])
    raw = subprocess.run([find_ncu(), "--import", rep + ".ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                         capture_output=True, text=True).stdout
    open(os.path.join(out_dir, "raw.csv"), "w").write(raw)
    kernels = counters.parse_raw_csv(raw)
    e = env()
    with open(os.path.join(out_dir, "profile.jsonl"), "w") as f:
        for target, kraw in zip(order, kernels):
            cell, page, impl = target.split("|")
            m = counters.summarize(kraw)
            m["warp_inst"] = counters._get(kraw, "smsp__inst_executed.sum")
            f.write(json.dumps({"kind": "paged-profile-ncu", "cell": cell, "page": page, "impl": impl, "D": HEAD_DIM,
                                "metrics": m, **e}) + "\n")
            stalls = ", ".join(f"{s['reason']} {s['share']:.0%}" for s in m["stalls"][:3])
            print(f"{cell:10s} {page:5s} {impl:22s} {str(m['kernel'])[:28]:28s} {m['duration_us']:8.1f} us dram "
                  f"{m['dram_pct']:5.1f}% issue {m['issue_pct'] or 0:5.1f}% occ {m['occupancy_pct'] or 0:4.1f}% "
                  f"inst {m['warp_inst'] or 0:.3g} | {stalls}", flush=True)
    print(f"ncu: {len(kernels)} kernels for {len(order)} targets in {time.time() - start:.0f} s, rc={proc.returncode}")


if __name__ == "__main__":
    {"race": lambda: race(sys.argv[2]), "ncu": lambda: ncu(sys.argv[2]), "child": child}[sys.argv[1]]()
