"""Where the paged decode's time goes at small caches: host path or kernel (GPU only).

For a few n11 cases, lab.ops.decode paged (with page_errors, the graph-safe call) and our contiguous decode:
  eager_us  - lab.bench.time_fn, the chapter's timer (one call between two events: host cost included)
  graph_us  - 20 calls captured in one CUDA graph, replayed: the kernels alone
  host_us   - perf_counter over 400 calls with no sync, per call: the Python + launch cost
One JSON line per (case, impl) on stdout, with the GPU and torch version.

    python tests/cuda/paged_host_probe.py
"""
from __future__ import annotations

import json
import time

import torch

from lab import bench, ops
from lab.cases import PagedCase
from lab.paged import paged_inputs


def graph_us(fn, calls: int = 20, replays: int = 20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / (calls * replays)


def host_us(fn, calls: int = 400) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / calls


def main() -> None:
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
    for page, B, L in ((64, 1, 4096), (16, 1, 4096), (64, 1, 32768), (64, 8, 4096), (16, 8, 16384), (64, 8, 16384)):
        case = PagedCase(f"pg-p{page}-b{B}-kv{L}", B, 32, 8, 1, L, 128, "bfloat16", (), page)
        a = paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
        flags = torch.zeros(B, dtype=torch.int32, device="cuda")
        calls = {
            "contiguous": lambda: ops.decode(a["q"], a["k"], a["v"]),
            "contiguous+seqlens": lambda: ops.decode(a["q"], a["k"], a["v"], a["seqlens"]),
            "paged": lambda: ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=a["table"],
                                        page_errors=flags),
        }
        for impl, fn in calls.items():
            eager = bench.time_fn(fn).median_ms * 1e3
            row = {"case": case.name, "impl": impl, "eager_us": round(eager, 2), "graph_us": round(graph_us(fn), 2),
                   "host_us": round(host_us(fn), 2), **env}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
