"""Append-only result records: one JSON line per measurement, under outputs/.

Where rows go:
- inside a session (`python -m lab session` sets LAB_SESSION_DIR): <session dir>/records.jsonl;
- a chapter run on its own (papermill or JupyterLab): outputs/adhoc/<run id>/records.jsonl.
A run only ever appends to its own file; it never opens another run's rows for writing.

Every row carries: kind, chapter, session, timestamp, commit, and the environment fingerprint
(GPU, SM, driver, CUDA, torch, nvcc). Kernel rows add version, source hash, case, timing, ratios, check.
Multi-GPU rows carry world_size (filled in from torchrun's WORLD_SIZE when a rank writes) and, where they
measure scaling, efficiency (scaling_efficiency).

This module is the one writer (`append`, `compress`) and the one reader (`read`, `session_rows`, `load`) of
records.jsonl. The reader skips a torn line (a killed process, a full disk) with a warning naming file:line
instead of raising, so one bad line never stops a chapter, the session runner or the log. It imports no torch.

A superseded session's records may be stored as records.jsonl.gz (`compress`, run by `python -m lab prune`):
the same text, gzipped, so the tree that travels to every GPU machine stays small. Readers take both. A folder
holding both is read .gz first, then the plain file: rows appended after compression land in a fresh plain
file and come after the older ones. No row is read twice: a plain file that begins with the whole .gz text
(the original, brought back from git history) is read alone, and so is a .gz that ends with the whole plain
text (`compress` stopped between writing the one and deleting the other).
"""
from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import json
import os
import re
import subprocess
import warnings
import zlib
from functools import lru_cache
from pathlib import Path

from . import env, files, paths

RECORDS = "records.jsonl"
RECORDS_GZ = RECORDS + ".gz"  # the same text gzipped (`compress`): a superseded session's records
READ_ORDER = (RECORDS_GZ, RECORDS)  # within one folder: compressed rows are older than any plain ones


class TornLineWarning(UserWarning):
    """A records.jsonl line that is not a whole JSON object; it is skipped."""


@lru_cache(maxsize=1)
def git_commit() -> str:
    if os.environ.get("LAB_COMMIT"):  # the GPU machine gets a copy of the working tree whose .git may lag
        return os.environ["LAB_COMMIT"]  # behind: the runner passes the commit it sent
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


def session_id(gpu: str, now: dt.datetime | None = None) -> str:
    """The one id format of sessions and ad-hoc runs: <YYYYmmdd-HHMMSS>-<gpu slug>-<commit>."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{now:%Y%m%d-%H%M%S}-{slug(gpu)}-{git_commit()}"


def new_run_id(now: dt.datetime | None = None) -> str:
    return session_id(fingerprint()["gpu"], now)


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


def append(row: dict, chapter: str | None = None, folder: Path | None = None, env: dict | None = None) -> dict:
    """Add the common fields and append the row to this run's records (or `folder`'s); returns the row.

    The session runner passes its own folder and fingerprint; chapters pass neither."""
    folder = Path(folder) if folder is not None else run_dir()
    full = {
        "kind": row.get("kind", "measurement"),
        "chapter": chapter or os.environ.get("LAB_CHAPTER"),
        "session": folder.name,
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "env": env if env is not None else fingerprint(),
        **row,
    }
    if "world_size" not in full and os.environ.get("WORLD_SIZE", "").isdigit() and "RANK" in os.environ:
        full["world_size"] = int(os.environ["WORLD_SIZE"])  # a torchrun rank's row
    files.append_line(folder / RECORDS, json.dumps(full, default=_jsonable))
    return full


def scaling_efficiency(single_ms: float, world_ms: float, world_size: int) -> float:
    """(time on one device) / (world_size x time on world_size devices): 1.0 is perfect scaling."""
    return single_ms / (world_size * world_ms)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)


def _raw(file: Path) -> bytes | None:
    """The bytes of one records file, gunzipped when it is records.jsonl.gz; None when it is missing."""
    try:
        data = Path(file).read_bytes()
    except FileNotFoundError:
        return None
    return _unpacked(Path(file), data)


def _unpacked(file: Path, stored: bytes) -> bytes:
    """A records file's text from its stored bytes: gunzipped for records.jsonl.gz."""
    return _gunzip(file, stored) if file.name.endswith(".gz") else stored


def _gunzip(file: Path, data: bytes) -> bytes:
    """A damaged .gz (a cut copy) gives the rows before the damage and a warning, like a torn plain file."""
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        warnings.warn(f"{file}: damaged gzip data ({err}); read up to the damage", TornLineWarning, stacklevel=4)
    try:
        return zlib.decompressobj(wbits=31).decompress(data)  # 31: a gzip header; stops without the trailer
    except zlib.error:
        return b""


def _rows(file: Path, data: bytes) -> list[dict]:
    text = data.decode("utf-8", errors="replace")
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            row, reason = None, f"not JSON ({err.msg} at column {err.colno})"
        else:
            reason = "not a JSON object"
        if not isinstance(row, dict):
            warnings.warn(f"{file}:{number}: skipped a torn record line: {reason}", TornLineWarning, stacklevel=3)
            continue
        rows.append(row)
    return rows


def read(file: Path) -> list[dict]:
    """The rows of one records.jsonl or records.jsonl.gz, in order; a torn or non-object line is skipped
    with a warning."""
    data = _raw(Path(file))
    return [] if data is None else _rows(Path(file), data)


def map_rows(file: Path, change) -> bool:
    """Rewrite a plain records file row by row: `change(row)` gives the row to keep, and a row it leaves equal
    keeps its line byte for byte; a torn or non-object line stays as it is. The file is replaced atomically, and
    only when a row changed; returns whether one did."""
    text = Path(file).read_text()
    lines = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        new = change(row) if isinstance(row, dict) else row
        lines.append(line if new == row else json.dumps(new, default=_jsonable))
    out = "\n".join(lines) + ("\n" if text.endswith("\n") else "")
    if out == text:
        return False
    files.write_atomic(file, out)
    return True


def _sources(folder: Path) -> list[tuple[Path, bytes]]:
    """A folder's records files with their (gunzipped) bytes, in reading order (see the module notes)."""
    found = [(folder / name, data) for name in READ_ORDER if (data := _raw(folder / name)) is not None]
    if len(found) == 2:
        (_, packed), (_, plain) = found
        if plain.startswith(packed):
            return found[1:]  # the original plain file, brought back from git history, has every .gz row
        if packed.endswith(plain):
            return found[:1]  # `compress` stopped after writing the .gz: it already has the plain rows
    return found


def session_rows(folder: Path) -> list[dict]:
    """Every row of one folder's records (records.jsonl.gz, then records.jsonl), in order."""
    return [row for file, data in _sources(Path(folder)) for row in _rows(file, data)]


def folders(root: Path, depth: str = "**") -> list[Path]:
    """Folders under root (at glob `depth`) that hold records, sorted as their records files' paths sort."""
    found = {p.parent for name in READ_ORDER for p in Path(root).glob(f"{depth}/{name}") if p.is_file()}
    return sorted(found, key=lambda folder: folder / RECORDS)


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)  # mtime=0: the same rows give the same bytes


def compressed(folder: Path) -> bytes | None:
    """What `compress` would write as the folder's records.jsonl.gz; None when it has no plain records."""
    folder = Path(folder)
    if not (folder / RECORDS).is_file():
        return None
    parts = [data for _, data in _sources(folder)]
    for i, data in enumerate(parts[:-1]):
        if data and not data.endswith(b"\n"):  # a torn last line must not swallow the next file's first row
            parts[i] = data + b"\n"
    return _gzip(b"".join(parts))


def compress(folder: Path) -> tuple[int, int] | None:
    """Replace the folder's records.jsonl with records.jsonl.gz holding every row (an older .gz's first);
    returns (bytes before, bytes after), or None when there was no plain file. Not for a run still appending.

    The .gz is written atomically before the plain file goes; a crash between leaves both, and the reader
    sees that the .gz already ends with the plain file's rows."""
    folder = Path(folder)
    data = compressed(folder)
    if data is None:
        return None
    before = sum((folder / name).stat().st_size for name in READ_ORDER if (folder / name).is_file())
    files.write_atomic(folder / RECORDS_GZ, data)
    (folder / RECORDS).unlink()
    return before, len(data)


# A records file alone in its folder (an archive, or a plain records.jsonl), read whole in this process without
# a torn line, is known by identity: path, inode, size and mtime. An archive is written once by an atomic replace
# (a new inode); a plain file that a session appends to changes size and mtime with every row, so a new key. A
# later load() that matches on plain strings parses only the lines that hold every one of them: a row whose field
# equals "n10_backward" holds the token "n10_backward", so no other line can match. A chapter that shows recorded
# results in several cells, and every test that loads them, then parses the committed records once, not per call.
# The lines that hold a load's first plain string are kept, by the file's key, for the next load that matches on it
# (a chapter's name: each of its cells loads its own kind of rows, from the chapter's lines): that load neither
# gunzips the file again nor scans every line of it.
# A file found clean is known so to later processes too: an empty marker named by the hash of the file's stored bytes,
# under LAB_CACHE_DIR/records-clean. Each chapter is a process of its own, and its first load would otherwise parse
# every committed row (78,590 rows, 0.75 CPU-seconds on the lab's 2-core machine) only to find no torn line; a file
# whose bytes change has another hash, so a marker never vouches for other rows.
_clean_files: set = set()
_token_lines: dict = {}  # file path -> (its key, {plain string: the file's lines that hold it})
_TOKENS_KEPT = 2
_PLAIN = re.compile(r"[A-Za-z0-9_.:+-]*")  # strings that json.dumps writes as they are, between quotes


def _clean_marker(stored: bytes) -> Path:
    """Where processes learn that a records file with these stored bytes was read whole without a torn line."""
    return paths.CACHE / "records-clean" / hashlib.sha256(stored).hexdigest()[:32]


def _mark_clean(marker: Path) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:  # a read-only cache: the next process reads the file whole again, as before
        pass


def _matching_rows(folder: Path, tokens: list[str]) -> list[dict]:
    """session_rows(folder), less rows that cannot match: for a folder's one records file already read whole and
    clean, only the rows whose line holds every token."""
    present = [folder / name for name in READ_ORDER if (folder / name).is_file()] if tokens else []
    try:
        stat = present[0].stat() if len(present) == 1 else None
    except FileNotFoundError:
        stat = None
    if stat is None:
        return session_rows(folder)
    file = present[0]
    key = (str(file), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    stored = None
    if key not in _clean_files:
        try:
            stored = file.read_bytes()  # hashed and parsed from the same bytes: the marker vouches for what was read
        except FileNotFoundError:
            return []
        marker = _clean_marker(stored)
        if marker.exists():
            _clean_files.add(key)
        else:
            with warnings.catch_warnings(record=True) as caught:  # a torn line, or damaged gzip data
                warnings.simplefilter("always")
                rows = _rows(file, _unpacked(file, stored))
            for warning in caught:  # given on, as read; a file with a torn line is read whole every time
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            if not caught:
                _clean_files.add(key)
                _mark_clean(marker)
            return rows
    known, by_token = _token_lines.get(str(file), (None, {}))
    if known != key:
        by_token = {}
        _token_lines[str(file)] = (key, by_token)
    lines = next((by_token[token] for token in tokens if token in by_token), None)
    if lines is None:
        data = _unpacked(file, stored) if stored is not None else _raw(file)  # stored: read just now, for the hash
        text = (data or b"").decode("utf-8", errors="replace")
        if len(by_token) == _TOKENS_KEPT:  # the oldest goes: a process that loads many kinds keeps a few files' worth
            del by_token[next(iter(by_token))]
        lines = by_token[tokens[0]] = [line for line in text.splitlines() if tokens[0] in line]
    return [json.loads(line) for line in lines if all(token in line for token in tokens)]


def load(root: Path | None = None, **match) -> list[dict]:
    """Every record under root (default outputs/), filtered by equality on top-level or case fields.

    load(kind="fwd", version="v02") or load(gpu_only=True): gpu_only drops rows measured without a GPU.
    """
    root = Path(root or paths.OUTPUTS)
    gpu_only = match.pop("gpu_only", False)
    tokens = [f'"{v}"' for v in match.values() if isinstance(v, str) and _PLAIN.fullmatch(v)]
    rows = []
    for folder in folders(root):
        for row in _matching_rows(folder, tokens):
            if gpu_only and (row.get("env") or {}).get("gpu", "cpu") == "cpu":
                continue
            case = row.get("case") if isinstance(row.get("case"), dict) else {}
            if all(row.get(k, case.get(k)) == v for k, v in match.items()):
                rows.append(row)
    return rows


def latest_gpu_rows(rows: list[dict]) -> list[dict]:
    """Rows of the most recent GPU session among `rows` (what CPU mode shows, with its session named)."""
    gpu_rows = [r for r in rows if r.get("env", {}).get("gpu", "cpu") != "cpu"]
    if not gpu_rows:
        return []
    latest = max(gpu_rows, key=lambda r: r["timestamp"])["session"]
    return [r for r in gpu_rows if r["session"] == latest]
