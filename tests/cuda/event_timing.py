"""The timing loop of the SDPA bench scripts beside it (sdpa_flash_bench.py, sdpa_decode_bench.py).

median_ms(call, warmups, reps): call(0) .. call(warmups - 1), a device synchronize, then `reps` calls
call(warmups + i), each between two CUDA events, synchronized on the second; the median of the event times in
ms (the upper one of an even count). The index lets a caller rotate its inputs.
host_us(fn, n, launches): the median host microseconds of fn() (host_breakdown.py, public_op_gap.py).
"""
import statistics
import time

import torch


def median_ms(call, warmups, reps):
    for i in range(warmups):
        call(i)
    torch.cuda.synchronize()
    ms = []
    for i in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        call(warmups + i)
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1))
    ms.sort()
    return ms[len(ms) // 2]


def host_us(fn, n=300, launches=True):
    """Median host time of fn() in us; launches=True keeps the GPU busy first, so no launch waits on it."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    if launches:
        torch.cuda._sleep(3_000_000 * n // 100)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)
