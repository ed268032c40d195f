"""decode v03's block-table walk on the CPU: tests/fixtures/paged_cursor_check.cu runs lab::paged::PageCursor
(kernels/common/paged.cuh) as host code against plain division, for both row patterns of the kernel's loader,
page sizes 16-256, splits starting inside pages, shuffled tables with a bad id, built with AddressSanitizer
so that a table read past the slots of a sequence's length fails. Needs nvcc, no GPU."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from lab import paths

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def test_page_cursor_matches_division_and_stays_in_the_table(tmp_path):
    binary = tmp_path / "cursor_check"
    flags = ["-Xcompiler", "-fsanitize=address", "-lasan"]
    build = subprocess.run(["nvcc", "-std=c++17", "-O1", "-I", "kernels", *flags, "tests/fixtures/paged_cursor_check.cu",
                            "-o", str(binary)], cwd=paths.ROOT, capture_output=True, text=True, timeout=600)
    if build.returncode != 0 and "asan" in build.stderr.lower():
        pytest.skip(f"no AddressSanitizer for nvcc's host compiler: {build.stderr.strip()[-200:]}")
    assert build.returncode == 0, build.stderr[-2000:]
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-2000:]
    assert int(run.stdout.split()[1]) > 10000
