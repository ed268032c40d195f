"""A backward version for the head dims above 128 before it is the default, on the GPU in one process: VERSION goes
ahead of bwd v09 in the Hopper preference (lab.registry.BEST_BWD_HOPPER, read at call time), so lab.ops.attention's
gradients at D 192 / 256 (and 160 / 200, padded) run it; then
  --checks  lab.fwd.head_dims_gpu.wide_grad_checks: the public op's gradients and every wide version by name against
            float64 through lab.check, strided views, a negative scale, D_v != D_qk, each version's build without the
            D term (must fail), the deterministic mode (must raise);
  --race    GPU time of bwd v09 and VERSION kernel-level in rounds with SDPA-cuDNN (race.versions), then the public
            op's backward and forward + backward raced against SDPA's backends (race.race), over
            lab.cases.wide_head_dim_cases (--quick: the S = 2048 and GQA cells);
  --calls   tools/gpu/wide_sanitize.py's calls (run this under compute-sanitizer).
--also NAME (e.g. v19:LAB_BWD_WIDE_SM90_DQ_UNDER_DP=1): another build timed beside them in race.versions.
Records go to $LAB_SESSION_DIR / $LAB_OUTPUTS. Usage: python3 tools/gpu/wide_bwd_candidate.py VERSION [--checks]
[--race] [--calls] [--quick] [--also NAME]"""
import runpy
import sys
from pathlib import Path

import torch

from lab import cases, registry
from lab.backward import race
from lab.fwd import head_dims_gpu
from lab.publish import tables


def prefer(version: str) -> None:
    """VERSION before v09 in the Hopper backward preference, in this process only."""
    rest = tuple(v for v in registry.BEST_BWD_HOPPER if v != version)
    at = rest.index("v09")
    registry.BEST_BWD_HOPPER = rest[:at] + (version,) + rest[at:]


def main(argv):
    version, quick = argv[0], "--quick" in argv
    prefer(version)
    torch.backends.cuda.matmul.allow_tf32 = False
    fails = 0
    if "--calls" in argv:
        sys.argv = [sys.argv[0]]
        runpy.run_path(str(Path(__file__).with_name("wide_sanitize.py")), run_name="__main__")
    if "--checks" in argv:
        fails, total = head_dims_gpu.wide_grad_checks(quick)
        print(f"wide gradient checks ({version} preferred): {total - fails}/{total} pass")
    if "--race" in argv:
        grid = cases.wide_head_dim_cases()
        if quick:
            grid = [c for c in grid if "s2048" in c.name or "gqa" in c.name]
        also = [argv[i + 1] for i, a in enumerate(argv) if a == "--also"]
        print(tables.versions(race.versions(grid, ["v09", version, *also], progress=False)))
        rows = race.race(grid, modes=("bwd", "fwd+bwd"), flex=False, progress=False)
        for kind in ("bwd", "fwd+bwd"):
            print(kind, tables.race([r for r in rows if r["kind"] == kind], backends=("flash", "cudnn", "efficient")))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
