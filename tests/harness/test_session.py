"""The session runner on tiny fixture chapters: one works, one raises, one is missing."""
import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nbformat
import pytest

from lab import files, paths, record, session
from lab.publish import clean, pages

# pytest-xdist (make test): the module's tests stay on one worker, so the fixture session runs once, by its module fixture
pytestmark = pytest.mark.xdist_group("test_session")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


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
    # papermill names the notebooks by this machine's absolute paths; the committed session names them as a reader can
    for name in ("ok_chapter", "fail_chapter"):
        meta = json.loads((folder / f"{name}.ipynb").read_text())["metadata"]["papermill"]
        assert meta["input_path"] == f"tests/fixtures/{name}.ipynb", meta
        out = meta["output_path"]  # (this test's outputs folder is a temporary one: ${TMPDIR:-/tmp}/...)
        assert not out.startswith("/") and out.endswith(f"/sessions/{folder.name}/{name}.ipynb"), meta
    rows = record.read(folder / "records.jsonl")
    ours = [r for r in rows if r["chapter"] == "ok_chapter" and r["kind"] == "fwd"]
    assert ours and ours[0]["session"] == folder.name and ours[0]["env"]["gpu"] == "cpu"


def test_the_session_folder_names_no_machine_path(first):
    """A session is committed as it comes back from the GPU machine: the fixture chapter's warning names its source
    file and the chapter prints where it runs, both absolute paths of this machine, which the folder shows from the
    checkout; the rest of each text stays."""
    _, folder, _, _ = first
    texts = {p.name: p.read_text() for p in folder.rglob("*") if p.is_file() and p.suffix != ".png"}
    assert texts and not {name for name, text in texts.items() if str(paths.ROOT) in text}
    cells = json.loads(texts["ok_chapter.ipynb"])["cells"]
    printed = {"stdout": "", "stderr": ""}
    for out in (o for c in cells if c["cell_type"] == "code" for o in c["outputs"] if o["output_type"] == "stream"):
        printed[out["name"]] += "".join(out["text"])
    assert "lab/__init__.py:1: UserWarning: a warning that names its source file" in printed["stderr"]
    assert "running in tests/fixtures" in printed["stdout"]
    nbformat.validate(nbformat.reads(texts["ok_chapter.ipynb"], as_version=4))  # still a notebook


def test_scrub_folder_rewrites_only_files_that_name_a_machine_path(tmp_path):
    """Notebooks, JSON, JSON lines and logs are scrubbed in their writers' layouts; a path after an escaped newline
    is found; image data, a torn JSON line and files without paths are left byte for byte."""
    from lab.publish.clean import scrub_folder

    where = str(paths.ROOT / "lab" / "bench.py")
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=f"warned\n{where}:3: UserWarning: x\n"),
                    nbformat.v4.new_output("display_data", data={"image/png": "iVBOR/tmp/AAAA", "text/plain": where})]
    nb.cells = [cell]
    (tmp_path / "a.ipynb").write_text(nbformat.writes(nb) + "\n")
    (tmp_path / "session.json").write_text(json.dumps({"error": f"failed at\n{where}"}, indent=1) + "\n")
    (tmp_path / "records.jsonl").write_text(json.dumps({"source": where}) + '\n{"kind":"fwd"}\n{"torn": "/work/x/y\n')
    (tmp_path / "run.log").write_text(f"built {where}\n")
    untouched = {"clean.json": json.dumps({"source": "lab/bench.py"}, indent=1) + "\n", "fig.png": "/tmp/x/y"}
    for name, text in untouched.items():
        (tmp_path / name).write_text(text)
    changed = scrub_folder(tmp_path)
    assert sorted(p.name for p in changed) == ["a.ipynb", "records.jsonl", "run.log", "session.json"]
    out = nbformat.reads((tmp_path / "a.ipynb").read_text(), as_version=4).cells[0].outputs
    assert out[0]["text"] == "warned\nlab/bench.py:3: UserWarning: x\n"
    assert out[1]["data"] == {"image/png": "iVBOR/tmp/AAAA", "text/plain": "lab/bench.py"}
    assert json.loads((tmp_path / "session.json").read_text()) == {"error": "failed at\nlab/bench.py"}
    rows = (tmp_path / "records.jsonl").read_text().splitlines()
    assert json.loads(rows[0]) == {"source": "lab/bench.py"}
    assert rows[1:] == ['{"kind":"fwd"}', '{"torn": "/work/x/y']  # a row without a path keeps its bytes
    assert (tmp_path / "run.log").read_text() == "built lab/bench.py\n"
    assert {name: (tmp_path / name).read_text() for name in untouched} == untouched
    assert scrub_folder(tmp_path) == []  # a second pass finds nothing


def test_failed_chapter_is_recorded_and_does_not_stop_the_session(first):
    _, folder, _, info = first
    failed = next(c for c in info["chapters"] if c["name"] == "fail_chapter")
    assert failed["status"] == "failed" and failed["error"].startswith("ValueError")
    assert "deliberate failure in the fixture chapter" in failed["traceback"] and "broken()" in failed["traceback"]
    assert "\x1b[" not in failed["traceback"]
    assert (folder / "fail_chapter.ipynb").exists()  # papermill's partial output is kept
    rows = record.read(folder / "records.jsonl")
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
    rows = record.read(folder / "records.jsonl")
    assert sum(r["kind"] == "gate" for r in rows) == 4 and sum(r["kind"] == "session" for r in rows) == 1
    assert any(line.startswith("gate [ok_chapter] cached load <= 1 s: pass") for line in lines)
    # a CPU session counts its gates without data in one line; a GPU session lists each, as it lists the verdicts
    assert not any(": no data" in line for line in lines)
    assert "1 gates without data, as in every CPU session (they judge GPU measurements): ok_chapter 1" in lines
    shown = []
    session.print_gates(info["chapters"][0]["gates"], "gpu", shown.append)
    assert any(line == "gate [ok_chapter] v01 >= 1.0x sdpa-flash: no data" for line in shown) and len(shown) == 3


def test_progress_shows_step_elapsed_and_estimate(first):
    lines = first[2]
    assert any(line.startswith("step 1/3: ok_chapter, elapsed") and "estimate" in line for line in lines)
    assert any(line.startswith("step 2/3: fail_chapter failed in") for line in lines)


def test_second_session_never_rewrites_the_first(first, capsys):
    outputs, folder, _, _ = first
    before = snapshot(folder)
    tar = outputs.parent / "session.tar.gz"
    # the log it regenerates names the fixture chapters, which no table of contents lists, as not published
    with pytest.warns(pages.LogWarning, match="not in _toc.yml, not published: .*ok_chapter"):
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
    odd = history + [{"mode": "gpu", "cases": "quick", "chapters": ["x", {"name": "n4", "status": "ok"},
                                                                    {"name": "n4", "status": "ok", "duration_s": "9"}]}]
    assert session.estimate(odd, "n4", "gpu", "quick") == 20  # odd entries of a crafted file are passed over
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


# ---------------------------------------------------------------- hardening: torn lines, full disks, signals

def test_a_torn_line_never_stops_the_session(tmp_path):
    lines = []
    with pytest.warns(record.TornLineWarning, match=r"records.jsonl:2: skipped a torn record line"):
        folder = session.run_session(["torn_chapter", "ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES,
                                     device="cpu", gates_file=FIXTURES / "gates.json", heartbeat=0,
                                     printer=lines.append)
    info = json.loads((folder / "session.json").read_text())
    assert info["status"] == "complete" and [c["status"] for c in info["chapters"]] == ["ok", "ok"]
    torn = nbformat.read(folder / "torn_chapter.ipynb", as_version=4)
    assert any("1 rows read" in o.get("text", "") for c in torn.cells for o in c.get("outputs", []))
    with pytest.warns(record.TornLineWarning):
        rows = record.read(folder / "records.jsonl")
    assert {"after-the-tear", "v01"} <= {r.get("impl") for r in rows}  # the rows after the tear are whole
    assert any(r["kind"] == "session" for r in rows)


def _quick_execute(source, target, parameters, cwd, timeout):
    return {"status": "ok", "error": None, "traceback": None}


def _failing_replace(monkeypatch, when):
    """os.replace fails with ENOSPC for session.json on the calls that `when(n)` selects (n counts from 1)."""
    real, calls = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if str(dst).endswith("session.json"):
            calls.append(dst)
            if when(len(calls)):
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *args, **kwargs)
    monkeypatch.setattr(files.os, "replace", replace)
    return calls


def test_runner_write_error_finishes_session_json_as_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "execute", _quick_execute)
    _failing_replace(monkeypatch, lambda n: n == 2)  # the disk is full once, after the first chapter
    lines = []
    folder = session.run_session(["ok_chapter", "fail_chapter"], outputs=tmp_path, chapters_dir=FIXTURES,
                                 device="cpu", gates_file=FIXTURES / "gates.json", heartbeat=0, printer=lines.append)
    info = json.loads((folder / "session.json").read_text())
    shown = clean.scrub(str(folder / "session.json"))  # as committed: no machine path (${TMPDIR:-/tmp}/...)
    assert info["status"] == "failed" and f"cannot write {shown}: the disk is full" in info["error"]
    assert "OutputError" in info["traceback"] and info["end"]
    assert [c["status"] for c in info["chapters"]] == ["ok", "skipped"]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")] and not (folder / "heartbeat").exists()
    assert any(line.startswith("session failed: OutputError") for line in lines)


def test_persistent_full_disk_raises_a_clear_error_and_keeps_the_last_whole_session_json(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "execute", _quick_execute)
    _failing_replace(monkeypatch, lambda n: n >= 2)  # full from the second write on
    with pytest.raises(files.OutputError, match=r"session.json: the disk is full"):
        session.run_session(["ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES, device="cpu",
                            gates_file=FIXTURES / "gates.json", heartbeat=0, printer=lambda line: None)
    folder = next((tmp_path / "sessions").iterdir())
    assert json.loads((folder / "session.json").read_text())["status"] == "running"  # whole, never half
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_unusable_outputs_folder_is_a_clear_error_and_exit_1(tmp_path, capsys):
    blocker = tmp_path / "outputs"
    blocker.write_text("a file where the outputs folder should be")
    code = session.main(["--chapters", "ok_chapter", "--chapters-dir", str(FIXTURES), "--device", "cpu",
                         "--outputs", str(blocker), "--heartbeat", "0", "--no-log"])
    assert code == 1 and f"cannot create {blocker / 'sessions'}" in capsys.readouterr().err


def test_exit_status_says_a_chapter_failed(tmp_path, capsys):
    code = session.main(["--chapters", "fail_chapter", "--chapters-dir", str(FIXTURES), "--device", "cpu",
                         "--outputs", str(tmp_path), "--heartbeat", "0", "--no-log"])
    assert code == 1 and "failed chapters: fail_chapter" in capsys.readouterr().err


def test_chapter_listed_but_missing_on_disk_is_skipped(tmp_path):
    lines = []
    folder = session.run_session(["n99_not_written_yet", "ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES,
                                 device="cpu", gates_file=FIXTURES / "gates.json", heartbeat=0, printer=lines.append)
    info = json.loads((folder / "session.json").read_text())
    assert info["status"] == "complete" and [c["status"] for c in info["chapters"]] == ["skipped", "ok"]
    assert "n99_not_written_yet.ipynb not found" in info["chapters"][0]["error"]
    assert any("n99_not_written_yet skipped" in line for line in lines)


def _start(outputs: Path, chapters: str) -> subprocess.Popen:
    """`python -m lab session` in its own process group (so the test can clean up the kernel it starts)."""
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    return subprocess.Popen([sys.executable, "-m", "lab", "session", "--chapters", chapters, "--chapters-dir",
                             str(FIXTURES), "--device", "cpu", "--outputs", str(outputs), "--heartbeat", "0",
                             "--no-log"], cwd=paths.ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_progress(outputs: Path, proc: subprocess.Popen, limit: float = 180.0) -> Path:
    """The session folder, once the slow chapter has written its row (it is then asleep in its cell)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        for folder in (outputs / "sessions").glob("*"):
            file = folder / "records.jsonl"
            if file.exists() and '"progress"' in file.read_text():
                return folder
        if proc.poll() is not None:
            pytest.fail(f"the runner exited early ({proc.returncode}): {proc.stdout.read()[-2000:]}")
        time.sleep(0.5)
    pytest.fail("the slow chapter never started")


def _cleanup(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this test started: runner and its kernel
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def test_sigterm_finishes_session_json_as_interrupted(tmp_path):
    proc = _start(tmp_path, "slow_chapter,ok_chapter")
    try:
        folder = _wait_for_progress(tmp_path, proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        _cleanup(proc)
    assert proc.returncode == 130, out[-2000:]
    info = json.loads((folder / "session.json").read_text())
    assert info["status"] == "interrupted" and "signal 15" in info["error"]
    assert [c["status"] for c in info["chapters"]] == ["failed", "skipped"]
    assert info["chapters"][0]["error"].startswith("interrupted while running")
    assert not (folder / "heartbeat").exists() and not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert "session interrupted" in out


def test_sigkill_leaves_running_which_the_log_shows_as_abandoned(tmp_path):
    from lab.publish import log, pages

    proc = _start(tmp_path, "slow_chapter")
    try:
        folder = _wait_for_progress(tmp_path, proc)
        assert (folder / "heartbeat").exists()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)  # reaped: its pid is gone
    finally:
        _cleanup(proc)
    assert json.loads((folder / "session.json").read_text())["status"] == "running"  # what SIGKILL leaves
    [info] = pages.load_sessions(tmp_path)
    assert info["status"] == "abandoned" and info["chapters"][0]["status"] == "abandoned"
    with pytest.warns(Warning):  # fixture chapter names are not in _toc.yml
        log.generate(tmp_path)
    assert "abandoned" in (tmp_path / "log" / "sessions.md").read_text()


def test_a_signal_during_the_final_write_does_not_cut_it_short(tmp_path, monkeypatch):
    monkeypatch.setattr(session, "execute", _quick_execute)
    real = session.write_json

    def write_and_get_signalled(path, data):
        if data.get("end"):  # the final write: a time limit's SIGTERM lands right now
            os.kill(os.getpid(), signal.SIGTERM)
        real(path, data)
    monkeypatch.setattr(session, "write_json", write_and_get_signalled)
    previous = signal.signal(signal.SIGTERM, session._interrupt)
    lines = []
    try:
        folder = session.run_session(["ok_chapter"], outputs=tmp_path, chapters_dir=FIXTURES, device="cpu",
                                     gates_file=FIXTURES / "gates.json", heartbeat=0, printer=lines.append)
    finally:
        signal.signal(signal.SIGTERM, previous)
    info = json.loads((folder / "session.json").read_text())
    assert info["status"] == "complete" and info["end"]
    assert any(line.startswith("signal 15 arrived while session.json was being finished") for line in lines)
