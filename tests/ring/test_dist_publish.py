"""The book's copy of a chapter that needs several GPUs (n12_ring: notebook metadata lab.min_gpus = 2): a
GPU session with fewer GPUs runs only its CPU version, so it counts as a CPU run and never replaces a
multi-GPU session's copy; its provenance says why. Sessions record how many GPUs they had."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

from lab import paths, session
from lab.publish import chapters as publish


def _session(root: Path, sid: str, mode: str, start: str, gpus=None) -> dict:
    folder = root / sid
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# n12 · ring"), nbformat.v4.new_markdown_cell(f"run {sid}")]
    (folder / "n12_ring.ipynb").write_text(nbformat.writes(nb))
    info = {"id": sid, "mode": mode, "start": start, "_dir": folder, "env": {"gpu": "NVIDIA H200" if mode == "gpu" else "cpu"},
            "commit": "abc", "chapters": [{"name": "n12_ring", "status": "ok", "notebook": "n12_ring.ipynb"}]}
    if gpus is not None:
        info["gpus"] = gpus
    return info


def test_n12_declares_two_gpus():
    assert publish.min_gpus("n12_ring", paths.CHAPTERS) == 2
    assert publish.min_gpus("n10_backward", paths.CHAPTERS) == 1
    assert publish.min_gpus("no_such_chapter", paths.CHAPTERS) == 1


def test_a_one_gpu_session_never_replaces_a_two_gpu_run(tmp_path):
    two = _session(tmp_path, "s-two", "gpu", "2026-11-23T01:00:00", gpus=2)
    one = _session(tmp_path, "s-one", "gpu", "2026-11-23T02:00:00", gpus=1)
    legacy = _session(tmp_path, "s-legacy", "gpu", "2026-11-23T03:00:00")  # no "gpus": one GPU
    cpu = _session(tmp_path, "s-cpu", "cpu", "2026-11-23T04:00:00", gpus=0)
    assert publish.choose("n12_ring", [two, one, legacy, cpu], need=2)[0]["id"] == "s-two"
    assert publish.choose("n12_ring", [one, legacy, cpu], need=1)[0]["id"] == "s-legacy"  # others: GPU first
    assert publish.choose("n12_ring", [one, legacy, cpu], need=2)[0]["id"] == "s-cpu"  # all CPU-like: newest
    assert publish.choose("n12_ring", [one], need=2)[0]["id"] == "s-one"  # still beats a placeholder


def test_provenance_says_why_and_counts_gpus(tmp_path):
    one = _session(tmp_path, "s-one", "gpu", "2026-11-23T02:00:00", gpus=1)
    two = _session(tmp_path, "s-two", "gpu", "2026-11-23T01:00:00", gpus=2)
    entry = one["chapters"][0]
    text = publish.provenance(one, entry, need=2)
    assert "needs 2 GPUs and this session had 1" in text and "No 2-GPU session has run it yet" in text
    assert "CPU-mode run" not in text
    assert "NVIDIA H200 × 2" in publish.provenance(two, entry, need=2)
    assert "{warning}" not in publish.provenance(two, entry, need=2)
    assert "{warning}" not in publish.provenance(one, entry)  # a one-GPU chapter: an ordinary GPU run


def test_publish_uses_the_chapters_declared_need(tmp_path):
    chapters_dir = tmp_path / "chapters"
    chapters_dir.mkdir()
    (chapters_dir / "n12_ring.ipynb").write_text((paths.CHAPTERS / "n12_ring.ipynb").read_text())
    sessions = [_session(tmp_path / "sessions", "s-two", "gpu", "2026-11-23T01:00:00", gpus=2),
                _session(tmp_path / "sessions", "s-one", "gpu", "2026-11-23T02:00:00", gpus=1)]
    chosen = publish.publish(tmp_path / "outputs", sessions, ["n12_ring"], chapters_dir)
    assert chosen == {"n12_ring": "s-two"}
    book = json.loads((tmp_path / "outputs" / "book" / "n12_ring.ipynb").read_text())
    assert "run s-two" in "".join(book["cells"][2]["source"])


def test_session_records_its_gpu_count():
    assert session.gpu_count("cpu") == 0
    import torch
    assert session.gpu_count("gpu") == torch.cuda.device_count()
