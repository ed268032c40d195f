"""The contiguous decode's split plan for the warp-ring kernels (v07 at D 64 / 128, v08 at 80 / 96): v02's rule (one
block an SM, lab.decode.splits.choose_num_splits_v02, what lab.ops.decode plans today) against two blocks an SM
(choose_num_splits, v01's rule, the occupancy the paged call reaches through ragged_splits) and twice v02's count,
each through lab.ops.decode with num_splits named, beside SDPA-cuDNN, GPU time in rounds (lab.bench.GpuTimeTimer).
Every plan's output is first checked against SDPA's math backend in float32 on the same cache. Records kind
'decode_split_ab'.   LAB_SESSION_DIR=<dir> python3 tools/gpu/decode_split_ab.py
"""
import os

import torch
import torch.nn.functional as F

from lab import bench, ops, record
from lab.decode import splits as sp

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
SMS = torch.cuda.get_device_properties(0).multi_processor_count
# (B, H_q, H_kv, L): the n11 head-dim cell (8 x 16384), n7's >= 1 GB cell (8 x 32768), the long single sequence, a
# batch of 4 with 64 query heads, and two cells whose blocks already fill a wave (no split either way).
CELLS = ((8, 32, 8, 16384), (8, 32, 8, 32768), (1, 32, 8, 131072), (4, 64, 8, 16384), (16, 32, 8, 4096),
         (64, 32, 8, 1024))
DIMS = tuple(int(d) for d in os.environ.get("AB_DIMS", "64 80 96 128").split())
bad = 0
for D in DIMS:
    for B, Hq, Hkv, L in CELLS:
        gen = torch.Generator(device="cuda").manual_seed(B * 1000 + L + D)
        q = torch.randn(B, Hq, 1, D, device="cuda", generator=gen).to(torch.bfloat16)
        k, v = (torch.randn(B, Hkv, L, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        plans = {"v02 rule": sp.choose_num_splits_v02(B, Hkv, L, SMS), "two a SM": sp.choose_num_splits(B, Hkv, L, SMS)}
        plans["2x v02"] = min(2 * plans["v02 rule"], sp.MAX_SPLITS)
        errs, calls = {}, {}
        for name, s in plans.items():
            out = ops.decode(q, k, v, num_splits=s)
            errs[name] = float((out.float() - ref).abs().max())
            bad += not errs[name] <= 2e-2
            calls[f"{name} ({s})"] = (lambda s=s: ops.decode(q, k, v, num_splits=s), None)
        calls["default"] = (lambda: ops.decode(q, k, v), None)
        calls["sdpa-cudnn"] = (bench.sdpa_runner("default", q, k, v), lambda: bench.sdpa_backend("cudnn"))
        times = bench.time_interleaved(calls, timer=bench.GpuTimeTimer(), budget_s=0.4, max_reps=50, min_reps=12)
        ms = {n: t.median_ms for n, t in times.items() if isinstance(t, bench.Timing)}
        line = {"kind": "decode_split_ab", "case": {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": D}, "plans": plans,
                "timer": "gpu_time", "median_ms": ms, "x_cudnn": {n: ms["sdpa-cudnn"] / t for n, t in ms.items()},
                "max_abs_err": errs, "env": env}
        record.append(line)
        print(f"D {D:3d} B {B:2d} Hq {Hq} Hkv {Hkv} L {L:6d}", {n: round(x, 3) for n, x in line["x_cudnn"].items()},
              flush=True)
        del q, k, v, ref
print("bad outputs:", bad)
