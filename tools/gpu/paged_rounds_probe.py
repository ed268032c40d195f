"""Does the paged race's timing order move its ratios? On chapter n11's cells where the head-dim gates and the
paged-vs-contiguous gate were missed (D 80 / 96 / 128 at 8 x 16384, page 64; D 128 at 1 x 131072, page 16), the
race's five calls (lab.decode.paged.race_calls: SDPA-cuDNN and -flash on the contiguous cache, our contiguous decode,
the paged op with and without page_errors), cold (lab.bench.CudaTimer, the chapter's timer), three times each way:
'one after another' (each call's repetitions back to back, as the sweep timed them before) and 'rounds'
(lab.bench.time_interleaved, each round every call once). Records kind 'paged_rounds_probe' (its first run, at
d878422, named the rows 'contiguous' and 'paged'; they are the race's row names now).
    LAB_SESSION_DIR=<dir> python3 tools/gpu/paged_rounds_probe.py
"""
import contextlib
import os

import torch

from lab import bench, cases, record
from lab.decode import paged

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
CELLS = [c for c in cases.bench_paged_head_dim_cases() if c.B == 8 and c.D in (80, 96, 128)]
CELLS += [c for c in cases.bench_paged_cases() if c.name == "pg-p16-b1-kv131072"]
for i, case in enumerate(CELLS):
    a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(i), "cuda")
    calls = paged.race_calls(case, a, torch.zeros(case.B, dtype=torch.int32, device="cuda"))
    for rep in range(3):
        for method in ("one after another", "rounds"):
            if method == "rounds":
                t = bench.time_interleaved(calls)
            else:
                t = {}
                for name, (fn, ctx) in calls.items():
                    with (ctx or contextlib.nullcontext)():
                        t[name] = bench.time_fn(fn)
            ms = {n: x.median_ms for n, x in t.items() if isinstance(x, bench.Timing)}
            contiguous, ours = ms[paged.CONTIGUOUS], ms[paged.PUBLIC_DECODE]
            ratios = {"contiguous / cudnn": ms["sdpa-cudnn"] / contiguous, "paged / cudnn": ms["sdpa-cudnn"] / ours,
                      "paged / contiguous": contiguous / ours}
            record.append({"kind": "paged_rounds_probe", "case": case.as_dict(), "method": method, "rep": rep,
                           "timer": "cold", "median_ms": ms, "ratios": ratios, "env": env})
            print(f"{case.name:24s} rep {rep} {method:18s}", {n: round(x * 1e3, 1) for n, x in ms.items()},
                  {n: round(x, 3) for n, x in ratios.items()}, flush=True)
    del a, calls
