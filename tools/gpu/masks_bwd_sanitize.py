"""A few small masked backward calls (bwd v08 through autograd) for compute-sanitizer (memcheck, racecheck,
synccheck, initcheck): window + softcap + sinks with requires_grad at odd lengths, bottom-right, D = 64 and 128,
GQA, a window that empties some rows, and a negative scale; then packed sequences (lab.ops.attention_varlen's
backward: empty sequences on either side, rows of no sequence, S_q != S_k per sequence)."""
import torch

from lab import ops

for D in (64, 128):
    q = torch.randn(1, 4, 130, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, 200, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 2, 200, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.zeros(4, device="cuda", requires_grad=True)
    out, lse = ops.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(70, 0), softcap=20.0, sinks=sinks,
                             return_lse=True, causal_variant="lower_right")
    torch.autograd.grad(out.float().sum() + lse.sum(), (q, k, v, sinks))
    out = ops.attention(q, k, v, enable_gqa=True, window_size=(3, 5))
    torch.autograd.grad(out.float().sum(), (q, k, v))
    out = ops.attention(q[:, :, :65], k[:, :, :65], v[:, :, :65], enable_gqa=True, softcap=3.0, scale=-0.2)
    torch.autograd.grad(out.float().sum(), (q, k, v))
cu_q = torch.tensor([0, 70, 70, 71, 201], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, 90, 97, 97, 180], dtype=torch.int32, device="cuda")
for D in (64, 128):
    q = torch.randn(205, 4, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(183, 2, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(183, 2, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.zeros(4, device="cuda", requires_grad=True)
    out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, 130, 90, is_causal=True, window_size=(40, 0), softcap=20.0,
                                    sinks=sinks, return_lse=True)
    torch.autograd.grad(out.float().sum() + torch.where(torch.isfinite(lse), lse, 0).sum(), (q, k, v, sinks))
    out = ops.attention_varlen(q, k, v, cu_q, cu_k, 130, 90, window_size=(3, 5))
    torch.autograd.grad(out.float().sum(), (q, k, v))
torch.cuda.synchronize()
print("sanitize calls done bwd")
