"""The chapter list, read from _toc.yml: the book's table of contents is the one list of chapters.

A chapter is an entry `file: outputs/book/<name>` whose name looks like `n<N>_<topic>`. A line is parsed
with a pattern rather than a YAML library, so this module needs nothing beyond the standard library.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import paths

TOC = paths.ROOT / "_toc.yml"
NAME = re.compile(r"^n\d+_[A-Za-z0-9_]+$")
_ENTRY = re.compile(r"^\s*-?\s*file:\s*outputs/book/(\S+?)(?:\.ipynb)?\s*(?:#.*)?$")


def chapters(toc: Path | None = None) -> list[str]:
    """Chapter names in book order; a missing _toc.yml gives an empty list."""
    path = Path(toc or TOC)
    try:
        text = path.read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if match and NAME.match(match.group(1)) and match.group(1) not in found:
            found.append(match.group(1))
    return found


def is_chapter_name(name) -> bool:
    """A name that is safe to use in a file name: n<N>_<letters, digits, underscores>."""
    return isinstance(name, str) and bool(NAME.match(name))
