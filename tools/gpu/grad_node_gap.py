"""The eager gradient call through the C++ autograd node (lab.backward.node) against the Python route
(lab.backward.op.EagerAttention: what an explicit version= takes, with the same kernels) and SDPA-cuDNN, in one
process, in rounds: the backward alone (torch.autograd.grad on a recorded graph) and the training step
(forward plus backward), each cold (bench.CudaTimer: host time shows) and in GPU time (bench.GpuTimeTimer: a GPU
sleep hides it). The node changes only the host's work, so the GPU-time rows must agree and the cold rows
show what the host's share was.

Usage: python3 tools/gpu/grad_node_gap.py OUT.jsonl [CASE_NAME ...]   (bench-bwd names; default: the short ones)
Each line: one (case, mode, timer) with the median ms of each path and the ratios against SDPA-cuDNN.
"""
import json
import sys

import torch

from lab import bench, cases, env, ops, record
from lab.backward.harness import ours_step, route_step, sdpa_step
from lab.sweep import _inputs_fwd

SHORT = ("bwd-d128-s512", "bwd-d128-s512-c", "bwd-d128-s1024", "bwd-d128-s1024-c", "bwd-d128-s2048",
         "bwd-d128-s2048-c", "bwd-d64-s512", "bwd-d64-s512-c", "bwd-d128-s4096-gqa-c")


def paths(case, mode, q, k, v, dout):
    return {"node": (ours_step(mode, q, k, v, case.causal, dout), None),
            "python route": (route_step(mode, q, k, v, case.causal, dout), None),
            "sdpa-cudnn": (sdpa_step("cudnn", mode, q, k, v, case.causal, dout), None)}


def main(out_path, names):
    chosen = [c for c in cases.bench_bwd_cases() if c.name in names]
    info = {**env.fingerprint(), "commit": record.git_commit()}
    with open(out_path, "w") as out:
        for case in chosen:
            q, k, v = _inputs_fwd(case, seed=0)
            dout = _inputs_fwd(case, seed=1)[0]
            for mode in ("bwd", "fwd+bwd"):
                for label, timer in (("cold", bench.CudaTimer()), ("gpu-time", bench.GpuTimeTimer())):
                    times = bench.time_interleaved(paths(case, mode, q, k, v, dout), timer)
                    ms = {n: t.median_ms for n, t in times.items()}
                    row = {"kind": "grad-node-gap", "case": case.name, "mode": mode, "timer": label, "ms": ms,
                           "vs_cudnn": {n: ms["sdpa-cudnn"] / t for n, t in ms.items() if n != "sdpa-cudnn"},
                           "node_over_route": ms["python route"] / ms["node"], "env": info}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"{case.name:22s} {mode:8s} {label:8s} node {ms['node'] * 1e3:8.1f} us  route "
                          f"{ms['python route'] * 1e3:8.1f}  cudnn {ms['sdpa-cudnn'] * 1e3:8.1f}  node/cudnn "
                          f"{row['vs_cudnn']['node']:.3f}  route/cudnn {row['vs_cudnn']['python route']:.3f}",
                          flush=True)
            del q, k, v, dout
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] or SHORT)
