"""Where the paged decode's time goes at small caches: host path or kernel (GPU only).

For a few n11 cases, lab.ops.decode paged (with page_errors, the graph-safe call) and our contiguous decode:
  eager_us  - lab.bench.time_fn, the chapter's timer (one call between two events: host cost included)
  graph_us  - the same call captured in a CUDA graph (lab.graphs.capture), replays timed by lab.bench.time_fn:
              the kernels and one graph launch
  host_us   - lab.hostcost.host_us with the GPU kept busy: the Python + launch cost of one call
One JSON line per (case, impl) on stdout, with the GPU and torch version.
(The log of 2026-11-23, outputs/driver_logs/20261123-h200-paged-host-probe-5172c812f0.jsonl, came from an
earlier copy of this probe with timers of its own: 20 calls per replayed graph, host time over 400 calls.)

    python tools/gpu/paged_host_probe.py
"""
from __future__ import annotations

import json

import torch

from lab import bench, graphs, hostcost, ops
from lab.cases import PagedCase
from lab.decode.paged import paged_inputs


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
            graph, _ = graphs.capture(fn)
            row = {"case": case.name, "impl": impl, "eager_us": round(bench.time_fn(fn).median_ms * 1e3, 2),
                   "graph_us": round(bench.time_fn(graph.replay).median_ms * 1e3, 2),
                   "host_us": round(hostcost.host_us(fn, busy=True), 2), **env}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
