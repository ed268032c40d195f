"""Split counts per head dim, the cell where small head dims trailed cuDNN (B 8 x 16384 keys, Hq 32 over Hkv 8, bf16,
one token): lab.ops.decode on the contiguous cache and on pages of 64 with num_splits 1, 2, 3, 4, 6 and the plan's
(None), beside SDPA-cuDNN on the contiguous cache, timed in interleaved rounds (lab.bench.time_interleaved) in one
process. Prints one line per D and call: microseconds and t(cuDNN) / t(call). JSON lines to $LAB_SESSION_DIR via
lab.record (kind "decode-dims-probe").
Usage: python3 tools/gpu/decode_dims_probe.py [D ...]
"""
from __future__ import annotations

import sys

import torch

from lab import bench, ops, record
from lab.cases import PagedCase
from lab.decode import paged


def main(dims) -> int:
    for D in dims:
        case = PagedCase(f"probe-d{D}-b8-kv16384", 8, 32, 8, 1, 16384, D, "bfloat16", (), 64)
        a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(D), "cuda")
        flags = torch.zeros(case.B, dtype=torch.int32, device="cuda")
        calls = {"sdpa-cudnn": (bench.sdpa_runner("default", a["q"], a["k"], a["v"]),
                                lambda: bench.sdpa_backend("cudnn"))}
        for s in (None, 1, 2, 3, 4, 6):
            calls[f"contiguous splits={s}"] = (lambda s=s: ops.decode(a["q"], a["k"], a["v"], None, None, s), None)
            calls[f"paged splits={s}"] = (lambda s=s: ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], None, s,
                                                                 block_table=a["table"], page_errors=flags), None)
        times = bench.time_interleaved(calls)
        cudnn = times["sdpa-cudnn"].median_ms
        for name, t in times.items():
            us = t.median_ms * 1e3 if isinstance(t, bench.Timing) else float("nan")
            print(f"D {D:3d} {name:24s} {us:7.1f} us  x cuDNN {cudnn * 1e3 / us:.3f}", flush=True)
            record.append({"kind": "decode-dims-probe", "impl": name, "case": case.as_dict(), "median_us": us,
                           "ratios": {"sdpa-cudnn": cudnn * 1e3 / us}})
        del a
    return 0


if __name__ == "__main__":
    sys.exit(main([int(d) for d in sys.argv[1:]] or [64, 80, 96, 128]))
