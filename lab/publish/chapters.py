"""The book's chapter pages: for each chapter, one executed copy chosen from the sessions.

The choice, best first: the latest session that ran the chapter successfully on a GPU; the latest GPU
session where it failed (its partial GPU output still beats any CPU run); the latest CPU-mode run; a
placeholder that says it never ran. A CPU run therefore never replaces GPU evidence, however new. A chapter
that needs several GPUs (its notebook's metadata `lab.min_gpus`, e.g. n12_ring's ring over 2 GPUs) counts a
GPU session with fewer (session.json `gpus`; absent: 1) as a CPU run: there it runs its CPU version, which
must never replace a multi-GPU run.
Every copy gets a provenance cell after its title: which session, GPU and commit executed it, and its outputs
are cleaned for a reader (lab.publish.clean: no progress bars, warnings or machine paths; long tables folded).

Only chapters of the known list (_toc.yml) are published, and a notebook is read only from inside its
session folder: a crafted session.json cannot make the log read or write anywhere else. A notebook that
does not parse (truncated by a full disk) is skipped with a warning and the next candidate is used.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

from .. import files, paths, toc
from . import clean, pages

_TIERS = [("gpu", "ok"), ("gpu", "failed"), ("cpu", "ok"), ("cpu", "failed")]


def notebook_path(session: dict, entry: dict) -> Path | None:
    """The executed notebook of a chapter entry, only if it is a plain .ipynb file inside the session folder."""
    folder = Path(session["_dir"])
    name = entry.get("notebook") or f"{entry.get('name')}.ipynb"
    if not isinstance(name, str) or Path(name).name != name or not name.endswith(".ipynb"):
        pages.warn(f"{folder}/session.json: notebook {name!r} is not a file name in the session folder; ignored")
        return None
    path = folder / name
    try:
        inside = path.resolve().parent == folder.resolve()
    except OSError:
        return None
    if not inside:  # a symlink out of the folder
        pages.warn(f"{path}: points outside its session folder; ignored")
        return None
    return path if path.is_file() else None


def _mode(session: dict, need: int) -> str | None:
    """The session's mode for a chapter that needs `need` GPUs: a GPU session with fewer counts as CPU."""
    gpus = session.get("gpus") if isinstance(session.get("gpus"), int) else 1
    return "cpu" if session.get("mode") == "gpu" and need > 1 and gpus < need else session.get("mode")


def _candidates(chapter: str, sessions: list[dict], need: int = 1):
    """(session, entry, notebook path), best first."""
    for mode, status in _TIERS:
        runs = [(s, e) for s in sessions if _mode(s, need) == mode for e in s.get("chapters", [])
                if e.get("name") == chapter and e.get("status") == status]
        for session, entry in sorted(runs, key=lambda pair: (str(pair[0].get("start") or ""), pair[0]["id"]),
                                     reverse=True):
            path = notebook_path(session, entry)
            if path is not None:
                yield session, entry, path


def choose(chapter: str, sessions: list[dict], need: int = 1) -> tuple[dict, dict] | None:
    """(session, chapter entry) to publish for `chapter`, or None when no session ran it."""
    for session, entry, _ in _candidates(chapter, sessions, need):
        return session, entry
    return None


def _read(path: Path):
    try:
        return nbformat.read(path, as_version=4)
    except Exception as err:  # truncated JSON, invalid notebook, unreadable file: never a crash
        pages.warn(f"{path}: unreadable notebook skipped ({type(err).__name__}: {str(err)[:200]})")
        return None


def min_gpus(chapter: str, chapters_dir: Path) -> int:
    """GPUs the chapter needs for its GPU results: its source notebook's metadata lab.min_gpus (default 1)."""
    try:
        meta = json.loads((chapters_dir / f"{chapter}.ipynb").read_text()).get("metadata", {})
        need = meta.get("lab", {}).get("min_gpus", 1)
    except (OSError, ValueError, AttributeError):
        return 1
    return need if isinstance(need, int) and need > 0 else 1


def _title(chapter: str, chapters_dir: Path) -> str:
    source = chapters_dir / f"{chapter}.ipynb"
    if source.exists():
        try:
            for c in json.loads(source.read_text()).get("cells", []):
                text = "".join(c.get("source", "")) if c.get("cell_type") == "markdown" else ""
                if text.lstrip().startswith("# "):
                    return text.lstrip()[2:].splitlines()[0].strip()
        except (OSError, ValueError):
            pass
    return chapter


def provenance(session: dict, entry: dict, need: int = 1) -> str:
    env = session.get("env") or {}
    gpus = session.get("gpus") if isinstance(session.get("gpus"), int) else 1
    gpu = pages.text(env.get("gpu", "cpu")) if session.get("mode") == "gpu" else "no GPU (CPU mode)"
    if session.get("mode") == "gpu" and gpus > 1:
        gpu += f" × {gpus}"
    parameters = session.get("parameters") if isinstance(session.get("parameters"), dict) else {}
    text = (f"Executed in session {pages.session_ref(session['id'])} on **{gpu}** at commit "
            f"{pages.text(session.get('commit', 'unknown'))} ({pages.date(session.get('start'))} UTC), "
            f"parameters {pages.text(', '.join(f'{k}={v}' for k, v in parameters.items()))}; "
            f"took {pages.duration(entry.get('duration_s'))}.")
    if _mode(session, need) != session.get("mode"):
        text += (f"\n\n```{{warning}}\nThis chapter needs {need} GPUs and this session had {gpus}: it ran the "
                 f"chapter's CPU version and showed recorded results. No {need}-GPU session has run it yet.\n```")
    elif session.get("mode") != "gpu":
        text += ("\n\n```{warning}\nThis is a CPU-mode run: no GPU executed this chapter, so its kernels were "
                 "compile-checked or emulated, not timed. No GPU session has run it yet.\n```")
    if entry.get("status") == "failed":
        text += (f"\n\n```{{warning}}\nThis execution failed: {pages.text(entry.get('error'))}. The cells after "
                 "the failure did not run (its gates are void); see the bugs page.\n```")
    found = [g for g in entry.get("gates") or [] if isinstance(g, dict)]
    if found:
        text += "\n\nGates of this chapter in that session:\n\n" + "\n".join(
            f"- **{pages.text(g.get('status'))}**: {pages.text(g.get('name'))} (measured {pages.cell(g.get('measured'))})"
            for g in found)
    return text


def annotate(nb, session: dict, entry: dict, need: int = 1):
    """Insert the provenance cell after the title; hide papermill's injected parameters."""
    nb.cells = [c for c in nb.cells if "papermill-error-cell-tag" not in c.get("metadata", {}).get("tags", [])]
    for c in nb.cells:
        tags = c.setdefault("metadata", {}).setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
    at = next((i for i, c in enumerate(nb.cells)
               if c.cell_type == "markdown" and c.source.lstrip().startswith("# ")), None)
    if at is None:
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(f"# {entry['name']}"))
        at = 0
    nb.cells.insert(at + 1, nbformat.v4.new_markdown_cell(provenance(session, entry, need),
                                                          metadata={"tags": ["provenance"]}))
    return nb


def placeholder(chapter: str, chapters_dir: Path):
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {pages.text(_title(chapter, chapters_dir))}"),
                nbformat.v4.new_markdown_cell(
                    "```{note}\nThis chapter has not been executed in any session yet. Run "
                    f"`python -m lab session --chapters {chapter}` (or `make book`) to execute it.\n```")]
    return nb


def publish(outputs: Path, sessions: list[dict], chapters: list[str], chapters_dir: Path | None = None) -> dict:
    """Write outputs/book/<chapter>.ipynb for every known chapter; returns {chapter: session id or None}."""
    chapters_dir = Path(chapters_dir or paths.CHAPTERS)
    book = outputs / "book"
    chosen = {}
    for chapter in chapters:
        if not toc.is_chapter_name(chapter):
            pages.warn(f"chapter name {chapter!r} is not n<N>_<topic>; not published")
            continue
        nb, pick, need = None, None, min_gpus(chapter, chapters_dir)
        for session, entry, path in _candidates(chapter, sessions, need):
            nb = _read(path)
            if nb is not None:
                pick = (session, entry)
                nb = clean.clean(annotate(nb, session, entry, need))
                break
        if nb is None:
            nb = placeholder(chapter, chapters_dir)
        files.write_atomic(book / f"{chapter}.ipynb", nbformat.writes(nb))
        chosen[chapter] = pick[0]["id"] if pick else None
    return chosen
