"""Where the cold backward call's wait before its first kernel comes from (D = 128, non-causal, S 8192 / 16384).

The chapter's cold timer (lab.bench.CudaTimer: flush L2, record the start event, call, record the end event)
shows 0.34-0.77 ms between the flush's end and the call's first kernel, for SDPA-cuDNN's call as for ours, and
longer at the larger S although the calls' tensors have the same size at both S (B·S fixed). Two readings:
the host issues the first launch late (host work), or the launch is issued in time and the kernel starts late
(the GPU or the driver). This probe runs the same timer under torch.profiler with CPU activity as well, exports
the trace, and per call pairs the first kernel with the runtime call that launched it (their correlation id):
  flush end -> launch call start (host lag), launch call start -> kernel start (launch latency).
It also names the host's slowest operators between the start event and that launch, and times the same calls
with lab.bench.GpuTimeTimer (a GPU sleep queued before the window, so the host issues the call while the GPU
sleeps) beside CudaTimer.
Usage: python3 tools/gpu/bwd_host_lag.py OUT_DIR
"""
import json
import os
import statistics
import sys

import torch

from lab import bench, cases, env
from lab.backward.harness import ours_step, sdpa_step
from lab.sweep import _inputs_fwd

CELLS = ("bwd-d128-s2048", "bwd-d128-s8192", "bwd-d128-s16384")
LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")


def marked_timer(flush):
    """lab.bench.CudaTimer's steps, each under a profiler label so the trace shows where the host is."""
    def timer(fn, label):
        with torch.profiler.record_function(f"flush|{label}"):
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.profiler.record_function(f"call|{label}"):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    return timer


def parse(trace_path, labels, rounds):
    """Per call: flush end, first launch's host start, first kernel start, last kernel end (us), from the trace."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    runtime = {e["args"].get("correlation"): e for e in events
               if e.get("cat") in ("cuda_runtime", "cuda_driver") and "args" in e}
    marks = sorted((e for e in events if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    out = {label: {"host_lag": [], "launch_latency": [], "flush_to_kernel": [], "call_host": [], "span": []}
           for label in labels}
    slow = {label: {} for label in labels}
    calls = [m for m in marks if m["name"].startswith("call|")]
    for m in calls:
        label = m["name"].split("|", 1)[1]
        if label not in out:
            continue
        t0, t1 = m["ts"], m["ts"] + m["dur"]
        # the call's kernels: launched by runtime calls inside the call's host span
        mine = [k for k in kernels if (r := runtime.get(k["args"].get("correlation"))) is not None
                and t0 <= r["ts"] <= t1 and "FillFunctor" not in k["name"]]
        if not mine:
            continue
        first = min(mine, key=lambda k: k["ts"])
        flushes = [k for k in kernels if "FillFunctor" in k["name"] and k["ts"] < first["ts"]]
        if not flushes:
            continue
        flush_end = flushes[-1]["ts"] + flushes[-1]["dur"]  # the flush just before the call (kernels sorted by start)
        launch = runtime[first["args"]["correlation"]]
        o = out[label]
        o["host_lag"].append(launch["ts"] - flush_end)
        o["launch_latency"].append(first["ts"] - launch["ts"])
        o["flush_to_kernel"].append(first["ts"] - flush_end)
        o["call_host"].append(m["dur"])
        o["span"].append(max(k["ts"] + k["dur"] for k in mine) - first["ts"])
        for op in ops:
            if t0 <= op["ts"] and op["ts"] + op["dur"] <= launch["ts"]:
                slow[label][op["name"]] = slow[label].get(op["name"], 0) + op["dur"] / rounds
    med = {label: {k: round(statistics.median(v), 1) for k, v in o.items() if v} for label, o in out.items()}
    for label in labels:
        top = sorted(slow[label].items(), key=lambda kv: -kv[1])[:8]
        med[label]["host_ops_before_first_launch_us"] = {k: round(v, 1) for k, v in top}
    return med


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    fingerprint = dict(env.fingerprint(), commit=os.environ.get("LAB_COMMIT"))
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(max(2 * getattr(props, "L2_cache_size", 64 * 2**20), 64 * 2**20) // 4, device="cuda")
    rows = []
    for name in CELLS:
        case = next(c for c in cases.bench_bwd_cases() if c.name == name)
        q, k, v = _inputs_fwd(case, seed=0)
        dout = _inputs_fwd(case, seed=1)[0]
        calls = {"ours": ours_step("bwd", q, k, v, False, dout), "cudnn": sdpa_step("cudnn", "bwd", q, k, v, False, dout)}
        timer, rounds = marked_timer(flush), 6
        for label, fn in calls.items():
            timer(fn, label)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        windows = {label: [] for label in calls}
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(rounds):
                for label, fn in calls.items():
                    windows[label].append(timer(fn, label) * 1e3)
        trace = os.path.join(out_dir, f"trace-{name}.json")
        prof.export_chrome_trace(trace)
        parts = parse(trace, list(calls), rounds)
        flops = 2.5 * bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, False)
        timed = {}
        for tname, t in (("CudaTimer", bench.CudaTimer()), ("GpuTimeTimer", bench.GpuTimeTimer())):
            res = bench.time_interleaved({label: (fn, None) for label, fn in calls.items()}, t)
            timed[tname] = {label: {"ms": round(r.median_ms, 4), "tflops": round(flops / r.median_ms / 1e9, 1)}
                            for label, r in res.items()}
        row = {"kind": "bwd-host-lag", "case": name, "env": fingerprint,
               "window_us_profiled": {lb: round(statistics.median(w), 1) for lb, w in windows.items()},
               "parts_us": parts, "timed": timed}
        print(json.dumps({k: v for k, v in row.items() if k != "env"}, indent=1), flush=True)
        rows.append(row)
        with open(os.path.join(out_dir, "host_lag.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        del q, k, v, dout, calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
