"""The masks' GPU checks and race standalone (lab.masks.gpu, and lab.masks.gpu_bwd for the backward):
LAB_SESSION_DIR=$OUT/<session> python tools/gpu/masks_run.py [checks-v11] [checks-v09] [checks-v08] [race] [checks-bwd]
[race-bwd]; with no argument, all six. MASKS_RACE_BUDGET_S bounds each race (150 s)."""
import os
import sys

from lab.masks import gpu, gpu_bwd


def main(argv: list[str]) -> int:
    stages = argv or ["checks-v11", "checks-v09", "checks-v08", "race", "checks-bwd", "race-bwd"]
    budget = float(os.environ.get("MASKS_RACE_BUDGET_S", "150"))
    bad = sum(gpu.checks(version) for version in ("v11", "v09", "v08") if f"checks-{version}" in stages)
    if "race" in stages:
        gpu.race(budget)
    if "checks-bwd" in stages:
        bad += gpu_bwd.checks()
    if "race-bwd" in stages:
        gpu_bwd.race(budget)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
