"""Where the masked backward's time goes beside the dense one's, at chapter n13's race cells (B 1, H 16, D 128, bf16,
S 4096 and 16384): torch.profiler's CUDA kernels of five backward calls (torch.autograd.grad over one retained
forward) of the dense causal op (bwd v14), the masked kernel's plain causal call (window (-1, -1): bwd v08) and the
window (1024, 0), summed by kernel name, microseconds a call. Records kind 'masked_bwd_probe'.
    LAB_SESSION_DIR=<dir> python3 tools/gpu/masked_bwd_probe.py
"""
import collections
import os

import torch
from torch.profiler import ProfilerActivity, profile

from lab import ops, record

env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
H, D, REPS = 16, 128, 5
for S in (4096, 16384):
    gen = torch.Generator(device="cuda").manual_seed(S)
    q, k, v = (torch.randn(1, H, S, D, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    dout = torch.randn(1, H, S, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    calls = {"dense causal": lambda: ops.attention(q, k, v, is_causal=True),
             "masked causal": lambda: ops.attention(q, k, v, is_causal=True, window_size=(-1, -1)),
             "window 1024": lambda: ops.attention(q, k, v, is_causal=True, window_size=(1024, 0))}
    for name, fn in calls.items():
        out = fn()
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            torch.cuda.synchronize()
        us = collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us[e.name[:90]] += e.device_time / REPS
        total = sum(us.values())
        record.append({"kind": "masked_bwd_probe", "case": {"B": 1, "H": H, "S": S, "D": D}, "call": name,
                       "kernels_us": dict(us), "total_us": total, "env": env})
        print(f"S {S} {name}: {total:.1f} us", flush=True)
        for kname, t in us.most_common():
            print(f"    {t:9.1f}  {kname}", flush=True)
        del out
