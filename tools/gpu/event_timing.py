"""The timing loop of the SDPA bench scripts beside it (sdpa_flash_bench.py, sdpa_decode_bench.py).

median_ms(call, warmups, reps): call(0) .. call(warmups - 1), a device synchronize, then `reps` calls
call(warmups + i), each between two CUDA events, synchronized on the second; the median of the event times in
ms (the upper one of an even count). The index lets a caller rotate its inputs.
"""
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

