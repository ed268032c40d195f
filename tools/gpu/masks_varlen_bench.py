"""The packed backward's time (GPU time, bench.GpuTimeTimer, in rounds): lab.ops.attention_varlen's backward and
forward + backward against FlexAttention's document mask (compiled), a loop of SDPA calls over the documents, and,
at one length, our dense masked call on the same tokens (the copies' cost: the packed call runs that kernel on
padded copies). 16384 tokens, H 16, D 128, bf16, causal; chapter n13's documents. One JSON line per cell to stdout
and $OUT/varlen_bench.jsonl.
Prediction (H100): the kernel's work equals the dense call's on the same tokens; the copies move 4 tensors in and
3 out of B max_seqlen H D bf16 elements (at 8 x 2048: ~0.5 GB at ~3 TB/s, ~0.2 ms) against a ~2-3 ms backward, so
+5-10 % over the dense call; against Flex's document mask, the dense margin (1.05-1.4x) minus that.
"""
import json
import os

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from lab import bench, ops

H, D, dt = 16, 128, torch.bfloat16
flex = torch.compile(flex_attention, dynamic=False)
timer = bench.GpuTimeTimer()
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
for lens in ([3000, 1000, 5000, 384, 7000], [2048] * 8):
    total = sum(lens)
    torch.manual_seed(total)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=dt).requires_grad_() for _ in range(3))
    dout = torch.randn(total, H, D, device="cuda", dtype=dt)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
    bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, total, total,
                           device="cuda")
    bounds = list(zip(cu[:-1].tolist(), cu[1:].tolist()))

    def view(t):
        return t.transpose(0, 1)[None]
    fns = {"lab": lambda: ops.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True,
                                               check_cu_seqlens=False),
           "flex_document": lambda: flex(view(q), view(k), view(v), block_mask=bm)[0].transpose(0, 1),
           "sdpa_loop": lambda: torch.cat([F.scaled_dot_product_attention(view(q)[:, :, a:b], view(k)[:, :, a:b],
                                                                          view(v)[:, :, a:b], is_causal=True)[0]
                                           .transpose(0, 1) for a, b in bounds])}
    if len(set(lens)) == 1:
        def dense(masked):
            qb, kb, vb = (t.view(len(lens), lens[0], H, D).transpose(1, 2) for t in (q, k, v))
            out = ops.attention(qb, kb, vb, is_causal=True, **({"window_size": (-1, -1)} if masked else {}))
            return out.transpose(1, 2).reshape(total, H, D)
        fns["lab_dense_masked"] = lambda: dense(True)
        fns["lab_dense_default"] = lambda: dense(False)
    calls = {}
    for name, fn in fns.items():
        out = fn()
        calls[name] = (lambda out=out: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), None)
        calls[name + "+fwd"] = (lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), dout), None)
    times = bench.time_interleaved(calls, timer=timer, budget_s=0.5, max_reps=20, min_reps=5)
    row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    ratios = {n: row[n] / row["lab" + ("+fwd" if n.endswith("+fwd") else "")] for n in row
              if isinstance(row[n], float) and not n.startswith("lab")}
    line = {"kind": "varlen_bwd_time", "lens": lens, "H": H, "D": D, "dtype": "bfloat16", "causal": True,
            "timer": "gpu_time", "median_ms": row, "ratio_vs_lab": ratios, "env": env}
    print(json.dumps(line), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "varlen_bench.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")
