"""A few small calls at head dims above 128 for compute-sanitizer (memcheck, racecheck): fwd v10 at D = 192 and
256 (and 200, padded), odd lengths (a partial last tile on both sides, one query row, more keys than queries and
fewer), causal and not, GQA, fp16 / bf16, LSE, a negative scale (the unfolded kernel)."""
import torch

from lab import ops

with torch.no_grad():
    for D, dtype in ((192, torch.bfloat16), (256, torch.float16), (200, torch.bfloat16)):
        for sq, sk, causal in ((130, 200, True), (1, 65, False), (257, 63, False)):
            q = torch.randn(1, 4, sq, D, device="cuda", dtype=dtype)
            k = torch.randn(1, 2, sk, D, device="cuda", dtype=dtype)
            ops.attention(q, k, k, is_causal=causal, enable_gqa=True, return_lse=True)
        ops.attention(q, k, k, enable_gqa=True, scale=-0.2)
torch.cuda.synchronize()
print("sanitize calls done")
