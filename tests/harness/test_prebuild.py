"""lab.prebuild: every kernel library built side by side before a GPU session's chapters; a failed build is named
and the others go on."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import paths, prebuild, record, session

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fake_builds(monkeypatch, seconds: float):
    """Each target's process sleeps `seconds`; a target named 'bad' fails as nvcc would."""
    def command(target, arch):
        if target == "bad":
            code = "import sys; print('bad: nvcc failed to build bad | x.cu:3: error: y', file=sys.stderr); sys.exit(1)"
        else:
            code = f"import time; time.sleep({seconds})"
        return [sys.executable, "-c", code]
    monkeypatch.setattr(prebuild, "_command", command)


def test_builds_run_side_by_side_and_a_failure_is_named_while_the_others_go_on(monkeypatch):
    _fake_builds(monkeypatch, 1.0)
    lines = []
    result = prebuild.prebuild(["-gencode=arch=compute_90a,code=sm_90a"], sources=["a", "b", "c", "d", "bad"],
                               jobs=5, printer=lines.append)
    assert result["built"] == 4 and result["jobs"] == 5
    assert result["failed"] == [{"source": "bad", "error": "bad: nvcc failed to build bad | x.cu:3: error: y"}]
    assert result["seconds"] < 3.0  # four one-second builds at once, not one after another
    assert sum(line.startswith("  prebuilt ") for line in lines) == 4
    assert any(line.startswith("  prebuild of bad failed") and "x.cu:3: error: y" in line for line in lines)


def test_jobs_bound_the_builds_at_once(monkeypatch):
    _fake_builds(monkeypatch, 0.5)
    result = prebuild.prebuild([], sources=["a", "b", "c", "d"], jobs=1, printer=lambda line: None)
    assert result["jobs"] == 1 and result["seconds"] >= 2.0


def test_targets_are_the_binding_and_every_kernel_file():
    from lab import build

    found = prebuild.targets()
    assert found[0] == prebuild.BINDING and len(found) == len(build.kernel_sources()) + 1
    assert "kernels/fwd/v07_overlap.cu" in found and all(t.startswith("kernels/") for t in found[1:])


def _child(tmp_path, *argv):
    env = {**os.environ, "LAB_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(paths.ROOT)}
    return subprocess.run([sys.executable, "-m", "lab.prebuild", *argv], cwd=paths.ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_build_process_puts_one_kernel_library_in_the_cache(tmp_path):
    proc = _child(tmp_path, str(FIXTURES / "launcher_probe.cu"), "-gencode=arch=compute_80,code=sm_80")
    assert proc.returncode == 0, proc.stderr
    built = list((tmp_path / "cache" / "kernels").glob("launcher_probe-*.so"))
    assert len(built) == 1
    assert json.loads(built[0].with_suffix(".json").read_text())["source"] == "tests/fixtures/launcher_probe.cu"


def test_a_build_process_that_fails_says_why_in_one_line(tmp_path):
    proc = _child(tmp_path, str(FIXTURES / "broken_kernel.cu"), "-gencode=arch=compute_80,code=sm_80")
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert "nvcc failed to build tests/fixtures/broken_kernel.cu" in line and "broken_kernel.cu:" in line
    assert _child(tmp_path).returncode == 2  # no target: usage


def test_a_cpu_session_has_nothing_to_prebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "execute", lambda *args: {"status": "ok", "error": None, "traceback": None})
    monkeypatch.setattr(prebuild, "prebuild", lambda *a, **k: pytest.fail("a CPU session built kernels"))
    lines = []
    folder = session.run_session(["ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES, device="cpu",
                                 heartbeat=0, prebuild=True, printer=lines.append)
    assert "prebuild: CPU mode, no kernel library to build" in lines
    assert "prebuild" not in json.loads((folder / "session.json").read_text())


def test_a_gpu_session_prebuilds_before_its_first_chapter_and_records_it(tmp_path, monkeypatch):
    from lab import build

    order = []
    monkeypatch.setattr(session, "execute", lambda *args: order.append("chapter") or
                        {"status": "ok", "error": None, "traceback": None})
    monkeypatch.setattr(build, "device_arch_flags", lambda: ["-gencode=arch=compute_90a,code=sm_90a"])
    monkeypatch.setattr(session, "gpu_count", lambda mode: 1)

    def fake(arch, printer=print):
        order.append(("prebuild", tuple(arch)))
        return {"built": 43, "failed": [{"source": "kernels/fwd/v01_scalar.cu", "error": "x"}], "jobs": 16,
                "seconds": 61.0}
    monkeypatch.setattr(prebuild, "prebuild", fake)
    env = {**record.fingerprint(), "gpu": "NVIDIA H200", "capability": "9.0"}
    lines = []
    folder = session.run_session(["ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES, heartbeat=0, env=env,
                                 prebuild=True, printer=lines.append)
    assert order == [("prebuild", ("-gencode=arch=compute_90a,code=sm_90a",)), "chapter"]
    info = json.loads((folder / "session.json").read_text())
    assert info["mode"] == "gpu" and info["prebuild"]["built"] == 43
    assert any(r["kind"] == "prebuild" and r["jobs"] == 16 for r in record.read(folder / "records.jsonl"))
    assert any(line.startswith("prebuild: 43 built in 1m01s (16 at once); failed: kernels/fwd/v01_scalar.cu")
               for line in lines), lines


def test_the_session_command_takes_prebuild(tmp_path, monkeypatch):
    seen = {}

    def fake_run(chapters, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt
    monkeypatch.setattr(session, "run_session", fake_run)
    assert session.main(["--chapters", "ok_chapter", "--prebuild", "--outputs", str(tmp_path)]) == 130
    assert seen["prebuild"] is True
