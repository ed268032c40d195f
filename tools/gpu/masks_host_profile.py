"""Where the masked public calls spend their host time: cProfile over many calls, the GPU kept busy (a queued sleep),
so each call only enqueues. tools/gpu/masks_varlen_host.py measured the host microseconds per call on the H100's host
(the masked and packed calls ~4x the default dense call's); this names the functions.
H 16, D 128, bf16, causal: the dense masked call (window (-1, -1)), the packed call (8 x 2048, check_cu_seqlens False)
and the dense default, 8 x 2048 each; then a window with softcap and sinks, and the two masked calls on their full
Python path (the version named: lab.masks.fast's one crossing is skipped).
    python3 tools/gpu/masks_host_profile.py   -> the top functions by own time per call, to stdout
"""
import cProfile
import io
import pstats
import time

import torch

from lab import ops

H, D, dt, N, CALLS = 16, 128, torch.bfloat16, 2048, 400
q, k, v = (torch.randn(8 * N, H, D, device="cuda", dtype=dt) for _ in range(3))
cu = torch.arange(0, 9 * N, N, dtype=torch.int32, device="cuda")
qb, kb, vb = (t.view(8, N, H, D).transpose(1, 2) for t in (q, k, v))
sinks = torch.zeros(H, device="cuda")
calls = {"dense_masked": lambda: ops.attention(qb, kb, vb, is_causal=True, window_size=(-1, -1)),
         "packed": lambda: ops.attention_varlen(q, k, v, cu, cu, N, N, is_causal=True, check_cu_seqlens=False),
         "dense_default": lambda: ops.attention(qb, kb, vb, is_causal=True),
         "dense_window_softcap_sinks": lambda: ops.attention(qb, kb, vb, is_causal=True, window_size=(1024, 0),
                                                             softcap=30.0, sinks=sinks),
         # the full Python path (lab.masks.op), taken when the version is named: the one-crossing path's baseline
         "dense_masked_full_path": lambda: ops.attention(qb, kb, vb, is_causal=True, window_size=(-1, -1),
                                                         version="v09"),
         "packed_full_path": lambda: ops.attention_varlen(q, k, v, cu, cu, N, N, is_causal=True,
                                                          check_cu_seqlens=False, version="v09")}
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for name, fn in calls.items():
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000 * CALLS)  # the GPU busy for longer than the calls take to enqueue
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    plain_us = (time.perf_counter() - start) / CALLS * 1e6
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000 * CALLS)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(CALLS):
        fn()
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
    print(f"== {name}: {plain_us:.1f} us per call without the profiler; cProfile over {CALLS} calls (its own cost "
          f"inflates the small functions):", flush=True)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:4000], flush=True)
