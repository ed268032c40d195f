"""Where the packed forward's time goes at one length, and the softcap's public-call gap: host, fills, kernel.

Chapter n13's race times cold public calls (bench.CudaTimer: the host's time until its first launch is inside the
window). Packed, 8 x 2048 tokens (H 16, D 128, bf16, causal) read 1.75x the dense default's time, and the masked
kernel's dense call on the same tokens 1.62x: so the packed call's own cost was about 8 %, the rest the masked
kernel (fwd v09, v05's serial loop) against the default (v07). Here, in one process, in rounds:
  - the public packed call (check_cu_seqlens False and True), the same call as it was (the whole output zeroed and
    LSE filled with -inf before the kernel), the kernel alone into preallocated tensors, the masked kernel's dense
    call (public and kernel alone) and the dense default, each cold (CudaTimer) and in GPU time (GpuTimeTimer);
  - host microseconds per call (lab.hostcost.host_us, the GPU idle and kept busy);
  - softcap 30 against the masked call without it (S 4096, causal): the public call cold and in GPU time, the kernel
    alone in GPU time (the session's public gap was 37 us where the kernels' A/B read 12 us).
Prediction: the packed call's 8 % is the fill (a 64 MiB memset, ~25 us at ~3 TB/s, of ~440 us) plus a few us of
host checks; without the fill the packed call is within 2-3 % of the masked kernel's dense call, and the 1.75x is
then the masked kernel's (1.6x), not the host's.
    LAB_COMMIT=<sha> python3 tools/gpu/masks_varlen_host.py   -> one JSON line per table, $OUT/varlen_host.jsonl
"""
import json
import os

import torch

from lab import bench, hostcost, ops
from lab.masks import op as mop, spec

H, D, dt = 16, 128, torch.bfloat16
env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "commit": os.environ.get("LAB_COMMIT", "")}
timers = {"cold": bench.CudaTimer(), "gpu_time": bench.GpuTimeTimer()}


def emit(kind, case, calls, host=()):
    line = {"kind": kind, "case": case, "env": env}
    for name, timer in timers.items():
        times = bench.time_interleaved(calls, timer=timer, budget_s=0.4, max_reps=30, min_reps=8)
        line[name + "_ms"] = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
    line["host_us"] = {n: {"idle": hostcost.host_us(calls[n][0], calls=50),
                           "busy": hostcost.host_us(calls[n][0], calls=50, busy=True)} for n in host}
    print(json.dumps(line), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "varlen_host.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


def packed():
    lens = [2048] * 8
    total, n = sum(lens), lens[0]
    torch.manual_seed(0)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=dt) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    qb, kb, vb = (t.view(len(lens), n, H, D).transpose(1, 2) for t in (q, k, v))
    mask, scale = spec.make_mask(True, None, 0.0), D ** -0.5
    out, lse = torch.empty_like(q), torch.empty(H, total, device="cuda")
    out_d, lse_d = torch.empty(len(lens), H, n, D, device="cuda", dtype=dt), torch.empty(len(lens), H, n, device="cuda")
    qc, kc, vc = (t.contiguous() for t in (qb, kb, vb))  # the dense kernel alone, on (B, H, S, D) tensors

    def as_it_was():  # lab.masks.op._varlen_impl before: the whole output zeroed, LSE -inf, then the kernel
        o = torch.zeros_like(q)
        lse_ = torch.full((H, total), float("-inf"), device="cuda")
        mop.launch(q, k, v, o, lse_, mask, scale, 0, None, cu, cu, n, n)
        return o
    calls = {
        "packed_public": lambda: ops.attention_varlen(q, k, v, cu, cu, n, n, is_causal=True, check_cu_seqlens=False),
        "packed_public_checked": lambda: ops.attention_varlen(q, k, v, cu, cu, n, n, is_causal=True),
        "packed_zero_filled": as_it_was,
        "packed_kernel": lambda: mop.launch(q, k, v, out, lse, mask, scale, 0, None, cu, cu, n, n),
        "dense_masked_public": lambda: ops.attention(qb, kb, vb, is_causal=True, window_size=(-1, -1)),
        "dense_masked_kernel": lambda: mop.launch(qc, kc, vc, out_d, lse_d, mask, scale),
        "dense_default_public": lambda: ops.attention(qb, kb, vb, is_causal=True)}
    emit("varlen_host", {"lens": lens, "H": H, "D": D, "dtype": "bfloat16", "causal": True},
         {name: (fn, None) for name, fn in calls.items()},
         host=("packed_public", "packed_public_checked", "packed_zero_filled", "dense_masked_public",
               "dense_default_public"))


def softcap():
    S = 4096
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=dt) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(1, H, S, device="cuda")
    scale = D ** -0.5
    calls = {
        "softcap_public": lambda: ops.attention(q, k, v, is_causal=True, softcap=30.0),
        "plain_public": lambda: ops.attention(q, k, v, is_causal=True, window_size=(-1, -1)),
        "softcap_kernel": lambda: mop.launch(q, k, v, out, lse, spec.make_mask(True, None, 30.0), scale),
        "plain_kernel": lambda: mop.launch(q, k, v, out, lse, spec.make_mask(True, None, 0.0), scale),
        "default_public": lambda: ops.attention(q, k, v, is_causal=True)}
    emit("softcap_host", {"S": S, "H": H, "D": D, "dtype": "bfloat16", "causal": True, "softcap": 30.0},
         {name: (fn, None) for name, fn in calls.items()}, host=("softcap_public", "plain_public"))


if __name__ == "__main__":
    print(env, flush=True)
    packed()
    softcap()
