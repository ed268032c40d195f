"""The book's chapter pages: for each chapter, one executed copy chosen from the sessions.

The choice, best first: the latest session that ran the chapter successfully on a GPU; the latest GPU
session where it failed (its partial GPU output still beats any CPU run); the latest CPU-mode run; a
placeholder that says it never ran. A CPU run therefore never replaces GPU evidence, however new.
Every copy gets a provenance cell after its title: which session, GPU and commit executed it.
"""
from __future__ import annotations

import json
from pathlib import Path

import nbformat

from . import pages, paths

_TIERS = [("gpu", "ok"), ("gpu", "failed"), ("cpu", "ok"), ("cpu", "failed")]


def choose(chapter: str, sessions: list[dict]) -> tuple[dict, dict] | None:
    """(session, chapter entry) to publish for `chapter`, or None when no session ran it."""
    for mode, status in _TIERS:
        runs = [(s, e) for s in sessions if s.get("mode") == mode for e in s.get("chapters", [])
                if e.get("name") == chapter and e.get("status") == status
                and (s["_dir"] / (e.get("notebook") or f"{chapter}.ipynb")).exists()]
        if runs:
            return max(runs, key=lambda pair: (pair[0].get("start") or "", pair[0]["id"]))
    return None


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


def provenance(session: dict, entry: dict) -> str:
    env = session.get("env") or {}
    gpu = env.get("gpu", "cpu") if session.get("mode") == "gpu" else "no GPU (CPU mode)"
    text = (f"Executed in session {pages.session_ref(session['id'])} on **{gpu}** at commit "
            f"`{session.get('commit', 'unknown')}` ({pages.date(session.get('start'))} UTC), "
            f"parameters {', '.join(f'{k}={v}' for k, v in (session.get('parameters') or {}).items())}; "
            f"took {pages.duration(entry.get('duration_s'))}.")
    if session.get("mode") != "gpu":
        text += ("\n\n```{warning}\nThis is a CPU-mode run: no GPU executed this chapter, so its kernels were "
                 "compile-checked or emulated, not timed. No GPU session has run it yet.\n```")
    if entry.get("status") == "failed":
        text += (f"\n\n```{{warning}}\nThis execution failed: {entry.get('error')}. The cells after the failure "
                 "did not run; see the bugs page.\n```")
    found = entry.get("gates") or []
    if found:
        text += "\n\nGates of this chapter in that session:\n\n" + "\n".join(
            f"- **{g['status']}**: {g['name']} (measured {pages.cell(g.get('measured'))})" for g in found)
    return text


def annotate(nb, session: dict, entry: dict):
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
    nb.cells.insert(at + 1, nbformat.v4.new_markdown_cell(provenance(session, entry),
                                                          metadata={"tags": ["provenance"]}))
    return nb


def placeholder(chapter: str, chapters_dir: Path):
    nb = nbformat.v4.new_notebook()
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {_title(chapter, chapters_dir)}"),
                nbformat.v4.new_markdown_cell(
                    "```{note}\nThis chapter has not been executed in any session yet. Run "
                    f"`python -m lab session --chapters {chapter}` (or `make book`) to execute it.\n```")]
    return nb


def publish(outputs: Path, sessions: list[dict], chapters: list[str], chapters_dir: Path | None = None) -> dict:
    """Write outputs/book/<chapter>.ipynb for every chapter; returns {chapter: session id or None}."""
    chapters_dir = Path(chapters_dir or paths.CHAPTERS)
    book = outputs / "book"
    book.mkdir(parents=True, exist_ok=True)
    chosen = {}
    for chapter in chapters:
        pick = choose(chapter, sessions)
        if pick is None:
            nb = placeholder(chapter, chapters_dir)
        else:
            session, entry = pick
            nb = annotate(nbformat.read(session["_dir"] / (entry.get("notebook") or f"{chapter}.ipynb"),
                                        as_version=4), session, entry)
        nbformat.write(nb, book / f"{chapter}.ipynb")
        chosen[chapter] = pick[0]["id"] if pick else None
    return chosen
