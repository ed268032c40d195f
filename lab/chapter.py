"""What every chapter does first: resolve the device, name the chapter, and be plain about CPU mode."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import paths, record


def _cell():
    """The running cell's execution count under IPython (a notebook), else None."""
    try:
        return get_ipython().execution_count  # noqa: F821 (defined by IPython)
    except NameError:
        return None


@dataclass
class Chapter:
    name: str
    device: str
    _said: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def skip(self, what: str) -> bool:
        """Call at the top of a GPU-only cell: `if ch.skip("timing v01"): ...`. Prints what was skipped."""
        if not self.gpu:
            print(f"[skipped in CPU mode: {what} needs a GPU]")
            return True
        return False

    def recorded(self, **match) -> list[dict]:
        """The latest GPU session's rows for this chapter (what CPU mode shows), with their session named once
        per cell: a cell that reads two kinds of rows from one session says so once."""
        rows = record.latest_gpu_rows(record.load(chapter=self.name, **match))
        if rows:
            env = rows[0]["env"]
            line = f"recorded GPU results: session {rows[0]['session']}, {env['gpu']}, commit {rows[0]['commit']}"
        else:
            line = "no GPU results recorded yet for this chapter"
        said = (_cell(), line)
        if said != self._said:
            print(line)
            self._said = said
        return rows


def start(name: str, device: str = "auto") -> Chapter:
    paths.setup_cache_env()
    os.environ["LAB_CHAPTER"] = name
    from .check import resolve_device

    chosen = resolve_device(device).type
    chapter = Chapter(name, chosen)
    fp = record.fingerprint()
    if chapter.gpu:
        print(f"{name}: GPU mode on {fp['gpu']} (torch {fp['torch']}, CUDA {fp['cuda']}, nvcc {fp['nvcc']})")
    else:
        print(f"{name}: CPU mode (torch {fp['torch']}, nvcc {fp['nvcc']}): kernels are compile-checked and the "
              f"algorithms emulated; GPU cells are skipped and say so; GPU numbers shown come from records.")
    print(f"records: {paths.relative(record.run_dir())}/records.jsonl")
    return chapter
