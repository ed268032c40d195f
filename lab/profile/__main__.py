"""`python -m lab.profile TARGET CASE`: profile one launch and print the verdict; `python -m lab.profile child
TARGET CASE` is what ncu runs (warm-ups, then the profiled launch)."""
from __future__ import annotations

import sys

from . import __doc__ as package_doc
from .ncu import NVTX_RANGE, ProfileUnavailable, measure
from .targets import find_case, make_call

def child_main(target: str, case_name: str, warmup: int, dtype: str | None = None) -> int:
    """Inside ncu: warm-up launches, then the profiled one, all inside one NVTX range."""
    import torch

    fn = make_call(target, find_case(case_name, dtype))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    for _ in range(warmup + 1):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.profile", description=package_doc.split("\n")[0])
    parser.add_argument("target", help="child | fwd:v04 | decode:v02 | bwd:v02 | op:attention | op:decode | sdpa:flash | sdpa-bwd:cudnn ...")
    parser.add_argument("rest", nargs="+", help="case name (after 'child': target and case)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dtype", help="dtype of a bench case (default: the case set's own)")
    args = parser.parse_args(argv)
    if args.target == "child":
        return child_main(args.rest[0], args.rest[1], args.warmup, args.dtype)
    try:
        row = measure(args.target, args.rest[0], args.warmup, dtype=args.dtype)
    except ProfileUnavailable as err:
        print(f"no profile: {err}", file=sys.stderr)
        return 1
    m, v = row["metrics"], row["verdict"]
    print(f"{row['impl']} on {args.rest[0]}: {m['kernel']} {m['duration_us']:.1f} us; {v['bound']}-bound "
          f"({v['reason']}); next: {v['action']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
