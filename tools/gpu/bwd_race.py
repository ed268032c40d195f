"""The Hopper backward on the GPU, in one process: gradient checks of a backward version through lab.check
(float64 reference, SDPA's error as the yardstick), then the race (lab.backward.race) over bench-bwd or a
subset, a table printed last. Usage: python3 tools/gpu/bwd_race.py VERSION CASE_FILTER [--flex] [--checks-only]
(CASE_FILTER: a substring of case names, '' for all). Records go to $LAB_OUTPUTS.
"""
import sys

import torch

from lab import cases, check
from lab.publish import tables
from lab.backward import harness as backward_harness
from lab.backward import race as backward_race
from lab.cases import Case

CHECKS = [Case("c-d64", 2, 4, 2, 65, 130, 64, "bfloat16", True), Case("c-d128", 2, 4, 2, 130, 65, 128, "float16", False),
          Case("c-odd", 1, 6, 2, 1025, 4097, 64, "bfloat16", True),
          Case("c-long", 1, 4, 4, 4097, 1025, 128, "float16", True),
          Case("c-big", 1, 2, 1, 4097, 4097, 128, "bfloat16", False), Case("c-one", 2, 2, 2, 1, 63, 128, "bfloat16", True),
          Case("c-gqa", 2, 32, 8, 1024, 1024, 128, "bfloat16", True)]


def main(argv):
    version, flt = argv[0], argv[1]
    torch.backends.cuda.matmul.allow_tf32 = False
    fails = 0
    for case in CHECKS:
        for scale in (None, -0.3):
            res = check.check_backward(backward_harness.bwd_runner(version), case, f"bwd-{version}", trials=1,
                                       scale=scale)
            ok = check.backward_passed(res)
            fails += not ok
            print("PASS" if ok else "FAIL", case.name, scale, "" if ok else [repr(r) for r in res.values()])
    print(f"checks: {len(CHECKS) * 2 - fails}/{len(CHECKS) * 2} pass")
    if "--checks-only" in argv:
        return 1 if fails else 0
    chosen = [c for c in cases.bench_bwd_cases() if flt in c.name]
    rows = backward_race.race(chosen, flex="--flex" in argv, progress=False)
    for kind in ("bwd", "fwd+bwd"):
        print(kind, tables.race([r for r in rows if r["kind"] == kind], backends=("flash", "cudnn", "efficient", "flex")))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
