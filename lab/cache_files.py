"""Publishing a built file into the shared cache, safe across processes and threads.

Several builders may want the same cache key at once: torchrun's ranks on a cold cache, pytest-xdist's
workers, two notebooks. So:
- each builder compiles to a temporary name of its own in the same folder (process id, thread id and a
  random part), so no two writers ever share a file and a rename stays on one file system;
- a builder holds an exclusive `flock` on <file>.lock while it builds; the others wait, then find the
  published file and load it instead of building it again. The kernel drops the lock when its holder
  dies, so a killed build never blocks the next one;
- the file that readers test for is published last, by an atomic rename, after its metadata was written
  atomically: a reader that sees the file sees its metadata too, and never a half-written one.
"""
from __future__ import annotations

import fcntl
import os
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")


def temporary(dest: Path) -> Path:
    """A name for this builder alone, beside `dest`, keeping its suffix (nvcc and ld look at it)."""
    tag = f"{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:8]}"
    return dest.with_name(f".{dest.stem}.{tag}.tmp{dest.suffix}")


@contextmanager
def locked(dest: Path):
    """Hold the exclusive build lock of `dest`. flock locks belong to one open file, so two threads of one
    process that each open the lock exclude each other as two processes do."""
    lock = dest.with_name(dest.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Removing the lock file is safe because every holder checks for the published file before it
        # builds: a builder that locks a fresh lock file opened it after this unlink, hence after the
        # publish (or after a failure, when building again is right).
        try:
            os.unlink(lock)
        except FileNotFoundError:
            pass
        os.close(fd)


def publish_once(dest: Path, ready: Callable[[], T | None], make: Callable[[Path], T]) -> T:
    """What `ready()` finds for an already-published `dest`; otherwise build it once.

    Under `dest`'s lock, `ready()` is asked again (another builder may have finished while this one
    waited); if it still finds nothing, `make(tmp)` writes the file to a temporary path and its metadata
    atomically, and the temporary is renamed onto `dest`. A failed `make` leaves no temporary behind."""
    found = ready()
    if found is not None:
        return found
    with locked(dest):
        found = ready()
        if found is not None:
            return found
        tmp = temporary(dest)
        try:
            result = make(tmp)
            os.replace(tmp, dest)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        return result
