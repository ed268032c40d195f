"""The workload ncu profiles at one wide head-dim cell: four backward calls of lab.ops.attention ("lab": bwd v09)
or of SDPA's flash backend ("flash": FlashAttention-2's kernel), so that --launch-skip 2 lands on a warm launch.
Usage: ncu ... python3 tools/gpu/wide_profile.py lab|flash [CELL] (default hdw-d256-s2048; tools/gpu/wide_profile.sh)
"""
import sys

import torch

from lab import bench, cases, ops, sweep

impl, name = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "hdw-d256-s2048"
case = {c.name: c for c in cases.wide_head_dim_cases()}[name]
q, k, v, causal = sweep.case_inputs(case)
q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
for _ in range(4):
    if impl == "lab":
        out = ops.attention(q, k, v, is_causal=causal)
    else:
        with bench.sdpa_backend("flash"):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
torch.cuda.synchronize()
