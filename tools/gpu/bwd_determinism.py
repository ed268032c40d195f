"""The deterministic mode's cost on Hopper, per bench-bwd cell whose name contains a filter: in GPU time
(lab.bench.GpuTimeTimer, the host hidden behind a GPU sleep) and in rounds, SDPA-cuDNN's backward, the public op's
backward in the default mode and under torch.use_deterministic_algorithms, and kernel-level v14 and every version
with a deterministic mode that runs here (lab.registry.DETERMINISTIC_BWD) in that mode. Then each deterministic kernel's gradients three times on the
cell's inputs, which must be bit-identical (v14's, which need not be, are compared too). Records (kind
'bwd-kernel', with 'identical') go to $LAB_OUTPUTS. Usage: python3 tools/gpu/bwd_determinism.py "d128-s1024,d64-s4096-c"
"""
import contextlib
import sys

import torch

from lab import bench, cases, ops, record
from lab.backward.harness import flops, ours_step, sdpa_step
from lab.backward.op import _bwd_impl
from lab.op_common import _scale
from lab.registry import BWD, DETERMINISTIC_BWD
from lab.sweep import _inputs_fwd, _row


@contextlib.contextmanager
def deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


def main(argv):
    filters = argv[0].split(",") if argv and argv[0] else [""]
    chosen = [c for c in cases.bench_bwd_cases() if any(f in c.name for f in filters)]
    timer, ceilings = bench.GpuTimeTimer(), bench.ceilings()
    capability = tuple(torch.cuda.get_device_capability())
    versions = [name for name in DETERMINISTIC_BWD if not BWD[name].capabilities or capability in BWD[name].capabilities]
    for i, case in enumerate(chosen):
        q, k, v = _inputs_fwd(case, seed=i)
        dout = _inputs_fwd(case, seed=10_000 + i)[0]
        with torch.no_grad():
            out, lse = ops.attention(q, k, v, is_causal=case.causal, enable_gqa=case.Hq != case.Hkv, return_lse=True)
        scale = _scale(None, case.D)

        def kernel(version, det):
            return lambda: _bwd_impl(dout, q, k, v, out, lse, None, case.causal, scale, det, version)

        base = "sdpa-cudnn (GPU time)"
        calls = {base: (sdpa_step("cudnn", "bwd", q, k, v, case.causal, dout), None),
                 "lab.ops.attention (GPU time)": (ours_step("bwd", q, k, v, case.causal, dout), None),
                 "lab.ops.attention, deterministic (GPU time)": (ours_step("bwd", q, k, v, case.causal, dout),
                                                                 deterministic),
                 "bwd-v14 (kernel-level)": (kernel("v14", False), None)}
        calls.update({f"bwd-{name} deterministic (kernel-level)": (kernel(name, True), None) for name in versions})
        times = bench.time_interleaved(calls, timer=timer)
        work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, "bwd")
        identical = {}
        for name, version, det in [(name, name, True) for name in versions] + [("v14", "v14", False)]:
            first = kernel(version, det)()
            identical[name] = all(all(torch.equal(a, b) for a, b in zip(first, kernel(version, det)()))
                                  for _ in range(2))
        print(f"{case.name}: bit-identical over 3 runs: {identical}")
        for impl, t in times.items():
            extra = {"flops": work, "timer": "gpu-time", "identical": identical}
            if impl != base and isinstance(t, bench.Timing) and isinstance(times[base], bench.Timing):
                extra["ratios"] = {"sdpa-cudnn": times[base].median_ms / t.median_ms}
            row = record.append(_row("bwd-kernel", impl, case, t, work, ceilings, extra))
            ms = f"{t.median_ms:8.3f} ms" if isinstance(t, bench.Timing) else str(t)
            print(f"  {impl:46s} {ms}  x cuDNN {extra.get('ratios', {}).get('sdpa-cudnn', float('nan')):.3f}"
                  f"  {row.get('tflops') or 0:.0f} TFLOP/s")
        del q, k, v, dout, out, lse
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
