"""Experiment records: the schema, the append-only writer, the Experiments page, and x_ab under papermill."""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from lab import ab, bench, experiments, launch, paths, toc
from lab.publish import experiments as page_mod
from lab.publish import log
from lab.publish.pages import LogWarning

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "experiments"
GOOD = FIXTURES / "20261121-fwd-v04-against-v03-d128.json"
COMMITTED = sorted(experiments.folder(paths.ROOT / "outputs").glob("*.json"))


def good() -> dict:
    return json.loads(GOOD.read_text())


def test_a_good_record_is_accepted():
    record = experiments.read(GOOD)
    assert record["outcome"] == "positive" and experiments.problems(record, GOOD.stem) == []
    assert experiments.missing_evidence(record, paths.ROOT / "outputs") == []


def _set(path: str, value):
    """A mutation of the good record: path 'a.b[0].c'; value ... deletes the field."""
    def mutate(record):
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        target = record
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        if value is ...:
            del target[last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return mutate


BAD = {  # mutation -> the field the error must name
    "no hypothesis": (_set("hypothesis", ...), "hypothesis"),
    "empty decision": (_set("decision", "  "), "decision"),
    "unknown family": (_set("family", "attention"), "family"),
    "unknown outcome": (_set("outcome", "won"), "outcome"),
    "bad date": (_set("date", "2026-13-01"), "date"),
    "date not the id's": (_set("date", "2026-11-22"), "date"),
    "id not the file's": (_set("id", "20261121-other"), "id"),
    "id without a date": (_set("id", "fwd-v04"), "id"),
    "commit not a string": (_set("commit", 1234), "commit"),
    "extra field": (_set("verdict", "good"), "verdict"),
    "evidence outside outputs": (_set("evidence", ["kernels/fwd/v04_lazy.cu"]), "evidence[0]"),
    "evidence climbing out": (_set("evidence", ["outputs/../README.md"]), "evidence[0]"),
    "evidence not a list": (_set("evidence", "outputs/bugs.json"), "evidence"),
    "no unit": (_set("measurement.unit", ...), "measurement.unit"),
    "cells not a list": (_set("measurement.cells", {}), "measurement.cells"),
    "value a string": (_set("measurement.cells[1].value", "0.4"), "measurement.cells[1].value"),
    "value a bool": (_set("measurement.cells[0].value", True), "measurement.cells[0].value"),
    "value NaN": (_set("measurement.cells[2].value", float("nan")), "measurement.cells[2].value"),
    "spread reversed": (_set("measurement.cells[0].spread", [0.6, 0.4]), "measurement.cells[0].spread"),
    "n zero": (_set("measurement.cells[0].n", 0), "measurement.cells[0].n"),
    "cell without a name": (_set("measurement.cells[3].cell", ...), "measurement.cells[3].cell"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_record_is_rejected_naming_the_file_and_field(case):
    mutate, field = BAD[case]
    record = good()
    mutate(record)
    with pytest.raises(experiments.RecordError) as caught:
        experiments.validate(record, "some/file.json", GOOD.stem)
    message = str(caught.value)
    assert message.startswith("some/file.json: ") and f"field '{field}'" in message, message


def test_an_unreadable_file_names_itself(tmp_path):
    path = tmp_path / "20261121-torn.json"
    path.write_text('{"id": "20261121-torn", ')
    with pytest.raises(experiments.RecordError, match="20261121-torn.json"):
        experiments.read(path)


def test_write_creates_a_record_once_and_never_rewrites_it(tmp_path):
    outputs = tmp_path / "outputs"
    (outputs / "driver_logs").mkdir(parents=True)
    record = good()
    for evidence in record["evidence"]:
        (outputs / evidence.split("/", 1)[1]).write_text("log\n")
    path = experiments.write(record, outputs)
    assert path == outputs / "experiments" / f"{record['id']}.json" and experiments.read(path) == record
    changed = {**record, "outcome": "negative"}
    with pytest.raises(experiments.RecordExists):
        experiments.write(changed, outputs)
    assert experiments.read(path)["outcome"] == "positive"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no staging file is left behind"
    assert experiments.new_id("fwd-v04-against-v03-d128", outputs, day=__import__("datetime").date(2026, 11, 21)) \
        == "20261121-fwd-v04-against-v03-d128-2"


def test_write_refuses_a_record_whose_evidence_is_missing(tmp_path):
    with pytest.raises(experiments.RecordError, match="field 'evidence': not found"):
        experiments.write(good(), tmp_path / "outputs")
    assert not (tmp_path / "outputs" / "experiments" / GOOD.name).exists()


def test_a_cell_from_samples_is_the_median_and_the_interquartile_range():
    assert experiments.cell("c", [4.0, 1.0, 3.0, 2.0, 100.0]) == {"cell": "c", "value": 3.0, "spread": [2.0, 4.0], "n": 5}
    assert experiments.cell("one", [0.5]) == {"cell": "one", "value": 0.5, "spread": [0.5, 0.5], "n": 1}
    timing = bench.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert experiments.cell("t", timing) == {"cell": "t", "value": 3.0, "spread": [2.0, 4.0], "n": 5}
    with pytest.raises(ValueError):
        experiments.cell("none", [])


@pytest.mark.parametrize("path", COMMITTED + sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_every_record_validates_and_its_evidence_exists(path):
    record = experiments.read(path)
    assert experiments.missing_evidence(record, paths.ROOT / "outputs") == [], f"{path.name}: evidence not in the tree"
    if record.get("notebook"):
        assert (paths.ROOT / record["notebook"]).is_file(), f"{path.name}: notebook {record['notebook']} not found"


def test_the_experiments_folder_holds_records_and_their_notebooks_only():
    folder = experiments.folder(paths.ROOT / "outputs")
    if not folder.exists():
        pytest.skip("no experiment recorded yet")
    strays = [p.name for p in folder.iterdir() if p.suffix != ".json" and p.name != experiments.NOTEBOOKS]
    assert not strays, f"not records: {strays}"
    cited = {e for r in experiments.load(paths.ROOT / "outputs") for e in r["evidence"]}
    orphans = [p.name for p in (folder / experiments.NOTEBOOKS).glob("*") if f"outputs/experiments/notebooks/{p.name}"
               not in cited]
    assert not orphans, f"executed notebooks no record cites: {orphans}"


def _page_outputs(tmp_path) -> Path:
    """An outputs/ with the fixture record (positive), a newer negative one and a broken one."""
    outputs = tmp_path / "outputs"
    (outputs / "driver_logs").mkdir(parents=True)
    positive = good()
    for evidence in positive["evidence"]:
        (outputs / evidence.split("/", 1)[1]).write_text("log\n")
    negative = copy.deepcopy(positive)
    negative.update(id="20261122-fwd-v04-prologue-all-stages", date="2026-11-22", outcome="negative",
                    title="v04 prologue issues every stage's tile", decision="PRO stays off",
                    hypothesis="tile 1 requested before tile 0 lands hides the first load at S 512",
                    evidence=["outputs/driver_logs/20261121-h200-v04-run2-bench.log"])
    negative["measurement"]["cells"] = [{"cell": "S 512 · PRO=1", "value": 0.452, "spread": [0.45, 0.455], "n": 9}]
    broken = {**copy.deepcopy(positive), "id": "20261123-broken", "date": "2026-11-23", "outcome": "won"}
    for record in (positive, negative, broken):
        (outputs / "experiments").mkdir(exist_ok=True)
        (outputs / "experiments" / f"{record['id']}.json").write_text(json.dumps(record))
    return outputs


def test_the_page_shows_negative_results_newest_first_with_a_summary(tmp_path):
    outputs = _page_outputs(tmp_path)
    with pytest.warns(LogWarning, match="20261123-broken.json: field 'outcome'"):
        text = page_mod.page(outputs)
    assert text.startswith("# Experiments\n") and "20261123-broken" not in text
    assert "| {ref}`Forward <experiments-fwd>` | 1 | 1 | – | – | 2 |" in text
    assert "**✗ negative**" in text and "**✓ positive**" in text
    assert text.index("v04 prologue issues every stage") < text.index("fwd v04 (lazy rescale"), "newest first"
    assert "**Decision.** PRO stays off" in text and "tile 1 requested before tile 0 lands" in text
    assert "| S 512 · PRO=1 | 0.452 | 0.45 – 0.455 | 9 |" in text
    assert "{download}`driver_logs/20261121-h200-v04-run2-bench.log <../driver_logs/20261121-h200-v04-run2-bench.log>`" \
        in text


def test_the_log_writes_the_experiments_page_and_the_book_lists_it(tmp_path):
    outputs = _page_outputs(tmp_path)
    with pytest.warns(LogWarning):
        written = log.generate(outputs, chapters_list=[])
    assert written["experiments"] == outputs / "log" / "experiments.md"
    assert "**✗ negative**" in written["experiments"].read_text()
    assert "- file: outputs/log/experiments" in (paths.ROOT / "_toc.yml").read_text()


def test_an_empty_experiments_folder_says_so(tmp_path):
    assert "No experiment has been recorded yet." in page_mod.page(tmp_path)


def _timing(median: float, spread: float = 0.01):
    return bench.Timing(median, median - spread, median + spread, 20)


def test_the_ab_outcome_rule_and_its_record():
    a, b = ab.candidate("decode", "v02"), ab.candidate("decode", "v02", {"num_splits": 4})
    assert b.name == "v02 num_splits=4" and ab.slug(a, b) == "ab-decode-v02-v02-num_splits4"
    case = ab.cases("decode", ["dec-h8-b1-kv131072"])[0]
    row = lambda ta, tb, ok=True: {"case": case, "checks": {a.name: (True, 1e-3), b.name: (ok, 1e-3)},  # noqa: E731
                                   "times": {a.name: _timing(ta), **({b.name: _timing(tb)} if ok else {})}}
    assert ab.outcome(a, b, [row(1.0, 0.8), row(1.0, 0.9)]) == "positive"
    assert ab.outcome(a, b, [row(1.0, 0.8), row(1.0, 1.0)]) == "mixed"
    assert ab.outcome(a, b, [row(1.0, 1.2), row(1.0, 1.005)]) == "negative"
    assert ab.outcome(a, b, [row(1.0, 1.005)]) == "inconclusive"
    assert ab.outcome(a, b, [row(1.0, 0.5, ok=False)]) == "negative", "a B that fails its check never wins"
    entry = ab.new_record("20261129-ab-decode", a, b, [row(1.0, 1.2)], hypothesis="h", prediction="p")
    experiments.validate(entry, "new record", "20261129-ab-decode")
    assert entry["outcome"] == "negative" and entry["decision"].startswith("keep v02")
    assert [c["cell"] for c in entry["measurement"]["cells"]] == [f"{case.name} · v02", f"{case.name} · v02 num_splits=4"]


def test_ab_checks_before_it_times_and_its_record_is_written(tmp_path, monkeypatch):
    """ab.run's flow with the kernels and the GPU faked: a candidate that fails its check is not timed, a case
    a version cannot run is named, and the record that follows validates and is written once."""
    import torch

    a, b = ab.candidate("fwd", "v03"), ab.candidate("fwd", "v10")  # v10: head dims 192 and 256 only, sm_90
    chosen = ab.cases("fwd", ["hdw-d256-s2048", "fwd-d128-s2048"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    calls = []
    monkeypatch.setattr(ab, "_call", lambda cand, case, seed=0: ((lambda: calls.append(cand.name)), None))
    monkeypatch.setattr(ab, "_check", lambda cand, case, run, trials: (cand.name == "v10", 1e-3))
    clock = iter(range(1, 10_000))
    rows = ab.run(a, b, chosen, timer=lambda fn: (fn(), float(next(clock)))[1], first_run=lambda fn: None,
                  min_reps=3, max_reps=5)
    assert rows[0]["checks"]["v03"] == "v03 takes head dims [64, 128], not 256"
    assert rows[1]["checks"]["v10"] == "v10 takes head dims [192, 256], not 128"
    assert rows[1]["checks"]["v03"] == (False, 1e-3) and rows[1]["times"] == {}, "a failed check is never timed"
    assert set(calls) == {"v10"} and rows[0]["times"]["v10"].n == 5
    entry = ab.new_record("20261129-ab-fwd-v03-v10", a, b, rows, hypothesis="h", prediction="p")
    assert entry["outcome"] == "inconclusive" and "failed the check: v03 on fwd-d128-s2048" in \
        entry["measurement"]["summary"]
    assert experiments.write(entry, tmp_path / "outputs").name == "20261129-ab-fwd-v03-v10.json"


def test_ab_names_what_does_not_exist():
    with pytest.raises(ValueError, match="no version 'v99'"):
        ab.candidate("fwd", "v99")
    with pytest.raises(ValueError, match="has no A/B adapter"):
        ab.candidate("ring", "v01")
    with pytest.raises(ValueError, match="not allowed"):
        ab.candidate("fwd", "v04", {"softcap": 30.0})
    with pytest.raises(ValueError, match="no fwd case named"):
        ab.cases("fwd", ["fwd-d96-s2048"])
    with pytest.raises(ValueError, match="nothing to compare"):
        ab.plan(ab.candidate("fwd", "v04"), ab.candidate("fwd", "v04"), [])
    v10 = ab.candidate("fwd", "v10")
    assert "head dims" in v10.supports(ab.cases("fwd", ["fwd-d128-s2048"])[0])


def test_x_ab_is_an_experiment_notebook_not_a_chapter():
    source = paths.CHAPTERS / "x_ab.ipynb"
    nb = json.loads(source.read_text())
    assert "x_ab" not in toc.chapters() and not toc.is_chapter_name("x_ab")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "stored without outputs"
    params = "".join(next(c for c in code if "parameters" in c["metadata"].get("tags", []))["source"])
    for name in ("device", "family", "candidate_a", "candidate_b", "cases", "hypothesis", "prediction"):
        assert f"\n{name} = " in f"\n{params}", name
    assert not any(line.startswith(("def ", "class ")) for c in code for line in "".join(c["source"]).splitlines()), \
        "an experiment notebook imports its helpers from lab"


def test_x_ab_runs_in_cpu_mode_and_writes_no_record(tmp_path, monkeypatch):
    """`python -m lab experiment x_ab` on a machine without a GPU: papermill runs it, it says what it skipped,
    no record is written and the executed copy is moved out of the evidence folder."""
    outputs = tmp_path / "outputs"
    monkeypatch.setenv("LAB_OUTPUTS", str(outputs))
    monkeypatch.delenv("LAB_SESSION_DIR", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")])))
    result = launch.launch(paths.CHAPTERS / "x_ab.ipynb", {"device": "cpu", "candidate_b": "v04"}, outputs,
                           printer=lambda line: None)
    assert result["status"] == "ok", result.get("traceback")
    assert result["record"] is None and result["id"].endswith("-ab-fwd-v03-v04")
    assert not list((outputs / "experiments").glob("*.json")), "CPU mode writes no record"
    assert not list((outputs / "experiments" / "notebooks").glob("*")), "no evidence without a record"
    executed = json.loads(result["notebook"].read_text())
    text = "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                     for c in executed["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
    assert "CPU mode" in text and "[skipped in CPU mode: checking and timing v03 against v04" in text
    assert "| fwd-d128-s2048 |" in text and "attn_fwd_v04" in text, "the plan and the compile check ran"
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]


def test_the_experiment_command_refuses_a_parameter_the_notebook_does_not_take(tmp_path, capsys):
    assert launch.main(["x_ab", "-p", "candidate_c", "v07", "--outputs", str(tmp_path)]) == 2
    assert "has no parameter candidate_c" in capsys.readouterr().err and not list(tmp_path.rglob("*.ipynb"))


def test_the_experiment_command_reads_parameters_as_json():
    assert launch.value('["fwd-d64-s2048"]') == ["fwd-d64-s2048"] and launch.value("2") == 2
    assert launch.value("v04") == "v04" and launch.value('{"num_splits": 4}') == {"num_splits": 4}
    assert launch.notebook_source("x_ab") == paths.CHAPTERS / "x_ab.ipynb"
    assert launch.default_slug(paths.CHAPTERS / "x_ab.ipynb", {"family": "decode", "candidate_a": "v02"}) \
        == "ab-decode-v02-v04"


def test_a_forward_ab_may_race_a_peer_with_its_backend_entered_outside_the_timer(monkeypatch):
    """A peer (SDPA forced to cuDNN) is a candidate like a version: every case runs, no kernel source is compiled
    for it, it takes no options, and run() hands the timer its backend as the call's context."""
    import torch

    from lab import bench

    a, b = ab.candidate("fwd", "sdpa-cudnn"), ab.candidate("fwd", "default")
    assert a.peer == "cudnn" and b.peer is None and a.name == "sdpa-cudnn"
    chosen = ab.cases("fwd", ["bwd-d128-s4096", "fwd-d128-s8192"])
    assert a.supports(chosen[0]) is None and ab.sources(a, ab.candidate("fwd", "v04"))[0].name == "v04_lazy.cu"
    with pytest.raises(ValueError, match="takes no options"):
        ab.candidate("fwd", "sdpa-cudnn", {"x": 1})
    with pytest.raises(ValueError, match="its peers: sdpa-cudnn, sdpa-flash"):
        ab.candidate("fwd", "sdpa-cudnn2")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (9, 0))
    monkeypatch.setattr(ab, "_call", lambda cand, case, seed=0: ((lambda: None), None))
    monkeypatch.setattr(ab, "_check", lambda cand, case, run, trials: (True, 1e-3))
    contexts = {}
    monkeypatch.setattr(bench, "time_interleaved",
                        lambda calls, **stop: contexts.update({n: c for n, (_, c) in calls.items()}) or {})
    ab.run(a, b, chosen[:1])
    assert contexts["default"] is None and callable(contexts["sdpa-cudnn"])
