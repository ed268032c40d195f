"""Backward versions against each other and SDPA-cuDNN, in rounds in one process (a diagnostic: the versions
are called through the kernel-level runner with the forward's lse precomputed, SDPA through autograd).
Usage: python3 tools/gpu/bwd_versions.py OUT.jsonl CASE_FILTER VERSION[:DEFINE=VALUE,...] ...
"""
import json
import sys

import torch

from lab import bench, cases, ops
from lab.backward import _bwd_impl
from lab.backward.harness import flops, sdpa_step
from lab.op_common import _scale
from lab.sweep import _inputs_fwd


def main(argv):
    out, flt, specs = argv[0], argv[1], argv[2:]
    rows = []
    for i, case in enumerate(c for c in cases.bench_bwd_cases() if flt in c.name):
        q, k, v = _inputs_fwd(case, seed=i)
        dout = _inputs_fwd(case, seed=10_000 + i)[0]
        scale = _scale(None, case.D)
        with torch.no_grad():
            o, lse = ops.attention(q, k, v, is_causal=case.causal, enable_gqa=case.Hq != case.Hkv, return_lse=True)
        calls = {"sdpa-cudnn": (sdpa_step("cudnn", "bwd", q, k, v, case.causal, dout), None)}
        for spec in specs:
            version, _, defs = spec.partition(":")
            defines = dict(d.split("=") for d in defs.split(",")) if defs else None
            calls[spec] = (lambda ver=version, d=defines: _bwd_impl(dout, q, k, v, o, lse, None, case.causal, scale,
                                                                    False, ver, d), None)
        times = bench.time_interleaved(calls)
        work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, "bwd")
        tf = {n: work / t.median_ms / 1e9 for n, t in times.items() if isinstance(t, bench.Timing)}
        rows.append({"case": case.name, "tflops": tf, "gpu": torch.cuda.get_device_name()})
        print(f"{case.name:24} " + " ".join(f"{n}={x:6.1f}" for n, x in tf.items()), flush=True)
    with open(out, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
