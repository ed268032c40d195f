"""Why lab.ops.attention can time slower than its own kernel (n9, issue 15): host time or GPU time?

For each cell, on the same inputs: the public op as users call it, the same kernel through the kernel-only
factory (preallocated output), that launch with an output allocated per call, and SDPA-cuDNN; the public op
and the kernel-only call appear twice (rows "... (again)"), so the spread between two copies of one call is
the noise any other difference has to beat. LAB_GAP_VARIANT=NAME=VALUE adds the kernel built again with a
define. Each call is timed four ways:
  cold   one call after an L2 flush (lab.bench.CudaTimer, what the sweeps record), in rounds
  slept  as cold, with a GPU sleep of ~50 us queued after the flush (SleptTimer): the host always finishes
         its launch before the timed window opens, so host time left in `cold` shows as cold - slept
  queued 50 calls back to back between two events: the host runs ahead, so host time is hidden
  host   microseconds of Python + launch per call while the GPU is kept busy (perf_counter)
Usage: python tests/cuda/public_op_gap.py [out.json]   (LAB_GAP_CASES=name,name: the cells; default below)
"""
import contextlib
import json
import os
import sys

import torch

from lab import bench, build, cases, ops, sweep
from event_timing import host_us  # tests/cuda/ is the script's own directory


def queued_ms(fn, n=50):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


class SleptTimer(bench.CudaTimer):
    """lab.bench.CudaTimer with a GPU sleep between the flush and the timed window (see `slept` above)."""

    def _settle(self) -> None:
        self._torch.cuda._sleep(100_000)  # ~50 us at 1.98 GHz: longer than any host path measured here


CELLS = "fwd-d128-s512,fwd-d128-s512-c,fwd-d128-s2048,fwd-d128-s2048-c,fwd-d64-s2048,fwd-d64-s8192-c"


def main():
    out = []
    grid = {c.name: c for c in cases.bench_fwd_cases("bfloat16")}
    print(torch.cuda.get_device_name(), torch.__version__)
    for name in os.environ.get("LAB_GAP_CASES", CELLS).split(","):
        case = grid[name]
        q, k, v, causal = sweep.case_inputs(case)
        version = ops.attention_version(q, None, causal)
        kernel_only = ops.fwd_call_factory(version)
        address, bind, scale = ops.launcher(ops.FWD, version), build.binding(), ops._scale(None, q.shape[-1])
        calls = {  # the public op and its kernel, each twice (the noise floor), and SDPA-cuDNN
            "lab.ops.attention": lambda: ops.attention(q, k, v, is_causal=causal),
            f"{version} kernel only": kernel_only(q, k, v, causal),
            "sdpa-cudnn": bench.sdpa_runner("default", q, k, v, causal),
            "lab.ops.attention (again)": lambda: ops.attention(q, k, v, is_causal=causal),
            f"{version} kernel only (again)": kernel_only(q, k, v, causal),
            # the kernel-only launch with an output allocated per call, as the public op does
            f"{version} kernel only, fresh output": lambda: bind.attn_fwd(address, q, k, v, torch.empty_like(q), None,
                                                                          scale, causal, None),
        }
        variant = os.environ.get("LAB_GAP_VARIANT")  # e.g. "NAME=0": the same source built again with a define
        if variant:
            name_, _, value = variant.partition("=")
            calls[f"{version}:{variant} kernel only"] = ops.fwd_call_factory(version, {name_: value})(q, k, v, causal)
        ctx = {"sdpa-cudnn": lambda: bench.sdpa_backend("cudnn")}
        cold = bench.time_interleaved({n: (fn, ctx.get(n)) for n, fn in calls.items()}, budget_s=1.0)
        slept = bench.time_interleaved({n: (fn, ctx.get(n)) for n, fn in calls.items()}, timer=SleptTimer(),
                                      budget_s=1.0)
        for label, fn in calls.items():
            with ctx.get(label, contextlib.nullcontext)():
                row = {"case": name, "call": label, "version": version, "cold": cold[label].as_dict(),
                       "slept": slept[label].as_dict(), "queued_ms": queued_ms(fn), "host_us": host_us(fn)}
            out.append(row)
            c, s = row["cold"], row["slept"]
            print(f"{name:<16} {label:<26} cold {c['median_ms']:.4f} ({c['q1_ms']:.4f}-{c['q3_ms']:.4f}, n {c['n']})"
                  f"  slept {s['median_ms']:.4f} ({s['q1_ms']:.4f}-{s['q3_ms']:.4f}, n {s['n']})"
                  f"  queued {row['queued_ms']:.4f}  host {row['host_us']:5.1f} us", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "commit": os.environ.get("LAB_COMMIT"), "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
