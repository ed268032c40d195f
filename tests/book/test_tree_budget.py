"""The tree budget: the tracked tree stays under 40 MB, and pruning never takes a copy the book publishes.

`python -m lab prune` removes the executed notebooks and figures of superseded sessions (their records
stay, gzipped) and writes pruned.json with the commit that still has them; the sessions page names that commit.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lab import paths, record, session
from lab.publish import log, pages, prune

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 64


def _git_tree() -> bool:
    try:
        return subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=paths.ROOT,
                              capture_output=True, text=True).stdout.strip() == "true"
    except OSError:
        return False


@pytest.mark.skipif(not _git_tree(), reason="the checkout is not a git work tree (an exported copy)")
def test_tracked_tree_is_under_budget():
    size = prune.tracked_bytes()
    assert 0 < size <= prune.BUDGET_BYTES, (
        f"the tracked tree is {size / 1e6:.1f} MB, over its {prune.BUDGET_BYTES / 1e6:.0f} MB budget: "
        "`python -m lab prune` removes the executed copies of superseded sessions (README: Where results go)")


def test_published_sessions_keep_their_notebooks():
    """Per chapter and GPU, the latest session that ran the chapter ok still has its executed notebook."""
    sessions = pages.load_sessions(paths.ROOT / "outputs")
    latest: dict[tuple[str, str], dict] = {}
    for s in sessions:  # oldest first, so the last one seen per (chapter, GPU) is the latest
        for entry in s["chapters"]:
            if s.get("mode") == "gpu" and entry.get("status") == "ok":
                latest[(entry["name"], s["env"].get("gpu"))] = (s, entry)
    assert latest, "the committed outputs hold GPU sessions"
    for (chapter, gpu), (s, entry) in latest.items():
        assert (s["_dir"] / entry.get("notebook", f"{chapter}.ipynb")).is_file(), (
            f"{s['id']} is the latest {gpu} session of {chapter}, but its executed notebook left the tree")


# ------------------------------------------------------------------ pruning a small tree of sessions

GPUS = {"h100": "NVIDIA H100 80GB HBM3", "h200": "NVIDIA H200", "cpu": "cpu"}


def _session(outputs: Path, sid: str, chapters: dict[str, str], ncu: bool = False) -> Path:
    gpu = sid.split("-")[2]
    folder = outputs / "sessions" / sid
    (folder / "figures").mkdir(parents=True)
    for name in chapters:
        (folder / f"{name}.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                          "nbformat_minor": 5}))
        (folder / "figures" / f"{name}.png").write_bytes(PNG)
    if ncu:
        (folder / "ncu").mkdir()
        (folder / "ncu" / "fwd.ncu-rep").write_bytes(b"\1" * 1000)
    (folder / "records.jsonl").write_text("".join(json.dumps({"kind": "check", "session": sid, "n": i,
                                                              "pad": "x" * 40}) + "\n" for i in range(50)))
    start = f"{sid[:4]}-{sid[4:6]}-{sid[6:8]}T{sid[9:11]}:{sid[11:13]}:00+00:00"
    (folder / "session.json").write_text(json.dumps({
        "start": start, "status": "complete", "mode": "cpu" if gpu == "cpu" else "gpu", "env": {"gpu": GPUS[gpu]},
        "chapters": [{"name": n, "status": st, "notebook": f"{n}.ipynb"} for n, st in chapters.items()]}))
    return folder


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "repo"
    (root / "chapters").mkdir(parents=True)
    shutil.copy(paths.ROOT / "_toc.yml", root / "_toc.yml")
    out = root / "outputs"
    ids = {"cited": "20251020-100000-h100-eeee", "old": "20251101-100000-h100-aaaa",
           "new": "20251102-100000-h100-bbbb", "h200": "20251103-100000-h200-cccc",
           "mixed": "20251104-100000-h100-dddd", "cpu": "20251105-100000-cpu-ffff"}
    _session(out, ids["cited"], {"n4_baseline": "ok"})
    _session(out, ids["old"], {"n4_baseline": "ok"}, ncu=True)
    _session(out, ids["new"], {"n4_baseline": "ok"}, ncu=True)
    _session(out, ids["h200"], {"n4_baseline": "ok"})
    _session(out, ids["mixed"], {"n4_baseline": "failed", "n5_correctness": "ok"})
    _session(out, ids["cpu"], {"n4_baseline": "ok"})
    (root / "README.md").write_text(f"The first H100 numbers: session `{ids['cited']}`.\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "sessions"], cwd=root, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    return root, ids, head


def test_prune_keeps_published_and_cited_sessions(tree):
    root, ids, head = tree
    sessions = root / "outputs" / "sessions"
    done = prune.prune(root)
    assert set(done) == {ids["old"], ids["cpu"], ids["new"], ids["cited"]}
    # superseded on its GPU (old) or CPU-mode beside GPU evidence (cpu): every copy leaves, the records stay
    # gzipped
    for key in ("old", "cpu"):
        folder = sessions / ids[key]
        assert prune.copies(folder) == [], key
        assert (folder / record.RECORDS_GZ).is_file() and (folder / "session.json").is_file()
        assert not (folder / record.RECORDS).exists(), key
        note = json.loads((folder / prune.PRUNED).read_text())
        assert note["commit"] == head and "n4_baseline.ipynb" in note["files"]
        assert note["records"]["file"] == record.RECORDS_GZ
        assert note["records"]["gzip_bytes"] == (folder / record.RECORDS_GZ).stat().st_size
        shown = subprocess.run(["git", "show", f"{note['commit']}:outputs/sessions/{ids[key]}/n4_baseline.ipynb"],
                               cwd=root, capture_output=True, text=True)
        assert shown.returncode == 0 and '"nbformat": 4' in shown.stdout
    # the latest H100 session keeps its notebook and figures; only its Nsight Compute report leaves
    new = sessions / ids["new"]
    assert (new / "n4_baseline.ipynb").is_file() and (new / "figures" / "n4_baseline.png").is_file()
    assert not (new / "ncu" / "fwd.ncu-rep").exists()
    assert json.loads((new / prune.PRUNED).read_text())["files"] == ["ncu/fwd.ncu-rep"]
    # the H200's latest, the only ok run of n5 (its failed n4 does not supersede an ok one), the cited one
    for key in ("h200", "mixed", "cited"):
        assert (sessions / ids[key] / "n4_baseline.ipynb").is_file(), key
        assert not (sessions / ids[key] / prune.PRUNED).exists(), key
    for key in ("new", "h200", "mixed"):  # published: plain records, as the runner wrote them
        assert (sessions / ids[key] / record.RECORDS).is_file(), key
        assert not (sessions / ids[key] / record.RECORDS_GZ).exists(), key
    # cited but not published: its copies stay, its records are gzipped (every row, read as before)
    cited = sessions / ids["cited"]
    assert (cited / record.RECORDS_GZ).is_file() and not (cited / record.RECORDS).exists()
    assert done[ids["cited"]]["files"] == [] and done[ids["cited"]]["records"]["file"] == record.RECORDS_GZ
    assert prune.prune(root) == {}, "a second prune finds nothing"


def test_a_session_cited_only_by_a_kernels_readme_keeps_its_records_not_its_copies(tree):
    root, ids, _ = tree
    (root / "README.md").write_text("No session named here.\n")
    (root / "kernels" / "bwd").mkdir(parents=True)
    (root / "kernels" / "bwd" / "README.md").write_text(f"Measured in session `{ids['cited']}`.\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "cite from a kernels README"], cwd=root, check=True)
    done = prune.prune(root)
    folder = root / "outputs" / "sessions" / ids["cited"]
    assert "n4_baseline.ipynb" in done[ids["cited"]]["files"]
    assert prune.copies(folder) == [] and (folder / record.RECORDS_GZ).is_file()
    assert len(record.read(folder / record.RECORDS_GZ)) == 50  # every row still there


def test_published_records_over_the_plain_limit_are_gzipped(tree, monkeypatch):
    """A published session whose records outgrow PLAIN_MAX_BYTES gzips them (every row, read as before) and keeps
    its notebook; one under the limit keeps them plain."""
    root, ids, _ = tree
    sessions = root / "outputs" / "sessions"
    with open(sessions / ids["new"] / record.RECORDS, "a") as f:  # the latest H100 session outgrows the H200's
        f.write("".join(json.dumps({"kind": "check", "n": i, "pad": "y" * 40}) + "\n" for i in range(50)))
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-qam",
                    "more rows"], cwd=root, check=True)
    rows = record.read(sessions / ids["new"] / record.RECORDS)
    monkeypatch.setattr(prune, "PLAIN_MAX_BYTES", (sessions / ids["h200"] / record.RECORDS).stat().st_size)
    done = prune.prune(root)
    new = sessions / ids["new"]
    assert done[ids["new"]]["records"]["file"] == record.RECORDS_GZ
    assert (new / record.RECORDS_GZ).is_file() and not (new / record.RECORDS).exists()
    assert record.read(new / record.RECORDS_GZ) == rows and (new / "n4_baseline.ipynb").is_file()
    assert (sessions / ids["h200"] / record.RECORDS).is_file()  # published and within the limit: plain


def test_sessions_page_names_the_commit_that_has_the_copies(tree):
    root, ids, head = tree
    before = log.generate(root / "outputs", chapters_list=["n4_baseline", "n5_correctness"],
                          chapters_dir=root / "chapters")["chapters"]
    prune.prune(root)
    written = log.generate(root / "outputs", chapters_list=["n4_baseline", "n5_correctness"],
                           chapters_dir=root / "chapters")
    assert written["chapters"] == before, "pruning changes no chapter page of the book"
    page = Path(written["sessions"]).read_text()
    section = page.split(f"## {ids['old']}")[1].split("\n## ")[0]
    assert f"git checkout {head[:10]} -- outputs/sessions/{ids['old']}" in section
    row = next(line for line in page.splitlines() if line.startswith(f"| {{ref}}`{ids['old']} "))
    assert row.rstrip(" |").endswith(f"at commit `{head[:10]}`")
    kept = next(line for line in page.splitlines() if line.startswith(f"| {{ref}}`{ids['h200']} "))
    assert kept.rstrip(" |").endswith("2 in the tree")


def test_prune_refuses_a_session_that_is_not_committed(tree):
    root, ids, _ = tree
    (root / "outputs" / "sessions" / ids["old"] / "figures" / "late.png").write_bytes(PNG)
    with pytest.raises(RuntimeError, match="commit the session"):
        prune.prune(root)
    assert (root / "outputs" / "sessions" / ids["old"] / "n4_baseline.ipynb").is_file()


def test_citations_by_name_stamp_and_short_form(tmp_path):
    ids = ["20251101-100000-h100-aaaa", "20251102-110000-h200-bbbb", "20251103-120000-h100-cccc",
           "20251104-130000-h100-dddd"]
    (tmp_path / "README.md").write_text(f"`{ids[0]}`, `20251102-110000-h200-…`, `…120000…`, 20251104-13000\n")
    assert prune.cited(tmp_path, ids) == set(ids[:3])


def test_pruning_keeps_every_record_row(tree):
    root, ids, _ = tree
    outputs = root / "outputs"
    before = record.load(outputs)
    rows = pages.load_rows(outputs)
    old = session.session_rows(outputs / "sessions" / ids["old"])
    assert len(before) == 6 * 50
    prune.prune(root)
    assert record.load(outputs) == before
    assert pages.load_rows(outputs) == rows
    assert session.session_rows(outputs / "sessions" / ids["old"]) == old and len(old) == 50


def _commit(root: Path, message: str) -> None:
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", message], cwd=root, check=True)


def test_a_session_pruned_before_gets_its_records_gzipped(tree):
    """A session pruned before records were gzipped still holds a plain records.jsonl: the next prune packs it."""
    root, ids, head = tree
    folder = root / "outputs" / "sessions" / ids["old"]
    prune.prune(root)
    _commit(root, "prune")
    (folder / record.RECORDS_GZ).unlink()
    subprocess.run(["git", "checkout", head, "--", f"outputs/sessions/{ids['old']}/{record.RECORDS}"],
                   cwd=root, check=True)
    _commit(root, "records as they were")
    rows, size = record.load(root / "outputs"), prune.tracked_bytes(root)
    old_note = (folder / prune.PRUNED).stat().st_size

    dry = prune.prune(root, dry_run=True)
    assert set(dry) == {ids["old"]} and dry[ids["old"]]["files"] == []
    assert (folder / record.RECORDS).is_file() and not (folder / record.RECORDS_GZ).exists(), "dry: no change"

    done = prune.prune(root)
    assert done == dry
    assert not (folder / record.RECORDS).exists() and (folder / record.RECORDS_GZ).is_file()
    note = json.loads((folder / prune.PRUNED).read_text())
    assert note["commit"] == head and "n4_baseline.ipynb" in note["files"], "the first prune's note stays"
    assert note["records"]["file"] == record.RECORDS_GZ
    assert record.load(root / "outputs") == rows
    _commit(root, "gzip")  # the dry run's projection is the tree's size, but for pruned.json's new lines
    grown = (folder / prune.PRUNED).stat().st_size - old_note
    assert prune.tracked_bytes(root) == size - prune.saved(dry) + grown < size
    assert prune.prune(root) == {}


def test_prune_refuses_records_that_are_not_committed(tree):
    root, ids, _ = tree
    prune.prune(root)
    _commit(root, "prune")
    folder = root / "outputs" / "sessions" / ids["old"]
    record.append({"kind": "late"}, folder=folder, env={"gpu": "cpu"})  # appended after its commit
    with pytest.raises(RuntimeError, match="commit the session"):
        prune.prune(root)
    assert (folder / record.RECORDS).is_file()
