"""Why lab.ops.attention times slower than its own kernel on short rows (n9, S = 512): host time or GPU time?

For each cell, three calls on the same inputs: the public op as users call it, the same kernel through the
kernel-only factory (preallocated output), and SDPA-cuDNN. Each is timed three ways:
  cold   one call after an L2 flush (lab.bench.CudaTimer, what the sweeps record), in rounds
  queued 50 calls back to back between two events: the host runs ahead, so host time is hidden
  host   microseconds of Python + launch per call while the GPU is kept busy (perf_counter)
If `queued` agrees and `cold` does not, the gap is host time not hidden behind the flush.
Usage: python tests/cuda/public_op_gap.py [out.json]
"""
import contextlib
import json
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


def main():
    out = []
    grid = {c.name: c for c in cases.bench_fwd_cases("bfloat16")}
    print(torch.cuda.get_device_name(), torch.__version__)
    for name in ("fwd-d128-s512", "fwd-d64-s512", "fwd-d128-s512-c", "fwd-d128-s2048"):
        case = grid[name]
        q, k, v, causal = sweep.case_inputs(case)
        version = ops.attention_version(q, None, causal)
        address, bind, scale = ops.launcher(ops.FWD, version), build.binding(), 1 / q.shape[-1] ** 0.5
        calls = {  # the public op, then the layers under it down to the bare launch
            "lab.ops.attention": lambda: ops.attention(q, k, v, is_causal=causal),
            "lab.ops.attention (full path)": lambda: ops.attention(q, k, v, is_causal=causal, version=version),
            "_attention_impl": lambda: ops._attention_impl(q, k, v, causal, scale, version, False),
            "binding.attn_call": lambda: bind.attn_call(address, q, k, v, scale, causal, False),
            "attn_fwd + empty_like": lambda: bind.attn_fwd(address, q, k, v, torch.empty_like(q), None, scale, causal,
                                                           None),
            f"{version} kernel only": ops.fwd_call_factory(version)(q, k, v, causal),
            "sdpa-cudnn": bench.sdpa_runner("default", q, k, v, causal),
        }
        ctx = {"sdpa-cudnn": lambda: bench.sdpa_backend("cudnn")}
        cold = bench.time_interleaved({n: (fn, ctx.get(n)) for n, fn in calls.items()})
        for label, fn in calls.items():
            with ctx.get(label, contextlib.nullcontext)():
                row = {"case": name, "call": label, "cold_ms": cold[label].median_ms, "queued_ms": queued_ms(fn),
                       "host_us": host_us(fn)}
            out.append(row)
            print(f"{name:<16} {label:<24} cold {row['cold_ms']:.4f} ms  queued {row['queued_ms']:.4f} ms  "
                  f"host {row['host_us']:6.1f} us")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
