"""Every kernel library built at once, before a GPU session's chapters run.

A chapter builds each kernel it calls on first use, one nvcc run at a time, and one nvcc run is one core: on a
16-core GPU machine a whole session would spend most of its build time with 15 cores idle. `prebuild` runs the
builds side by side, as the compile check does (lab.build.compile_check): threads that wait on their nvcc
processes, at most `jobs` at once, each publishing into the kernel cache under its own lock. The chapters then
load every default library from the cache. A chapter's own variants (a `-D` switch, a deliberately wrong build)
still build when the chapter asks for them.

A build that fails is reported and the others go on: the chapter that needs the kernel fails with the compiler's
own message, in its place in the book.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

from . import build, paths

BINDING = "binding"  # the torch binding (lab/binding.cpp), built beside the kernels


def targets() -> list[str]:
    """The binding and every kernel file (`kernels/...`, relative)."""
    return [BINDING, *(paths.relative(p) for p in build.kernel_sources())]


def _build(target: str, arch: list[str]) -> None:
    if target == BINDING:
        build.binding()
    else:
        build.build_kernel(target, arch=arch)


def prebuild(arch: list[str], sources: list[str] | None = None, jobs: int | None = None, printer=print) -> dict:
    """Build `sources` (default: `targets()`) for the nvcc target flags `arch`, at most `jobs` (default: one per
    core) at once. Returns {"built", "failed": [{"source", "error"}], "jobs", "seconds"}; prints a line a build,
    a failure as the compiler's summary and its first error."""
    sources = targets() if sources is None else list(sources)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(sources) or 1))
    start = time.perf_counter()

    def one(source: str) -> dict:
        began = time.perf_counter()
        try:
            _build(source, arch)
        except build.BuildError as err:
            error = " | ".join(line.strip() for line in str(err).splitlines()[:2])
            printer(f"  prebuild of {source} failed in {time.perf_counter() - began:.0f} s: {error}")
            return {"source": source, "error": error}
        printer(f"  prebuilt {source} in {time.perf_counter() - began:.0f} s")
        return {"source": source, "error": None}

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(one, sources))
    failed = [r for r in results if r["error"]]
    return {"built": len(results) - len(failed), "failed": failed, "jobs": jobs,
            "seconds": round(time.perf_counter() - start, 2)}
