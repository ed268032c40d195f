"""A few small masked calls for compute-sanitizer (memcheck, racecheck): dense window + softcap + sinks at odd
lengths, D = 64 and 128, and a packed batch with empty sequences and cu_seqlens past max_seqlen (clamped)."""
import sys

import torch

from lab import ops

version = sys.argv[1] if len(sys.argv) > 1 else None  # None: the default for this GPU
for D in (64, 128):
    q = torch.randn(1, 4, 130, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 200, D, device="cuda", dtype=torch.bfloat16)
    ops.attention(q, k, k, is_causal=True, enable_gqa=True, window_size=(70, 0), softcap=20.0,
                  sinks=torch.zeros(4, device="cuda"), return_lse=True, causal_variant="lower_right", version=version)
    ops.attention(q, k, k, enable_gqa=True, window_size=(3, 5), version=version)
    lens = [0, 65, 1, 0, 130]
    cu = torch.tensor([0, 0, 65, 66, 66, 196], dtype=torch.int32, device="cuda")
    qp = torch.randn(196, 4, D, device="cuda", dtype=torch.bfloat16)
    ops.attention_varlen(qp, qp[:, :2], qp[:, :2], cu, cu, 130, 130, is_causal=True, window_size=(16, 0),
                         sinks=torch.ones(4, device="cuda"), return_lse=True, version=version)
    # max_seqlen smaller than a real length: the kernel clamps (check_cu_seqlens=False skips the host check)
    ops.attention_varlen(qp, qp[:, :2], qp[:, :2], cu, cu, 64, 64, check_cu_seqlens=False, version=version)
    ops.attention(q, k, k, enable_gqa=True, softcap=3.0, scale=-0.2, version=version)  # a negative scale
torch.cuda.synchronize()
print("sanitize calls done", version)
