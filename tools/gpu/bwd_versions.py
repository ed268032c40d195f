"""Backward versions in GPU time beside SDPA-cuDNN's backward and the public op's (lab.backward.race.versions),
on the bench-bwd cells whose name contains a filter, then the table. Records go to $LAB_OUTPUTS.
Usage: python3 tools/gpu/bwd_versions.py v05,v06 "d128-s1024,d64-s4096" (names may carry switches: v05:LAB_BWD_STAGGER=0)
"""
import sys

from lab import cases
from lab.backward import race
from lab.publish import tables


def main(argv):
    names = argv[0].split(",")
    filters = argv[1].split(",") if len(argv) > 1 and argv[1] else [""]
    chosen = [c for c in cases.bench_bwd_cases() if any(f in c.name for f in filters)]
    rows = race.versions(chosen, names=names, progress=False)
    print(tables.versions(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
