"""The decode kernels' block-table walks on the CPU, no GPU needed: each fixture runs a walk as host code against
plain division over the tables of tests/fixtures/paged_tables.h (page sizes 16-256, splits starting inside pages,
shuffled tables with a bad id), built with AddressSanitizer so that a table read past the slots of a sequence's
length fails.
- tests/fixtures/paged_cursor_check.cu: lab::paged::PageCursor (kernels/common/paged.cuh), decode v03's walk, for
  both row patterns of its loader;
- tests/fixtures/paged_rowwalk_check.cu: lab::paged::RowWalk (kernels/common/paged.cuh), decode v05's
  per-thread walk, for every row of a 64-key tile; its LAB_PAGED_BUG_IDENTITY build (slot i read as page i)
  must fail the same check.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from lab import paths

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _run_fixture(tmp_path, fixture: str, defines=()):
    """Build tests/fixtures/<fixture>.cu with AddressSanitizer and run it: the finished process."""
    binary = tmp_path / fixture
    flags = ["-Xcompiler", "-fsanitize=address", "-lasan", *(f"-D{d}" for d in defines)]
    build = subprocess.run(["nvcc", "-std=c++17", "-O1", "-I", "kernels", *flags, f"tests/fixtures/{fixture}.cu",
                            "-o", str(binary)], cwd=paths.ROOT, capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "asan" in build.stderr.lower():
        pytest.skip(f"no AddressSanitizer for nvcc's host compiler: {build.stderr.strip()[-200:]}")
    assert build.returncode == 0, build.stderr[-2000:]
    return subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)


def _assert_ok(run):
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-2000:]
    assert int(run.stdout.split()[1]) > 10000


def test_page_cursor_matches_division_and_stays_in_the_table(tmp_path):
    _assert_ok(_run_fixture(tmp_path, "paged_cursor_check"))


@pytest.mark.parametrize("wrong", [False, True], ids=["walk", "identity-table"])
def test_row_walk_matches_division_and_stays_in_the_table(tmp_path, wrong):
    run = _run_fixture(tmp_path, "paged_rowwalk_check", ["LAB_PAGED_BUG_IDENTITY"] if wrong else [])
    if wrong:
        assert run.returncode == 1 and run.stdout.startswith("mismatch"), run.stdout[-2000:]
        return
    _assert_ok(run)
