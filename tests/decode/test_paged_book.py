"""Chapter n11_paged_decode is in the book before any GPU session has run it: the log publishes a placeholder
page for it (titled from the notebook), its gates read "no data" (never "pass") with no rows, and match the
rows the race writes. No torch needed."""
from __future__ import annotations

import json
import warnings

import nbformat

from lab import gates, paths, toc
from lab.publish import chapters, log

NAME = "n11_paged_decode"


def test_chapter_is_in_the_toc_and_on_disk():
    assert NAME in toc.chapters()
    assert toc.chapters().index(NAME) == toc.chapters().index("n10_backward") + 1
    assert (paths.CHAPTERS / f"{NAME}.ipynb").exists()


def test_never_run_chapter_gets_a_placeholder_page(tmp_path):
    chosen = chapters.publish(tmp_path, [], [NAME])
    assert chosen == {NAME: None}
    nb = nbformat.read(tmp_path / "book" / f"{NAME}.ipynb", as_version=4)
    assert nb.cells[0].source.startswith("# n11 · Paged decoding")
    assert "not been executed in any session yet" in nb.cells[1].source


def test_log_generates_with_no_session_for_the_chapter(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the book build runs with -W: nothing here may warn
        written = log.generate(tmp_path, chapters_list=[NAME, "n10_backward"])
    assert written["chapters"] == {NAME: None, "n10_backward": None}
    assert (tmp_path / "book" / f"{NAME}.ipynb").exists() and (tmp_path / "log" / "sessions.md").exists()


def _row(**fields):
    base = {"kind": "paged", "chapter": NAME, "impl": "lab.ops.decode", "env": {"gpu": "NVIDIA H200"},
            "ratios": {"lab.ops.decode contiguous": 0.97, "sdpa-cudnn": 0.96}, "frac_ceiling": 0.93,
            "page_size": 64, "cache_ge_1gb": True, "case": {"page_size": 64, "name": "pg-p64"}}
    base.update(fields)
    return base


def test_gates_read_no_data_without_rows_and_judge_the_race_rows():
    mine = [g for g in gates.load_gates() if g["chapter"] == NAME]
    assert len(mine) == 11
    assert {r["status"] for r in gates.evaluate_all([], mine)} == {"no data"}
    results = {r["name"]: r for r in gates.evaluate_all([_row(), _row(page_size=16, case={"page_size": 16, "name": "pg-p16"},
                                                                         ratios={"lab.ops.decode contiguous": 0.80,
                                                                                 "sdpa-cudnn": 0.99})], mine)}
    by = {name.split(" >= ", 1)[1] if " >= " in name else name: r for name, r in results.items()}
    assert by["0.95x our contiguous decode in every cell (pages 16, 64 and 256)"]["status"] == "fail"  # page 16: 0.80
    assert by["0.95x the contiguous step on a ragged batch"]["status"] == "no data"
    assert by["0.95x SDPA-cuDNN on the same data made contiguous"]["status"] == "pass"
    assert by["90% of copy bandwidth wherever the cache is >= 1 GB"]["status"] == "pass"
    default = [g for g in mine if g["query"].get("impl") == "lab.ops.decode (no page_errors)"]
    slow = _row(impl="lab.ops.decode (no page_errors)", ratios={"lab.ops.decode contiguous": 0.94})
    assert [r["status"] for r in gates.evaluate_all([_row(impl=slow["impl"]), slow], default)] == ["fail"]
    assert [r["status"] for r in gates.evaluate_all([_row(impl=slow["impl"])], default)] == ["pass"]
    assert json.loads((paths.CHAPTERS / "gates.json").read_text())  # still valid JSON
    # the head-dim race's rows (names hd-*) have gates of their own and stay out of the serving cells' gates
    head_dims = [_row(case={"page_size": 64, "name": "hd-p64-d80-b8-kv16384"}, ratios={"sdpa-cudnn": 0.90},
                      frac_ceiling=0.5),
                 _row(impl="lab.ops.decode contiguous", case={"page_size": 64, "name": "hd-p64-d80-b8-kv16384"},
                      ratios={"sdpa-cudnn": 0.97})]
    results = {r["name"]: r["status"] for r in gates.evaluate_all([_row()] + head_dims, mine)}
    assert results["paged lab.ops.decode >= 0.95x SDPA-cuDNN on the same data made contiguous"] == "pass"
    assert [results[n] for n in results if "every head dim" in n] == ["fail", "pass", "fail"]
