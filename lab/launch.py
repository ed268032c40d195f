"""`python -m lab experiment NOTEBOOK -p key value ...`: run one experiment notebook with papermill.

The experiment gets its id (<YYYYMMDD>-<slug>, lab.experiments.new_id) before it starts; the notebook receives
it as `experiment_id`, and `notebook_path`, where its executed copy is kept: outputs/experiments/notebooks/<id>.ipynb,
the record's evidence. A run that wrote no record (CPU mode, a failed cell) leaves no evidence behind: its
executed copy moves to outputs/adhoc/experiments/, which git ignores. Papermill runs as in a session
(lab.notebook_run.execute), with the checkout on the kernel's PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from . import experiments, paths
from .notebook_run import execute

SLUG_PARAMETERS = ("family", "candidate_a", "candidate_b")  # the default slug names what an A/B compares


def value(text: str):
    """A -p value: JSON when it parses (numbers, lists, true/false, null), else the string as written."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def notebook_source(name: str) -> Path:
    """A path to a notebook, or the name of one in chapters/ ("x_ab" or "x_ab.ipynb")."""
    path = Path(name)
    if path.suffix != ".ipynb":
        path = path.with_suffix(".ipynb")
    return path if path.exists() or len(path.parts) > 1 else paths.CHAPTERS / path.name


def default_slug(source: Path, parameters: dict) -> str:
    """The notebook's name without x_, then the family and candidates: given ones, else the notebook's defaults."""
    import papermill

    declared = {k: v.get("default") for k, v in papermill.inspect_notebook(str(source)).items()}
    stem = source.stem[2:] if source.stem.startswith("x_") else source.stem
    named = [str(parameters[k]) if k in parameters else str(declared[k]).strip("'\"") for k in SLUG_PARAMETERS
             if k in parameters or declared.get(k)]
    return "-".join([stem, *named]).lower()


@contextmanager
def _kernel_path(outputs: Path):
    """The notebook's kernel imports `lab` from this checkout and writes under `outputs`."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "LAB_OUTPUTS")}
    entries = [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(entries + ([str(paths.ROOT)] if str(paths.ROOT) not in entries else []))
    os.environ["LAB_OUTPUTS"] = str(outputs)
    try:
        yield
    finally:
        for key, old in saved.items():
            os.environ.pop(key, None) if old is None else os.environ.__setitem__(key, old)


def launch(source: Path, parameters: dict, outputs: Path | None = None, slug: str | None = None,
           timeout: float | None = None, printer=print) -> dict:
    """Execute the notebook; {id, status, error, record (path or None), notebook (path)}."""
    import papermill

    declared = papermill.inspect_notebook(str(source))
    unknown = sorted(set(parameters) - set(declared))
    if unknown:  # papermill would only warn, and the experiment would run with the default instead
        raise ValueError(f"{paths.relative(source)} has no parameter {', '.join(unknown)}; it takes {', '.join(declared)}")
    outputs = Path(outputs or paths.OUTPUTS)
    paths.setup_cache_env()
    experiment_id = experiments.new_id(slug or default_slug(source, parameters), outputs)
    target = experiments.folder(outputs) / experiments.NOTEBOOKS / f"{experiment_id}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    given = {**parameters, "experiment_id": experiment_id,
             "notebook_path": f"outputs/{target.relative_to(outputs).as_posix()}",
             "source_notebook": paths.relative(source)}
    printer(f"experiment {experiment_id}: {paths.relative(source)} -> {paths.relative(target)}")
    with _kernel_path(outputs):
        result = execute(source, target, given, source.parent, timeout)
    written = experiments.folder(outputs) / f"{experiment_id}.json"
    if not written.exists() and target.exists():  # no record: the copy is no one's evidence
        draft = outputs / "adhoc" / "experiments" / target.name
        draft.parent.mkdir(parents=True, exist_ok=True)
        target = target.replace(draft)
    return {"id": experiment_id, **result, "record": written if written.exists() else None, "notebook": target}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab experiment", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", help="the experiment notebook: a path, or a name in chapters/ (x_ab)")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"),
                        help="a notebook parameter; VALUE is read as JSON when it parses (2, true, [\"a\", \"b\"])")
    parser.add_argument("--slug", help=f"the id's slug (default: the notebook's name and {', '.join(SLUG_PARAMETERS)})")
    parser.add_argument("--outputs", type=Path, help="outputs root (default: $LAB_OUTPUTS or outputs/)")
    parser.add_argument("--cell-timeout", type=float, help="seconds one cell may run (default: no limit)")
    args = parser.parse_args(argv)
    source = notebook_source(args.notebook)
    if not source.exists():
        print(f"no notebook at {source}", file=sys.stderr)
        return 2
    parameters = {key: value(text) for key, text in args.parameter}
    try:
        result = launch(source, parameters, args.outputs, args.slug, args.cell_timeout,
                        printer=lambda line: print(line, flush=True))
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    except OSError as err:
        print(f"experiment failed: {err}", file=sys.stderr)
        return 1
    if result["status"] != "ok":
        print(f"experiment {result['id']} failed: {result['error']}\n{result['traceback'] or ''}\n"
              f"executed copy: {paths.relative(result['notebook'])}", file=sys.stderr)
        return 1
    if result["record"] is None:
        print(f"experiment {result['id']}: the notebook wrote no record (in CPU mode it only checks the plan); "
              f"executed copy: {paths.relative(result['notebook'])}")
        return 0
    print(f"record: {paths.relative(result['record'])}\nexecuted notebook: {paths.relative(result['notebook'])}\n"
          f"commit both; `python -m lab log` publishes the record on the Experiments page")
    return 0
