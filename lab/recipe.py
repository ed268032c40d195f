"""The edit -> rebuild -> rerun loop, measured: cold build, cached load, one-constant edit, a compile error.

Scratch copies live in kernels/.scratch/ (ignored by git and by the compile check), so that includes
resolve as for real kernels and errors name a kernels/ path.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from . import build, paths, record

SCRATCH = paths.KERNELS / ".scratch"
_EDIT_MARK = "constexpr int kScratchEdit = "


def scratch_copy(source: str, edit: int) -> Path:
    """A copy of a kernel with one extra named constant; changing `edit` is a real source change."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    original = (paths.KERNELS / source).read_text()
    target = SCRATCH / Path(source).name
    target.write_text(original + f"\n// Edited in the build-recipe chapter.\n{_EDIT_MARK}{edit};\n")
    return target


def broken_copy(source: str) -> Path:
    """A copy with one undeclared identifier added at the end: what a typo looks like."""
    SCRATCH.mkdir(parents=True, exist_ok=True)
    target = SCRATCH / f"broken_{Path(source).name}"
    target.write_text((paths.KERNELS / source).read_text()
                      + "\n__global__ void typo_kernel(float* x) { x[0] = undeclared_scale * 2.0f; }\n")
    return target


def _smoke(lib: build.KernelLibrary, symbol: str) -> float:
    """Run the freshly loaded kernel once on a small input and return its max error against SDPA."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, 2, 65, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    build.binding().attn_fwd(lib.address(symbol), q, k, v, out, None, 0.125, False, None)
    return float((out.float() - F.scaled_dot_product_attention(q, k, v).float()).abs().max())


def measure_loop(source: str = "fwd/v01_scalar.cu", symbol: str = "attn_fwd_v01") -> dict:
    """Time the binding, a cold kernel build, a cached load (in a fresh process) and an edit; record each."""
    steps = {"cold binding + kernel build + load (fresh process, empty caches)": cold_build_seconds(source, symbol)}
    start = time.perf_counter()
    build.binding()
    steps["binding (first use this session)"] = time.perf_counter() - start

    nonce = time.time_ns() % 1_000_000_007  # a value never built before: the next build is cold
    start = time.perf_counter()
    lib = build.build_kernel(scratch_copy(source, nonce))
    steps["cold kernel build + load + run"] = time.perf_counter() - start
    steps["  (nvcc alone)"] = lib.build_seconds
    assert not lib.cached
    steps["  max error vs SDPA"] = _smoke(lib, symbol)

    steps["cached load (fresh process)"] = cached_load_seconds(lib.path.name, scratch_copy(source, nonce), symbol)

    start = time.perf_counter()
    edited = build.build_kernel(scratch_copy(source, nonce + 1))
    error = _smoke(edited, symbol)
    steps["edit -> rebuilt -> loaded -> run"] = time.perf_counter() - start
    steps["  max error vs SDPA after edit"] = error
    for step, seconds in (("binding", steps["binding (first use this session)"]),
                          ("cold", steps["cold binding + kernel build + load (fresh process, empty caches)"]),
                          ("cold kernel", steps["cold kernel build + load + run"]),
                          ("cached", steps["cached load (fresh process)"]),
                          ("edit", steps["edit -> rebuilt -> loaded -> run"])):
        record.append({"kind": "build", "source": source, "step": step, "seconds": seconds})
    return steps


def cold_build_seconds(source: str, symbol: str) -> float:
    """Binding and kernel built from nothing: a new process whose extension and kernel caches are empty."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as empty:
        env = {**os.environ, "TORCH_EXTENSIONS_DIR": os.path.join(empty, "ext"), "LAB_CACHE_DIR": os.path.join(empty, "lab")}
        code = textwrap.dedent(f"""
            import time, torch
            from lab import build
            start = time.perf_counter()
            build.binding()
            lib = build.build_kernel({source!r})
            lib.address({symbol!r})
            assert not lib.cached
            print(time.perf_counter() - start)
        """)
        out = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, env=env, capture_output=True, text=True,
                             check=True)
    return float(out.stdout.strip().splitlines()[-1])


def cached_load_seconds(expected_so: str, scratch: Path, symbol: str) -> float:
    """Load binding + kernel in a new Python process; fails loudly if anything was recompiled."""
    code = textwrap.dedent(f"""
        import time, torch
        from lab import build
        start = time.perf_counter()
        build.binding()
        lib = build.build_kernel({str(scratch)!r})
        lib.address({symbol!r})
        seconds = time.perf_counter() - start
        assert lib.cached and lib.path.name == {expected_so!r}, "a cached load recompiled"
        print(seconds)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=paths.ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])
