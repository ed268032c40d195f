"""Issue 11 quick check on a GPU, outside a session: host cost of both public ops beside SDPA's on a few
shapes, and decode through the public op on the long-cache cells. Prints a short table; rows go to the
ad-hoc records (outputs/adhoc). Usage: python tests/cuda/public_op_check.py"""
import torch

from lab import cases, hostcost, ops, sweep

print(torch.cuda.get_device_name(), torch.__version__)
dec = [c for c in cases.bench_decode_cases() if c.B in (1, 8)][:6] + cases.decode_long_cases()
fwd = [c for c in cases.bench_fwd_cases() if c.Sq in (512, 8192)][:4] + cases.seed_cases()[:3]
print(hostcost.table(hostcost.host_sweep(dec, sweep.public_decode(), sweep.PUBLIC_DECODE, progress=False)))
print(hostcost.table(hostcost.host_sweep(fwd, sweep.public_attention(), sweep.PUBLIC_FWD, progress=False)))
rows = sweep.decode_sweep(cases.decode_long_cases(), {sweep.PUBLIC_DECODE: sweep.public_decode(),
                                                     sweep.kernel_only("auto"): ops.decode_call_factory(None)},
                          backends=("flash", "cudnn"), progress=False)
for r in rows:
    if "timing" in r:
        print(f"{r['case']['name']:<24} {r['impl']:<20} {r['gbps']:8.0f} GB/s  {r.get('ratios', {})}")
