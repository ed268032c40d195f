"""fwd v11's candidates against its default build in one process (GPU time in rounds, the kernels called through
lab.masks.op.launch with their build switches named):
  LAB_FWD_MASK_CAP_POLY 2      the bf16 softcap's exp2 on the FMA pipe for every 2nd n8 block, beside the default
                          (0) and the call without softcap (H 16, D 128, causal, S 4096 and 16384);
  LAB_FWD_MASK_OVERLAP_D128_STAGES 3   fwd v07's few-keys ring (B_c 128, 3 stages) on the packed batch of eight 2048-token
                          sequences (beside the dense default op on the same tokens) and the two 16k window cells;
then the candidates' checks (lab.masks.gpu: the softcap rows of the grid and the rows at the cap's floor for CAP_POLY,
the diagonal and window rows of the grid at D 128 for STAGES), recorded like the chapter's.
    LAB_SESSION_DIR=<dir> OUT=<dir> python tools/gpu/masks_v11_cand.py    -> $OUT/v11_cand.jsonl
Prediction and outcome: kernels/fwd/v11_masks_overlap.cu, header.
"""
import json
import os
import sys

import torch

from lab import bench, ops
from lab.masks import gpu, op as mop, spec

H, D, dt = 16, 128, torch.bfloat16
timer = bench.GpuTimeTimer()
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
STOP = dict(timer=timer, budget_s=0.4, max_reps=25, min_reps=5)
POLY = {n: {"LAB_FWD_MASK_CAP_POLY": n} for n in (2,)}
STAGES3 = {"LAB_FWD_MASK_OVERLAP_D128_STAGES": 3}


def emit(case, calls):
    times = bench.time_interleaved(calls, **STOP)
    row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    line = {"kind": "v11_candidates", "case": case, "timer": "gpu_time", "median_ms": row, "env": env}
    print(json.dumps(line), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "v11_cand.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def dense(q, k, v, out, lse, window, cap, defines=None):
    mask = spec.make_mask(True, window, cap)
    return lambda: mop.launch(q, k, v, out, lse, mask, D ** -0.5, version="v11", defines=defines), None


for S in (4096, 16384):
    q, k, v = (gpu.draw(1, H, S, D, dtype=dt) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(1, H, S, device="cuda")
    emit({"feature": "softcap", "S": S, "softcap": 30.0},
         {"plain": dense(q, k, v, out, lse, None, 0.0), "cap": dense(q, k, v, out, lse, None, 30.0),
          **{f"cap_poly{n}": dense(q, k, v, out, lse, None, 30.0, d) for n, d in POLY.items()}})
    if S == 16384:
        for W in (1024, 4096):
            emit({"feature": "window", "S": S, "window": W},
                 {"stages2": dense(q, k, v, out, lse, (W, 0), 0.0), "stages3": dense(q, k, v, out, lse, (W, 0), 0.0, STAGES3)})
lens = [2048] * 8
q, k, v = (gpu.draw(sum(lens), H, D, dtype=dt) for _ in range(3))
out, lse = torch.empty_like(q), torch.empty(H, sum(lens), device="cuda")
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
causal = spec.make_mask(True, None, 0.0)
qb, kb, vb = (t.view(len(lens), lens[0], H, D).transpose(1, 2) for t in (q, k, v))
emit({"feature": "varlen", "lens": lens},
     {name: (lambda d=d: mop.launch(q, k, v, out, lse, causal, D ** -0.5, 0, None, cu, cu, 2048, 2048, "v11", d), None)
      for name, d in (("stages2", None), ("stages3", STAGES3))}
     | {"dense_default": (lambda: ops.attention(qb, kb, vb, is_causal=True), None)})

bad = 0
for d in POLY[2], STAGES3:
    for Dh in (128, 64):
        for name, causal_, window, cap, sink in gpu.GRID_MASKS:
            if (d is STAGES3 and Dh == 128 and name in ("w1c", "sym", "all")) or (d is not STAGES3 and cap > 0):
                for B, Hq, Hkv, Sq, Sk in gpu.GRID_SIZES:
                    w = (Sk, Sk) if window == "S" else (Sk + 100, -1) if window == "S+" else window
                    bad += not gpu.check_dense("v11", name, B, Hq, Hkv, Sq, Sk, Dh, dt, causal_, w, cap, sink, defines=d)
for cap in (50.0, 5.0):
    bad += not gpu.check_cap_floor("v11", cap, dt, defines=POLY[2])
print(f"candidate checks: {bad} bad", flush=True)
sys.exit(1 if bad else 0)
