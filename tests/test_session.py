"""The session runner on tiny fixture chapters: one works, one raises, one is missing."""
import hashlib
import json
import os
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pytest

from lab import paths, session

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    outputs = tmp_path_factory.mktemp("outputs")
    lines = []
    folder = session.run_session(["ok_chapter", "fail_chapter", "missing_chapter"], outputs=outputs,
                                 chapters_dir=FIXTURES, device="cpu", gates_file=FIXTURES / "gates.json",
                                 heartbeat=0, price_per_gpu_hour=2.0, printer=lines.append)
    return outputs, folder, lines, json.loads((folder / "session.json").read_text())


def test_session_folder_holds_notebooks_records_figures_and_session_json(first):
    outputs, folder, _, info = first
    assert folder.parent == outputs / "sessions" and "-cpu-" in folder.name
    assert (folder / "ok_chapter.ipynb").exists() and (folder / "figures" / "tiny.png").exists()
    assert info["id"] == folder.name and info["status"] == "complete" and info["mode"] == "cpu"
    assert info["start"] <= info["end"] and info["env"]["gpu"] == "cpu" and info["cases"] == "quick"
    assert info["cost"] is None  # a price per GPU-hour costs nothing without a GPU
    by_name = {c["name"]: c for c in info["chapters"]}
    assert by_name["ok_chapter"]["status"] == "ok" and by_name["ok_chapter"]["build_s"] == pytest.approx(0.25)
    assert by_name["missing_chapter"]["status"] == "skipped"
    rows = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    ours = [r for r in rows if r["chapter"] == "ok_chapter" and r["kind"] == "fwd"]
    assert ours and ours[0]["session"] == folder.name and ours[0]["env"]["gpu"] == "cpu"


def test_failed_chapter_is_recorded_and_does_not_stop_the_session(first):
    _, folder, _, info = first
    failed = next(c for c in info["chapters"] if c["name"] == "fail_chapter")
    assert failed["status"] == "failed" and failed["error"].startswith("ValueError")
    assert "deliberate failure in the fixture chapter" in failed["traceback"] and "broken()" in failed["traceback"]
    assert "\x1b[" not in failed["traceback"]
    assert (folder / "fail_chapter.ipynb").exists()  # papermill's partial output is kept
    rows = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    bugs = [r for r in rows if r["kind"] == "bug"]
    assert len(bugs) == 1 and bugs[0]["status"] == "open" and bugs[0]["chapter"] == "fail_chapter"


def test_gates_are_evaluated_and_recorded(first):
    _, folder, lines, info = first
    gates = {g["name"]: g for c in info["chapters"] for g in c["gates"]}
    assert gates["cached load <= 1 s"]["status"] == "pass" and gates["cached load <= 1 s"]["measured"] == 0.25
    assert gates["v01 >= 1.0x sdpa-flash"]["status"] == "no data"  # gpu_only, CPU session
    void = gates["fail chapter records a row"]  # its row would pass; the chapter failed, so it is void
    assert void["status"] == "void" and void["passed"] is None and void["measured"] == 0.5
    assert info["gates"] == {"pass": 2, "fail": 0, "no data": 1, "void": 1}
    rows = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    assert sum(r["kind"] == "gate" for r in rows) == 4 and sum(r["kind"] == "session" for r in rows) == 1
    assert any(line.startswith("gate [ok_chapter] cached load <= 1 s: pass") for line in lines)


def test_progress_shows_step_elapsed_and_estimate(first):
    lines = first[2]
    assert any(line.startswith("step 1/3: ok_chapter, elapsed") and "estimate" in line for line in lines)
    assert any(line.startswith("step 2/3: fail_chapter failed in") for line in lines)


def test_second_session_never_rewrites_the_first(first, capsys):
    outputs, folder, _, _ = first
    before = snapshot(folder)
    tar = outputs.parent / "session.tar.gz"
    code = session.main(["--chapters", "ok_chapter", "--chapters-dir", str(FIXTURES), "--device", "cpu",
                         "--outputs", str(outputs), "--heartbeat", "0", "--tarball", str(tar)])
    out = capsys.readouterr().out
    assert code == 0
    assert snapshot(folder) == before
    folders = sorted(p for p in (outputs / "sessions").iterdir())
    assert len(folders) == 2 and folder in folders
    second = next(p for p in folders if p != folder)
    assert json.loads((second / "session.json").read_text())["chapters"][0]["status"] == "ok"
    step = next(line for line in out.splitlines() if line.startswith("step 1/1: ok_chapter, elapsed"))
    assert "estimate unknown" not in step  # learnt from the first session's duration
    with tarfile.open(tar) as archive:
        assert f"{outputs.name}/sessions/{second.name}/session.json" in archive.getnames()
    assert (outputs / "log" / "sessions.md").exists()  # the session regenerates the log
    with pytest.raises(session.SessionExists):
        session.create_session_dir(outputs, {"gpu": "cpu"}, "cpu", session_id=folder.name)


def test_kernel_env_extends_pythonpath_and_restores_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/carried/wheels")
    monkeypatch.delenv("LAB_SESSION_DIR", raising=False)
    with session.kernel_env(tmp_path, "n4_baseline", tmp_path):
        assert os.environ["PYTHONPATH"].split(os.pathsep) == ["/carried/wheels", str(paths.ROOT)]
        assert os.environ["LAB_SESSION_DIR"] == str(tmp_path) and os.environ["LAB_CHAPTER"] == "n4_baseline"
    assert os.environ["PYTHONPATH"] == "/carried/wheels" and "LAB_SESSION_DIR" not in os.environ


def test_estimate_uses_earlier_sessions_of_the_same_mode():
    history = [{"mode": "gpu", "cases": "quick", "chapters": [{"name": "n4", "status": "ok", "duration_s": 10}]},
               {"mode": "gpu", "cases": "quick", "chapters": [{"name": "n4", "status": "ok", "duration_s": 30}]},
               {"mode": "cpu", "cases": "quick", "chapters": [{"name": "n4", "status": "ok", "duration_s": 99}]}]
    assert session.estimate(history, "n4", "gpu", "quick") == 20
    assert session.estimate(history, "n4", "gpu", "full") is None
    assert session.fmt_seconds(75) == "1m15s" and session.fmt_seconds(None) == "unknown"


def test_interrupt_finishes_session_json(tmp_path, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(session, "execute", interrupted)
    folder = session.run_session(["ok_chapter", "fail_chapter"], outputs=tmp_path, chapters_dir=FIXTURES,
                                 device="cpu", gates_file=FIXTURES / "gates.json", heartbeat=0,
                                 printer=lambda line: None)
    info = json.loads((folder / "session.json").read_text())
    assert info["status"] == "interrupted" and info["end"]
    assert [c["status"] for c in info["chapters"]] == ["failed", "skipped"]
