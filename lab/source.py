"""Key lines of a kernel, cut from its file by marker comments, for a chapter to show beside its numbers.

A kernel marks a region with a pair of comment lines:

    // [lab:inner-loop] one key tile: S = Q K^T, online softmax, O += P V
    ...
    // [/lab:inner-loop]

excerpt("fwd/v04_lazy.cu", "inner-loop") returns the lines between them (markers excluded) with their
file line numbers, so the chapter shows the code that actually ran, never a copy that can drift.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import paths


class MarkerError(ValueError):
    pass


def excerpt(source: str | Path, marker: str, root: Path | None = None) -> tuple[int, list[str], str]:
    """(first line number, the lines, the opening marker's note) of the region `marker` in a kernel file."""
    path = Path(root or paths.KERNELS) / source
    lines = path.read_text().splitlines()
    open_re = re.compile(r"^\s*//\s*\[lab:" + re.escape(marker) + r"\]\s*(.*)$")
    close_re = re.compile(r"^\s*//\s*\[/lab:" + re.escape(marker) + r"\]\s*$")
    starts = [i for i, line in enumerate(lines) if open_re.match(line)]
    ends = [i for i, line in enumerate(lines) if close_re.match(line)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] <= starts[0]:
        raise MarkerError(f"{path}: expected one '// [lab:{marker}]' ... '// [/lab:{marker}]' pair, found "
                          f"{len(starts)} opening and {len(ends)} closing markers")
    note = open_re.match(lines[starts[0]]).group(1)
    return starts[0] + 2, lines[starts[0] + 1:ends[0]], note


def markdown(source: str | Path, marker: str, root: Path | None = None) -> str:
    """The region as a fenced CUDA block headed by its file and line range."""
    first, body, note = excerpt(source, marker, root)
    fence = "```"
    while fence in "\n".join(body):
        fence += "`"
    head = f"`kernels/{source}`, lines {first}-{first + len(body) - 1}" + (f": {note}" if note else "")
    return f"{head}\n\n{fence}cuda\n" + "\n".join(body) + f"\n{fence}\n"


def markers(source: str | Path, root: Path | None = None) -> list[str]:
    """Names of every marked region in a kernel file."""
    text = (Path(root or paths.KERNELS) / source).read_text()
    return re.findall(r"//\s*\[lab:([\w.-]+)\]", text)
