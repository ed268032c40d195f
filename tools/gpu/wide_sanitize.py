"""A few small calls at head dims above 128 for compute-sanitizer (memcheck, racecheck): fwd v10 at D = 192 and
256 (and 200, padded), odd lengths (a partial last tile on both sides, one query row, more keys than queries and
fewer), causal and not, GQA, fp16 / bf16, LSE, a negative scale (the unfolded kernel)."""
import os

import torch

from lab import ops

# WIDE_ALT (NAME=VALUE ...): also run a second build of fwd v10 (tools/gpu/head_dims.py's wide_alt) at D 192/256
alt = dict(item.split("=", 1) for item in os.environ.get("WIDE_ALT", "").split())

with torch.no_grad():
    for D, dtype in ((192, torch.bfloat16), (256, torch.float16), (200, torch.bfloat16)):
        for sq, sk, causal in ((130, 200, True), (1, 65, False), (257, 63, False)):
            q = torch.randn(1, 4, sq, D, device="cuda", dtype=dtype)
            k = torch.randn(1, 2, sk, D, device="cuda", dtype=dtype)
            ops.attention(q, k, k, is_causal=causal, enable_gqa=True, return_lse=True)
            if alt and D in (192, 256):
                ops.fwd_writer("v10", alt)(q, k, k, causal, None, torch.empty_like(q))
        ops.attention(q, k, k, enable_gqa=True, scale=-0.2)
torch.cuda.synchronize()
print("sanitize calls done")
