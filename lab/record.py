"""Append-only result records: one JSON line per measurement, under outputs/.

Where rows go:
- inside a session (`python -m lab session` sets LAB_SESSION_DIR): <session dir>/records.jsonl;
- a chapter run on its own (papermill or JupyterLab): outputs/adhoc/<run id>/records.jsonl.
A run only ever appends to its own file; it never opens another run's rows for writing.

Every row carries: kind, chapter, session, timestamp, commit, and the environment fingerprint
(GPU, SM, driver, CUDA, torch, nvcc). Kernel rows add version, source hash, case, timing, ratios, check.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path

from . import env, paths


@lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=paths.ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return os.environ.get("LAB_COMMIT", "unknown")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=paths.ROOT,
                           capture_output=True, text=True).stdout.strip()
    return out + ("-dirty" if dirty else "")


@lru_cache(maxsize=1)
def fingerprint() -> dict:
    return env.fingerprint()


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3'."""
    text = re.sub(r"^nvidia\s+", "", text.strip().lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


def new_run_id(now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{slug(fingerprint()['gpu'])}-{git_commit()}"


_adhoc_dir: Path | None = None


def run_dir() -> Path:
    """This run's folder: the session's, or a fresh ad-hoc one for a chapter run on its own."""
    global _adhoc_dir
    if os.environ.get("LAB_SESSION_DIR"):
        folder = Path(os.environ["LAB_SESSION_DIR"])
    else:
        if _adhoc_dir is None:
            _adhoc_dir = paths.OUTPUTS / "adhoc" / new_run_id()
        folder = _adhoc_dir
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def run_id() -> str:
    return run_dir().name


def figure_path(name: str) -> Path:
    folder = run_dir() / "figures"
    folder.mkdir(exist_ok=True)
    return folder / name


def append(row: dict, chapter: str | None = None) -> dict:
    """Add the common fields and append the row; returns the row as written."""
    full = {
        "kind": row.get("kind", "measurement"),
        "chapter": chapter or os.environ.get("LAB_CHAPTER"),
        "session": run_id(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "env": fingerprint(),
        **row,
    }
    with open(run_dir() / "records.jsonl", "a") as handle:
        handle.write(json.dumps(full, default=_jsonable) + "\n")
    return full


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)


def load(root: Path | None = None, **match) -> list[dict]:
    """Every record under root (default outputs/), filtered by equality on top-level or case fields.

    load(kind="fwd", version="v02") or load(gpu_only=True): gpu_only drops rows measured without a GPU.
    """
    root = Path(root or paths.OUTPUTS)
    gpu_only = match.pop("gpu_only", False)
    rows = []
    for file in sorted(root.rglob("records.jsonl")):
        for line in file.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if gpu_only and row.get("env", {}).get("gpu", "cpu") == "cpu":
                continue
            if all(row.get(k, row.get("case", {}).get(k)) == v for k, v in match.items()):
                rows.append(row)
    return rows


def latest_gpu_rows(rows: list[dict]) -> list[dict]:
    """Rows of the most recent GPU session among `rows` (what CPU mode shows, with its session named)."""
    gpu_rows = [r for r in rows if r.get("env", {}).get("gpu", "cpu") != "cpu"]
    if not gpu_rows:
        return []
    latest = max(gpu_rows, key=lambda r: r["timestamp"])["session"]
    return [r for r in gpu_rows if r["session"] == latest]
