"""Decision gates: a chapter's pass/fail conditions, declared as data and judged against records.

The origin's reports set gates in prose ("if the baseline is not 0.10x +- 10%, stop"), which no
tool could check. Here a gate is a row in chapters/gates.json:

    {"chapter": "n6_fa2", "name": "v02 >= 1.0x SDPA-flash at D=128, S=8192",
     "query": {"kind": "fwd", "impl": "v02", "D": 128, "Sk": 8192, "causal": false},
     "metric": "ratios.sdpa-flash", "op": ">=", "value": 1.0, "gpu_only": true}

query: each key matches a record's top-level field, its case field, or a dotted path; a list
means any of; a string with * or ? is a glob; "not": {...} excludes rows matching a sub-query; "impl":
"default" matches the rows of the version lab.ops runs by default for that row's shape and GPU
(lab.registry.default_for_row), so a gate outlives a change of default. metric: a dotted path into the row.
op: >=, <=, >, <, == (every matching row must satisfy it: the measured value shown is the worst)
or "all" (every matching row's metric equals value). gpu_only: rows measured without a GPU do
not count. With no matching row the status is "no data", never "pass": a CPU session proves nothing.
A gate of a chapter that failed is "void" (lab.session): its partial rows prove nothing either.
"""
from __future__ import annotations

import fnmatch
import json
import operator
from pathlib import Path

from . import paths, registry

GATES_FILE = paths.CHAPTERS / "gates.json"

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}


def load_gates(path: Path | None = None) -> list[dict]:
    path = Path(path or GATES_FILE)
    if not path.exists():
        return []
    gates = json.loads(path.read_text())
    for gate in gates:
        missing = {"chapter", "name", "query", "metric", "op"} - gate.keys()
        if missing:
            raise ValueError(f"{path}: gate {gate.get('name', gate)!r} lacks {sorted(missing)}")
        if gate["op"] not in (*_OPS, "all"):
            raise ValueError(f"{path}: gate {gate['name']!r} has unknown op {gate['op']!r}")
    return gates


def field(row: dict, dotted: str):
    """row['a']['b'] for 'a.b'; keys may themselves hold dots or dashes ('ratios.sdpa-flash')."""
    value = row
    parts = dotted.split(".")
    i = 0
    while i < len(parts):
        if not isinstance(value, dict):
            return None
        # the longest key that exists wins, so 'ratios.sdpa-flash' and a key 'a.b' both resolve
        for j in range(len(parts), i, -1):
            key = ".".join(parts[i:j])
            if key in value:
                value, i = value[key], j
                break
        else:
            return None
    return value


def _lookup(row: dict, key: str):
    if key in row:
        return row[key]
    case = row.get("case")
    if isinstance(case, dict) and key in case:
        return case[key]
    return field(row, key) if "." in key else None


def _matches_one(actual, wanted) -> bool:
    if isinstance(wanted, str) and any(c in wanted for c in "*?[") and isinstance(actual, str):
        return fnmatch.fnmatchcase(actual, wanted)
    return actual == wanted


def matches(row: dict, query: dict) -> bool:
    for key, wanted in query.items():
        if key == "not":  # {"not": {...}}: the row must not match the sub-query
            if matches(row, wanted):
                return False
            continue
        actual = _lookup(row, key)
        options = wanted if isinstance(wanted, list) else [wanted]
        if not any(_matches_one(actual, option) or (key == "impl" and option == "default" and actual is not None
                                                     and actual == registry.default_for_row(row))
                   for option in options):
            return False
    return True


def select(rows: list[dict], query: dict, metric: str, gpu_only: bool = False) -> list[tuple[dict, object]]:
    """(row, metric value) for every row that matches the query and carries the metric."""
    found = []
    for row in rows:
        if gpu_only and row.get("env", {}).get("gpu", "cpu") == "cpu":
            continue
        if row.get("kind") == "gate" or not matches(row, query):
            continue
        value = field(row, metric)
        if value is not None:
            found.append((row, value))
    return found


def worst(values: list, op: str):
    """The value nearest to failing: the minimum for >=/>, the maximum for <=/<."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return values[0]
    return min(numbers) if op in (">=", ">") else max(numbers) if op in ("<=", "<") else numbers[0]


def judge(values: list, op: str, expected) -> bool:
    if op == "all":
        return all(v == expected for v in values)
    try:
        return all(_OPS[op](v, expected) for v in values)
    except TypeError:  # a string or None where a number was expected fails, it does not crash
        return False


def evaluate(gate: dict, rows: list[dict]) -> dict:
    found = select(rows, gate["query"], gate["metric"], gate.get("gpu_only", False))
    result = {"name": gate["name"], "chapter": gate["chapter"], "metric": gate["metric"], "op": gate["op"],
              "expected": gate.get("value"), "rows": len(found), "measured": None, "passed": None,
              "status": "no data"}
    if not found:
        return result
    values = [value for _, value in found]
    passed = judge(values, gate["op"], gate.get("value"))
    if gate["op"] == "all":
        bad = sum(1 for v in values if v != gate.get("value"))
        measured = f"{len(values) - bad}/{len(values)} rows"
    else:
        measured = worst(values, gate["op"])
        if isinstance(measured, float):
            measured = round(measured, 4)
    result.update(measured=measured, passed=passed, status="pass" if passed else "fail")
    return result


def evaluate_all(rows: list[dict], gates: list[dict], chapters: list[str] | None = None) -> list[dict]:
    """Every gate of the given chapters (all chapters when None), in file order."""
    return [evaluate(g, rows) for g in gates if chapters is None or g["chapter"] in chapters]


def void(result: dict, reason: str) -> dict:
    """Mark a gate result void (its chapter failed): never a pass, whatever the partial rows measured."""
    result.update(status="void", passed=None, void_reason=reason)
    return result


def describe(result: dict) -> str:
    """'pass: measured 1.12 (>= 1.0, 3 rows)' — one line for logs and progress output."""
    if result["status"] == "no data":
        return "no data"
    if result["status"] == "void":
        return f"void ({result.get('void_reason', 'its chapter failed')}; measured {result.get('measured')})"
    if result["op"] == "all":
        return f"{result['status']}: {result['measured']} with {result['metric']} == {result['expected']}"
    return f"{result['status']}: measured {result['measured']} ({result['op']} {result['expected']}, {result['rows']} rows)"


def counts(results: list[dict]) -> dict:
    out = {"pass": 0, "fail": 0, "no data": 0}
    for r in results:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out
