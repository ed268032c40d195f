"""The tree budget: which sessions keep their executed copies, and `python -m lab prune` for the others.

A session folder holds two kinds of files. Its evidence (records.jsonl or records.jsonl.gz, session.json,
ceilings.json, pruned.json once pruned, and notes *.md) is small, append-only and always stays. Its executed
copies (the notebooks with embedded figures, figures/, ncu reports) weigh 0.2-6 MB a session, and every copy
of the checkout to a GPU machine carries them. Notebooks and figures stay only for the sessions the book publishes:

- per chapter and GPU, the session whose copy the book shows or would show (`chapters.choose` over that
  GPU's sessions), and the overall choice when no GPU ever ran the chapter;
- any session that a chapter, the front page (README.md and the other top-level *.md) or the curated log data
  (outputs/bugs.json, outputs/patterns.json) cites by its folder name, by its `YYYYmmdd-HHMMSS` stamp, or by the
  `…HHMMSS…` short form the README uses.

A session cited by a kernel README (kernels/**/README.md) keeps no executed copy: the numbers such a citation
stands for are in the records, which stay. When those READMEs still held each step's numbers, 37 sessions cited
only there held 14.6 MB of notebooks and figures, more than a third of the budget.

Nsight Compute reports (.ncu-rep, 0.3-2.5 MB each) leave the tree in every session: the book never shows
them (the executed notebook has the charts, the records have the metrics), and one n8 session's four
reports alone weigh 6 MB.

A superseded session's records stay in the tree as records.jsonl.gz: every row, a tenth of the bytes
(lab.record reads both forms). Only the sessions the book publishes keep plain records.jsonl, and only up to
PLAIN_MAX_BYTES: a session a document cites keeps its executed copies but gzips its records too (the plain records
of the cited sessions outweighed every other part of the tree).

Git history keeps everything pruned. Pruning writes <session>/pruned.json with the last commit whose
tree has the files, and the sessions page names it with the command that restores them.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

from .. import files, paths, record, toc
from . import chapters, pages

BUDGET_BYTES = 40_000_000  # the tracked tree; a checkout travels to a GPU machine on every call
EVIDENCE = frozenset({record.RECORDS, record.RECORDS_GZ, "session.json", "ceilings.json", "pruned.json"})
PRUNED = "pruned.json"
DOCUMENTS = ("*.md", "chapters/*.ipynb", "outputs/bugs.json", "outputs/patterns.json")  # citations that keep copies
NEVER_KEPT = (".ncu-rep",)  # suffixes that leave the tree even in a published session
# A published session keeps plain records up to this size; above it (the backward chapter's 1800 gradient checks
# write 2 MB; the head-dim and paged chapters 0.3-0.5 MB each) they are gzipped too, as every reader takes both
# forms. At 1 MB the published sessions' plain records held 3 MB of the tree's 40.
PLAIN_MAX_BYTES = 250_000
_STAMP = re.compile(r"(?<![0-9])(\d{8}-\d{6})(?![0-9])")
_SHORT = re.compile(r"…(\d{6})(?:…|-)")  # README's `…211951…` / `…220156-h100-…` forms


def copies(folder: Path) -> list[Path]:
    """The executed copies in a session folder, sorted: every file but the evidence and the notes (*.md,
    which say where files removed earlier went)."""
    return sorted(p for p in Path(folder).rglob("*") if p.is_file() and p.suffix != ".md"
                  and not (p.parent == Path(folder) and p.name in EVIDENCE))


def cited(root: Path, session_ids: list[str]) -> set[str]:
    """Sessions a document names: by full folder name, by its date-time stamp, or by the short time form."""
    texts = []
    for pattern in DOCUMENTS:
        for path in sorted(Path(root).glob(pattern)):
            try:
                texts.append(path.read_text(errors="replace"))
            except OSError:
                continue
    text = "\n".join(texts)
    stamps = set(_STAMP.findall(text))
    shorts = set(_SHORT.findall(text))
    found = set()
    for sid in session_ids:
        stamp = sid[:15]
        if sid in text or stamp in stamps or stamp[9:] in shorts:
            found.add(sid)
    return found


def published(sessions: list[dict], chapter_names: list[str], chapters_dir: Path) -> set[str]:
    """Per chapter and GPU, the session whose executed copy the book shows (or would, on that GPU)."""
    groups: dict[str, list[dict]] = {}
    for s in sessions:
        if s.get("mode") == "gpu":
            groups.setdefault(str((s.get("env") or {}).get("gpu")), []).append(s)
    keep = set()
    for chapter in chapter_names:
        need = chapters.min_gpus(chapter, chapters_dir)
        for group in [*groups.values(), sessions]:
            pick = chapters.choose(chapter, group, need)
            if pick is not None:
                keep.add(pick[0]["id"])
    return keep


def plan(root: Path | None = None, outputs: Path | None = None
         ) -> tuple[set[str], dict[str, list[Path]], set[str]]:
    """(sessions whose notebooks and figures stay, {session to prune: the files that leave the tree},
    sessions the book does not publish whose plain records.jsonl becomes records.jsonl.gz)."""
    root = Path(root or paths.ROOT)
    outputs = Path(outputs or root / "outputs")
    sessions = pages.load_sessions(outputs)
    shown = published(sessions, toc.chapters(root / "_toc.yml"), root / "chapters")
    keep = shown | cited(root, [s["id"] for s in sessions])
    drop = {}
    for s in sessions:
        found = [p for p in copies(s["_dir"]) if s["id"] not in keep or p.name.endswith(NEVER_KEPT)]
        if found:
            drop[s["id"]] = found
    # a session still at work may append more rows: its records stay plain until it ends
    squeeze = {s["id"] for s in sessions if s.get("status") != "running" and (s["_dir"] / record.RECORDS).is_file()
               and (s["id"] not in shown or (s["_dir"] / record.RECORDS).stat().st_size > PLAIN_MAX_BYTES)}
    return keep, drop, squeeze


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def _committed(root: Path, found: list[Path]) -> list[str]:
    """Their paths relative to root; refuses files with uncommitted changes (history must have what leaves)."""
    names = [str(p.relative_to(root)) for p in found]
    if _git(root, "status", "--porcelain", "--", *names).strip():
        raise RuntimeError(f"{found[0].parent}: uncommitted changes; commit the session before pruning it")
    return names


def last_commit(root: Path, found: list[Path]) -> str:
    """The last commit whose tree has these files as they are now; refuses uncommitted ones."""
    names = _committed(root, found)
    commit = _git(root, "log", "-1", "--format=%H", "--", *names).strip()
    if not commit:
        raise RuntimeError(f"{found[0].parent}: not in git history; commit the session before pruning it")
    return commit


def prune(root: Path | None = None, outputs: Path | None = None, dry_run: bool = False) -> dict[str, dict]:
    """Remove the executed copies of every session outside the kept set and gzip the records of the
    superseded ones; returns {session: what was done}, which pruned.json keeps once files left the tree."""
    root = Path(root or paths.ROOT)
    outputs = Path(outputs or root / "outputs")
    keep, drop, squeeze = plan(root, outputs)
    done = {}
    for sid in sorted(set(drop) | squeeze):
        folder = outputs / "sessions" / sid
        found = drop.get(sid, [])
        note = _copies_note(root, folder, found, sid in keep) if found else {"files": [], "bytes": 0}
        if sid in squeeze:
            _committed(root, [folder / record.RECORDS])  # changed since its commit: maybe still being written
            note["records"] = _records_note(folder)
        done[sid] = note
        if not dry_run:
            _apply(folder, found, note)
    return done


def _copies_note(root: Path, folder: Path, found: list[Path], kept: bool) -> dict:
    return {"commit": last_commit(root, found), "files": [p.relative_to(folder).as_posix() for p in found],
            "bytes": sum(p.stat().st_size for p in found),
            "why": ("Nsight Compute reports: the book shows their charts and the records their metrics"
                    if kept else "superseded: the book publishes a later session of these chapters "
                    "on this GPU, and no chapter, README or log page cites this one")}


def _records_note(folder: Path) -> dict:
    before = sum((folder / n).stat().st_size for n in record.READ_ORDER if (folder / n).is_file())
    return {"file": record.RECORDS_GZ, "bytes": before, "gzip_bytes": len(record.compressed(folder)),
            "how": "every row, gzipped; lab.record reads records.jsonl.gz as it reads records.jsonl"}


def _apply(folder: Path, found: list[Path], note: dict) -> None:
    """Write pruned.json, then remove the copies and gzip the records: a failure midway leaves the note."""
    old = _read_note(folder)  # a session pruned twice keeps the first commit, which has the most files
    if old:
        note = {**old, **note, "commit": old["commit"], "files": sorted(set(old["files"]) | set(note["files"])),
                "bytes": old.get("bytes", 0) + note["bytes"]}
    if old or found:  # gzipped records alone need no note: nothing left the tree, no commit to name
        files.write_atomic(folder / PRUNED, json.dumps(note, indent=1) + "\n")
    for path in found:
        path.unlink()
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(sub.iterdir()):
            sub.rmdir()
    if "records" in note:
        record.compress(folder)


def _read_note(folder: Path) -> dict | None:
    try:
        note = json.loads((Path(folder) / PRUNED).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(note, dict) and isinstance(note.get("commit"), str) and isinstance(note.get("files"), list)
    return note if ok else None


def _note(session: dict) -> dict | None:
    note = _read_note(session["_dir"])
    return note if note and re.fullmatch(r"[0-9a-f]{7,40}", note["commit"]) else None


def where(session: dict) -> str:
    """For the sessions page: where this session's executed copies are (the tree, a commit, or both)."""
    note, here = _note(session), copies(session["_dir"])
    parts = ([f"{len(here)} in the tree"] if here else []) + (
        [f"{len(note['files'])} at commit `{note['commit'][:10]}`"] if note else [])
    return pages.Markdown("; ".join(parts) or "–")


def restore_note(session: dict) -> str | None:
    """A paragraph that says how to get a session's pruned files back, or None when nothing was pruned."""
    note = _note(session)
    if note is None:
        return None
    shown = ", ".join(note["files"][:4]) + (", …" if len(note["files"]) > 4 else "")
    return (f"{len(note['files'])} of its files ({pages.text(shown)}) left the tree to keep it under its budget "
            f"({pages.text(note.get('why', ''))}); commit `{note['commit'][:10]}` has them: "
            f"`git checkout {note['commit'][:10]} -- outputs/sessions/{session['id']}`.\n")


def tracked_bytes(root: Path | None = None) -> int:
    """Bytes of every file git tracks in the checkout (what a copy of the checkout carries)."""
    root = Path(root or paths.ROOT)
    names = _git(root, "ls-files", "-z").split("\0")
    return sum((root / n).stat().st_size for n in names if n and (root / n).is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab prune", description=__doc__.split("\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="list what would leave the tree or be gzipped; change nothing")
    args = parser.parse_args(argv)
    try:
        done = prune(dry_run=args.dry_run)
    except (RuntimeError, subprocess.CalledProcessError, OSError) as err:
        print(f"prune: {err}", file=sys.stderr)
        return 1
    for sid, note in done.items():
        print(f"{'would prune' if args.dry_run else 'pruned'} {sid}: {_summary(note)}")
    if not done:
        print("nothing to prune: every session with executed copies or plain records is published or cited")
    elif not args.dry_run:
        print("commit the removal: git add -A outputs/sessions && git commit")
    size = tracked_bytes()
    print(f"tracked tree: {size / 1e6:.1f} MB (budget {BUDGET_BYTES / 1e6:.0f} MB)")
    if args.dry_run and done:
        print(f"tracked tree after pruning: {(size - saved(done)) / 1e6:.1f} MB")
    return 0


def _summary(note: dict) -> str:
    parts = []
    if note["files"]:
        parts.append(f"{len(note['files'])} files, {note['bytes'] / 1e6:.1f} MB "
                     f"(commit {note['commit'][:10]} has them)")
    if "records" in note:
        packed = note["records"]
        parts.append(f"records {packed['bytes'] / 1e6:.2f} MB -> {packed['gzip_bytes'] / 1e6:.2f} MB "
                     f"as {packed['file']}")
    return "; ".join(parts)


def saved(done: dict[str, dict]) -> int:
    """Bytes a prune takes out of the tree: the copies removed, and what gzip saves on the records."""
    total = 0
    for note in done.values():
        total += note["bytes"]
        if "records" in note:
            total += note["records"]["bytes"] - note["records"]["gzip_bytes"]
    return total
