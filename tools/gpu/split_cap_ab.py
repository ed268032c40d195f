"""Does a split plan with a cap on the chunk help ragged batches without costing uniform ones? (GPU only)

The default plan (lab.decode.splits) sees only shapes, so a batch whose longest sequence is 16x its median gets one
split per sequence at B = 64 and the longest sequence's blocks walk all its keys alone. Capped: num_splits = max(the
plan's, ceil(capacity / cap)). Per call, GPU time of a CUDA-graph replay (lab.bench CudaTimer on graph.replay), paged
public op (page 16, page_errors given) and the contiguous op, default plan against caps of 2048 and 4096 keys, on the
serving cells (every sequence full) and on lab.decode.paged.serving_lengths' ragged batch. One JSON line per call.

    python tools/gpu/split_cap_ab.py > ab.jsonl
"""
from __future__ import annotations

import json
import os

import torch

from lab import bench, graphs, ops, registry
from lab.cases import PAGED_CELLS, PagedCase
from lab.decode import paged, splits as plans
from lab.op_common import sm_count


def default_splits(layout: str, B: int, L: int) -> int:
    """The split count lab.ops.decode picks by default for this call (the same rule and capacity)."""
    sms = sm_count(torch.device("cuda"))
    version = registry.default_paged_version(8) if layout == "paged" else registry.default_decode_version(32, 8, 1)
    return plans.split_plan(B, 8, L, sms, registry.SPLIT_RULE.get(version, version))


def main() -> None:
    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT")}
    cells = [(f"{B}x{L}", B, L, ()) for B, L in PAGED_CELLS]
    cells.append(("ragged 64 (max 16384)", 64, 16384, tuple(paged.serving_lengths(64, 16384))))
    timer = bench.CudaTimer()
    for name, B, L, lengths in cells:
        case = PagedCase("ab", B, 32, 8, 1, L, 128, "bfloat16", lengths, 16)
        a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
        flags = torch.zeros(B, dtype=torch.int32, device="cuda")
        for layout in ("paged", "contiguous"):
            base = default_splits(layout, B, L)
            for cap in (None, 4096, 2048):
                splits = base if cap is None else max(base, -(-L // cap))

                def call():
                    if layout == "paged":
                        return ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], None, splits,
                                          block_table=a["table"], page_errors=flags)
                    return ops.decode(a["q"], a["k"], a["v"], a["seqlens"], None, splits)
                graph, _ = graphs.capture(call)
                t = bench.time_fn(graph.replay, timer=timer)
                print(json.dumps({"cell": name, "layout": layout, "cap": cap, "num_splits": splits,
                                  "graph_us": round(t.median_ms * 1e3, 2), **env}), flush=True)
        del a
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
