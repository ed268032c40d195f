"""Every chapter executes headless through papermill in CPU mode, and says which cells it skipped."""
from __future__ import annotations

import json
import os
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


def test_chapter_runs_in_cpu_mode(name, tmp_path, monkeypatch):
    import papermill

    outputs = tmp_path / "outputs"
    env = {"LAB_OUTPUTS": str(outputs), "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LAB_SESSION_DIR", raising=False)
    out = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(str(paths.CHAPTERS / f"{name}.ipynb"), str(out), parameters={"device": "cpu"},
                               cwd=str(paths.ROOT), kernel_name="python3", progress_bar=False)
    executed = json.loads(out.read_text())
    text = "\n".join("".join(o.get("text", "")) for c in executed["cells"] if c["cell_type"] == "code"
                     for o in c.get("outputs", []))
    assert "CPU mode" in text
    # a chapter records its own results even when run on its own, with no session
    assert list(outputs.rglob("records.jsonl")), "the chapter wrote no records under outputs/"
    if name not in ("n0_environment",):
        assert "[skipped in CPU mode:" in text, "GPU cells must say they were skipped"
    assert not any(o.get("output_type") == "error" for c in executed["cells"] for o in c.get("outputs", []))
