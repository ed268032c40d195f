"""decode v05's per-thread walk of the block table on the CPU: tests/fixtures/paged_rowwalk_check.cu runs
lab::paged::RowWalk (kernels/common/paged_bulk.cuh) as host code against plain division, for every row of a 64-key
tile, page sizes 16-256, splits starting inside pages, shuffled tables with a bad id, built with AddressSanitizer so
that a table read past the slots of a sequence's length fails. Needs nvcc, no GPU."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from lab import paths

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


@pytest.mark.parametrize("wrong", [False, True], ids=["walk", "identity-table"])
def test_row_walk_matches_division_and_stays_in_the_table(tmp_path, wrong):
    """wrong: the self-test's build (LAB_PAGED_BUG_IDENTITY reads slot i as page i) must fail the same check."""
    binary = tmp_path / "rowwalk_check"
    flags = ["-Xcompiler", "-fsanitize=address", "-lasan"] + (["-DLAB_PAGED_BUG_IDENTITY"] if wrong else [])
    build = subprocess.run(["nvcc", "-std=c++17", "-O1", "-I", "kernels", *flags, "tests/fixtures/paged_rowwalk_check.cu",
                            "-o", str(binary)], cwd=paths.ROOT, capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "asan" in build.stderr.lower():
        pytest.skip(f"no AddressSanitizer for nvcc's host compiler: {build.stderr.strip()[-200:]}")
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    if wrong:
        assert run.returncode == 1 and run.stdout.startswith("mismatch"), run.stdout[-2000:]
        return
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-2000:]
    assert int(run.stdout.split()[1]) > 10000
