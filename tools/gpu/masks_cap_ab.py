"""fwd v11's softcap builds against each other in one process (GPU time in rounds, the kernels called through
lab.masks.op.launch with every switch named, whatever the header defaults to):
  poly0       LAB_FWD_MASK_CAP_POLY 0, tanh.approx.f32: both MUFU issues per score (the default)
  poly2       LAB_FWD_MASK_CAP_POLY 2: the exp2 of every 2nd n8 block on the FMA pipe
  half        LAB_FWD_MASK_CAP_TANH_HALF 1, CAP_POLY 0: the tanh on fp16 pairs
  half_poly2  both; half_poly4  the pairs with the exp2 of every 4th block on the FMA pipe
beside the call without softcap (H 16, causal, bf16, D 128 at S 4096 and 16384, D 64 at 4096, softcap 30); then the
checks of the builds that are not the default (the softcap rows of the grid at D 128 and 64, the rows at the cap's
floor at softcap 50 and 5), recorded like the chapter's (the default's are chapter n13's).
    LAB_SESSION_DIR=<dir> OUT=<dir> python tools/gpu/masks_cap_ab.py    -> $OUT/cap_ab.jsonl
Prediction and outcome: kernels/fwd/v11_masks_overlap.cu, header.
"""
import json
import os
import sys

import torch

from lab import bench
from lab.masks import gpu, op as mop, spec

H, dt = 16, torch.bfloat16
timer = bench.GpuTimeTimer()
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
STOP = dict(timer=timer, budget_s=0.4, max_reps=25, min_reps=5)
BUILDS = {"poly0": (0, 0), "poly2": (2, 0), "half": (0, 1), "half_poly2": (2, 1), "half_poly4": (4, 1)}
DEFINES = {n: {"LAB_FWD_MASK_CAP_POLY": p, "LAB_FWD_MASK_CAP_TANH_HALF": t} for n, (p, t) in BUILDS.items()}
DEFAULT = "poly0"

for D, S in ((128, 4096), (128, 16384), (64, 4096)):
    q, k, v = (gpu.draw(1, H, S, D, dtype=dt) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(1, H, S, device="cuda")

    def call(cap, defines=None):
        mask = spec.make_mask(True, None, cap)
        return lambda: mop.launch(q, k, v, out, lse, mask, D ** -0.5, version="v11", defines=defines), None
    times = bench.time_interleaved({"plain": call(0.0), **{n: call(30.0, d) for n, d in DEFINES.items()}}, **STOP)
    row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    line = {"kind": "v11_softcap_builds", "case": {"D": D, "S": S, "softcap": 30.0}, "timer": "gpu_time",
            "median_ms": row, "env": env}
    print(json.dumps(line), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "cap_ab.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
    del q, k, v, out, lse

bad = {name: gpu.softcap_checks("v11", dt, d) for name, d in DEFINES.items() if name != DEFAULT}
print(f"candidate checks, bad per build: {bad}", flush=True)
sys.exit(1 if any(bad.values()) else 0)
