"""Does the math backend slow the rows timed after it in a round? (n9: sdpa-default and lab.ops.attention came
out 7-16 % slow in exactly the cells where SDPA-math ran.)

Per cell, the same rows timed in rounds three ways:
  with_math    cudnn, math, default, lab.ops.attention, kernel only (the sweep's old order)
  math_alone   the same rows without math in the round; math timed after, in rounds of its own (lab.sweep now)
  no_math      the rows without math at all
If the slow-down follows math, default/cudnn and op/kernel are ~1 in math_alone and no_math only.
Usage: python tests/cuda/math_round_effect.py out.jsonl
"""
import json
import sys

import torch

from lab import bench, cases, ops, sweep


def main():
    grid = {c.name: c for c in cases.bench_fwd_cases("bfloat16")}
    lines = []
    for name in ("fwd-d128-s512", "fwd-d128-s2048", "fwd-d128-s2048-c", "fwd-d64-s512-c"):
        case = grid[name]
        q, k, v, causal = sweep.case_inputs(case)
        version = ops.attention_version(q, None, causal)
        sdpa = bench.sdpa_runner("default", q, k, v, causal)
        rows = {
            "cudnn": (sdpa, lambda: bench.sdpa_backend("cudnn")),
            "math": (sdpa, lambda: bench.sdpa_backend("math")),
            "default": (sdpa, None),
            "lab.ops.attention": (lambda: ops.attention(q, k, v, is_causal=causal), None),
            "kernel only": (ops.fwd_call_factory(version)(q, k, v, causal), None),
        }
        layouts = {"with_math": [rows], "math_alone": [{n: r for n, r in rows.items() if n != "math"},
                                                       {"math": rows["math"]}],
                   "no_math": [{n: r for n, r in rows.items() if n != "math"}]}
        for layout, groups in layouts.items():
            timed = {}
            for group in groups:
                timed.update(bench.time_interleaved(group))
            ms = {n: t.median_ms for n, t in timed.items()}
            line = {"case": name, "version": version, "layout": layout, "median_ms": ms,
                    "default_over_cudnn": ms["default"] / ms["cudnn"],
                    "op_over_kernel": ms["lab.ops.attention"] / ms["kernel only"],
                    "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
            lines.append(line)
            print(f"{name:<18} {layout:<11} default/cudnn {line['default_over_cudnn']:.3f}  "
                  f"op/kernel {line['op_over_kernel']:.3f}  " + "  ".join(f"{n} {m:.4f}" for n, m in ms.items()),
                  flush=True)
    with open(sys.argv[1], "w") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)


if __name__ == "__main__":
    main()
