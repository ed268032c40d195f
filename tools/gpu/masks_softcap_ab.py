"""The softcap's softmax and the masked backward's softcap, A/B in one process (GPU time, in rounds, the kernels
called through lab.masks' launchers with their build switches):
  fwd v09  LAB_FWD_MASK_SOFTCAP 0 (the online max), 1 (the default: the fixed offset the cap's bound allows, l from the
           rounded P) and 2 (the candidate: the same, l = P 1 on the tensor core), beside the kernel without softcap;
  bwd v08  the staged build (the default) without softcap, with it, and with LAB_BWD_MASK_TANH_HALF=1 (the
           candidate: the tanh on fp16 pairs);
every variant by its explicit switches, whatever the default; then the checks of the candidates (fwd
LAB_FWD_MASK_SOFTCAP=2: the softcap grid and the rows at the cap's floor; bwd LAB_BWD_MASK_TANH_HALF=1: the gradient
grid's softcap rows), recorded like the chapter's (the defaults' checks are chapter n13's). H 16, D 128 (64 too for
the forward), bf16, causal.
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
STAGE0, STAGED = {"LAB_BWD_MASK_STAGE": 0, "LAB_BWD_MASK_TANH_HALF": 0}, {"LAB_BWD_MASK_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 0}
TANH_HALF = {"LAB_BWD_MASK_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 1}
TENSOR_L = {"LAB_FWD_MASK_SOFTCAP": 2}


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
                 {"plain": call(0.0), **{f"softcap{m}": call(cap, {"LAB_FWD_MASK_SOFTCAP": m}) for m in (0, 1, 2)}})


def backward_cells():
    """The staged build (the default) with and without softcap, and with the tanh on fp16 pairs, in one set of rounds
    per length: the candidate against the default, and both against no softcap."""
    D = 128
    for S in (4096, 16384):
        q, k, v, dout = (torch.randn(1, H, S, D, device="cuda", dtype=dt) for _ in range(4))
        calls = {}
        for name, cap, defines in (("plain", 0.0, STAGED), ("softcap_staged", 30.0, STAGED),
                                   ("softcap_tanh_half", 30.0, TANH_HALF)):
            mask = spec.make_mask(True, None, cap)
            out, lse = mop._masked_impl(q, k, v, None, mask.left, mask.right, 0, cap, D ** -0.5, "v09")

            def call(defines=defines, mask=mask, cap=cap, out=out, lse=lse):
                return lambda: mbwd.launch_backward(dout, q, k, v, out, lse, None, None, False, mask.left,
                                                    mask.right, 0, cap, D ** -0.5, defines=defines), None
            calls[name] = call()
        emit("masked_bwd_ab", {"D": D, "S": S, "window": None, "softcap": 30.0}, calls)


def variant_checks() -> int:
    """The candidates only (the defaults are checked by chapter n13): fwd LAB_FWD_MASK_SOFTCAP=2 on the softcap grid and
    the rows at the cap's floor; bwd LAB_BWD_MASK_TANH_HALF=1 (staged) on the gradient grid's softcap rows."""
    bad = 0
    for D in (128, 64):
        for name, causal, window, cap, sink in gpu.GRID_MASKS:
            if cap > 0:
                for B, Hq, Hkv, Sq, Sk in gpu.GRID_SIZES:
                    bad += not gpu.check_dense("v09", name, B, Hq, Hkv, Sq, Sk, D, dt, causal, window, cap, sink,
                                               defines=TENSOR_L)
    for cap in (50.0, 5.0):
        bad += not gpu.check_cap_floor("v09", cap, dt, defines=TENSOR_L)
    for D in (128, 64):
        for name, causal, window, cap, sink in gpu.GRID_MASKS:
            if cap > 0:
                for B, Hq, Hkv, Sq, Sk in gpu.GRID_SIZES:
                    w = (Sk, Sk) if window == "S" else (Sk + 100, -1) if window == "S+" else window
                    bad += not gpu_bwd.check_bwd(name, B, Hq, Hkv, Sq, Sk, D, dt, causal, w, cap, sink,
                                                 defines=TANH_HALF)
    print(f"variant checks: {bad} bad", flush=True)
    return bad


if __name__ == "__main__":  # argument: "time" (the A/B alone, on a quiet GPU), "check", or both (none)
    import sys

    stage = sys.argv[1] if len(sys.argv) > 1 else "all"
    print(env, flush=True)
    if stage in ("time", "all"):
        forward_cells()
        backward_cells()
    if stage in ("check", "all"):
        variant_checks()
