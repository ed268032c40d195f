"""Shared test setup: import path, headless matplotlib, the `gpu` marker, isolated records.

- matplotlib renders with Agg (MPLBACKEND=Agg while matplotlib is imported here, before any test
  imports pyplot; the variable is restored afterwards so executed notebooks are not affected);
- tests marked `@pytest.mark.gpu` are skipped when torch sees no CUDA device;
- the `session_dir` fixture points lab.record at a temporary session folder, so nothing a test
  records lands in outputs/.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Under pytest-xdist (make test) one worker runs per core: torch in a worker, and in the processes it starts
# (torchrun, mp.spawn, papermill), keeps to one thread, so that workers do not oversubscribe the cores with
# OpenMP threads that spin while they wait. Set before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lab import paths  # noqa: E402  (after the import path is set)

os.environ.setdefault("MPLCONFIGDIR", str(paths.CACHE / "matplotlib"))
# Agg for this test process: matplotlib reads MPLBACKEND once, when it is imported. The variable is then
# restored, so notebooks that tests execute in subprocesses (papermill, nbmake) keep their inline backend.
_previous_backend = os.environ.get("MPLBACKEND")
os.environ["MPLBACKEND"] = "Agg"
import matplotlib  # noqa: E402

if _previous_backend is None:
    del os.environ["MPLBACKEND"]
else:
    os.environ["MPLBACKEND"] = _previous_backend

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# The binding's CPU check build (binding.cpp with LAB_BINDING_CPU_CHECKS: every argument check, nothing launched),
# shared by the families' tests of bad input.
@pytest.fixture(scope="module")
def cpu_binding():
    if shutil.which("ninja") is None or shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler and ninja to build the binding's CPU check build")
    import hashlib

    import torch
    from torch.utils.cpp_extension import load_inline

    from lab import build, cache_files

    source = (paths.ROOT / "lab" / "binding.cpp").read_text()
    header = (paths.KERNELS / "common" / "params.h").read_text()
    key = hashlib.sha256((source + header + torch.__version__).encode()).hexdigest()[:12]
    folder = paths.CACHE / f"binding_cpu_{key}"
    folder.mkdir(parents=True, exist_ok=True)
    with cache_files.locked(folder / "binding.so"):  # pytest-xdist's workers: one builds, the others wait
        module = load_inline(name=f"lab_binding_cpu_{key}", cpp_sources=[source], extra_cflags=["-O0", "-DLAB_BINDING_CPU_CHECKS"],
                             extra_include_paths=[str(paths.KERNELS)], build_directory=str(folder), verbose=False)
    return build.Binding(module)



def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped automatically when torch sees none)")
    # Under compute-sanitizer the SDPA yardstick must not be cuDNN's: its sm80 fprop kernel reads 4 bytes
    # past a 10-byte allocation of its own (memcheck on an H200, torch 2.11, 2026-11-23; log
    # outputs/driver_logs/20261123-h200-memcheck-cudnn-sdpa-07bc0ab157.log), which aborts the process.
    if os.environ.get("LAB_SDPA_NO_CUDNN") == "1":
        import torch

        torch.backends.cuda.enable_cudnn_sdp(False)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Longest first (pytest-xdist hands tests out in collection order): the binding's CPU check build (one worker
# builds it, ~20 CPU-seconds, while the other starts the compile gate; placed later, the second worker would wait
# idle on its lock when two of its tests meet), then the compile gate, one test per kernel file, which fills both
# workers while the kernel cache is cold, its heaviest files first (CPU-seconds for both targets on a cold cache,
# 2026-11-29: fwd/v07 58, decode/v03 29, bwd/v08 27, decode/v06 23, bwd/v21 23, decode/v01 22, fwd/v11 22; the
# rest 1-16), so that none of them is the last job of a worker; then the tests that read the gate's PTX (each
# builds one switched variant), the chapters that compile-check (served from that cache) and the other long
# tests, the multi-process ring runs among them, so that none of them starts last and leaves a worker idle.
_GATE = "tests/product/test_build.py::test_every_kernel_compiles_for_sm80_and_sm90a"
FIRST = ("tests/product/test_binding_checks.py::test_good_calls_pass_every_check",
         *(f"{_GATE}[{name}]" for name in ("fwd/v07_overlap.cu", "decode/v03_paged.cu", "bwd/v08_masks.cu",
                                           "decode/v06_warpring.cu", "bwd/v21_masks_wide.cu", "decode/v01_splitk.cu",
                                           "fwd/v11_masks_overlap.cu")),
         _GATE,
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n2_build_recipe",
         "tests/masks/test_masks_tanh.py",
         "tests/masks/test_paged_prefill.py::test_paged_switches_leave_the_dense_and_packed_kernels",
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n12_ring",
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n10_backward",
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n9_hopper",
         "tests/book/test_book.py", "tests/decode/test_decode_head_dims.py::test_decode_kernels_compile",
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n13_masks",
         "tests/book/test_chapters.py::test_chapter_runs_in_cpu_mode[n6_fa2",
         "tests/harness/test_session.py", "tests/product/test_add_version.py", "tests/ring/",
         "tests/product/test_build_concurrency.py", "tests/harness/test_tools.py")


def _rank(item) -> int:
    return next((i for i, prefix in enumerate(FIRST) if item.nodeid.startswith(prefix)), len(FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or _cuda_available():
        return
    import torch

    reason = ("no CUDA device: this torch is a CPU-only build" if torch.version.cuda is None
              else "no CUDA device visible to torch")
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def session_dir(tmp_path, monkeypatch):
    """Records go to <tmp>/session-under-test/records.jsonl; caches of lab.record are reset around the test."""
    from lab import record

    folder = tmp_path / "session-under-test"
    monkeypatch.setenv("LAB_SESSION_DIR", str(folder))
    monkeypatch.delenv("LAB_CHAPTER", raising=False)
    monkeypatch.setattr(record, "_adhoc_dir", None)
    fingerprint, git_commit = record.fingerprint, record.git_commit  # the lru_cached originals
    fingerprint.cache_clear()
    git_commit.cache_clear()
    yield folder
    fingerprint.cache_clear()
    git_commit.cache_clear()


@pytest.fixture
def close_figures():
    """No figure open before the test (another test on the same worker may have left some) and none after it."""
    import matplotlib.pyplot as plt

    plt.close("all")
    yield
    plt.close("all")
