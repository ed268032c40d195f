"""Every chapter executes headless through papermill in CPU mode, and says which cells it skipped."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import paths, toc

CHAPTERS = toc.chapters()  # the one chapter list: the book's _toc.yml


def test_chapter_list_is_complete():
    """Every notebook under chapters/ is in the book (so the session runs it and the log publishes it)."""
    on_disk = {p.stem for p in paths.CHAPTERS.glob("n*.ipynb")}
    assert on_disk and on_disk <= set(CHAPTERS), f"notebooks missing from _toc.yml: {sorted(on_disk - set(CHAPTERS))}"


@pytest.fixture(params=CHAPTERS)
def name(request):
    if not (paths.CHAPTERS / f"{request.param}.ipynb").exists():
        pytest.skip(f"{request.param} is listed in _toc.yml but its notebook is not written yet")
    return request.param


EXECUTOR_KEYS = {"execution", "papermill"}  # cell metadata that papermill or a timing extension writes


def test_chapter_is_clean_source(name):
    """The notebook is the chapter's one source (no generator writes it), so it must be stored as one: no
    outputs or execution counts, no executor metadata, a stable unique id per cell (nbformat 4.5), a # Title
    first and a papermill `parameters` cell that takes `device`. A chapter saved from JupyterLab after a run
    fails here until its outputs are cleared (README, "Editing a chapter")."""
    nb = json.loads((paths.CHAPTERS / f"{name}.ipynb").read_text())
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), "nbformat 4.5 or later (cells carry ids)"
    assert "papermill" not in nb["metadata"], "an executed copy was saved over the source"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not any(c.get("outputs") for c in code), "chapters are stored without outputs"
    assert all(c.get("execution_count") is None for c in code), "chapters are stored without execution counts"
    for cell in nb["cells"]:
        assert not EXECUTOR_KEYS & set(cell["metadata"]), f"cell {cell.get('id')}: executor metadata {cell['metadata']}"
        assert "injected-parameters" not in cell["metadata"].get("tags", []), "papermill's injected cell was saved"
    ids = [c.get("id") for c in nb["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), f"every cell needs its own id: {ids}"
    assert any("parameters" in c["metadata"].get("tags", []) for c in code), "papermill needs a parameters cell"
    first = "".join(nb["cells"][0]["source"])
    assert first.startswith("# "), "every chapter starts with a # Title cell"
    params = "".join(next(c for c in code if "parameters" in c["metadata"].get("tags", []))["source"])
    assert "device" in params


def _execute(name: str, out: Path, root: Path = paths.ROOT, warm: bool = False) -> str:
    """Run the chapter through papermill in CPU mode; the text of every code cell's output. warm: its kernel is
    forked from a server that has imported torch and numpy (tests/book/warm_kernel.py says how the chapter still
    starts from a clean namespace in a process of its own), which spares each run the ~1.5 CPU-seconds of those
    imports; the server serves only kernels whose environment matches its own, less LAB_*."""
    import papermill

    extra = {}
    if warm:
        import warm_kernel

        extra["kernel_manager_class"] = warm_kernel.manager_class()
    # the executed notebook is written once, at the end (or at the failing cell), not after every cell: nothing
    # reads it before then, and each write validates and serializes the whole notebook again
    papermill.execute_notebook(str(root / "chapters" / f"{name}.ipynb"), str(out), parameters={"device": "cpu"},
                               cwd=str(root), kernel_name="python3", progress_bar=False,
                               request_save_on_cell_execute=False, **extra)
    executed = json.loads(out.read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    return "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                     for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))


@pytest.mark.parametrize("outputs", ["empty", "committed"])
def test_chapter_runs_in_cpu_mode(name, outputs, tmp_path, monkeypatch):
    """Against an empty outputs/ (a new user's first run) and against the committed one, the path `make book`
    takes on a machine without a GPU: there CPU mode shows the recorded GPU results."""
    if outputs == "empty":
        root = tmp_path / "outputs"
        monkeypatch.setenv("LAB_OUTPUTS", str(root))
        monkeypatch.delenv("LAB_SESSION_DIR", raising=False)
    else:  # read the committed records; write this run's records beside the test, never into outputs/
        root = tmp_path / "session"
        monkeypatch.setenv("LAB_OUTPUTS", str(paths.ROOT / "outputs"))
        monkeypatch.setenv("LAB_SESSION_DIR", str(root))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")])))
    text = _execute(name, tmp_path / f"{name}.ipynb", warm=True)
    assert "CPU mode" in text
    # a chapter records its own results even when run on its own, with no session
    assert list(root.rglob("records.jsonl")), "the chapter wrote no records"
    if name not in ("n0_environment",):
        assert "[skipped in CPU mode:" in text, "GPU cells must say they were skipped"
    source = (paths.CHAPTERS / f"{name}.ipynb").read_text()
    if outputs == "committed" and ".recorded(" in source:  # a chapter that shows recorded GPU results
        from lab import record

        recorded = {r["session"] for r in record.load(paths.ROOT / "outputs", chapter=name, gpu_only=True)}
        if not recorded:  # a new chapter before its first committed GPU session says so
            assert "no GPU results recorded yet" in text, f"{name}: no committed GPU session, and it does not say so"
        assert not recorded or any(session in text for session in recorded), \
            f"{name}: shows recorded GPU results, but named none of the committed sessions {sorted(recorded)}"


def _tracked_copy(destination: Path) -> Path:
    """The checkout's tracked files (or, outside git, everything but caches and builds) copied to destination."""
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=paths.ROOT, capture_output=True, text=True,
                               check=True).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        shutil.copytree(paths.ROOT, destination, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "_build", "__pycache__", "adhoc", "book", "log"))
        return destination
    for name in filter(None, names):
        if (paths.ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(paths.ROOT / name, destination / name)
    return destination


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def test_a_read_only_checkout_runs_a_chapter_with_the_cache_elsewhere(tmp_path, monkeypatch):
    """LAB_CACHE_DIR alone moves every cache: a read-only copy of the checkout compile-checks its kernels and
    plots in CPU mode, and nothing is written inside the copy."""
    checkout = _tracked_copy(tmp_path / "checkout")
    cache = tmp_path / "elsewhere"
    for name in ("TORCH_EXTENSIONS_DIR", "MPLCONFIGDIR", "JUPYTER_RUNTIME_DIR", "LAB_CACHE", "LAB_OUTPUTS"):
        monkeypatch.delenv(name, raising=False)  # they must follow LAB_CACHE_DIR, not the test's environment
    monkeypatch.setenv("LAB_CACHE_DIR", str(cache))
    monkeypatch.setenv("LAB_SESSION_DIR", str(tmp_path / "session"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # what Python does by itself in a read-only folder
    monkeypatch.setenv("PYTHONPATH", str(checkout))
    for path in [checkout, *checkout.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    before = _snapshot(checkout)
    try:
        text = _execute("n4_baseline", tmp_path / "out.ipynb", root=checkout)
    finally:
        for path in [checkout, *checkout.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)  # so pytest can remove its temporary folder
    assert "CPU mode" in text
    assert _snapshot(checkout) == before, "the chapter wrote inside the checkout"
    assert list((cache / "compile_check").glob("*.cubin")), "the kernels were compile-checked into LAB_CACHE_DIR"
    assert (cache / "matplotlib").is_dir() and (cache / "torch_extensions").is_dir()


def test_recorded_results_name_their_session_once_per_cell(monkeypatch, capsys):
    """A CPU-mode cell that reads two kinds of rows from one session (n4: timings and checks) names it once; the
    next cell names it again."""
    from lab import chapter, record

    rows = [{"session": "s1", "env": {"gpu": "NVIDIA H200"}, "commit": "c0ffee0"}]
    monkeypatch.setattr(record, "load", lambda **match: rows)
    monkeypatch.setattr(record, "latest_gpu_rows", lambda found: found)
    cells = iter([7, 7, 8])
    monkeypatch.setattr(chapter, "_cell", lambda: next(cells))
    ch = chapter.Chapter("n4_baseline", "cpu")
    assert ch.recorded(kind="fwd") == rows and ch.recorded(kind="check") == rows and ch.recorded(kind="fwd") == rows
    assert capsys.readouterr().out.count("recorded GPU results: session s1, NVIDIA H200, commit c0ffee0\n") == 2


def test_front_doors_name_every_chapter_and_experiment():
    """README.md (at most 8 KB, for users) and the book's front page (intro.md) name every notebook in chapters/:
    the n<N>_ chapters and the x_ experiments."""
    notebooks = sorted(p.stem for p in paths.CHAPTERS.glob("*.ipynb"))
    assert any(n.startswith("n") for n in notebooks)
    readme, intro = (paths.ROOT / "README.md").read_text(), (paths.ROOT / "intro.md").read_text()
    assert len(readme.encode()) <= 8 * 1024, f"README.md is {len(readme.encode())} bytes"
    for name in notebooks:
        assert f"`{name}`" in readme, f"README.md does not name {name}"
        assert f"`{name}`" in intro, f"intro.md does not name {name}"


def test_a_warm_kernel_starts_each_run_from_a_clean_namespace(tmp_path, monkeypatch):
    """The warm kernels that run the chapters above (tests/book/warm_kernel.py): each run is a process of its own
    with a new namespace and none of the modules an earlier run imported but the preloaded torch and numpy, started
    in the run's working folder, with its environment, argv and sys.path[0] as `python -m ipykernel_launcher`
    gives them; a run whose environment differs from the server's (beyond LAB_*) gets an ordinary kernel."""
    import nbformat
    import papermill

    import warm_kernel

    probe = ("import os, sys, json\n"
             "print(json.dumps({'pid': os.getpid(), 'seen': 'left_behind' in globals(), 'cwd': os.getcwd(),\n"
             "    'path': sys.path, 'argv0': os.path.basename(sys.argv[0]), 'probe': os.environ.get('LAB_PROBE'),\n"
             "    'torch': 'torch' in sys.modules, 'imported': 'warm_probe_marker' in sys.modules or 'colorsys' in sys.modules}))\n"
             "left_behind = 1\nimport colorsys\nsys.modules['warm_probe_marker'] = type(sys)('warm_probe_marker')")
    notebook = tmp_path / "probe.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(probe)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, notebook)

    # the chapters' environment (test_chapter_runs_in_cpu_mode), so that this test asks the server they use
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")])))
    manager = warm_kernel.manager_class()  # the server for this environment; each run below asks it

    def run(label: str, cwd: Path) -> dict:
        monkeypatch.setenv("LAB_PROBE", label)
        out = tmp_path / f"{label}.ipynb"
        papermill.execute_notebook(str(notebook), str(out), cwd=str(cwd), kernel_name="python3", progress_bar=False,
                                   kernel_manager_class=manager)
        return json.loads("".join(json.loads(out.read_text())["cells"][0]["outputs"][0]["text"]))

    (tmp_path / "elsewhere").mkdir()
    first, second = run("first", paths.ROOT), run("second", tmp_path / "elsewhere")
    for seen, label, cwd in ((first, "first", paths.ROOT), (second, "second", tmp_path / "elsewhere")):
        assert seen["torch"], "served warm: torch was imported before the first cell"
        assert not seen["seen"] and not seen["imported"], "a name or module of an earlier run is visible"
        assert seen["probe"] == label and seen["cwd"] == str(cwd) and seen["argv0"] == "ipykernel_launcher.py"
    assert first["pid"] != second["pid"] != os.getpid()
    monkeypatch.setenv("WARM_KERNEL_PROBE_OTHER_ENV", "1")  # an environment the server was not started with
    cold = run("cold", paths.ROOT)
    assert not cold["torch"] and cold["probe"] == "cold", "a differing environment must get an ordinary kernel"
    assert first["path"] == cold["path"] == second["path"], "the import path must be an ordinary kernel's"
