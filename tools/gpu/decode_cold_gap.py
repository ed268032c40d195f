"""Where the public decode call's cold-timer gap to its kernel-only row comes from, at chapter n7's one-row-a-KV-head
cell (1 x 131072 keys, 32 / 32 heads, D 128, bf16) and a GQA cell (8 x 16384, 32 / 8): the public op
(lab.ops.decode as called), the same kernel and plan through a pre-resolved launcher with its workspace allocated
up front (n7's "auto (kernel only)") and SDPA-cuDNN, each timed in rounds with lab.bench.CudaTimer (flush L2, then the
call: host time before the first launch shows) and with GpuTimeTimer (a GPU sleep queued first: the call's GPU work
alone), plus each call's host time alone (perf_counter around an unsynchronised call, median of 200).
Records kind 'decode_cold_gap'.   LAB_SESSION_DIR=<dir> python3 tools/gpu/decode_cold_gap.py
"""
import os
import statistics
import time

import torch

from lab import bench, ops, record

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
for B, Hq, Hkv, L in ((1, 32, 32, 131072), (8, 32, 8, 16384)):
    gen = torch.Generator(device="cuda").manual_seed(L)
    q = torch.randn(B, Hq, 1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(B, Hkv, L, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    calls = {"public": (lambda: ops.decode(q, k, v), None),
             "kernel only": (ops.decode_call_factory(None)(q, k, v, None), None),
             "sdpa-cudnn": (bench.sdpa_runner("default", q, k, v), lambda: bench.sdpa_backend("cudnn"))}
    row = {"kind": "decode_cold_gap", "case": {"B": B, "Hq": Hq, "Hkv": Hkv, "L": L, "D": 128}, "env": env}
    for label, timer in (("cold", bench.CudaTimer()), ("gpu_time", bench.GpuTimeTimer())):
        t = bench.time_interleaved(calls, timer=timer, budget_s=0.6, max_reps=60, min_reps=15)
        row[label] = {n: x.median_ms for n, x in t.items() if isinstance(x, bench.Timing)}
    host = {}
    for name, (fn, ctx) in calls.items():
        samples = []
        for _ in range(200):
            torch.cuda.synchronize()
            with (ctx() if ctx else torch.autograd.graph.saved_tensors_hooks(lambda x: x, lambda x: x)):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e6)
        host[name] = statistics.median(samples)
    row["host_us"] = host
    record.append(row)
    print(row["case"], "cold ms", {n: round(x, 4) for n, x in row["cold"].items()}, "gpu_time ms",
          {n: round(x, 4) for n, x in row["gpu_time"].items()}, "host us", {n: round(x, 1) for n, x in host.items()},
          flush=True)
    del q, k, v
