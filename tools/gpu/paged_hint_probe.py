"""Which part of pass 1's 16-byte copies moves 1.5x the sectors it needs over the L2-to-SM crossbar (ncu: 25.2 M sectors
and 11.0 M L2 requests for 16.8 M sectors of data, where cuDNN's unhinted copies of the same width move 16.8 M in 4.2 M
requests; outputs/driver_logs/20261126-h100-paged-source-ae71cb7/): the copies' L2 prefetch-size hint, or the
destination rows (v03 / v06 pad a shared-memory row to D + 8 elements, so every second row of a copy lands 16 bytes off
a 128-byte boundary). Decode v06 built with each hint (LAB_PAGED_PREFETCH 128, the default; 0: none; 256), one paged
cell (32 x 4096, page 16, Hq 32, Hkv 8, D 128, bf16), through the binding with the public op's split plan.

    python tools/gpu/paged_hint_probe.py time OUT.jsonl   # GPU time, interleaved rounds, beside SDPA-cuDNN
    python tools/gpu/paged_hint_probe.py child            # one launch of each in an NVTX range (for ncu)
"""
from __future__ import annotations

import os
import sys

import torch
from paged_rows import write_rows  # tools/gpu/paged_rows.py (this script's folder is on sys.path)

from lab import bench, build, op_common, ops
from lab.cases import PagedCase
from lab.decode import paged
from lab.decode.op import _v03_plan

HINTS = {"hint 128": {}, "hint none": {"LAB_PAGED_PREFETCH": "0"}, "hint 256": {"LAB_PAGED_PREFETCH": "256"}}


def setup():
    B, L, page = 32, 4096, 16
    case = PagedCase("hint", B, 32, 8, 1, L, 128, "bfloat16", (), page)
    a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
    flags = torch.zeros(B, dtype=torch.int32, device="cuda")
    splits = _v03_plan(a["q"], 8, a["table"].shape[1] * page, "v06", None, True)[1]
    bind, scale = build.binding(), op_common._scale(None, 128)
    calls = {}
    for name, defines in HINTS.items():
        address = ops.launcher(ops.DECODE, "v06", defines)
        calls[f"v06 {name}"] = (lambda address=address: bind.decode_paged_call(
            address, a["q"], a["k_pages"], a["v_pages"], a["seqlens"], a["table"], flags, scale, splits, False)[0])
    runner = bench.sdpa_runner("default", a["q"], a["k"], a["v"])

    def cudnn():
        with bench.sdpa_backend("cudnn"):
            return runner()
    calls["sdpa-cudnn"] = cudnn
    return calls


def time_rows(path: str) -> int:
    calls = setup()
    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    times = bench.time_interleaved({k: (fn, None) for k, fn in calls.items()}, timer=bench.GpuTimeTimer(), min_reps=15,
                                   max_reps=40, budget_s=1.0)
    with open(path, "a") as out:
        write_rows(out, "32x4096 p16", times, timer="gpu", **env)
    return 0


def child() -> int:
    calls = setup()
    for name, fn in calls.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("lab.profile")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("PROFILED", name, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(child() if sys.argv[1] == "child" else time_rows(sys.argv[2]))
