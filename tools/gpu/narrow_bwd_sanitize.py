"""Small gradient calls at the narrow head dims for compute-sanitizer (memcheck, racecheck, synccheck, initcheck):
bwd v20 reading Q, K, V, O, dO at D_qk = D_v below 128 unpadded and writing dQ, dK, dV's D columns, at both widths
(D 32, 8 on width 64; 80, 96, 120 on width 128), odd lengths, GQA, fp16 / bf16, causal and not, a gradient through
the LSE, a negative scale, and (B, S, H, D) views. A store past D in any row but the last lands inside the next row,
which memcheck cannot see and lab.backward.narrow_gpu's checks do (the LAB_BWD_BUG_NARROW_SHORT build must fail them).
Usage: compute-sanitizer --tool memcheck python3 tools/gpu/narrow_bwd_sanitize.py"""
import torch

from lab import ops
from lab.fwd.narrow_gpu import unpadded

SHAPES = ((65, 130, True), (1, 1025, True), (257, 63, False), (600, 65, False))

with unpadded():
    for D, dtype in ((32, torch.bfloat16), (80, torch.float16), (96, torch.bfloat16), (8, torch.float16),
                     (120, torch.bfloat16)):
        for sq, sk, causal in SHAPES if D in (32, 80) else SHAPES[:2]:
            q, k, v = (torch.randn(1, h, s, D, device="cuda", dtype=dtype, requires_grad=True)
                       for h, s in ((4, sq), (2, sk), (2, sk)))
            out, lse = ops.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
            torch.autograd.grad((out, lse), (q, k, v), (torch.randn_like(out), torch.randn_like(lse)))
            out = ops.attention(q, k, v, is_causal=causal, enable_gqa=True, scale=-0.2)
            torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
        qs = torch.randn(1, 65, 4, D, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        ks = torch.randn(1, 130, 2, D, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
        out = ops.attention(qs, ks, ks, is_causal=True, enable_gqa=True)
        torch.autograd.grad(out, (qs, ks), torch.randn_like(out))
torch.cuda.synchronize()
print("sanitize narrow backward calls done")
