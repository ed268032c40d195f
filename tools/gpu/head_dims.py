"""Head dims without a kernel of their own, on the GPU in one process: lab.ops.attention's forward and
gradients (zero-padded to the next kernel head dim) checked through lab.check against float64, value head dims
other than the query's checked the same way by hand, then forward and backward timed against SDPA's backends
over lab.cases.head_dim_cases. Usage: python3 tools/gpu/head_dims.py [--quick] [--checks-only] [--wide].
--wide: the head dims above 128 instead (fwd v10 and bwd v19 / v09 at 192 / 256, 160 and 200 padded; deterministic
gradients must raise NotImplementedError), raced over lab.cases.wide_head_dim_cases. Records go to $LAB_OUTPUTS.
The checks and races themselves are lab.fwd.head_dims_gpu's (chapter n14 runs them too).
"""
import sys

import torch

from lab.fwd.head_dims_gpu import checks, head_dim_race, wide_bwd_race, wide_checks, wide_race


def main(argv):
    torch.backends.cuda.matmul.allow_tf32 = False
    quick = "--quick" in argv
    if "--wide" in argv:
        fails = wide_checks(quick)
        if "--checks-only" not in argv:
            wide_race(quick)
            wide_bwd_race(quick)
        return 1 if fails else 0
    fails = checks(quick)
    if "--checks-only" not in argv:
        head_dim_race(quick)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
