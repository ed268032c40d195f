"""`python -m lab log`: the published log and the book's chapter copies, generated from outputs/.

Writes outputs/log/{sessions,baselines,bugs,patterns,experiments}.md (+ figures/), outputs/log/standings.md (included
by the front page) and outputs/book/<chapter>.ipynb. Run by the session at its end and by `make book`; it
reads session folders and never writes into them, so it can be rerun at any time with the same result.
A torn or crafted session is skipped with a warning; the pages are built from the sessions that are whole.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .. import paths, toc
from . import baselines, chapters, experiments, ledger, pages, prune, standings
from .pages import Markdown


def _gate_cells(counts) -> str:
    counts = counts if isinstance(counts, dict) else {}
    text = f"{counts.get('pass', 0)} / {counts.get('fail', 0)} / {counts.get('no data', 0)}"
    return text + (f" ({counts['void']} void)" if counts.get("void") else "")


def _cost(session: dict) -> str:
    cost = session.get("cost")
    try:
        return Markdown(f"${cost['cost']:.2f} ({cost['gpu_hours']:.2f} h at ${cost['price_per_gpu_hour']:.2f})")
    except (TypeError, KeyError, ValueError):
        return "–"


def _chapter_counts(session: dict) -> str:
    states = [c.get("status") for c in session.get("chapters", [])]
    text = f"{states.count('ok')} ok"
    for state in ("failed", "skipped", "running", "pending", "abandoned"):
        if states.count(state):
            text += f", {states.count(state)} {state}"
    return text


def sessions_page(outputs: Path, sessions: list[dict]) -> str:
    parts = ["# Sessions\n", pages.generated_note(outputs, sessions),
             "One row per `python -m lab session` run, newest first. Gates are counted pass / fail / no data; "
             "a gate without data (a CPU session, a chapter that did not get that far) never counts as a pass, "
             "and the gates of a chapter that failed are *void*. A session marked *abandoned* was left "
             "\"running\" by a runner that was killed. "
             "Cost is GPU-hours at the price given to the session, when one was given. Every session's records "
             "stay in the tree; its executed notebooks and figures stay only while the book publishes it or a "
             "chapter, README or log page cites it (`python -m lab prune`), and *Copies* names the commit that "
             "still has them otherwise.\n"]
    newest = list(reversed(sessions))
    parts.append(pages.table(
        ["Session", "Start (UTC)", "GPU", "Mode", "Cases", "Status", "Duration", "Chapters", "Gates", "Cost",
         "Copies"],
        [[pages.session_ref(s["id"]), pages.date(s.get("start")), (s.get("env") or {}).get("gpu"), s.get("mode"),
          s.get("cases"), s.get("status"), pages.duration(s.get("duration_s")), _chapter_counts(s),
          _gate_cells(s.get("gates")), _cost(s), prune.where(s)] for s in newest]) if newest else "No session has run yet: `python -m lab session`.\n")
    for s in newest:
        env = s.get("env") or {}
        facts = ", ".join(f"{k} {env[k]}" for k in ("capability", "sms", "driver", "cuda", "torch", "nvcc", "python")
                          if env.get(k))
        parts.append(f"({pages.label(s['id'])})=\n## {s['id']}\n\n"
                     f"{pages.text(env.get('gpu', 'cpu'))} ({pages.text(s.get('mode'))} mode), commit "
                     f"{pages.text(s.get('commit'))}, {pages.date(s.get('start'))} to {pages.date(s.get('end'))} UTC, "
                     f"status {pages.text(s.get('status'))}. Environment: {pages.text(facts or 'not recorded')}.\n")
        if (restore := prune.restore_note(s)) is not None:
            parts.append(restore)
        if s.get("error"):
            parts.append(f"The runner stopped on an error: {pages.text(s['error'])}\n")
        parts.append(pages.table(["Chapter", "Status", "Duration", "Build s", "Gates", "Error"],
                                 [[c.get("name"), c.get("status"), pages.duration(c.get("duration_s")),
                                   c.get("build_s"), ", ".join(str(g.get("status")) for g in _gates(c)) or "–",
                                   c.get("error")] for c in s.get("chapters", [])]))
        gates = [g for c in s.get("chapters", []) for g in _gates(c)]
        if gates:
            parts.append(pages.table(["Chapter", "Gate", "Status", "Measured", "Expected", "Rows"],
                                     [[g.get("chapter"), g.get("name"), g.get("status"), g.get("measured"),
                                       f"{g.get('op')} {g.get('expected')}", g.get("rows")] for g in gates]))
        for c in s.get("chapters", []):
            if c.get("traceback"):
                parts.append(f"Traceback of {pages.text(c.get('name'))} (shortened):\n\n"
                             + pages.fence(str(c["traceback"])))
        if s.get("traceback"):
            parts.append("Traceback of the runner (shortened):\n\n" + pages.fence(str(s["traceback"])))
    return "\n".join(parts)


def _gates(entry: dict) -> list[dict]:
    return [g for g in entry.get("gates") or [] if isinstance(g, dict)]


def generate(outputs: Path | None = None, chapters_list: list[str] | None = None,
             chapters_dir: Path | None = None) -> dict:
    """Write every log page and every chapter copy; returns {page or chapter: path or chosen session}.

    The chapters published are the book's (_toc.yml) or `chapters_list`; a chapter name read from a
    session.json is never used for a path."""
    outputs = Path(outputs or paths.OUTPUTS)
    paths.setup_cache_env()
    log_dir = outputs / "log"
    sessions = pages.load_sessions(outputs)
    rows = pages.load_rows(outputs)
    written = {
        "sessions": pages.write_page(log_dir / "sessions.md", sessions_page(outputs, sessions)),
        "baselines": pages.write_page(log_dir / "baselines.md", baselines.page(outputs, sessions, rows, log_dir)),
        "bugs": pages.write_page(log_dir / "bugs.md", ledger.bugs_page(outputs, sessions, rows, log_dir)),
        "patterns": pages.write_page(log_dir / "patterns.md", ledger.patterns_page(outputs, sessions, rows, log_dir)),
        "experiments": pages.write_page(log_dir / "experiments.md", experiments.page(outputs)),
        "standings": pages.write_page(log_dir / "standings.md", standings.include(rows)),
    }
    known = list(chapters_list or toc.chapters())
    unknown = sorted({str(c.get("name")) for s in sessions for c in s.get("chapters", [])} - set(known))
    if unknown:
        pages.warn(f"chapters in session.json files but not in _toc.yml, not published: {', '.join(unknown)}")
    written["chapters"] = chapters.publish(outputs, sessions, known, chapters_dir)
    return written


def latest_summary(outputs: Path | None = None) -> str:
    """One line on the newest session: its status and the chapters that failed (printed by `make book`)."""
    sessions = pages.load_sessions(Path(outputs or paths.OUTPUTS))
    if not sessions:
        return "no session has run yet"
    last = sessions[-1]
    failed = [str(c.get("name")) for c in last["chapters"] if c.get("status") in ("failed", "abandoned")]
    return (f"latest session {last['id']}: {last.get('status')}"
            + (f"; failed chapters: {', '.join(failed)}" if failed else "; no chapter failed"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab log", description=__doc__.split("\n")[0])
    parser.add_argument("--outputs", type=Path, help="outputs root (default: $LAB_OUTPUTS or outputs/)")
    parser.add_argument("--chapters-dir", type=Path, help="where the source notebooks are (for titles)")
    parser.add_argument("--summary", action="store_true",
                        help="only print the latest session's status and failed chapters")
    args = parser.parse_args(argv)
    if args.summary:
        print(latest_summary(args.outputs))
        return 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            written = generate(args.outputs, chapters_dir=args.chapters_dir)
        except OSError as err:  # a full disk or a read-only outputs/: say which path, no traceback
            print(f"log generation failed: {err}", file=sys.stderr)
            return 1
        finally:
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr)
    for name in ("sessions", "baselines", "bugs", "patterns", "experiments", "standings"):
        print(f"wrote {paths.relative(written[name])}")
    for chapter, session in written["chapters"].items():
        print(f"book/{chapter}.ipynb <- {session or 'placeholder (never run)'}")
    return 0
