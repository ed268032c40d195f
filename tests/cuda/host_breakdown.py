"""Where the host microseconds of lab.ops.decode / lab.ops.attention go (GPU kept busy, medians).

Each stage of the call path timed alone, beside SDPA's whole call. Usage: python tests/cuda/host_breakdown.py
"""
import torch
import torch.nn.functional as F

from lab import build, ops
from event_timing import host_us  # tests/cuda/ is the script's own directory

q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 8, 131072, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
name = ops._decode_version(None, q, k)
splits = ops._num_splits(None, 1, 8, 131072, q.device, name)
addr, bind = ops.launcher(ops.DECODE, name), build.binding()
out = torch.empty_like(q)
po = torch.empty(1, 32, 1, splits, 128, device="cuda")
pl = torch.empty(1, 32, 1, splits, device="cuda")
stages = {
    "ops.decode (whole)": (lambda: ops.decode(q, k, v), True),
    "SDPA (whole)": (lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), True),
    "_check_decode": (lambda: ops._check_decode(q, k, v, None), False),
    "_decode_version+_num_splits": (lambda: ops._num_splits(None, 1, 8, 131072, q.device, ops._decode_version(None, q, k)), False),
    "_direct": (lambda: ops._direct(q, k, v), False),
    "_scale": (lambda: ops._scale(None, 128), False),
    "3 allocations": (lambda: (q.new_empty(q.shape), torch.empty(1, 32, 1, splits, 128, device=q.device),
                               torch.empty(1, 32, 1, splits, device=q.device)), False),
    "3 x _aligned": (lambda: (ops._aligned(q), ops._aligned(k), ops._aligned(v)), False),
    "binding.decode_fwd (launch)": (lambda: bind.decode_fwd(addr, q, k, v, out, None, po, pl, None, 0.088, splits), True),
    "_decode_impl": (lambda: ops._decode_impl(q, k, v, None, 0.088, splits, name), True),
    "torch.empty_like (one)": (lambda: torch.empty_like(q), False),
}
print(torch.cuda.get_device_name(), torch.__version__, f"decode B1 H32/8 131072 keys, {name}, {splits} splits")
for label, (fn, launches) in stages.items():
    print(f"{label:<32} {host_us(fn, launches=launches):7.2f} us")
qa = torch.randn(4, 16, 512, 128, device="cuda", dtype=torch.bfloat16)
fv = ops.attention_version(qa)
fa = ops.launcher(ops.FWD, fv)
oa = torch.empty_like(qa)
print(f"attention B4 H16 S512 D128, {fv}")
for label, (fn, launches) in {
    "ops.attention (whole)": (lambda: ops.attention(qa, qa, qa), True),
    "SDPA (whole)": (lambda: F.scaled_dot_product_attention(qa, qa, qa), True),
    "binding.attn_fwd (launch)": (lambda: bind.attn_fwd(fa, qa, qa, qa, oa, None, 0.088, False, None), True),
    "_attention_impl": (lambda: ops._attention_impl(qa, qa, qa, False, 0.088, fv, False), True),
}.items():
    print(f"{label:<32} {host_us(fn, launches=launches):7.2f} us")
