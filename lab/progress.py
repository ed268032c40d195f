"""Progress lines for long runs: durations as 1m05s and a heartbeat while a step is silent.

The origin's users gave up during a silent ten-minute stall (their Pattern 11); a session therefore
never goes quiet for longer than its heartbeat interval.
"""
from __future__ import annotations

import threading
import time


def fmt_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Heartbeat:
    """Prints 'still running' every `every` seconds while a chapter runs (no silent stalls)."""

    def __init__(self, label: str, start: float, guess: float | None, every: float, printer):
        self.stop = threading.Event()
        self.every = every
        self.thread = threading.Thread(target=self._beat, args=(label, start, guess, every, printer), daemon=True)

    def _beat(self, label, start, guess, every, printer):
        while not self.stop.wait(every):
            printer(f"  ... {label} still running, {fmt_seconds(time.time() - start)} elapsed"
                    f" (estimate {fmt_seconds(guess)})")

    def __enter__(self):
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
