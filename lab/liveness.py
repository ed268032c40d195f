"""How a running session shows that it is alive, and finishes cleanly when signalled.

- Beat rewrites <session>/heartbeat with the time every 30 s; lab.publish.pages calls a session that is
  still marked "running" "abandoned" once its heartbeat is stale or its pid is gone (SIGKILL can stop
  a runner before it writes anything else);
- deferred_signals holds back Ctrl-C or SIGTERM while the runner writes its final session.json, so the
  last write is never cut short.
"""
from __future__ import annotations

import datetime as dt
import signal
import threading
from contextlib import contextmanager
from pathlib import Path

from . import files

HEARTBEAT_FILE = "heartbeat"  # lab.publish.pages reads it
HEARTBEAT_S = 30.0


class Beat:
    """Rewrites <session>/heartbeat with the time every `every` seconds, so a reader can tell a live runner
    from one that was killed; a failed write is ignored (the pid check still works)."""

    def __init__(self, folder: Path, every: float = HEARTBEAT_S):
        self.path, self.every, self.stop_event = folder / HEARTBEAT_FILE, every, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _beat(self):
        try:
            files.write_atomic(self.path, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds") + "\n")
        except OSError:
            pass

    def _run(self):
        while not self.stop_event.wait(self.every):
            self._beat()

    def __enter__(self):
        self._beat()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_event.set()
        self.thread.join(timeout=5)
        try:
            self.path.unlink()
        except OSError:
            pass


@contextmanager
def deferred_signals():
    """While the runner finishes session.json, Ctrl-C or SIGTERM is noted (in the yielded list) instead of
    cutting the last write short; the session is finished by then, so nothing else is lost."""
    pending: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in saved:
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield pending
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
