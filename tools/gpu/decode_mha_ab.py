"""Decode with one query row per KV head (MHA: H_q = H_kv, one new token), where lab.ops.decode runs v01 (scalar, two
blocks a SM), against v02 and v07 named and SDPA-cuDNN, GPU time in rounds through the public op: is v01 still the
pick at this row count now that v07 is the GQA default? Each version's output is first checked against SDPA's math
backend in float32 on the same cache (max abs error, fp16/bf16 tolerance). Records kind 'decode_mha_ab'.
    LAB_SESSION_DIR=<dir> python3 tools/gpu/decode_mha_ab.py
"""
import os

import torch
import torch.nn.functional as F

from lab import bench, ops, record

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
VERSIONS = ("v01", "v02", "v07")
CELLS = ((1, 32, 131072), (1, 32, 32768), (8, 32, 16384), (8, 32, 65536), (64, 32, 4096), (64, 32, 16384))
bad = 0
for B, H, L in CELLS:
    gen = torch.Generator(device="cuda").manual_seed(B * 1000 + L)
    q = torch.randn(B, H, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(B, H, L, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    errs = {}
    for ver in VERSIONS:
        errs[ver] = float((ops.decode(q, k, v, version=ver).float() - ref).abs().max())
        bad += errs[ver] > 2e-2 or errs[ver] != errs[ver]
    calls = {ver: (lambda ver=ver: ops.decode(q, k, v, version=ver), None) for ver in VERSIONS}
    calls["default"] = (lambda: ops.decode(q, k, v), None)
    calls["sdpa-cudnn"] = (bench.sdpa_runner("default", q, k, v), lambda: bench.sdpa_backend("cudnn"))
    times = bench.time_interleaved(calls, timer=bench.GpuTimeTimer(), budget_s=0.5, max_reps=60, min_reps=10)
    ms = {n: t.median_ms for n, t in times.items() if isinstance(t, bench.Timing)}
    line = {"kind": "decode_mha_ab", "case": {"B": B, "H": H, "L": L, "D": 128}, "timer": "gpu_time", "median_ms": ms,
            "x_cudnn": {n: ms["sdpa-cudnn"] / t for n, t in ms.items()}, "max_abs_err": errs, "env": env}
    record.append(line)
    print(f"B {B} H {H} L {L}", {n: round(x, 3) for n, x in line["x_cudnn"].items()}, "err", errs, flush=True)
    del q, k, v, ref
print("bad outputs:", bad)
