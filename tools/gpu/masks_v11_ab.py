"""fwd v11 (v09's mask steps in v07's overlapped loop) against v09 in one process, before it is the masked default:
chapter n13's race cells (H 16, D 128, bf16, causal), each masked kernel called through the public op with its
version named, beside FlexAttention (compiled, the same mask) and the dense default op where the cell has one.
Rows in rounds (lab.bench.time_interleaved, the chapter's timer and stop rule); one JSON line per cell.
    LAB_COMMIT=<sha> OUT=<dir> python tools/gpu/masks_v11_ab.py    -> $OUT/v11_ab.jsonl
Prediction and outcome: kernels/fwd/v11_masks_overlap.cu, header.
"""
import json
import os

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from lab import bench, ops
from lab.masks import gpu

H, D, dt = 16, 128, torch.bfloat16
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
STOP = dict(budget_s=0.4, max_reps=25, min_reps=5)
flex = torch.compile(flex_attention, dynamic=False)


def emit(case, calls):
    times = bench.time_interleaved(calls, **STOP)
    row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    line = {"kind": "v11_ab", "case": case, "median_ms": row, "env": env}
    print(json.dumps(line), flush=True)
    with open(os.path.join(os.environ.get("OUT", "."), "v11_ab.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def versions(fn):
    return {name: (lambda name=name: fn(name), None) for name in ("v11", "v09")}


for S in (4096, 16384):
    q, k, v = (gpu.draw(1, H, S, D, dtype=dt) for _ in range(3))
    for W in (1024, 4096):
        bm = create_block_mask(lambda b, h, qi, ki, W=W: (qi >= ki) & (qi - ki <= W), None, None, S, S, device="cuda")
        emit({"feature": "window", "S": S, "window": W},
             {**versions(lambda ver: ops.attention(q, k, v, is_causal=True, window_size=(W, 0), version=ver)),
              "flex": (lambda: flex(q, k, v, block_mask=bm), None)})
    emit({"feature": "softcap", "S": S, "softcap": 30.0},
         {**{f"{n}_cap": c for n, c in versions(lambda ver: ops.attention(q, k, v, is_causal=True, softcap=30.0,
                                                                           version=ver)).items()},
          **{f"{n}_plain": c for n, c in versions(lambda ver: ops.attention(q, k, v, is_causal=True,
                                                                             window_size=(-1, -1), version=ver)).items()},
          "dense_default": (lambda: ops.attention(q, k, v, is_causal=True), None)})
for lens in ([2048] * 8, [3000, 1000, 5000, 384, 7000]):
    total = sum(lens)
    q, k, v = (gpu.draw(total, H, D, dtype=dt) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    calls = versions(lambda ver: ops.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True,
                                                      check_cu_seqlens=False, version=ver))
    if len(set(lens)) == 1:
        qb, kb, vb = (t.view(len(lens), lens[0], H, D).transpose(1, 2) for t in (q, k, v))
        calls["dense_default"] = (lambda: ops.attention(qb, kb, vb, is_causal=True), None)
    emit({"feature": "varlen", "lens": lens}, calls)
