"""Where the public op's backward spends GPU time beyond the kernel-level call: torch.profiler's kernel list of
one torch.autograd.grad on lab.ops.attention, and both paths timed in rounds (the same inputs, one process).
Usage: python3 tools/gpu/bwd_public_gap.py CASE_NAME
"""
import sys

import torch

from lab import bench, cases, ops
from lab.backward import _bwd_impl
from lab.backward.harness import ours_step
from lab.op_common import _scale
from lab.sweep import _inputs_fwd


def main(name):
    case = next(c for c in cases.bench_bwd_cases() if c.name == name)
    q, k, v = _inputs_fwd(case, seed=0)
    dout = _inputs_fwd(case, seed=1)[0]
    public = ours_step("bwd", q, k, v, case.causal, dout)
    with torch.no_grad():
        o, lse = ops.attention(q, k, v, is_causal=case.causal, return_lse=True)
    scale = _scale(None, case.D)
    kernel = lambda: _bwd_impl(dout, q, k, v, o, lse, None, case.causal, scale, False, "v02")  # noqa: E731
    times = bench.time_interleaved({"public": (public, None), "kernel-level": (kernel, None)})
    print({n: round(t.median_ms, 4) for n, t in times.items()})
    for label, fn in (("public", public), ("kernel-level", kernel)):
        fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        print(f"== {label}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main(sys.argv[1])
