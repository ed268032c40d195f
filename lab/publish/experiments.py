"""The Experiments page: every record under outputs/experiments/, one section per family, newest first.

Each record shows what was expected (hypothesis, prediction), what was measured (a cell, value, spread table), what was
decided, its outcome and its evidence. A negative result is shown like any other, with its badge: it is the page's
reason to exist. Records are files of the lab's own tree, but their text is still escaped (pages.text), so no
record can break the book; a record that does not follow the schema is skipped with a warning that names the field.
"""
from __future__ import annotations

import re
from pathlib import Path

from .. import experiments
from . import pages
from .pages import Markdown

FAMILY_TITLES = {"fwd": "Forward", "bwd": "Backward", "decode": "Decode", "paged": "Paged decode", "masks": "Masks",
                 "head_dims": "Head dims", "ring": "Ring attention", "build": "Build", "harness": "Harness"}
BADGES = {"positive": "✓ positive", "negative": "✗ negative", "mixed": "± mixed", "inconclusive": "? inconclusive"}


def badge(outcome: str) -> Markdown:
    return Markdown(f"**{pages.text(BADGES.get(outcome, outcome))}**")


def label(record_id: str) -> str:
    return f"experiment-{record_id}"


def _link(outputs: Path, path: str) -> Markdown:
    """An evidence path as a link: a session folder to its section on the Sessions page, a file as a download
    (relative to outputs/log/); anything else (a folder, a missing path) as plain text."""
    rest = path.split("/", 1)[-1]
    target = (outputs / rest).resolve()
    try:
        target.relative_to(outputs.resolve())
    except ValueError:
        return Markdown(pages.text(path) + " (outside outputs/)")
    session = re.fullmatch(r"sessions/([^/]+)/?", rest)
    if session and pages.SESSION_ID.match(session.group(1)) and (target / "session.json").is_file():
        return pages.session_ref(session.group(1))  # its section on the Sessions page
    if not target.is_file():
        if not target.exists():
            pages.warn(f"experiment evidence {path} not found")
        return Markdown(pages.text(path) + ("" if target.exists() else " (not found)"))
    if re.search(r"[`<>\\]", rest):  # cannot be written inside a role: shown, not linked
        return Markdown(pages.text(path))
    return Markdown(f"{{download}}`{rest} <../{rest}>`")


def _spread(cell: dict) -> str:
    spread = cell.get("spread")
    return f"{pages.fmt_number(float(spread[0]))} – {pages.fmt_number(float(spread[1]))}" if spread else "–"


def summary(records: list[dict]) -> str:
    """Count per family and outcome (families with no record are left out)."""
    rows = []
    for family in experiments.FAMILIES:
        mine = [r["outcome"] for r in records if r["family"] == family]
        if mine:
            rows.append([Markdown(f"{{ref}}`{FAMILY_TITLES[family]} <experiments-{family}>`"),
                         *[mine.count(o) or "–" for o in experiments.OUTCOMES], len(mine)])
    rows.append([Markdown("**All**"), *[sum(r["outcome"] == o for r in records) or "–" for o in experiments.OUTCOMES],
                 len(records)])
    return pages.table(["Family", *experiments.OUTCOMES, "Records"], rows)


def section(outputs: Path, record: dict) -> str:
    m = record["measurement"]
    facts = [pages.text(record["date"]), pages.text(record["gpu"]),
             f"commit {pages.text(record['commit'])}" if record.get("commit") else "commit not recorded",
             f"record {pages.text(record['id'])}.json"]
    if record.get("notebook"):
        facts.append(f"notebook {pages.text(record['notebook'])}")
    parts = [f"({label(record['id'])})=\n### {pages.text(record['title'])}\n",
             f"{badge(record['outcome'])} · " + " · ".join(facts) + "\n",
             f"**Hypothesis.** {pages.text(record['hypothesis'])}\n",
             f"**Prediction.** {pages.text(record['prediction'])}\n",
             f"**Measurement:** {pages.text(m['metric'])}" + (f" ({pages.text(m['unit'])})" if m["unit"] else "")
             + ".\n"]
    if m["cells"]:
        unit = f" ({m['unit']})" if m["unit"] else ""
        parts.append(pages.table(["Cell", f"Value{unit}", f"Spread{unit}", "n"],
                                 [[c["cell"], float(c["value"]), _spread(c), c.get("n")] for c in m["cells"]]))
    else:
        parts.append("No measured cells.\n")
    if m.get("summary"):
        parts.append(f"{pages.text(m['summary'])}\n")
    parts.append(f"**Decision.** {pages.text(record['decision'])}\n")
    evidence = [_link(outputs, p) for p in record["evidence"]]
    parts.append("**Evidence:** " + (", ".join(evidence) if evidence else "none kept") + "\n")
    if record.get("notes"):
        parts.append(f"**Notes.** {pages.text(record['notes'])}\n")
    return "\n".join(parts)


def page(outputs: Path) -> str:
    records = experiments.load(outputs, on_error=lambda message: pages.warn(f"{message}; skipped"))
    parts = ["# Experiments\n",
             Markdown(f"*Generated by `python -m lab log` from {len(records)} record(s) under `outputs/experiments/`; "
                      f"edit or add the records, not this page.*\n"),
             "Every A/B, probe and negative result of the lab is a record: what was expected (hypothesis, "
             "prediction), what was measured, what was decided, and the evidence. A new experiment is a new file "
             "(`python -m lab experiment x_ab -p ...` writes one); a negative result stays on this page like a "
             "positive one. Spread is the interquartile range of the samples unless the measurement says otherwise.\n"]
    if not records:
        parts.append("No experiment has been recorded yet.\n")
        return "\n".join(parts)
    parts.append(summary(records))
    for family in experiments.FAMILIES:
        mine = sorted((r for r in records if r["family"] == family), key=lambda r: (r["date"], r["id"]), reverse=True)
        if mine:
            parts.append(f"(experiments-{family})=\n## {FAMILY_TITLES[family]}\n")
            parts += [section(outputs, r) for r in mine]
    return "\n".join(parts)
