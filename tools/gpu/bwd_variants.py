"""Backward kernel variants on a few bench-fwd cells: warps per CTA (LAB_BWD_WARPS 4 / 8: 64 / 128
keys per CTA) x dQ atomics (LAB_BWD_RED 1 scalar / 4 vector red) x dQ mode (atomic / deterministic separate pass),
timed as the binding call alone (forward done once before), beside SDPA-flash's and cuDNN's backward.
    python3 tools/gpu/bwd_variants.py OUT.jsonl"""
from __future__ import annotations

import json
import sys

import torch

from lab import backward, bench, cases, ops
from lab.backward import harness as backward_harness

CELLS = [c for c in cases.bench_fwd_cases("bfloat16", seqlens=(2048, 8192))
         if c.name in ("fwd-d64-s2048", "fwd-d64-s8192-c", "fwd-d128-s2048-c", "fwd-d128-s8192")]
VARIANTS = [{"LAB_BWD_WARPS": w, "LAB_BWD_RED": r} for w in (4, 8) for r in (1, 4)]
rows = []
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for case in CELLS:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(case.B, case.Hq, case.Sq, case.D, generator=gen, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    flops = backward_harness.flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, "bwd")
    with torch.no_grad():
        out, lse = ops.attention(q, k, v, is_causal=case.causal, return_lse=True)
    scale = 1.0 / case.D ** 0.5
    for backend in ("flash", "cudnn"):
        t = backward_harness._try_step(lambda: backward_harness.sdpa_step(backend, "bwd", q, k, v, case.causal, do), budget_s=1.0)
        ms = t.median_ms if isinstance(t, bench.Timing) else float("nan")
        rows.append({"case": case.name, "impl": f"sdpa-{backend}", "ms": ms, "tflops": flops / ms / 1e9})
        print(f"{case.name:18} sdpa-{backend:8} {ms:8.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s", flush=True)
    for defines in VARIANTS:
        for det in (False, True):
            fn = lambda: backward._bwd_impl(do, q, k, v, out, lse, None, case.causal, scale, det, "v01", defines)  # noqa: E731
            t = bench.time_fn(fn, budget_s=1.0)
            name = f"w{defines['LAB_BWD_WARPS']}-red{defines['LAB_BWD_RED']}-{'det' if det else 'atomic'}"
            rows.append({"case": case.name, "impl": name, "ms": t.median_ms, "tflops": flops / t.median_ms / 1e9,
                         "defines": defines, "deterministic": det})
            print(f"{case.name:18} {name:18} {t.median_ms:8.3f} ms {flops / t.median_ms / 1e9:6.1f} TFLOP/s", flush=True)
    del q, k, v, do, out, lse
with open(sys.argv[1], "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
