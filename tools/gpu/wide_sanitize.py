"""A few small calls at head dims above 128 for compute-sanitizer (memcheck, racecheck, synccheck, initcheck): fwd
v10 at D = 192 and 256 (and 200, padded), odd lengths (a partial last tile on both sides, one query row, more keys
than queries and fewer), causal and not, GQA, fp16 / bf16, LSE, a negative scale (the unfolded kernel); then the
same calls' gradients (the Hopper default bwd v19, the pre-pass and the dQ convert), D_v != D_qk among them.
BWD_ALT (NAME=VALUE ...): the D 192 / 256 gradients also through a second build of bwd v09 (kernel-level).
Usage: compute-sanitizer --tool memcheck python3 tools/gpu/wide_sanitize.py [--fwd-only]"""
import os
import sys

import torch

from lab import ops
from lab.backward import harness

# WIDE_ALT (NAME=VALUE ...): also run a second build of fwd v10 (tools/gpu/head_dims.py's wide_alt) at D 192/256,
# there also on two calls of more work tiles than an H100 or H200 has SMs (17 or 9 query blocks x 32 heads)
alt = dict(item.split("=", 1) for item in os.environ.get("WIDE_ALT", "").split())
bwd_alt = dict(item.split("=", 1) for item in os.environ.get("BWD_ALT", "").split())
SHAPES = ((130, 200, True), (1, 65, False), (257, 63, False), (65, 130, True))

with torch.no_grad():
    for D, dtype in ((192, torch.bfloat16), (256, torch.float16), (200, torch.bfloat16)):
        for sq, sk, causal in SHAPES[:3]:
            q = torch.randn(1, 4, sq, D, device="cuda", dtype=dtype)
            k = torch.randn(1, 2, sk, D, device="cuda", dtype=dtype)
            ops.attention(q, k, k, is_causal=causal, enable_gqa=True, return_lse=True)
            if alt and D in (192, 256):
                ops.fwd_writer("v10", alt)(q, k, k, causal, None, torch.empty_like(q))
        ops.attention(q, k, k, enable_gqa=True, scale=-0.2)
        if alt and D in (192, 256):  # more work tiles than SMs: a persistent build's CTAs take two or three
            for sq, sk, causal in ((2100, 300, True), (1100, 700, False)):
                q = torch.randn(1, 32, sq, D, device="cuda", dtype=dtype)
                k = torch.randn(1, 8, sk, D, device="cuda", dtype=dtype)
                ops.fwd_writer("v10", alt)(q, k, k, causal, None, torch.empty_like(q))
torch.cuda.synchronize()
print("sanitize forward calls done")
if "--fwd-only" not in sys.argv:
    for (d_qk, d_v), dtype in (((192, 192), torch.bfloat16), ((256, 256), torch.float16), ((192, 128), torch.bfloat16),
                               ((200, 200), torch.float16)):
        for sq, sk, causal in SHAPES:
            q = torch.randn(1, 4, sq, d_qk, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(1, 2, sk, d_qk, device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn(1, 2, sk, d_v, device="cuda", dtype=dtype, requires_grad=True)
            out = ops.attention(q, k, v, is_causal=causal, enable_gqa=True, scale=-0.2 if sq == 65 else None)
            dout = torch.randn_like(out)
            torch.autograd.grad(out, (q, k, v), dout)
            if bwd_alt and d_qk == d_v and d_qk in (192, 256):
                harness.bwd_runner("v09", defines=bwd_alt)(q.detach(), k.detach(), v.detach(), causal,
                                                           -0.2 if sq == 65 else None, dout)
    torch.cuda.synchronize()
    print("sanitize backward calls done")
