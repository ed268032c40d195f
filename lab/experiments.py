"""Experiments are records: one JSON file per A/B, probe or negative result, which the log's Experiments page publishes.

outputs/experiments/<YYYYMMDD>-<slug>.json holds one experiment: what was expected (hypothesis, prediction), what
was measured (cells with their spread), what was decided and why (decision, outcome), and the files under outputs/
that show it (evidence). The folder is append-only: a new experiment is a new file, and `write` refuses a name
that exists. `python -m lab experiment NOTEBOOK -p key value ...` (lab.launch) runs an experiment notebook with
papermill; the notebook writes the record with `write`, and its executed copy stays in notebooks/ as evidence.
The log's Experiments page (lab.publish.experiments) publishes every record.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import statistics
from pathlib import Path

from . import files, paths

FOLDER = "experiments"  # under outputs/
NOTEBOOKS = "notebooks"  # executed experiment notebooks, under outputs/experiments/
FAMILIES = ("fwd", "bwd", "decode", "paged", "masks", "head_dims", "ring", "build", "harness")
OUTCOMES = ("positive", "negative", "mixed", "inconclusive")
ID = re.compile(r"^(\d{8})-[A-Za-z0-9][A-Za-z0-9._-]*$")
REQUIRED = ("id", "title", "family", "date", "gpu", "commit", "hypothesis", "prediction", "measurement",
            "decision", "outcome", "evidence")
OPTIONAL = ("notes", "notebook")


class RecordError(ValueError):
    """A record that does not follow the schema; the message names the file and the field."""


class RecordExists(FileExistsError):
    """Append-only: an experiment's file is never rewritten."""


def folder(outputs: Path | None = None) -> Path:
    return Path(outputs or paths.OUTPUTS) / FOLDER


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _cell_problems(cell, where: str) -> list[tuple[str, str]]:
    if not isinstance(cell, dict):
        return [(where, "must be an object")]
    found = [(f"{where}.{k}", "is not a field of a cell") for k in cell if k not in ("cell", "value", "spread", "n")]
    if not _text(cell.get("cell")):
        found.append((f"{where}.cell", "must be a non-empty string"))
    if not _number(cell.get("value")):
        found.append((f"{where}.value", f"must be a finite number, got {cell.get('value')!r}"))
    spread = cell.get("spread")
    if "spread" in cell and not (isinstance(spread, list) and len(spread) == 2 and all(map(_number, spread))
                                 and spread[0] <= spread[1]):
        found.append((f"{where}.spread", f"must be [low, high] with low <= high, got {spread!r}"))
    n = cell.get("n")
    if "n" in cell and not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        found.append((f"{where}.n", f"must be a positive integer, got {n!r}"))
    return found


def problems(record, name: str | None = None) -> list[tuple[str, str]]:
    """Every (field, what is wrong) of a record; [] when it follows the schema. `name`: its file's stem."""
    if not isinstance(record, dict):
        return [("(record)", "must be a JSON object")]
    found = [(key, "is required") for key in REQUIRED if key not in record]
    found += [(key, "is not a field of the schema") for key in record if key not in REQUIRED + OPTIONAL]
    match = ID.match(record["id"]) if isinstance(record.get("id"), str) else None
    if "id" in record and not match:
        found.append(("id", f"must be <YYYYMMDD>-<slug>, got {record['id']!r}"))
    if name is not None and "id" in record and record["id"] != name:
        found.append(("id", f"must equal the file name's stem {name!r}, got {record['id']!r}"))
    for key in ("title", "hypothesis", "prediction", "decision", "gpu"):
        if key in record and not _text(record[key]):
            found.append((key, "must be a non-empty string"))
    for key in OPTIONAL:
        if key in record and not isinstance(record[key], str):
            found.append((key, "must be a string"))
    if "family" in record and record["family"] not in FAMILIES:
        found.append(("family", f"must be one of {', '.join(FAMILIES)}, got {record['family']!r}"))
    if "outcome" in record and record["outcome"] not in OUTCOMES:
        found.append(("outcome", f"must be one of {', '.join(OUTCOMES)}, got {record['outcome']!r}"))
    if "commit" in record and record["commit"] is not None and not _text(record["commit"]):
        found.append(("commit", "must be a non-empty string or null"))
    if "date" in record:
        try:
            day = dt.date.fromisoformat(record["date"]) if isinstance(record["date"], str) else None
        except ValueError:
            day = None
        if day is None or len(record["date"]) != 10:
            found.append(("date", f"must be YYYY-MM-DD, got {record['date']!r}"))
        elif match and match.group(1) != f"{day:%Y%m%d}":
            found.append(("date", f"{record['date']} is not the date in the id ({match.group(1)})"))
    evidence = record.get("evidence")
    if "evidence" in record and not isinstance(evidence, list):
        found.append(("evidence", "must be a list of paths under outputs/"))
    for i, path in enumerate(evidence if isinstance(evidence, list) else []):
        parts = path.split("/") if isinstance(path, str) else []
        if len(parts) < 2 or parts[0] != "outputs" or ".." in parts or "" in parts:
            found.append((f"evidence[{i}]", f"must be a relative path under outputs/, got {path!r}"))
    measurement = record.get("measurement")
    if "measurement" in record:
        if not isinstance(measurement, dict):
            return found + [("measurement", "must be an object with metric, unit and cells")]
        found += [(f"measurement.{k}", "is not a field of a measurement") for k in measurement
                  if k not in ("metric", "unit", "cells", "summary")]
        for key in ("metric", "unit"):
            if not isinstance(measurement.get(key), str):
                found.append((f"measurement.{key}", "must be a string"))
        if "summary" in measurement and not isinstance(measurement["summary"], str):
            found.append(("measurement.summary", "must be a string"))
        cells = measurement.get("cells")
        if not isinstance(cells, list):
            found.append(("measurement.cells", "must be a list of cells"))
        for i, cell in enumerate(cells if isinstance(cells, list) else []):
            found += _cell_problems(cell, f"measurement.cells[{i}]")
    return found


def validate(record, where: str | Path = "record", name: str | None = None) -> dict:
    """The record, if it follows the schema; else RecordError naming `where` and the first fields at fault."""
    found = problems(record, name)
    if found:
        listed = "; ".join(f"field '{key}': {why}" for key, why in found[:5])
        raise RecordError(f"{where}: {listed}" + (f" (+{len(found) - 5} more)" if len(found) > 5 else ""))
    return record


def missing_evidence(record: dict, outputs: Path | None = None) -> list[str]:
    """Evidence paths (outputs/...) that do not exist under the outputs root `outputs`."""
    outputs = Path(outputs or paths.OUTPUTS)
    return [p for p in record.get("evidence", []) if not (outputs / p.split("/", 1)[-1]).exists()]


def read(path: Path) -> dict:
    """One record file, validated (RecordError names the file and the field)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecordError(f"{path}: not a readable JSON record ({type(err).__name__}: {err})") from err
    return validate(record, path, path.stem)


def load(outputs: Path | None = None, on_error=None) -> list[dict]:
    """Every record under outputs/experiments/, oldest first. A bad file raises RecordError, or, with
    `on_error(message)`, is reported there and skipped (the log page warns and goes on)."""
    found = []
    for path in sorted(folder(outputs).glob("*.json")):
        try:
            found.append(read(path))
        except RecordError as err:
            if on_error is None:
                raise
            on_error(str(err))
    return sorted(found, key=lambda r: (r["date"], r["id"]))


def new_id(slug: str, outputs: Path | None = None, day: dt.date | None = None) -> str:
    """<YYYYMMDD>-<slug> for today (UTC), with -2, -3 ... when that experiment exists already."""
    day = day or dt.datetime.now(dt.timezone.utc).date()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", slug).strip("-._") or "experiment"
    base, taken = f"{day:%Y%m%d}-{slug}", {p.stem for p in folder(outputs).glob("*.json")}
    chosen, count = base, 1
    while chosen in taken:
        count += 1
        chosen = f"{base}-{count}"
    return chosen


def write(record: dict, outputs: Path | None = None) -> Path:
    """Validate the record, check that its evidence exists, and create outputs/experiments/<id>.json.

    Refuses (RecordExists) when that file exists: an experiment's record is never rewritten."""
    target = folder(outputs) / f"{record.get('id')}.json"
    validate(record, target, target.stem)
    missing = missing_evidence(record, outputs)
    if missing:
        raise RecordError(f"{target}: field 'evidence': not found: {', '.join(missing)}")
    if target.exists():
        raise RecordExists(f"{target} exists: an experiment is a new file, never a rewrite of another's")
    staged = files.write_atomic(target.with_name(f".{target.name}.new"), json.dumps(record, indent=1) + "\n")
    try:
        os.link(staged, target)  # fails if the target appeared meanwhile: never replaces a record
    except FileExistsError:
        raise RecordExists(f"{target} exists: an experiment is a new file, never a rewrite of another's") from None
    finally:
        staged.unlink()
    return target


def cell(name: str, samples) -> dict:
    """A measurement cell from timing samples (a list of numbers, or a lab.bench.Timing): the median as its
    value, the interquartile range [q1, q3] as its spread, and the number of samples as n."""
    if hasattr(samples, "median_ms"):
        return {"cell": name, "value": samples.median_ms, "spread": [samples.q1_ms, samples.q3_ms], "n": samples.n}
    values = sorted(float(v) for v in samples)
    if not values:
        raise ValueError(f"cell {name!r}: no samples")
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
    return {"cell": name, "value": statistics.median(values), "spread": [q1, q3], "n": len(values)}
