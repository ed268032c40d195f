"""Small calls at the narrow head dims for compute-sanitizer (memcheck, racecheck, synccheck, initcheck): fwd v05 and
v07 reading D_qk = D_v below 128 unpadded (lab.fwd.head_dims.narrow) in every instantiation the public op reaches
(lab.fwd.narrow_gpu.SHAPES' comment says which shape reaches which), fwd v10's at 136, 160 (NarrowSteps when
LAB_FWD_NARROW_QK_STEPS >= 3) and 200; odd lengths, GQA, fp16 / bf16, causal and not, LSE, a negative scale (the
unfolded kernels), and (B, S, H, D) views. A store past D_v in any row but the last lands inside the next row,
which memcheck cannot see and narrow_gpu.narrow_checks does (the LAB_FWD_BUG_NARROW_SHORT build must fail them);
past the last row's D_v it leaves the tensor, which memcheck sees.
Usage: compute-sanitizer --tool memcheck python3 tools/gpu/narrow_sanitize.py [--wide | --dims 80,96]  (--wide: fwd
v10's only; --dims: those of the dims below only)"""
import sys

import torch

from lab import ops
from lab.fwd.narrow_gpu import unpadded

SHAPES = ((65, 130, True), (1, 1025, True), (257, 63, False), (600, 65, False), (63, 2100, False))

with torch.no_grad(), unpadded():
    dims = ((32, torch.bfloat16), (80, torch.float16), (96, torch.bfloat16), (8, torch.float16), (120, torch.bfloat16),
            (200, torch.bfloat16), (136, torch.float16), (160, torch.bfloat16))
    if "--dims" in sys.argv:
        chosen = {int(d) for d in sys.argv[sys.argv.index("--dims") + 1].split(",")}
        dims = tuple((D, dtype) for D, dtype in dims if D in chosen)
    elif "--wide" in sys.argv:
        dims = dims[5:]
    for D, dtype in dims:
        for sq, sk, causal in SHAPES if D in (32, 80) else SHAPES[:3]:
            q = torch.randn(1, 4, sq, D, device="cuda", dtype=dtype)
            k = torch.randn(1, 2, sk, D, device="cuda", dtype=dtype)
            v = torch.randn(1, 2, sk, D, device="cuda", dtype=dtype)
            ops.attention(q, k, v, is_causal=causal, enable_gqa=True, return_lse=True)
            ops.attention(q, k, v, is_causal=causal, enable_gqa=True, scale=-0.2)
        qs = torch.randn(1, 65, 4, D, device="cuda", dtype=dtype).transpose(1, 2)  # (B, S, H, D) views
        ks = torch.randn(1, 130, 2, D, device="cuda", dtype=dtype).transpose(1, 2)
        ops.attention(qs, ks, ks, is_causal=True, enable_gqa=True)
torch.cuda.synchronize()
print("sanitize narrow calls done")
