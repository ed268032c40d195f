"""Every kernel library built at once, before a GPU session's chapters run.

A chapter builds each kernel it calls on first use, one nvcc run at a time, and one nvcc run is one core: on a
16-core GPU machine a whole session would spend most of its build time with 15 cores idle. `prebuild` runs the
builds side by side, each in its own process (`python -m lab.prebuild`, no torch imported for a kernel file), at
most `jobs` at once; the chapters then load every default library from the cache. A chapter's own variants (a
`-D` switch, a deliberately wrong build) still build when the chapter asks for them.

A build that fails is reported and the others go on: the chapter that needs the kernel fails with the compiler's
own message, in its place in the book.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import paths

BINDING = "binding"  # the torch binding (lab/binding.cpp), built beside the kernels


def targets() -> list[str]:
    """The binding and every kernel file, as the command line names them (`kernels/...` relative)."""
    from .build import kernel_sources

    return [BINDING, *(paths.relative(p) for p in kernel_sources())]


def _command(target: str, arch: list[str]) -> list[str]:
    return [sys.executable, "-m", "lab.prebuild", target, *arch]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def prebuild(arch: list[str], sources: list[str] | None = None, jobs: int | None = None, printer=print) -> dict:
    """Build `sources` (default: `targets()`) for the nvcc target flags `arch`, at most `jobs` (default: one per
    core) at once. Returns {"built", "failed": [{"source", "error"}], "seconds"}; prints a line a build."""
    sources = targets() if sources is None else list(sources)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(sources) or 1))
    start = time.perf_counter()

    def one(source: str) -> dict:
        began = time.perf_counter()
        proc = subprocess.run(_command(source, arch), cwd=paths.ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - began
        if proc.returncode == 0:
            printer(f"  prebuilt {source} in {seconds:.0f} s")
            return {"source": source, "error": None}
        error = _last_line(proc.stderr + proc.stdout)
        printer(f"  prebuild of {source} failed in {seconds:.0f} s: {error}")
        return {"source": source, "error": error}

    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait: each build is its own process
        results = list(pool.map(one, sources))
    failed = [r for r in results if r["error"]]
    return {"built": len(results) - len(failed), "failed": failed, "jobs": jobs,
            "seconds": round(time.perf_counter() - start, 2)}


def main(argv: list[str]) -> int:
    """`python -m lab.prebuild TARGET [NVCC TARGET FLAGS...]`: build one kernel file (or the binding) into the
    cache; what a prebuild runs in each of its processes."""
    if not argv:
        print("usage: python -m lab.prebuild binding | kernels/<family>/<file>.cu [nvcc target flags]",
              file=sys.stderr)
        return 2
    from . import build

    target, arch = argv[0], argv[1:]
    paths.setup_cache_env()
    try:
        if target == BINDING:
            build.binding()
        else:
            build.build_kernel(Path(target), arch=arch or None)
    except build.BuildError as err:  # one line, which the prebuild prints: the summary and the first error
        print(f"{target}: " + " | ".join(line.strip() for line in str(err).splitlines()[:2]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
