"""Decode at every head dim (64, 80, 96, 128, 192, 256) on the GPU before the chapters run: the same checks as
chapters n7 (contiguous, lab.cases.decode_head_dim_tests_cases, through the plan's kernel) and n11 (paged,
lab.cases.paged_head_dim_tests_cases, through lab.ops.decode), with the plan's splits and 3, by lab.check's rule
(float64 reference, SDPA's error as the yardstick, fresh inputs, poisoned outputs); a wrong scale (x1.05) at D 80 and
256 must fail. --race adds n11's head-dim race (lab.cases.bench_paged_head_dim_cases). Rows go to lab.record's
session ($LAB_SESSION_DIR). Exit 1 on any failed check.
Usage: LAB_SESSION_DIR=<dir> python3 tools/gpu/decode_head_dims.py [--race]
"""
from __future__ import annotations

import math
import sys

import torch

from lab import cases, check
from lab.decode import paged, profile_view
from lab.decode.op import decode_writer


def checks() -> int:
    results = [check.check_decode(decode_writer(None, s), c, f"lab.ops.decode splits={s}", trials=2)
               for c in cases.decode_head_dim_tests_cases() for s in (None, 3)]
    results += [paged.check_paged(c, f"{paged.PUBLIC_DECODE} splits={s}", num_splits=s, trials=2)
                for c in cases.paged_head_dim_tests_cases() for s in (None, 3)]
    fails = 0
    for r in results:
        fails += not r.passed
        print("PASS" if r.passed else "FAIL", r.impl, r.case.label, "" if r.passed else repr(r), flush=True)
    for D in (80, 256):  # the check must see a wrong kernel: the scale off by 5 %
        case = cases.DecodeCase(f"hd-wrong-scale-d{D}", 5, 32, 8, 1, 4097, D, "bfloat16", (1, 63, 65, 1025, 4097))
        writer = decode_writer()
        r = check.check_decode(lambda q, k, v, s, scale, out: writer(q, k, v, s, 1.05 / math.sqrt(D), out), case,
                               "selftest: wrong scale", trials=1)
        fails += r.passed
        print("PASS" if not r.passed else "FAIL", f"D {D} wrong scale fails the check: {not r.passed}", flush=True)
    print(f"decode head-dim checks: {len(results) + 2 - fails}/{len(results) + 2} as expected", flush=True)
    return fails


def main(argv: list[str]) -> int:
    fails = checks()
    if "--race" in argv:
        print(profile_view.head_dim_table(paged.paged_sweep(cases.bench_paged_head_dim_cases(), progress=False)))
    torch.cuda.synchronize()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
