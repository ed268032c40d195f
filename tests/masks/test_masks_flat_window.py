"""The masked backward's window rule without branches (lab::FlatWindow, kernels/common/mask.cuh) on the CPU: built as
host code and held to the window rule written out in 64 bits over every (row, key) of small calls, windows near
INT_MAX included (tests/fixtures/flat_window_check.cu); its self-test build, one key too wide on the right, fails."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from lab import paths

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def _run(tmp_path, defines=()):
    binary = tmp_path / "flat_window_check"
    build = subprocess.run(["nvcc", "-std=c++17", "-O1", "-I", "kernels", *(f"-D{d}" for d in defines),
                            "tests/fixtures/flat_window_check.cu", "-o", str(binary)], cwd=paths.ROOT,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    return subprocess.run([str(binary)], capture_output=True, text=True, timeout=600)


def test_flat_window_is_the_window_rule(tmp_path):
    run = _run(tmp_path)
    assert run.returncode == 0 and run.stdout.startswith("ok "), run.stdout[-2000:] + run.stderr[-2000:]
    assert int(run.stdout.split()[1]) > 1_000_000


def test_a_flat_window_one_key_too_wide_fails(tmp_path):
    run = _run(tmp_path, ["LAB_FLAT_WINDOW_BUG_RIGHT"])
    assert run.returncode == 1 and run.stdout.startswith("mismatch: "), run.stdout[-2000:]
