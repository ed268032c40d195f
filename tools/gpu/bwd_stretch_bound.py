"""What bounds the backward's TFLOP/s at the stretch cells (D = 128, S 8192 / 16384, non-causal) as users call it:
the public op's backward and SDPA-cuDNN's, timed cold in rounds (lab.bench.time_interleaved, the chapter's
timer), with the SM clock and the power sampled by nvidia-smi while they run; then torch.profiler's kernel list
of a few calls of each, back to back and again with an L2 flush and a synchronize before each call (as the timed
calls run), so the main kernel's own time is read beside the passes around it (the D pre-pass, dQ's conversion)
and beside the cold call's window; last, the timed window itself under the profiler, taken apart into host lag,
kernels and the gaps between them (window_parts). TFLOP/s: 2.5x the forward's FLOPs over each time.

Prediction (from the profile of one launch, 4419 us = 622 TFLOP/s, beside the call's 5054 us): the main kernel
under sustained load takes 8-12 % longer than its lone profiled launch (the SM clock below its boost), and the
passes around it about 0.13 ms; cuDNN's kernel the same ratio.
Outcome (H100, outputs/driver_logs/20261126-h100-bwd-stretch-bound-1c70220/): the main kernel takes 4361-4372 us
at S = 8192 (625-633 TFLOP/s at both S), back to back and cold alike, the SM clock at 1980 MHz while profiled, so
the clock is not what the race loses; the window holds 9-11 % more than the kernels' sum, for cuDNN as for ours
(window_parts says where).
Usage: python3 tools/gpu/bwd_stretch_bound.py OUT_JSONL [--window-only]
"""
import json
import os
import statistics
import subprocess
import sys

import torch

from lab import bench, cases, env
from lab.backward.harness import ours_step, sdpa_step
from lab.sweep import _inputs_fwd

CELLS = ("bwd-d128-s8192", "bwd-d128-s16384")


def clocks_while(fn):
    """fn() with nvidia-smi sampling the SM clock (MHz) and power (W) every 50 ms; returns (result, samples)."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    try:
        result = fn()
    finally:
        smi.terminate()
    samples = []
    for line in smi.communicate()[0].splitlines():
        try:
            mhz, watts = (float(x) for x in line.split(","))
            samples.append((mhz, watts))
        except ValueError:
            pass
    return result, samples


def kernel_times(fn, calls: int = 5, flush=None) -> dict:
    """{kernel name: mean us per call} over `calls` calls (after one untimed): back to back, or with `flush` zeroed
    and the device synchronized before each (the flush's own fill kernel is left out)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if flush is not None:
                flush.zero_()
                torch.cuda.synchronize()
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us > 0 and not (flush is not None and "FillFunctor" in e.key):
            out[e.key[:90]] = round(us / calls, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def window_parts(calls: dict, rounds: int = 4) -> dict:
    """The cold timed window taken apart: `rounds` rounds of lab.bench's CudaTimer over `calls` (as the race times
    them) under torch.profiler; each call's kernels are those between one flush (the fill kernel) and the next.
    Per call (medians over the rounds, us): the event window; the flush's end to the first kernel's start (host
    lag); the first kernel's start to the last one's end (span); the kernels' summed durations; span - sum (gaps)."""
    timer = bench.CudaTimer()
    windows = {label: [] for label in calls}
    for label, (fn, _) in calls.items():
        timer(fn)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for label, (fn, _) in calls.items():
                windows[label].append(timer(fn) * 1e3)
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    segments, current = [], None
    for e in kernels:
        if "FillFunctor" in e.name:
            current = {"flush_end": e.time_range.end, "kernels": []}
            segments.append(current)
        elif current is not None:
            current["kernels"].append(e)
    parts = {label: {"window": [], "host_lag": [], "span": [], "kernel_sum": [], "gaps": []} for label in calls}
    order = [label for _ in range(rounds) for label in calls]
    for label, seg in zip(order, segments):
        ks = seg["kernels"]
        if not ks:
            continue
        span = ks[-1].time_range.end - ks[0].time_range.start
        total = sum(k.time_range.end - k.time_range.start for k in ks)
        p = parts[label]
        p["host_lag"].append(ks[0].time_range.start - seg["flush_end"])
        p["span"].append(span)
        p["kernel_sum"].append(total)
        p["gaps"].append(span - total)
    for label in calls:
        parts[label]["window"] = windows[label]
    return {label: {k: round(statistics.median(v), 1) for k, v in p.items() if v} for label, p in parts.items()}


def main(path):
    fingerprint = dict(env.fingerprint(), commit=os.environ.get("LAB_COMMIT"))
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(max(2 * getattr(props, "L2_cache_size", 64 * 2**20), 64 * 2**20) // 4, device="cuda")
    with open(path, "a") as f:
        for name in CELLS:
            case = next(c for c in cases.bench_bwd_cases() if c.name == name)
            q, k, v = _inputs_fwd(case, seed=0)
            dout = _inputs_fwd(case, seed=1)[0]
            calls = {"lab.ops.attention (backward)": (ours_step("bwd", q, k, v, False, dout), None),
                     "sdpa-cudnn (backward)": (sdpa_step("cudnn", "bwd", q, k, v, False, dout), None)}
            times, samples = clocks_while(lambda: bench.time_interleaved(calls))
            flops = 2.5 * bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, False)
            if "--window-only" in sys.argv:
                row = {"kind": "stretch-window", "case": name, "env": fingerprint, "window_parts_us": window_parts(calls)}
                print(json.dumps({k: v for k, v in row.items() if k != "env"}, indent=1))
                f.write(json.dumps(row) + "\n")
                continue
            row = {"kind": "stretch-bound", "case": name, "env": fingerprint,
                   "median_ms": {n: round(t.median_ms, 4) for n, t in times.items()},
                   "tflops": {n: round(flops / t.median_ms / 1e9, 1) for n, t in times.items()},
                   "sm_mhz": {"median": statistics.median(s[0] for s in samples), "min": min(s[0] for s in samples),
                              "max": max(s[0] for s in samples)} if samples else None,
                   "power_w": {"median": statistics.median(s[1] for s in samples),
                               "max": max(s[1] for s in samples)} if samples else None,
                   "kernels_us": {}}
            for label, (fn, _) in calls.items():
                for how, f_ in (("back to back", None), ("cold", flush)):
                    (kt, ks) = clocks_while(lambda: kernel_times(fn, flush=f_))
                    row["kernels_us"].setdefault(how, {})[label] = kt
                    top = next(iter(kt.values()))
                    row.setdefault("main_kernel_tflops", {}).setdefault(how, {})[label] = round(flops / top / 1e6, 1)
                    row.setdefault("profiled_sm_mhz", {}).setdefault(how, {})[label] = \
                        statistics.median(s[0] for s in ks) if ks else None
            row["window_parts_us"] = window_parts(calls)
            print(json.dumps({k: v for k, v in row.items() if k != "env"}, indent=1))
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
