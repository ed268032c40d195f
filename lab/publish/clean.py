"""What a reader sees of an executed chapter: the published copy's outputs, cleaned (the session's own notebook
keeps every byte but its machine paths).

- progress bars (tqdm's carriage-return fragments on stderr), Python warnings and torch's log lines are dropped;
  any other stderr text stays;
- consecutive stream outputs of one cell are merged, so a cell that printed line by line reads as one block;
- absolute machine paths become paths a reader can use: inside the checkout, relative to it
  (`/work/main/lab/bench.py` -> `lab/bench.py`); inside an environment, from `site-packages/`; a temporary
  folder as `${TMPDIR:-/tmp}/...` (a shell command stays runnable); a home folder as `~/...`;
- a long or wide text output, and a long Markdown table, shows its first rows; the whole of it follows in a
  collapsed `<details>` block.

A session folder itself is committed as the run left it, but for its machine paths: `scrub_folder` rewrites them
in every text file the runner and the chapters wrote (notebooks, records, session.json, logs), so a GPU session
can be committed as it comes back.
"""
from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from .. import files, paths, record

HEAD_LINES = 15  # rows shown before the collapsed block
MAX_LINES = 40  # a text output or Markdown table longer than this is collapsed
MAX_COLUMNS = 10  # a Markdown table with more columns shows its first ten
MAX_WIDTH = 160  # characters; a text output with a wider line is collapsed, its first rows cut at this width

# the checkout's top-level folders: a path through one of them is shown from there
_CHECKOUT = ("lab", "kernels", "chapters", "outputs", "tests", "tools", ".venv", ".cache")
_ROOTS = ("root", "home", "tmp", "work", "opt", "mnt", "scratch", "data")


def path_pattern(roots=_ROOTS) -> re.Pattern:
    """An absolute path under one of the top-level folders `roots`, up to the first character no path here holds."""
    alternation = "|".join(re.escape(root) for root in dict.fromkeys(roots))
    return re.compile(rf"(?<![\w.~$}}/-])/(?:{alternation})(?=/)" r"[^\s'\"`,;:()\[\]{}<>|*]*")


def _running_roots() -> tuple[str, ...]:
    """The top-level folders of this checkout and of the temporary folder: a checkout cloned under a folder of its
    own (`/check/work/main`, `/srv/ci/lab`) writes its paths into the notebooks it runs like any other."""
    found = []
    for folder in (paths.ROOT.resolve(), Path(tempfile.gettempdir()).resolve()):
        if len(folder.parts) > 1:
            found.append(folder.parts[1])
    return tuple(found)


_PATH = path_pattern((*_ROOTS, *_running_roots()))
_TQDM = re.compile(r"^\s*[^|\n]*:?\s*\d{1,3}%\|")  # 'fwd sweep:  56%|█████▋    | 9/16 [...]'
_WARNING = re.compile(r"^\S.*:\d+: \w*Warning: ")  # path:line: UserWarning: message (its source line follows)
_GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ ")  # torch's C++ / dynamo log lines
_BINARY = ("image/", "application/pdf")


def machine_path(match: re.Match) -> str:
    path = match.group(0)
    parts = path.split("/")
    if "site-packages" in parts:
        return "/".join(parts[parts.index("site-packages"):])
    for i, part in enumerate(parts[:-1] if not path.endswith("/") else parts):
        if part in _CHECKOUT and i > 1:
            return "/".join(parts[i:])
    if path.startswith("/tmp/"):
        return "${TMPDIR:-/tmp}" + path[len("/tmp"):]
    if path.startswith(("/root/", "/home/")):
        rest = parts[2:] if path.startswith("/root/") else parts[3:]
        return "~/" + "/".join(rest)
    return "…/" + (parts[-1] or parts[-2])


def scrub(text: str) -> str:
    """Absolute machine paths in text replaced (machine_path)."""
    return _PATH.sub(machine_path, text)


def _terminal(line: str) -> str:
    """What a terminal shows of a line with carriage returns: its last segment."""
    return line.rsplit("\r", 1)[-1] if "\r" in line else line


WARNING_MESSAGE_LINES = 8  # the most lines a warning's message may run to before its indented source line


def _warning_end(lines: list[str], start: int) -> int:
    """Where the Python warning whose header is lines[start] ends (exclusive): its message may run over several
    lines (torch's "... to a scalar may lead to unexpected results.\nConsider using tensor.detach() first.
    (Triggered internally at ...)"), then comes its indented source line. A header with no indented line within
    reach (the source was not found) is one line."""
    for j in range(start + 1, min(len(lines), start + 1 + WARNING_MESSAGE_LINES)):
        if lines[j].startswith((" ", "\t")):
            end = j
            while end < len(lines) and lines[end].startswith((" ", "\t")):
                end += 1
            return end
        if _WARNING.match(lines[j]) or not lines[j].strip():
            break
    return start + 1


def quiet_stderr(text: str) -> str:
    """stderr without progress bars, Python warnings (their whole message and their source line) or torch log
    lines."""
    lines = [_terminal(raw) for raw in text.split("\n")]
    kept, i = [], 0
    while i < len(lines):
        line = lines[i]
        if _WARNING.match(line):
            i = _warning_end(lines, i)
            continue
        if not (_GLOG.match(line) or _TQDM.match(line) or not line.strip()):
            kept.append(line)
        i += 1
    return "\n".join(kept) + ("\n" if kept else "")


def _source(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _fence(body: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{body.rstrip()}\n{ticks}"


def _details(summary: str, body: str) -> dict:
    """A display output (Markdown, rendered as MyST) holding `body` in a collapsed block."""
    text = f"<details>\n<summary>{summary}</summary>\n\n{body.rstrip()}\n\n</details>\n"
    return {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": text}}


def fold_text(text: str) -> list[dict] | None:
    """A long or wide stream text: [its first rows, cut to MAX_WIDTH; the whole, collapsed], or None if it fits."""
    lines = text.rstrip("\n").split("\n")
    width = max(len(line) for line in lines)
    if len(lines) <= MAX_LINES and width <= MAX_WIDTH:
        return None
    head = [line if len(line) <= MAX_WIDTH else line[:MAX_WIDTH - 2] + " …" for line in lines[:HEAD_LINES]]
    more = f"… {len(lines) - HEAD_LINES} more lines below\n" if len(lines) > HEAD_LINES else ""
    shown = {"output_type": "stream", "name": "stdout", "text": "\n".join(head) + "\n" + more}
    summary = f"The whole output: {len(lines)} lines, up to {width} characters wide"
    return [shown, _details(summary, _fence(text))]


_CELL_BREAK = re.compile(r"(?<!\\)\|")


def _first_columns(line: str, n: int) -> str:
    cells = _CELL_BREAK.split(line.strip())[1:-1]
    return "|" + "|".join(cells[:n]) + "|" + (" … |" if len(cells) > n else "")


def fold_markdown(text: str) -> list[dict] | None:
    """A Markdown output whose table has more than MAX_LINES rows or MAX_COLUMNS columns: [the text with the
    table's first rows and columns; the whole table, collapsed], or None."""
    lines = text.rstrip("\n").split("\n")
    rows = [i for i, line in enumerate(lines) if line.startswith("|")]
    if not rows:
        return None
    first, last = rows[0], rows[-1]
    columns = len(_CELL_BREAK.split(lines[first].strip())) - 2
    if len(rows) <= MAX_LINES + 2 and columns <= MAX_COLUMNS:  # + header and rule
        return None
    table = lines[first:last + 1]
    head = [_first_columns(line, MAX_COLUMNS) for line in table[:2 + HEAD_LINES]]
    if len(head) > 2:
        head[1] = "|" + "---|" * (head[0].count("|") - 1)
    hidden = [f"{len(rows) - 2 - HEAD_LINES} more rows"] if len(rows) - 2 > HEAD_LINES else []
    hidden += [f"{columns - MAX_COLUMNS} more columns"] if columns > MAX_COLUMNS else []
    shown = lines[:first] + head + [f"\n*… {' and '.join(hidden)} below.*"] + lines[last + 1:]
    summary = f"The whole table: {len(rows) - 2} rows, {columns} columns"
    return [{"output_type": "display_data", "metadata": {}, "data": {"text/markdown": "\n".join(shown) + "\n"}},
            _details(summary, "\n".join(table))]


def _scrub_tree(value, key: str = "", join_lines: bool = True):
    """Every string of a parsed notebook or JSON value scrubbed, image data left alone. A notebook's multiline
    text stored as a list of lines becomes one string (`join_lines`, for the published copy) or stays a list
    (a session file keeps its layout: no path spans two lines)."""
    if isinstance(value, str):
        return value if key.startswith(_BINARY) else scrub(value)
    if isinstance(value, list):
        if join_lines and (key in ("source", "text") or key.startswith("text/")):
            return scrub("".join(value))
        return [_scrub_tree(v, key, join_lines) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _scrub_tree(v, k, join_lines)) for k, v in value.items())
    return value


_PLAIN_TEXT = (".log", ".err", ".out", ".txt", ".md", ".csv")


def _scrubbed_json(text: str, suffix: str) -> str:
    """A notebook or JSON file with the machine paths of its strings scrubbed, in the layout its writer used
    (nbformat's; session.json's indent 1). Scrubbing the raw text would miss a path after an escaped newline
    (`\\n/work/...`) and could touch base64 image data."""
    value = json.loads(text)
    scrubbed = _scrub_tree(value, join_lines=False)
    if scrubbed == value:
        return text
    if suffix == ".ipynb":
        import nbformat

        return nbformat.writes(nbformat.from_dict(scrubbed)) + "\n"
    return json.dumps(scrubbed, indent=1) + "\n"


def scrub_folder(folder: Path) -> list[Path]:
    """Machine paths scrubbed from every text file under `folder` (a session's notebooks, records, session.json,
    logs); images, reports and compressed files are left alone. Returns the files rewritten; a file that does
    not parse is left as it is."""
    changed = []
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        suffix = path.suffix
        if suffix not in (".ipynb", ".json", ".jsonl", *_PLAIN_TEXT):
            continue
        try:
            if suffix == ".jsonl":  # records: lab.record owns their lines
                if record.map_rows(path, lambda row: _scrub_tree(row, join_lines=False)):
                    changed.append(path)
                continue
            text = path.read_text()
            new = scrub(text) if suffix in _PLAIN_TEXT else _scrubbed_json(text, suffix)
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        if new != text:
            files.write_atomic(path, new)
            changed.append(path)
    return changed


def _cell_outputs(outputs: list) -> list:
    merged = []
    for out in outputs:
        if out.get("output_type") == "stream":
            text = _source(out.get("text", ""))
            if out.get("name") == "stderr":
                text = quiet_stderr(text)
            if not text:
                continue
            if merged and merged[-1].get("output_type") == "stream" and merged[-1].get("name") == out.get("name"):
                merged[-1]["text"] += text
                continue
            merged.append({"output_type": "stream", "name": out.get("name"), "text": text})
        else:
            merged.append(out)
    cleaned = []
    for out in merged:
        folded = None
        if out.get("output_type") == "stream":
            folded = fold_text(out["text"])
        elif "text/markdown" in out.get("data", {}):
            folded = fold_markdown(_source(out["data"]["text/markdown"]))
            if folded and out.get("output_type") == "execute_result":
                folded[0].update(output_type="execute_result", execution_count=out.get("execution_count"))
        cleaned.extend(folded or [out])
    return cleaned


def clean(nb):
    """The notebook (nbformat node or dict) as the book shows it: a new notebook node."""
    import nbformat

    cells = [{**cell, "outputs": _cell_outputs(cell.get("outputs", []))} if cell.get("cell_type") == "code"
             else cell for cell in nb["cells"]]
    return nbformat.from_dict(_scrub_tree({**nb, "cells": cells}))
