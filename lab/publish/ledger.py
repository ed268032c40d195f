"""The bugs and patterns pages: curated entries under outputs/ merged with what the records show.

Bugs: outputs/bugs.json holds the curated entries; records of kind "bug" (a chapter reproducing a bug,
the session runner reporting a failed chapter) merge into them by id, and every failing correctness
check that was not a deliberate failure adds an entry by itself, status "open".
Patterns: outputs/patterns.json holds each pattern with record queries as its evidence; the page
resolves each query to measured values and the sessions behind them, or says there is none yet.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import gates
from . import pages
from .pages import Markdown

# Checks that are meant to fail (n3's self-test wrong kernels, n5's kernels built with a LAB_BUG_* define)
# are evidence that the harness works, not bugs; the self-test's control must pass, so it is not exempt.
# Chapters may also mark a row "expected_fail": true.
DELIBERATE = {"impl": ["selftest: *", "*LAB_BUG*", "wrong*"], "not": {"impl": "*control*"}}
BUG_FIELDS = ("title", "symptom", "shape", "root_cause", "fix", "fix_commit", "version", "status", "source")
STATUS_ORDER = {"open": 0, "fixed": 1, "historical": 2}


IMAGE_SUFFIXES = (".png", ".svg", ".jpg", ".jpeg", ".gif")


def _read_list(path: Path) -> list[dict]:
    """A curated file (written by people, trusted): its strings are Markdown and shown as written."""
    if not path.exists():
        return []
    return [{k: Markdown(v) if isinstance(v, str) else v for k, v in entry.items()}
            for entry in json.loads(path.read_text()) if isinstance(entry, dict)]


def _figure(outputs: Path, relative: str, within: Path) -> str | None:
    """A figure path as the log page links it (relative to outputs/log), only if it is an image inside `within`."""
    target = (outputs / relative).resolve()
    try:
        target.relative_to(within.resolve())
    except ValueError:
        return None
    if target.suffix.lower() not in IMAGE_SUFFIXES or not target.is_file():
        return None
    return "../" + target.relative_to(outputs.resolve()).as_posix()


def deliberate(row: dict) -> bool:
    """A failure on purpose: a wrong build or a self-test case (the backward chapter's `bwd-selftest` rows run builds
    without Delta, named `no-delta-bwd-vNN:dq`, that must fail), which no bug entry should count."""
    check = row.get("check") or {}
    if row.get("expected_fail") or check.get("expected_fail") or row.get("expect") == "fail":
        return True
    case = row.get("case") if isinstance(row.get("case"), dict) else {}
    if str(case.get("name") or "").endswith("selftest"):
        return True
    return gates.matches(row, DELIBERATE)


def _check_bug(row: dict) -> dict:
    check = row.get("check") or {}
    case = row.get("case") if isinstance(row.get("case"), dict) else {}
    facts = [f"{k} {pages.cell(check[k])}" for k in ("max_abs", "sdpa_max_abs", "rel_l2", "nan") if k in check]
    return {"id": f"CHECK-{row.get('impl')}-{case.get('name') or pages.case_label(case)}" if isinstance(case, dict)
            else f"CHECK-{row.get('impl')}",
            "title": f"{row.get('impl')} fails the correctness check", "symptom": ", ".join(facts) or "check failed",
            "shape": pages.case_label(case), "status": "open", "source": f"failing check in {row.get('chapter')}"}


def bugs(outputs: Path, rows: list[dict]) -> list[dict]:
    """Curated entries, merged by id with bug records and failing checks; each with its sessions."""
    merged: dict[str, dict] = {}
    found = [(r, {k: r.get(k) for k in (*BUG_FIELDS, "id", "figures")}) for r in rows
             if r.get("kind") == "bug" and r.get("id") is not None]
    found += [(r, _check_bug(r)) for r in rows
              if r.get("kind") in ("check", "fwd", "decode") and isinstance(r.get("check"), dict)
              and r["check"].get("passed") is False and not deliberate(r)]
    # GPU rows are applied last: a CPU emulation's "reproduced" never overwrites a GPU "fixed"
    for row, entry in sorted(found, key=lambda pair: (pages.is_gpu(pair[0]), pair[0].get("timestamp", ""))):
        entry["id"] = str(entry["id"])
        target = merged.setdefault(entry["id"], {"id": entry["id"], "sessions": [], "figures": []})
        target.update({k: v for k, v in entry.items() if v not in (None, "", []) and k != "figures"})
        figures = entry.get("figures") if isinstance(entry.get("figures"), list) else []
        session_dir = outputs / "sessions" / row["session"]
        for fig in figures:
            link = _figure(outputs, f"sessions/{row['session']}/{fig}", session_dir)
            if link and link not in target["figures"]:
                target["figures"].append(link)
        if row["session"] not in target["sessions"]:
            target["sessions"].append(row["session"])
        target["last_chapter"] = row.get("chapter")
    for curated in _read_list(outputs / "bugs.json"):  # the curator's word wins over what rows said
        target = merged.setdefault(curated["id"], {"id": curated["id"], "sessions": [], "figures": []})
        target.update({k: v for k, v in curated.items() if k not in ("sessions", "figures") and v not in (None, "")})
        target["figures"] += [link for f in curated.get("figures", []) if (link := _figure(outputs, f, outputs))]
    return sorted(merged.values(), key=lambda b: (STATUS_ORDER.get(b.get("status"), 0), b["id"]))


def _fix(bug: dict) -> str:
    parts = [pages.text(bug.get("fix") or "")]
    if bug.get("fix_commit"):
        parts.append(f"commit `{pages.text(bug['fix_commit'])}`")
    if bug.get("version"):
        parts.append(f"version {pages.text(bug['version'])}")
    return Markdown("; ".join(p for p in parts if p) or "–")


def _fixed_in(bug: dict) -> str:
    """Short form for the summary table: where it was fixed, or the first words of the fix."""
    where = [f"`{pages.text(bug['fix_commit'])}`" if bug.get("fix_commit") else "",
             pages.text(bug.get("version") or "")]
    if any(where):
        return Markdown(" ".join(w for w in where if w))
    fix = bug.get("fix") or ""
    short = fix if len(fix) <= 60 else fix[:57].rsplit(" ", 1)[0] + " …"
    return Markdown(short) if isinstance(fix, Markdown) else short


def _sessions(ids: list[str], limit: int = 4) -> str:
    shown = [pages.session_ref(s) for s in ids[-limit:]]
    return Markdown(", ".join(shown) + (f" (+{len(ids) - limit} earlier)" if len(ids) > limit else "")
                    if ids else "–")


def bugs_page(outputs: Path, sessions: list[dict], rows: list[dict], log_dir: Path) -> str:
    entries = bugs(outputs, rows)
    known = {s["id"] for s in sessions}
    parts = ["# Bugs\n", pages.generated_note(outputs, sessions),
             "Curated entries live in `outputs/bugs.json`; chapters add entries as records of kind `bug`, and "
             "every failed chapter and every failing correctness check (other than deliberate ones) opens one "
             "by itself.\n",
             pages.table(["ID", "Title", "Status", "Fix", "Sessions"],
                         [[b["id"], b.get("title"), b.get("status", "open"), _fixed_in(b),
                           len(b["sessions"]) or "–"] for b in entries])]
    for bug in entries:
        ids = [s for s in bug["sessions"] if s in known]
        fields = [["Symptom", bug.get("symptom")], ["Reproducing shape", bug.get("shape")],
                  ["Root cause", bug.get("root_cause") or "not yet known"], ["Fix", _fix(bug)],
                  ["Status", bug.get("status", "open")], ["Source", bug.get("source")]]
        parts.append(f"## {pages.text(bug['id'])}: {pages.cell(bug.get('title'))}\n\n"
                     + pages.table(["Field", "Value"], fields) + f"\nSessions where it appeared: {_sessions(ids)}\n")
        for fig in bug["figures"]:
            parts.append(f"![{pages.text(bug['id'])}]({fig})\n")
    return "\n".join(parts)


def _summary(values: list) -> str:
    if all(isinstance(v, bool) for v in values):
        return f"{sum(values)}/{len(values)} true"
    numbers = [v for v in values if isinstance(v, (int, float))]
    if not numbers:
        return ", ".join(sorted({str(v) for v in values}))[:80]
    numbers.sort()
    median = numbers[len(numbers) // 2]
    if numbers[0] == numbers[-1]:
        return pages.fmt_number(float(median)) + (f" (all {len(numbers)})" if len(numbers) > 1 else "")
    return (f"median {pages.fmt_number(float(median))} (min {pages.fmt_number(float(numbers[0]))}, "
            f"max {pages.fmt_number(float(numbers[-1]))})")


def resolve(evidence: dict, rows: list[dict]) -> dict:
    """One evidence query -> rows found, a summary, whether it supports the practice, and sessions."""
    found = gates.select(rows, evidence.get("query", {}), evidence["metric"], evidence.get("gpu_only", False))
    if not found:
        return {"n": 0, "measured": "no evidence yet", "verdict": "–", "sessions": []}
    values = [v for _, v in found]
    verdict = "–"
    if "op" in evidence:
        ok = sum(gates.judge([v], evidence["op"], evidence.get("value")) for v in values)
        verdict = "supports" if ok == len(values) else "contradicts" if ok == 0 else f"mixed ({ok}/{len(values)})"
    sessions = sorted({r["session"] for r, _ in found}, key=lambda s: s)
    return {"n": len(values), "measured": _summary(values), "verdict": verdict, "sessions": sessions}


def patterns_page(outputs: Path, sessions: list[dict], rows: list[dict], log_dir: Path) -> str:
    entries = _read_list(outputs / "patterns.json")
    known = {s["id"] for s in sessions}
    parts = ["# Patterns\n", pages.generated_note(outputs, sessions),
             "The origin's pattern library (their patterns 1-11), each re-judged against what this lab measures, "
             "followed by patterns our own sessions revealed. *Evidence* rows are record queries resolved at "
             "generation time; *supports* means every matching measurement meets the stated bound.\n"]
    resolved = {p["id"]: [resolve(e, rows) for e in p.get("evidence", [])] for p in entries}
    summary = []
    for p in entries:
        found = [r for r in resolved[p["id"]] if r["n"]]
        summary.append([p["id"], p["name"], p.get("origin_source") or "ours", p.get("verdict"),
                        f"{len(found)}/{len(resolved[p['id']])} with data" if resolved[p["id"]] else "none declared"])
    parts.append(pages.table(["#", "Pattern", "Origin", "Verdict", "Evidence"], summary))
    for p in entries:
        parts.append(f"## {p['id']}. {p['name']}\n\n**Problem.** {p.get('problem', '–')}\n\n"
                     f"**Practice.** {p.get('practice', '–')}\n\n**Verdict.** {p.get('verdict', '–')}\n\n"
                     f"*Origin:* {p.get('origin_source') or 'ours'}\n")
        body = []
        for evidence, found in zip(p.get("evidence", []), resolved[p["id"]]):
            bound = f" ({evidence['op']} {evidence.get('value')})" if "op" in evidence else ""
            body.append([Markdown(evidence.get("label", evidence["metric"]) + bound), found["n"] or "–", found["measured"],
                         found["verdict"], _sessions([s for s in found["sessions"] if s in known], 3)])
        if body:
            parts.append(pages.table(["Evidence", "Rows", "Measured", "Judgement", "Sessions"], body))
        else:
            parts.append("No evidence declared: this pattern is judged by argument only.\n")
    if not entries:
        parts.append("No patterns file yet (`outputs/patterns.json`).\n")
    return "\n".join(parts)
