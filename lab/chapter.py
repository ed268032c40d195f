"""What every chapter does first: resolve the device, name the chapter, and be plain about CPU mode."""
from __future__ import annotations

import os
from dataclasses import dataclass

from . import paths, record


@dataclass
class Chapter:
    name: str
    device: str

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
        """The latest GPU session's rows for this chapter (what CPU mode shows), with their session named."""
        rows = record.latest_gpu_rows(record.load(chapter=self.name, **match))
        if rows:
            env = rows[0]["env"]
            print(f"recorded GPU results: session {rows[0]['session']}, {env['gpu']}, commit {rows[0]['commit']}")
        else:
            print("no GPU results recorded yet for this chapter")
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
