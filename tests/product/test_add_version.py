"""Adding a kernel version takes two edits: add the file, add the registry line (kernels/README.md,
"Adding a version").

In a temporary clone of the repository, a scratch v99 (a copy of v01 under its own symbol: which kernel is
copied does not matter to the two edits, and v01 compiles in seconds where v04 takes half a minute) is added with
exactly those two edits; then the compile check builds it for sm_80 and sm_90a, the registry-driven CPU
tests pass with it, and the GPU tests pick it up without being touched.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("git") is None,
                                reason="needs nvcc and git")


def _run(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": str(cwd), "LAB_CACHE_DIR": str(Path(cwd) / ".cache"), "LAB_OUTPUTS": str(Path(cwd) / "outputs")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, **kw)


def test_scratch_version_takes_two_edits(tmp_path):
    clone = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    before = set(_run(["git", "ls-files"], clone).stdout.split())

    # Edit 1: the file (a copy of v01 under its own launcher symbol).
    source = (clone / "kernels/fwd/v01_scalar.cu").read_text().replace("attn_fwd_v01", "attn_fwd_v99")
    (clone / "kernels/fwd/v99_scratch.cu").write_text(source)
    # Edit 2: the registry line.
    ops_py = clone / "lab/registry.py"
    text = ops_py.read_text()
    anchor = '    "v04": Kernel("fwd/v04_lazy.cu", "attn_fwd_v04", (64, 128)),\n'
    assert anchor in text, "the FWD registry line of v04 moved: update this test's anchor"
    ops_py.write_text(text.replace(anchor, anchor + '    "v99": Kernel("fwd/v99_scratch.cu", "attn_fwd_v99", (16, 32, 64, 128)),\n'))

    status = _run(["git", "status", "--porcelain"], clone).stdout.split("\n")
    changed = sorted(line[3:] for line in status if line.strip())
    assert changed == ["kernels/fwd/v99_scratch.cu", "lab/registry.py"], changed  # two edits, nothing else

    compiled = _run([sys.executable, "-c",
                     "from lab import build, ops\n"
                     "rows = build.compile_check(sources=[build.paths.KERNELS / ops.FWD['v99'].source])\n"
                     "names = {r['arch'] for r in rows if 'v99' in r['kernel']}\n"
                     "assert names == {'sm_80', 'sm_90a'}, names\n"
                     "print(len(rows), 'instantiations')"], clone, timeout=1800)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr

    # one pytest run for both (each run imports torch and collects): the registry-driven CPU tests pass with v99, and
    # the GPU tests, parametrised by the registry, list it among their cases (-rs names each skipped case's reason,
    # -v each case's id)
    tests = _run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:nbmake",
                  "tests/product/test_ops.py", "tests/product/test_gpu.py"], clone, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    ops_cases = [line for line in tests.stdout.splitlines() if line.startswith("tests/product/test_ops.py::")]
    assert ops_cases and all(" PASSED" in line for line in ops_cases), tests.stdout[-3000:]
    gpu_cases = [line for line in tests.stdout.splitlines() if line.startswith("tests/product/test_gpu.py::")]
    assert any("v99" in line for line in gpu_cases), tests.stdout[-2000:]
    assert set(_run(["git", "ls-files"], clone).stdout.split()) == before
