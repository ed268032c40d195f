"""Writing under outputs/ without leaving a half-written file behind.

A full disk or a read-only folder must end in an error that names the path, never in a truncated
session.json, a leftover temp file, or a torn records line that the next append glues onto:
- write_atomic: the whole text goes to a temp file in the same folder, then os.replace puts it in place,
  so a reader sees the old file or the new one, never half of one;
- append_line: one whole line per call; if the file's last line was torn (a killed process), the new
  line starts on a line of its own; if the write fails, the file is cut back to its old length.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

_HINTS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is exhausted",
          errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
          errno.EPERM: "permission denied"}


class OutputError(OSError):
    """A write under outputs/ failed; the message names the path and the reason."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno N]" prefix
        return str(self.strerror)


def _error(path: Path, err: OSError) -> OutputError:
    reason = _HINTS.get(err.errno, err.strerror or str(err))
    return OutputError(err.errno, f"cannot write {path}: {reason} ({type(err).__name__}: {err.strerror or err})")


def _mkdir(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise _error(folder, err) from err


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Replace `path` with `data` all at once; on failure the old file is untouched and no temp file stays."""
    path = Path(path)
    _mkdir(path.parent)
    payload = data.encode() if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as err:
        raise _error(path, err) from err
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def append_line(path: Path | str, line: str) -> None:
    """Append one line (no newline inside); a failed write leaves the file as it was."""
    path = Path(path)
    _mkdir(path.parent)
    data = line.encode() + b"\n"
    try:
        with open(path, "a+b", buffering=0) as handle:
            size = handle.seek(0, os.SEEK_END)
            if size:
                handle.seek(size - 1)
                if handle.read(1) != b"\n":  # a torn last line stays alone on its line
                    data = b"\n" + data
            try:
                view = memoryview(data)
                while view:
                    view = view[handle.write(view):]
            except OSError:
                handle.truncate(size)  # no partial line for the next reader to trip over
                raise
    except OSError as err:
        raise _error(path, err) from err
