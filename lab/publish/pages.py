"""What every log page needs: the sessions and their records read from outputs/, and MyST helpers.

Pages are generated, never edited by hand: everything a page states comes from a session folder,
a record, or a curated data file under outputs/ (bugs.json, patterns.json).

Session folders are untrusted input: a session.json may be torn, crafted or left "running" by a killed
runner. So a session's id is its folder's name (never the file's "id" field), every string from a record
or a traceback is escaped before it reaches a page (`text`, `fence`), and only `Markdown` values, which
this package builds itself or reads from the curated files, are written as they are.
"""
from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
import re
import socket
import warnings
from pathlib import Path

from .. import files, record
from ..liveness import HEARTBEAT_FILE, HEARTBEAT_S

SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STALE_S = max(15 * 60, 10 * HEARTBEAT_S)  # no heartbeat for this long: the runner is gone
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*{}\[\]|$~])")


class LogWarning(UserWarning):
    """Something under outputs/ was skipped while generating the log (torn, crafted or unreadable)."""


class Markdown(str):
    """Markup this package made (or a curator wrote): written to a page as it is."""


def warn(message: str) -> None:
    warnings.warn(message, LogWarning, stacklevel=2)


def text(value) -> str:
    """Untrusted text as inline Markdown that shows literally: no HTML, roles, links, code or table breaks."""
    if isinstance(value, Markdown):
        return str(value).replace("\n", " ")
    plain = _ANSI.sub("", str(value)).replace("\r", "").replace("\n", " ")
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(plain, quote=False))


def fence(body: str, language: str = "text") -> str:
    """A code block that no content can close: the fence is longer than any backtick run inside."""
    body = _ANSI.sub("", str(body)).rstrip("\n")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(4, longest + 1)
    return f"{ticks}{language}\n{body}\n{ticks}\n"


def _alive(info: dict, folder: Path) -> bool:
    """Whether the runner of a session marked "running" may still be at work."""
    pid, host = info.get("pid"), info.get("host")
    if isinstance(pid, int) and host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by someone else
    beat = folder / HEARTBEAT_FILE
    try:
        last = dt.datetime.fromisoformat(beat.read_text().strip())
    except (OSError, ValueError):
        last = None
    if last is None:
        try:
            last = dt.datetime.fromisoformat(info.get("start") or "")
        except ValueError:
            return False
    if last.tzinfo is None:
        last = last.replace(tzinfo=dt.timezone.utc)
    return (dt.datetime.now(dt.timezone.utc) - last).total_seconds() < STALE_S


def load_sessions(outputs: Path) -> list[dict]:
    """Every session.json under outputs/sessions, oldest first; a torn or crafted one is skipped with a warning.

    A session still marked "running" whose runner is gone (dead pid on this host, or a stale heartbeat)
    is shown as "abandoned"."""
    found = []
    for file in (outputs / "sessions").glob("*/session.json"):
        folder = file.parent
        if not SESSION_ID.match(folder.name):
            warn(f"{folder}: not a session folder name; skipped")
            continue
        try:
            info = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            warn(f"{file}: unreadable session.json skipped ({type(err).__name__}: {err})")
            continue
        if not isinstance(info, dict):
            warn(f"{file}: session.json is not an object; skipped")
            continue
        info["id"] = folder.name  # the folder names the session; a crafted "id" names nothing
        info["_dir"] = folder
        if not isinstance(info.get("chapters"), list):
            info["chapters"] = []
        info["chapters"] = [c for c in info["chapters"] if isinstance(c, dict)]
        if not isinstance(info.get("env"), dict):
            info["env"] = {}
        if info.get("status") == "running" and not _alive(info, folder):
            info["status"] = "abandoned"
            for entry in info["chapters"]:
                if entry.get("status") in ("running", "pending"):
                    entry["status"] = "abandoned"
        found.append(info)
    return sorted(found, key=lambda s: (str(s.get("start") or ""), s["id"]))


def load_rows(outputs: Path) -> list[dict]:
    """Records of published sessions only: ad-hoc chapter runs are drafts, not evidence."""
    rows = []
    for folder in record.folders(outputs / "sessions", depth="*"):  # records.jsonl and records.jsonl.gz
        if not SESSION_ID.match(folder.name):
            continue
        for row in record.session_rows(folder):
            row["session"] = folder.name  # a row belongs to the folder it is in
            rows.append(row)
    return rows


def is_gpu(row_or_session: dict) -> bool:
    if "mode" in row_or_session:
        return row_or_session["mode"] == "gpu"
    return (row_or_session.get("env") or {}).get("gpu", "cpu") != "cpu"


def session_ref(session_id: str) -> Markdown:
    """A cross-reference to the session's section on the sessions page (ids are folder names)."""
    if not SESSION_ID.match(str(session_id)):
        return Markdown(text(session_id))
    return Markdown(f"{{ref}}`{session_id} <session-{session_id}>`")


def label(session_id: str) -> str:
    return f"session-{session_id}"


def cell(value) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else fmt_number(value)
    if isinstance(value, Markdown):
        return str(value).replace("\n", " ").replace("|", "\\|")
    return text(value)


def fmt_number(value: float) -> str:
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def table(header: list[str], rows: list[list]) -> str:
    """The one Markdown table renderer (chapters' lab.publish.tables.Table uses it too)."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def date(iso: str | None) -> str:
    if not iso:
        return "–"
    try:
        return dt.datetime.fromisoformat(str(iso)).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return text(iso)


def duration(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "–"
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def case_label(case: dict | None) -> str:
    """'seq8k: B2 H16/16 S8192 D128 causal' — the name plus the shape that reproduces it."""
    if not isinstance(case, dict) or not case:
        return "–"
    shape = []
    if case.get("B") is not None:
        shape.append(f"B{case['B']}")
    if case.get("Hq") is not None:
        shape.append(f"H{case['Hq']}/{case.get('Hkv', case['Hq'])}")
    if case.get("kv_len") is not None:
        shape.append(f"q{case.get('q_len', 1)} kv{case['kv_len']}")
    elif case.get("Sq") is not None:
        shape.append(f"S{case['Sq']}" if case.get("Sq") == case.get("Sk") else f"Sq{case['Sq']} Sk{case.get('Sk')}")
    if case.get("D") is not None:
        shape.append(f"D{case['D']}")
    if case.get("dtype"):
        shape.append(str(case["dtype"]))
    if case.get("causal"):
        shape.append("causal")
    label_text = " ".join(shape)
    return f"{case['name']}: {label_text}" if case.get("name") else label_text or "–"


def write_page(path: Path, body: str) -> Path:
    return files.write_atomic(path, body.rstrip() + "\n")


def generated_note(outputs: Path, sessions: list[dict]) -> Markdown:
    return Markdown(f"*Generated by `python -m lab log` from {len(sessions)} session folder(s) under "
                    f"`outputs/sessions/`; edit the records or the data files, not this page.*\n")
