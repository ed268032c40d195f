"""Where a short backward's time goes: for bench-bwd cells, the public op's backward and SDPA-cuDNN's, each
timed cold in rounds (bench.time_interleaved, as the race) and in GPU time (bench.GpuTimeTimer), then
torch.profiler's kernel list of one call of each. The cold time minus the GPU time is the host's share.
Usage: python3 tools/gpu/bwd_short_breakdown.py bwd-d128-s512,bwd-d64-s512 [VERSION]
(VERSION: a backward version for the public op, through LAB_BWD_VERSION, when the op reads it)
"""
import sys

import torch

from lab import bench, cases
from lab.backward.harness import ours_step, sdpa_step
from lab.sweep import _inputs_fwd


def main(names):
    for name in names:
        case = next(c for c in cases.bench_bwd_cases() if c.name == name)
        q, k, v = _inputs_fwd(case, seed=0)
        dout = _inputs_fwd(case, seed=1)[0]
        steps = {"lab.ops.attention": ours_step("bwd", q, k, v, case.causal, dout),
                 "sdpa-cudnn": sdpa_step("cudnn", "bwd", q, k, v, case.causal, dout)}
        cold = bench.time_interleaved({n: (fn, None) for n, fn in steps.items()})
        gpu = bench.time_interleaved({n: (fn, None) for n, fn in steps.items()}, timer=bench.GpuTimeTimer())
        print(f"== {name}")
        for n in steps:
            print(f"{n:20s} cold {cold[n].median_ms * 1e3:8.1f} us   gpu time {gpu[n].median_ms * 1e3:8.1f} us")
        for n, fn in steps.items():
            fn()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
            print(f"-- {n}: kernels over 5 calls")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=90))


if __name__ == "__main__":
    main(sys.argv[1].split(","))
