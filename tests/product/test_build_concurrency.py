"""Kernel builds across processes and threads: several builders of one key on a cold cache all succeed, one
of them compiles, and the cache ends with one library, its metadata and no temporary or lock file.

Needs nvcc (no GPU): the libraries are compiled for sm_80 and never loaded on a device.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import build, cache_files, paths

requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
PROBE = Path(__file__).resolve().parents[1] / "fixtures" / "launcher_probe.cu"
BUILDERS = 4

# Each child announces itself, waits for the common start, builds, and prints what it got.
CHILD = """
import json, os, sys, time
from pathlib import Path
from lab import build
folder = Path(sys.argv[1])
(folder / f"ready-{os.getpid()}").touch()
while not (folder / "go").exists():
    time.sleep(0.005)
lib = build.build_kernel(sys.argv[2], arch=build.check_arch_flags("sm_80"))
print(json.dumps({"cached": lib.cached, "path": str(lib.path), "resources": lib.resources}))
"""


def _cache_listing(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "kernels").iterdir())


@requires_nvcc
def test_processes_building_one_kernel_at_once(tmp_path):
    cache, start = tmp_path / "cache", tmp_path / "start"
    start.mkdir()
    env = {**os.environ, "LAB_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(start), str(PROBE)], cwd=paths.ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(BUILDERS)]
    deadline = time.monotonic() + 120
    while len(list(start.glob("ready-*"))) < BUILDERS and time.monotonic() < deadline:
        time.sleep(0.01)
    (start / "go").touch()  # every child is waiting: they all ask for the kernel at the same moment
    results = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, f"a builder failed:\n{err[-2000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["path"] for r in results}) == 1
    assert sorted(r["cached"] for r in results) == [False] + [True] * (BUILDERS - 1), \
        "one process compiles; the others wait for its library and load it"
    assert all(r["resources"] == results[0]["resources"] and r["resources"] for r in results)
    library = Path(results[0]["path"])
    assert _cache_listing(cache) == [library.with_suffix(".json").name, library.name], \
        "one library and its metadata; no temporary and no lock file left"


@requires_nvcc
def test_threads_building_one_kernel_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(build, "_loaded", {})
    calls, real = [], build.run_nvcc

    def counting(args, what, *usage):
        calls.append(what)
        return real(args, what, *usage)

    monkeypatch.setattr(build, "run_nvcc", counting)
    barrier, results, errors = threading.Barrier(BUILDERS), [], []

    def one():
        barrier.wait()
        try:
            results.append(build.build_kernel(PROBE, arch=build.check_arch_flags("sm_80")))
        except Exception as err:  # noqa: BLE001 -- any failure of a thread fails the test below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(BUILDERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors and len(results) == BUILDERS
    assert len(calls) == 1, "the threads share one compile"
    assert len({lib.path for lib in results}) == 1
    assert _cache_listing(tmp_path / "cache") == [results[0].path.with_suffix(".json").name, results[0].path.name]


def test_metadata_is_visible_before_the_library(tmp_path):
    """make() writes the metadata; the library appears only after, by rename: whoever sees it finds both."""
    dest, seen = tmp_path / "k.so", []

    def make(tmp: Path) -> str:
        tmp.write_bytes(b"library")
        (tmp_path / "k.json").write_text("{}")
        seen.append((dest.exists(), sorted(p.name for p in tmp_path.iterdir())))
        return "built"

    assert cache_files.publish_once(dest, lambda: None, make) == "built"
    assert seen[0][0] is False, "the library is not visible while it is being made"
    assert dest.read_bytes() == b"library" and sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "k.so"]


def test_a_failed_build_leaves_nothing_and_the_next_one_builds(tmp_path):
    dest = tmp_path / "k.so"

    def broken(tmp: Path):
        tmp.write_bytes(b"half")
        raise RuntimeError("nvcc failed")

    with pytest.raises(RuntimeError, match="nvcc failed"):
        cache_files.publish_once(dest, lambda: None, broken)
    assert list(tmp_path.iterdir()) == []
    assert cache_files.publish_once(dest, lambda: None, lambda tmp: tmp.write_bytes(b"ok") and "built") == "built"
    assert dest.read_bytes() == b"ok"


def test_a_library_without_metadata_is_built_again(tmp_path, monkeypatch):
    """An older cache (or a build killed after the rename) may hold a library whose metadata never came."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(build, "_loaded", {})
    first = build.build_kernel(PROBE, arch=build.check_arch_flags("sm_80"))
    first.path.with_suffix(".json").unlink()
    monkeypatch.setattr(build, "_loaded", {})
    again = build.build_kernel(PROBE, arch=build.check_arch_flags("sm_80"))
    assert again.cached is False and again.path == first.path and again.resources == first.resources
    assert json.loads(first.path.with_suffix(".json").read_text())["resources"] == first.resources


@requires_nvcc
def test_torchrun_ranks_build_the_rings_kernels_on_a_cold_cache(tmp_path):
    """The ring's entry point under torchrun (2 processes, gloo, CPU) on an empty cache: both ranks compile
    the forward kernels the ring calls on an sm_80 GPU at once, then run the ring's checks."""
    cache = tmp_path / "cache"
    env = {**os.environ, "LAB_CACHE_DIR": str(cache), "LAB_SESSION_DIR": str(tmp_path / "session"),
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "lab.ring.run", "--device", "cpu", "--stages", "checks", "--build-arch", "sm_80"]
    done = subprocess.run(command, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert sorted(line.split(":")[0] for line in said) == ["rank 0", "rank 1"], done.stdout
    assert sum("built" in line for line in said) == 1, "one rank compiles, the other loads its library"
    names = _cache_listing(cache)
    assert len(names) == 2 and {Path(n).suffix for n in names} == {".so", ".json"}, names
    checks = [json.loads(line) for line in (tmp_path / "session" / "records.jsonl").read_text().splitlines()]
    assert checks and all(r["world_size"] == 2 for r in checks)
