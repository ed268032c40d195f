"""lab.prebuild: every kernel library built side by side before a GPU session's chapters; a failed build is named
and the others go on."""
import json
import shutil
import time
from pathlib import Path

import pytest

from lab import build, paths, prebuild, record, session

requires_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _fake_builds(monkeypatch, seconds: float):
    """Each target's build takes `seconds` (waiting, as a thread waits on nvcc); a target named 'bad' fails as
    nvcc would."""
    def fake(target, arch):
        if target == "bad":
            raise build.BuildError("nvcc failed to build bad", [{"path": "x.cu", "line": 3, "kind": "error",
                                                                 "msg": "y"}])
        time.sleep(seconds)
    monkeypatch.setattr(prebuild, "_build", fake)


def test_builds_run_side_by_side_and_a_failure_is_named_while_the_others_go_on(monkeypatch):
    _fake_builds(monkeypatch, 1.0)
    lines = []
    result = prebuild.prebuild(["-gencode=arch=compute_90a,code=sm_90a"], sources=["a", "b", "c", "d", "bad"],
                               jobs=5, printer=lines.append)
    assert result["built"] == 4 and result["jobs"] == 5
    assert result["failed"] == [{"source": "bad", "error": "nvcc failed to build bad | x.cu:3: error: y"}]
    assert result["seconds"] < 3.0  # four one-second builds at once, not one after another
    assert sum(line.startswith("  prebuilt ") for line in lines) == 4
    assert any(line.startswith("  prebuild of bad failed") and "x.cu:3: error: y" in line for line in lines)


def test_jobs_bound_the_builds_at_once(monkeypatch):
    _fake_builds(monkeypatch, 0.5)
    result = prebuild.prebuild([], sources=["a", "b", "c", "d"], jobs=1, printer=lambda line: None)
    assert result["jobs"] == 1 and result["seconds"] >= 2.0


def test_targets_are_the_binding_and_every_kernel_file():
    found = prebuild.targets()
    assert found[0] == prebuild.BINDING and len(found) == len(build.kernel_sources()) + 1
    assert "kernels/fwd/v07_overlap.cu" in found and all(t.startswith("kernels/") for t in found[1:])


@requires_nvcc
def test_a_real_build_lands_in_the_cache_and_a_broken_one_is_named_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(build, "_loaded", {})
    probe, broken = str(FIXTURES / "launcher_probe.cu"), str(FIXTURES / "broken_kernel.cu")
    lines = []
    result = prebuild.prebuild(build.check_arch_flags("sm_80"), sources=[probe, broken], printer=lines.append)
    assert result["built"] == 1 and len(list((tmp_path / "cache" / "kernels").glob("launcher_probe-*.so"))) == 1
    [failed] = result["failed"]
    assert failed["source"] == broken and "\n" not in failed["error"]
    assert failed["error"].startswith("nvcc failed to build tests/fixtures/broken_kernel.cu | ")
    assert "tests/fixtures/broken_kernel.cu:" in failed["error"]  # the first error, at its line
    assert any(line.startswith(f"  prebuild of {broken} failed") for line in lines)


def test_a_cpu_session_has_nothing_to_prebuild(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "execute", lambda *args: {"status": "ok", "error": None, "traceback": None})
    monkeypatch.setattr(prebuild, "prebuild", lambda *a, **k: pytest.fail("a CPU session built kernels"))
    lines = []
    folder = session.run_session(["ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES, device="cpu",
                                 heartbeat=0, prebuild=True, printer=lines.append)
    assert "prebuild: CPU mode, no kernel library to build" in lines
    assert "prebuild" not in json.loads((folder / "session.json").read_text())


def test_a_gpu_session_prebuilds_before_its_first_chapter_and_records_it(tmp_path, monkeypatch):
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
