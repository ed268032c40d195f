"""Backward timings: the public op's backward (and forward plus backward) against
SDPA-flash and SDPA-cuDNN over a subset of bench-fwd. Prints a table and writes the rows as JSON lines.
    python3 tools/gpu/bwd_bench.py OUT.jsonl [--lengths 2048,8192] [--modes bwd,fwd+bwd]"""
from __future__ import annotations

import argparse
import json

import torch

from lab import bench, cases
from lab.backward import harness as backward_harness

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--lengths", default="2048,8192")
parser.add_argument("--modes", default="bwd")
parser.add_argument("--dtype", default="bfloat16")
parser.add_argument("--budget", type=float, default=1.0)
args = parser.parse_args()
grid = cases.bench_fwd_cases(args.dtype, seqlens=tuple(int(s) for s in args.lengths.split(",")))
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
with open(args.out, "w") as f:
    for mode in args.modes.split(","):
        rows = backward_harness.backward_sweep(grid, mode, backends=("flash", "cudnn"), progress=False, budget_s=args.budget)
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
            if r["impl"] == "lab.ops.attention":
                rat = r.get("ratios", {})
                print(f"{mode:8} {r['case']['name']:18} ours {r.get('tflops', float('nan')):6.1f} TFLOP/s "
                      f"{r.get('timing', {}).get('median_ms', float('nan')):8.3f} ms  x flash {rat.get('sdpa-flash', float('nan')):.2f}"
                      f"  x cudnn {rat.get('sdpa-cudnn', float('nan')):.2f} {r.get('unsupported', '')}", flush=True)
            else:
                print(f"{mode:8} {r['case']['name']:18} {r['impl']:12} {r.get('tflops', float('nan')):6.1f} TFLOP/s "
                      f"{r.get('unsupported', '')}", flush=True)
