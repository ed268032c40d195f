"""BUG-002 reproduction: lab.ops.decode through the public call vs SDPA-cuDNN on issue 11's six shapes.

Run once with the lab before the fix on PYTHONPATH and once with the current one, on the same GPU:
    PYTHONPATH=.old python tests/cuda/decode_public_bench.py old   # .old: `git archive c64defa lab kernels`
    PYTHONPATH=.    python tests/cuda/decode_public_bench.py new
One JSON line per shape: GB/s of the public op, of a pre-resolved launcher (decode_call_factory), and of cuDNN.
"""
import json
import subprocess
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from lab import bench, ops

SHAPES = [(1, 32, 8, 131072), (8, 32, 8, 32768), (1, 32, 32, 65536), (4, 64, 8, 16384), (64, 32, 8, 4096),
          (16, 32, 32, 8192)]
label = sys.argv[1] if len(sys.argv) > 1 else "current"
commit = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], capture_output=True, text=True).stdout.strip()
for B, Hq, Hkv, L in SHAPES:
    q = torch.randn(B, Hq, 1, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, L, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
    public = bench.time_fn(lambda: ops.decode(q, k, v))
    factory = getattr(ops, "decode_call_factory", None) or ops.decode_maker  # the name before issue 13
    kernel = bench.time_fn(factory(None)(q, k, v, None))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        cudnn = bench.time_fn(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    gbps = {name: nbytes / t.median_ms / 1e6 for name, t in (("public", public), ("kernel_only", kernel), ("cudnn", cudnn))}
    print(json.dumps({"label": label, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "commit_run_from": commit, "B": B, "Hq": Hq, "Hkv": Hkv, "kv_len": L, "gbps": gbps,
                      "ratio_public_vs_cudnn": gbps["public"] / gbps["cudnn"]}), flush=True)
    del q, k, v
