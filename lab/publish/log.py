"""`python -m lab log`: the published log and the book's chapter copies, generated from outputs/.

Writes outputs/log/{sessions,baselines,bugs,patterns}.md (+ figures/) and outputs/book/<chapter>.ipynb.
Run by the session at its end and by `make book`; it reads session folders and never writes into them,
so it can be rerun at any time with the same result.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from . import baselines, ledger, pages, paths, publish


def _gate_cells(counts: dict | None) -> str:
    counts = counts or {}
    return f"{counts.get('pass', 0)} / {counts.get('fail', 0)} / {counts.get('no data', 0)}"


def _cost(session: dict) -> str:
    cost = session.get("cost")
    if not cost:
        return "–"
    return f"${cost['cost']:.2f} ({cost['gpu_hours']:.2f} h at ${cost['price_per_gpu_hour']:.2f})"


def _chapter_counts(session: dict) -> str:
    states = [c.get("status") for c in session.get("chapters", [])]
    text = f"{states.count('ok')} ok"
    for state in ("failed", "skipped", "running", "pending"):
        if states.count(state):
            text += f", {states.count(state)} {state}"
    return text


def sessions_page(outputs: Path, sessions: list[dict]) -> str:
    parts = ["# Sessions\n", pages.generated_note(outputs, sessions),
             "One row per `python -m lab session` run, newest first. Gates are counted pass / fail / no data; "
             "a gate without data (a CPU session, a chapter that did not get that far) never counts as a pass. "
             "Cost is GPU-hours at the price given to the session, when one was given.\n"]
    newest = list(reversed(sessions))
    parts.append(pages.table(
        ["Session", "Start (UTC)", "GPU", "Mode", "Cases", "Duration", "Chapters", "Gates", "Cost"],
        [[pages.session_ref(s["id"]), pages.date(s.get("start")), (s.get("env") or {}).get("gpu"), s.get("mode"),
          s.get("cases"), pages.duration(s.get("duration_s")), _chapter_counts(s), _gate_cells(s.get("gates")),
          _cost(s)] for s in newest]) if newest else "No session has run yet: `python -m lab session`.\n")
    for s in newest:
        env = s.get("env") or {}
        facts = ", ".join(f"{k} {env[k]}" for k in ("capability", "sms", "driver", "cuda", "torch", "nvcc", "python")
                          if env.get(k))
        parts.append(f"({pages.label(s['id'])})=\n## {s['id']}\n\n"
                     f"{env.get('gpu', 'cpu')} ({s.get('mode')} mode), commit `{s.get('commit')}`, "
                     f"{pages.date(s.get('start'))} to {pages.date(s.get('end'))} UTC, status {s.get('status')}. "
                     f"Environment: {facts or 'not recorded'}.\n")
        parts.append(pages.table(["Chapter", "Status", "Duration", "Build s", "Gates", "Error"],
                                 [[c["name"], c.get("status"), pages.duration(c.get("duration_s")), c.get("build_s"),
                                   ", ".join(f"{g['status']}" for g in c.get("gates", [])) or "–", c.get("error")]
                                  for c in s.get("chapters", [])]))
        gates = [g for c in s.get("chapters", []) for g in c.get("gates", [])]
        if gates:
            parts.append(pages.table(["Chapter", "Gate", "Status", "Measured", "Expected", "Rows"],
                                     [[g["chapter"], g["name"], g["status"], g.get("measured"),
                                       f"{g['op']} {g.get('expected')}", g.get("rows")] for g in gates]))
        for c in s.get("chapters", []):
            if c.get("traceback"):
                parts.append(f"Traceback of {c['name']} (shortened):\n\n````text\n{c['traceback']}\n````\n")
    return "\n".join(parts)


def generate(outputs: Path | None = None, chapters: list[str] | None = None,
             chapters_dir: Path | None = None) -> dict:
    """Write every log page and every chapter copy; returns {page or chapter: path or chosen session}."""
    from .session import CHAPTERS

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
    }
    names = list(chapters or CHAPTERS)
    names += sorted({c["name"] for s in sessions for c in s.get("chapters", [])
                     if c.get("status") in ("ok", "failed")} - set(names))
    written["chapters"] = publish.publish(outputs, sessions, names, chapters_dir)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab log", description=__doc__.split("\n")[0])
    parser.add_argument("--outputs", type=Path, help="outputs root (default: $LAB_OUTPUTS or outputs/)")
    parser.add_argument("--chapters-dir", type=Path, help="where the source notebooks are (for titles)")
    args = parser.parse_args(argv)
    written = generate(args.outputs, chapters_dir=args.chapters_dir)
    for name in ("sessions", "baselines", "bugs", "patterns"):
        print(f"wrote {paths.relative(written[name])}")
    for chapter, session in written["chapters"].items():
        print(f"book/{chapter}.ipynb <- {session or 'placeholder (never run)'}")
    return 0
