"""The softcap's softmax and the masked backward's tile config, A/B in one process (GPU time, in rounds, the
kernels called through lab.masks' launchers with their build switches):
  fwd v09  LAB_V09_SOFTCAP 0 (the online max), 1 (the fixed offset the cap's bound allows, l from the rounded
           P) and 2 (the same, l = P 1 on the tensor core), each beside the same kernel without softcap;
  bwd v08  LAB_V08_STAGE 0 (v07's tile config) / 1 (v12's staged dK / dV), and with 1 LAB_BWD_MASK_TANH_HALF=1 (the
           tanh on fp16 pairs) on the softcap cells;
every variant by its explicit switches, whatever the default; then the checks of the variants (fwd
LAB_V09_SOFTCAP=1 and 2: the softcap grid and the rows at the cap's floor; bwd LAB_V08_STAGE=1: the whole gradient grid,
and with the fp16-pair tanh its softcap rows), recorded like the chapter's. H 16, D 128 (64 too for the forward), bf16, causal.
    LAB_SESSION_DIR=$OUT/ab python tools/gpu/masks_softcap_ab.py    -> one JSON line per cell, $OUT/softcap_ab.jsonl
Predictions and outcomes: kernels/fwd/v09_masks_wgmma.cu and kernels/bwd/v08_masks.cu, headers.
"""
import json
import os

import torch

from lab import bench
from lab.masks import backward as mbwd, gpu, gpu_bwd, op as mop, spec

H, dt = 16, torch.bfloat16
timer = bench.GpuTimeTimer()
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
STOP = dict(timer=timer, budget_s=0.4, max_reps=25, min_reps=5)
# every switch named, so that a variant is the same build whichever values the headers default to
STAGE0, STAGED = {"LAB_V08_STAGE": 0, "LAB_BWD_MASK_TANH_HALF": 0}, {"LAB_V08_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 0}
TANH_HALF = {"LAB_V08_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 1}


def emit(kind, case, calls):
    times = bench.time_interleaved(calls, **STOP)
    row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    line = {"kind": kind, "case": case, "timer": "gpu_time", "median_ms": row, "env": env}
    print(json.dumps(line), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "softcap_ab.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


def forward_cells():
    for D, S in ((128, 4096), (128, 16384), (64, 4096)):
        q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=dt) for _ in range(3))
        out, lse = torch.empty_like(q), torch.empty(1, H, S, device="cuda")

        def call(cap, defines=None):
            mask = spec.make_mask(True, None, cap)
            return lambda: mop.launch(q, k, v, out, lse, mask, D ** -0.5, version="v09", defines=defines), None
        for cap in (30.0, 50.0) if S == 4096 else (30.0,):
            emit("softcap_fwd_ab", {"D": D, "S": S, "softcap": cap},
                 {"plain": call(0.0), **{f"softcap{m}": call(cap, {"LAB_V09_SOFTCAP": m}) for m in (0, 1, 2)}})


def backward_cells():
    D = 128
    for S, cells in ((4096, [(None, 30.0), (None, 0.0), (1024, 0.0)]), (16384, [(None, 30.0), (None, 0.0),
                                                                              (4096, 0.0)])):
        q, k, v, dout = (torch.randn(1, H, S, D, device="cuda", dtype=dt) for _ in range(4))
        for window, cap in cells:
            mask = spec.make_mask(True, None if window is None else (window, 0), cap)
            out, lse = mop._masked_impl(q, k, v, None, mask.left, mask.right, 0, cap, D ** -0.5, "v09")

            def call(defines=None, mask=mask, cap=cap, out=out, lse=lse):
                return lambda: mbwd.launch_backward(dout, q, k, v, out, lse, None, None, False, mask.left,
                                                    mask.right, 0, cap, D ** -0.5, defines=defines), None
            calls = {"stage0": call(STAGE0), "stage1": call(STAGED)}
            if cap > 0:
                calls["stage1_tanh_half"] = call(TANH_HALF)
            emit("masked_bwd_ab", {"D": D, "S": S, "window": window, "softcap": cap}, calls)


def variant_checks() -> int:
    bad = 0
    for bounded in ({"LAB_V09_SOFTCAP": 1}, {"LAB_V09_SOFTCAP": 2}):
        for D in (128, 64):
            for name, causal, window, cap, sink in gpu.GRID_MASKS:
                if cap > 0:
                    for B, Hq, Hkv, Sq, Sk in gpu.GRID_SIZES:
                        bad += not gpu.check_dense("v09", name, B, Hq, Hkv, Sq, Sk, D, dt, causal, window, cap,
                                                   sink, defines=bounded)
        for cap in (50.0, 5.0):
            bad += not gpu.check_cap_floor("v09", cap, dt, defines=bounded)
    for D in (128, 64):
        for name, causal, window, cap, sink in gpu.GRID_MASKS:
            for B, Hq, Hkv, Sq, Sk in gpu.GRID_SIZES:
                w = (Sk, Sk) if window == "S" else (Sk + 100, -1) if window == "S+" else window
                for defines in (STAGED, TANH_HALF) if cap > 0 else (STAGED,):
                    bad += not gpu_bwd.check_bwd(name, B, Hq, Hkv, Sq, Sk, D, dt, causal, w, cap, sink,
                                                 defines=defines)
    print(f"variant checks: {bad} bad", flush=True)
    return bad


if __name__ == "__main__":
    print(env, flush=True)
    forward_cells()
    backward_cells()
    variant_checks()
