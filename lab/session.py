"""`python -m lab session`: execute every chapter once with papermill and leave one session folder.

outputs/sessions/<YYYYmmdd-HHMMSS>-<gpu>-<commit>/ holds the executed notebooks, the records the
chapters append (LAB_SESSION_DIR points them here), their figures, and session.json.

Why it is shaped like this:
- a chapter that fails must not cost the others: its error becomes a bug entry and the session goes on
  (the origin lost whole sessions to one blocker);
- progress prints 'step X/Y' with elapsed time and an estimate from earlier sessions, plus a heartbeat,
  because silent multi-minute stalls made the origin's user give up (their Pattern 11);
- session.json is rewritten (atomically: temp file + rename) after every chapter inside this session's own
  folder, so a killed session keeps what it finished; another session's folder is never opened for writing;
- every exception, from a chapter or from the runner's own writes (a full disk, a read-only outputs/),
  ends the session as "failed" or "interrupted" with the error in session.json, never as a crash that
  leaves it "running"; only a SIGKILL can, and the log then shows it as "abandoned" (its pid is gone, or
  its heartbeat file has gone stale);
- a failed chapter's gates are void: partial rows prove nothing, so they can never count as a pass.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import statistics
import sys
import tarfile
import time
import traceback as tb
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from . import files, paths, record, toc
from . import gates as gates_mod
from .liveness import Beat, deferred_signals
from .notebook_run import execute, short_traceback
from .progress import Heartbeat, fmt_seconds
from .publish.clean import scrub_folder


class SessionExists(RuntimeError):
    """Append-only: a session folder that exists already belongs to another session."""


def create_session_dir(outputs: Path, env: dict, device: str, session_id: str | None = None) -> Path:
    """A fresh outputs/sessions/<id>/; refuses an id whose folder exists (mkdir is the lock)."""
    sessions = outputs / "sessions"
    try:
        sessions.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise files.OutputError(err.errno, f"cannot create {sessions}: {err.strerror or err}") from err
    for _ in range(3):
        gpu = "cpu" if device == "cpu" else env.get("gpu", "cpu")
        sid = session_id or record.session_id(gpu)
        try:
            (sessions / sid).mkdir()
            return sessions / sid
        except FileExistsError:
            if session_id:
                raise SessionExists(f"{sessions / sid} exists: a session never rewrites another's folder") from None
            time.sleep(1.05)  # ids are per second: wait for the next one rather than share a folder
        except OSError as err:
            raise files.OutputError(err.errno, f"cannot create {sessions / sid}: {err.strerror or err}") from err
    raise SessionExists(f"could not find a free session id under {sessions}")


def gpu_count(mode: str) -> int | None:
    """GPUs this session can use (the book's chapter choice needs it for multi-GPU chapters); 0 in CPU mode."""
    if mode == "cpu":
        return 0
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.device_count()


def _history(outputs: Path) -> list[dict]:
    """Earlier sessions, for estimates only: a torn or odd session.json is passed over, never fatal."""
    found = []
    for file in sorted((outputs / "sessions").glob("*/session.json")):
        try:
            info = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue  # a session killed mid-write must not stop the next one
        if isinstance(info, dict) and isinstance(info.get("chapters"), list):
            found.append(info)
    return found


def estimate(history: list[dict], chapter: str, mode: str, cases: str) -> float | None:
    """Median duration of this chapter in earlier successful sessions of the same mode and case set."""
    past = [c.get("duration_s") for s in history if s.get("mode") == mode and s.get("cases") == cases
            for c in s.get("chapters", []) if isinstance(c, dict) and c.get("name") == chapter
            and c.get("status") == "ok"]
    past = [x for x in past if isinstance(x, (int, float)) and not isinstance(x, bool)]
    return statistics.median(past) if past else None


@contextmanager
def kernel_env(session_dir: Path, chapter: str, outputs: Path):
    """Environment the chapter's kernel inherits; PYTHONPATH is extended, never replaced
    (on the GPU machine it already holds the carried wheels)."""
    saved = {k: os.environ.get(k) for k in ("LAB_SESSION_DIR", "LAB_CHAPTER", "LAB_OUTPUTS", "PYTHONPATH")}
    os.environ["LAB_SESSION_DIR"] = str(session_dir)
    os.environ["LAB_CHAPTER"] = chapter
    os.environ["LAB_OUTPUTS"] = str(outputs)
    entries = [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p]
    if str(paths.ROOT) not in entries:
        entries.append(str(paths.ROOT))
    os.environ["PYTHONPATH"] = os.pathsep.join(entries)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def append_row(session_dir: Path, row: dict, env: dict) -> None:
    """A row written by the runner itself (gate, bug, session): lab.record's writer, into this session."""
    record.append(row, chapter=row.get("chapter"), folder=session_dir, env=env)


def session_rows(session_dir: Path) -> list[dict]:
    return record.session_rows(session_dir)


def write_json(path: Path, data: dict) -> None:
    files.write_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def run_session(chapters: list[str], *, outputs: Path | None = None, chapters_dir: Path | None = None,
                device: str = "auto", cases: str = "quick", dtype: str | None = None, reps: int | None = None,
                price_per_gpu_hour: float | None = None, gates_file: Path | None = None,
                cell_timeout: float | None = None, heartbeat: float = 60.0, session_id: str | None = None,
                env: dict | None = None, prebuild: bool = False, printer=print) -> Path:
    """Execute `chapters` in order into a new session folder; returns the folder.

    `prebuild` (GPU mode): every kernel library is built in parallel first (lab.prebuild), so the chapters
    load them from the cache. An interrupt stops the chapter in flight; the rest are marked skipped and
    session.json says so."""
    outputs = Path(outputs or paths.OUTPUTS)
    chapters_dir = Path(chapters_dir or paths.CHAPTERS)
    paths.setup_cache_env()
    env = env or record.fingerprint()
    mode = "cpu" if device == "cpu" or env.get("gpu", "cpu") == "cpu" else "gpu"
    history = _history(outputs)
    folder = create_session_dir(outputs, env, device, session_id)
    parameters = {"device": device, "cases": cases}
    parameters.update({k: v for k, v in (("dtype", dtype), ("reps", reps)) if v is not None})
    start = time.time()
    info = {"id": folder.name, "start": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "end": None, "status": "running", "mode": mode, "device": device, "cases": cases,
            "parameters": parameters, "commit": record.git_commit(), "env": env,
            "gpus": gpu_count(mode), "pid": os.getpid(), "host": socket.gethostname(),
            "chapters": [{"name": c, "status": "pending"} for c in chapters], "gates": [], "cost": None}
    with Beat(folder):
        try:
            write_json(folder / "session.json", info)
            printer(f"session {folder.name}: {len(chapters)} chapters, {mode} mode, {cases} cases -> "
                    f"{paths.relative(folder)}")
            if prebuild:
                _prebuild(info, folder, env, printer)
            for step, entry in enumerate(info["chapters"], 1):
                _run_chapter(entry, step, len(chapters), folder, chapters_dir, outputs, parameters, history,
                             info, start, cell_timeout, heartbeat, env, printer)
                write_json(folder / "session.json", info)
            info["status"] = "complete"
        except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM from a time limit (main() turns it into this)
            _stop(info, "interrupted", f"interrupted ({err})" if str(err) else "interrupted", None)
            printer("session interrupted: finishing session.json with what ran")
        except BaseException as err:  # the runner's own failure (a full disk...): still a finished session.json
            _stop(info, "failed", f"{type(err).__name__}: {err}"[:500], short_traceback(tb.format_exc()))
            printer(f"session failed: {info['error']}")
        with deferred_signals() as held:
            _finish(info, folder, start, gates_file, price_per_gpu_hour, env, printer)
        if held:
            printer(f"signal {held[0]} arrived while session.json was being finished: the session was already done")
    return folder


def _prebuild(info: dict, folder: Path, env: dict, printer) -> None:
    """Every kernel library built at once for this GPU (lab.prebuild), recorded in session.json and the records;
    a CPU session has no library to build (`python -m lab compile` checks the kernels there)."""
    if info["mode"] != "gpu":
        printer("prebuild: CPU mode, no kernel library to build")
        return
    from . import build, prebuild

    printer("prebuild: every kernel library for this GPU, in parallel")
    result = prebuild.prebuild(build.device_arch_flags(), printer=printer)
    info["prebuild"] = result
    append_row(folder, {"kind": "prebuild", **result}, env)
    write_json(folder / "session.json", info)
    failed = ", ".join(f["source"] for f in result["failed"])
    printer(f"prebuild: {result['built']} built in {fmt_seconds(result['seconds'])} ({result['jobs']} at once)"
            + (f"; failed: {failed} (the chapters that call them will say why)" if failed else ""))


def _stop(info: dict, status: str, error: str, traceback: str | None) -> None:
    """Close a session that did not complete: the chapter in flight failed, the ones not started skipped."""
    info.update(status=status, error=error)
    if traceback:
        info["traceback"] = traceback
    for entry in info["chapters"]:
        if entry["status"] == "running":  # it ran partly: its notebook, if written, is kept
            entry.update(status="failed", error=f"{status} while running: {error}", notebook=f"{entry['name']}.ipynb")
        elif entry["status"] == "pending":
            entry.update(status="skipped", error=f"session {status}")


def _run_chapter(entry, step, total, folder, chapters_dir, outputs, parameters, history, info, start,
                 cell_timeout, heartbeat, env, printer):
    name = entry["name"]
    source = chapters_dir / f"{name}.ipynb"
    guess = estimate(history, name, info["mode"], info["cases"])
    left = [estimate(history, e["name"], info["mode"], info["cases"]) for e in info["chapters"][step - 1:]]
    remaining = sum(left) if all(x is not None for x in left) else None
    printer(f"step {step}/{total}: {name}, elapsed {fmt_seconds(time.time() - start)}, "
            f"estimate {fmt_seconds(guess)} (session left: {fmt_seconds(remaining)})")
    if not source.exists():
        entry.update(status="skipped", duration_s=0.0, build_s=0.0,
                     error=f"{paths.relative(source)} not found (listed, but no notebook on disk yet)")
        printer(f"step {step}/{total}: {name} skipped: {entry['error']}")
        return
    entry.update(status="running", started=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    began = time.time()
    with kernel_env(folder, name, outputs), Heartbeat(f"step {step}/{total}: {name}", began, guess,
                                                      heartbeat, printer):
        result = execute(source, folder / f"{name}.ipynb", parameters, chapters_dir, cell_timeout)
    rows = session_rows(folder)
    entry.update(result, duration_s=round(time.time() - began, 2), notebook=f"{name}.ipynb",
                 build_s=round(sum(r.get("seconds") or 0 for r in rows
                                   if r.get("kind") == "build" and r.get("chapter") == name), 3))
    if result["status"] == "failed":
        append_row(folder, {"kind": "bug", "chapter": name, "id": f"RUN-{name}-{result['exception']}",
                            "title": f"{name} fails with {result['exception']}", "symptom": result["error"],
                            "status": "open", "source": f"failed chapter {name}", "notebook": f"{name}.ipynb"}, env)
    printer(f"step {step}/{total}: {name} {result['status']} in {fmt_seconds(entry['duration_s'])}"
            f" (build {entry['build_s']:.1f} s)" + (f": {result['error']}" if result["error"] else ""))


def _finish(info, folder, start, gates_file, price, env, printer):
    """Gates, cost and the final session.json: runs even when the session is interrupted or failed.

    A write that fails here (a full disk) is reported in session.json as the session's error; if even
    session.json cannot be written, the OutputError naming its path reaches the caller."""
    info["end"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    info["duration_s"] = round(time.time() - start, 2)
    results = []
    try:
        ran = [e["name"] for e in info["chapters"]]
        results = gates_mod.evaluate_all(session_rows(folder), gates_mod.load_gates(gates_file), ran)
        status_of = {e["name"]: e["status"] for e in info["chapters"]}
        for result in results:
            if status_of.get(result["chapter"]) == "failed":
                gates_mod.void(result, f"chapter {result['chapter']} failed")
        for result in results:
            append_row(folder, {"kind": "gate", **result}, env)
    except Exception as err:
        _runner_error(info, err, printer)
    for entry in info["chapters"]:
        entry["gates"] = [r for r in results if r["chapter"] == entry["name"]]
    info["gates"] = gates_mod.counts(results)
    if price is not None and info["mode"] == "gpu":
        hours = info["duration_s"] / 3600
        info["cost"] = {"price_per_gpu_hour": price, "gpu_hours": round(hours, 4), "cost": round(hours * price, 4)}
    try:
        append_row(folder, {"kind": "session", "duration_s": info["duration_s"], "mode": info["mode"],
                            "status": info["status"], "chapters_ok": sum(e["status"] == "ok" for e in info["chapters"]),
                            "chapters_failed": sum(e["status"] == "failed" for e in info["chapters"]),
                            "build_s": round(sum(e.get("build_s") or 0 for e in info["chapters"]), 3)}, env)
    except Exception as err:
        _runner_error(info, err, printer)
    write_json(folder / "session.json", info)
    # a session folder is committed as it comes back from the GPU machine: none of its files names that machine's
    # paths (a warning's source file on stderr, a traceback, a record's path)
    scrub_folder(folder)
    print_gates(results, info["mode"], printer)
    failed = [e["name"] for e in info["chapters"] if e["status"] == "failed"]
    printer(f"session {info['id']} {info['status']} in {fmt_seconds(info['duration_s'])}; gates {info['gates']}"
            + (f"; failed chapters: {', '.join(failed)}" if failed else ""))


def print_gates(results: list[dict], mode: str, printer) -> None:
    """A line per gate with a verdict. The gates without data are listed one by one after a GPU session (a
    chapter skipped what it should have measured); after a CPU session, where every GPU gate has none, they are
    one line counted by chapter, so the verdicts a CPU can reach stand out."""
    missing = [r for r in results if r["status"] == "no data"]
    for result in results:
        if result["status"] != "no data" or mode != "cpu":
            printer(f"gate [{result['chapter']}] {result['name']}: {gates_mod.describe(result)}")
    if missing and mode == "cpu":
        by_chapter = Counter(result["chapter"] for result in missing)  # in the chapters' order
        printer(f"{len(missing)} gates without data, as in every CPU session (they judge GPU measurements): "
                + ", ".join(f"{chapter} {n}" for chapter, n in by_chapter.items()))


def _runner_error(info: dict, err: Exception, printer) -> None:
    if info["status"] in ("running", "complete"):
        info["status"] = "failed"
    text = f"{type(err).__name__}: {err}"[:500]
    info["error"] = f"{info['error']}; then {text}" if info.get("error") else text
    printer(f"session error: {text}")


def tarball(folder: Path, target: Path) -> Path:
    """One archive of the session folder, to carry back from the GPU machine; unpack at the outputs' parent."""
    with tarfile.open(target, "w:gz") as tar:
        tar.add(folder, arcname=str(folder.relative_to(folder.parent.parent.parent)))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab session", description=__doc__.split("\n")[0])
    parser.add_argument("--chapters", help="comma-separated chapter names (default: the chapters in _toc.yml)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--dtype", help="passed to every chapter (default: each chapter's own)")
    parser.add_argument("--cases", choices=["quick", "full"], default="quick")
    parser.add_argument("--reps", type=int, help="timing repetitions (default: each chapter's own)")
    parser.add_argument("--price-per-gpu-hour", type=float,
                        default=float(os.environ["LAB_GPU_PRICE"]) if os.environ.get("LAB_GPU_PRICE") else None,
                        help="records a cost in session.json (default: $LAB_GPU_PRICE, else none)")
    parser.add_argument("--cell-timeout", type=float, help="seconds one cell may run (default: no limit)")
    parser.add_argument("--heartbeat", type=float, default=60.0, help="seconds between 'still running' lines")
    parser.add_argument("--outputs", type=Path, help="outputs root (default: $LAB_OUTPUTS or outputs/)")
    parser.add_argument("--chapters-dir", type=Path, help="where the notebooks are (default: chapters/)")
    parser.add_argument("--tarball", type=Path, help="also pack the session folder into this .tar.gz")
    parser.add_argument("--no-log", action="store_true", help="do not regenerate the log pages afterwards")
    parser.add_argument("--strict", action="store_true", help="also exit 1 when a gate failed")
    parser.add_argument("--prebuild", action="store_true",
                        help="on a GPU, build every kernel library in parallel before the first chapter")
    args = parser.parse_args(argv)
    chapters = [c.strip() for c in args.chapters.split(",") if c.strip()] if args.chapters else toc.chapters()
    outputs = args.outputs or paths.OUTPUTS
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout` sends SIGTERM: still write session.json
    printer = lambda line: print(line, flush=True)  # noqa: E731
    try:
        folder = run_session(chapters, outputs=outputs, chapters_dir=args.chapters_dir, device=args.device,
                             cases=args.cases, dtype=args.dtype, reps=args.reps,
                             price_per_gpu_hour=args.price_per_gpu_hour, cell_timeout=args.cell_timeout,
                             heartbeat=args.heartbeat, prebuild=args.prebuild, printer=printer)
    except KeyboardInterrupt:
        print("session interrupted before it started", file=sys.stderr)
        return 130
    except OSError as err:  # no session folder, or its session.json could not be written at all
        print(f"session failed: {err}", file=sys.stderr)
        return 1
    if args.tarball:
        print(f"packed {tarball(folder, args.tarball)}")
    if not args.no_log:
        from .publish import log

        try:
            log.generate(Path(outputs))
        except Exception as err:  # the session's evidence is written; a log bug must not hide that
            print(f"log generation failed ({type(err).__name__}: {err}); run `python -m lab log`", file=sys.stderr)
    info = json.loads((folder / "session.json").read_text())
    if info["status"] == "interrupted":
        return 130
    failed = [c["name"] for c in info["chapters"] if c["status"] == "failed"]
    if info["status"] == "failed" or failed:
        print(f"session {info['status']}" + (f"; failed chapters: {', '.join(failed)}" if failed else ""),
              file=sys.stderr)
        return 1
    return 1 if args.strict and info["gates"].get("fail") else 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")
