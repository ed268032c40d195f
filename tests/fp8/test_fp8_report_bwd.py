"""Chapter n15's FP8-backward section on the CPU: the emulated budget, the tables and findings from made-up rows, and
the chapter's gates judging rows with the fields that checks_bwd and race_bwd record."""
from __future__ import annotations

import pytest

from lab import bench, gates
from lab.fp8 import emulate_bwd, race_bwd, report_bwd

GPU = {"gpu": "NVIDIA H200"}


def _errors(rel_l2: float) -> dict:
    return {g: {"rel_l2": rel_l2, "max_abs": rel_l2, "nan": 0, "inf": 0} for g in ("dq", "dk", "dv")}


def _check(name: str, passed, bug=None, rel_l2=0.04) -> dict:
    return {"kind": "fp8-bwd-check", "chapter": "n15_fp8", "env": GPU, "backward": "fp8", "check": name, "bug": bug,
            "pass": passed, "error": _errors(rel_l2), "model": _errors(0.04), "bf16_eager": _errors(0.005),
            "dequantise_bf16": _errors(0.004)}


def _race(kernel_ms: float, cudnn="unsupported: no frontend") -> list[dict]:
    timed = {"lab-fp8-kernel": bench.Timing(kernel_ms, kernel_ms, kernel_ms, 20),
             "lab-fp8-train": bench.Timing(4.0, 3.9, 4.1, 20), "lab-bf16": bench.Timing(3.0, 2.9, 3.1, 20),
             "cudnn-fp8": cudnn, "lab-fp8-kernel fwd+bwd": bench.Timing(4.0, 4, 4, 20)}
    rows = []
    for case in race_bwd.CHAPTER_CASES:
        rows += [dict(r, chapter="n15_fp8", env=GPU) for r in race_bwd.rows_of(timed, *case)]
    return rows


def _gate(rows: list[dict], starts: str) -> dict:
    gate = next(g for g in gates.load_gates() if g["chapter"] == "n15_fp8" and g["name"].startswith(starts))
    return gates.evaluate(gate, rows)


def test_the_budget_puts_the_kernel_model_between_bf16_and_e5m2():
    rows = emulate_bwd.kernel_budget(1, 2, 96, 128, causal=(True,))
    by = {r["variant"]: r["error"] for r in rows}
    model, e5m2 = by["kernel model (bwd v22's scales)"], by["e5m2 dO, dS; e4m3 P, amax scales"]
    assert by[emulate_bwd.YARDSTICK]["dq"]["rel_l2"] < model["dq"]["rel_l2"] < e5m2["dq"]["rel_l2"]
    assert by["kernel model, wrong build (dK without its row multiplier)"]["dk"]["rel_l2"] > 10
    table = report_bwd.budget_table(rows)
    assert len(table.rows) == len(rows) and table.rows[0][-1] == pytest.approx(1.0)
    assert "x bf16 eager's" in report_bwd.findings(rows, [], [])[0]


def test_checks_table_and_findings_name_the_pass_count_and_the_wrong_build():
    rows = [_check("fp8-s1", True), _check("fp8-s65-c", False, rel_l2=0.3),
            _check("wrong-fp8-bwd-no-dk-multiplier", False, bug="fp8_bwd_wrong", rel_l2=190.0),
            {"kind": "fp8-bwd-check", "check": "casts-bitwise", "pass": True}]  # not a kernel row: left out
    table = report_bwd.checks_table(rows)
    assert table.caption.startswith("1/2 kernel cells pass") and len(table.rows) == 3
    assert table.rows[-1][0].endswith("(must fail)") and table.rows[-1][-1] == "FAIL"
    text = "\n".join(report_bwd.findings([], rows, []))
    assert "1/2 cells pass" in text and "FAIL, as it must" in text


def test_a_raised_check_is_a_row_the_gates_see():
    raised = dict(_check("fp8-s1", False), error_raised="RuntimeError: boom")
    wrong = dict(_check("wrong-fp8-bwd-no-dk-multiplier", None, bug="fp8_bwd_wrong"), error_raised="ValueError: no")
    assert _gate([_check("fp8-s65-c", True), raised], "every FP8 backward kernel check")["status"] == "fail"
    assert _gate([wrong], "the FP8 backward kernel built without")["status"] == "no data"  # never a pass
    assert "raised: RuntimeError: boom" in report_bwd.checks_table([raised]).rows[0][-1]


def test_the_gates_judge_the_rows_the_chapter_records():
    checks = [_check("fp8-s1", True), _check("wrong-fp8-bwd-no-dk-multiplier", False, bug="fp8_bwd_wrong")]
    assert _gate(checks, "every FP8 backward kernel check")["status"] == "pass"
    assert _gate(checks, "the FP8 backward kernel built without")["status"] == "pass"
    assert _gate([dict(checks[1], **{"pass": True})], "the FP8 backward kernel built without")["status"] == "fail"
    slow, fast = _race(3.5), _race(2.0, cudnn=bench.Timing(2.5, 2.5, 2.5, 20))
    speed = _gate(slow, "the FP8 backward kernel >= 1.3x")
    d128 = [c for c in race_bwd.CHAPTER_CASES if c[4] == 128]  # the speed gates judge D 128 (cuDNN's FP8 head dim)
    assert speed["status"] == "fail" and speed["rows"] == len(d128) < len(race_bwd.CHAPTER_CASES)
    assert speed["measured"] == pytest.approx(3.0 / 3.5, abs=1e-4)
    assert _gate(fast, "the FP8 backward kernel >= 1.3x")["status"] == "pass"
    assert _gate(slow, "the FP8 backward kernel >= 1.0x cuDNN")["status"] == "no data"  # cuDNN's did not run
    assert _gate(fast, "the FP8 backward kernel >= 1.0x cuDNN")["status"] == "pass"
    assert all(_gate([dict(r, env={"gpu": "cpu"}) for r in fast], name)["status"] == "no data"
               for name in ("the FP8 backward kernel >= 1.3x", "every FP8 backward kernel check"))


def test_race_table_and_findings_carry_the_ratio_to_our_bf16_backward():
    rows = _race(3.5)
    table = report_bwd.race_table(rows)
    kernel = [r for r in table.rows if r[1].startswith("FP8 backward kernel")]
    assert len(kernel) == len(race_bwd.CHAPTER_CASES) and kernel[0][5] == pytest.approx(3.0 / 3.5)
    cudnn = [r for r in table.rows if r[1] == "cuDNN FP8 backward"]
    assert cudnn and cudnn[0][4] == "unsupported: no frontend"
    text = "\n".join(report_bwd.findings([], [], rows))
    n = len(race_bwd.CHAPTER_CASES)
    assert "0.86-0.86x our bf16 backward" in text
    assert f"cuDNN FP8's backward did not run in {n} of {n} cells (d128-b4-s4096, " in text
    assert text.endswith("): unsupported: no frontend")
    # one cell refused for its own reason: named apart, with the cells of each reason
    rows = [dict(r, unsupported="unsupported: head dim") if r["impl"] == "cudnn-fp8" and r["case"] == "d64-b4-s4096"
            else r for r in rows]
    text = "\n".join(report_bwd.findings([], [], rows))
    assert f"did not run in 1 of {n} cells (d64-b4-s4096): unsupported: head dim" in text
    assert f"did not run in {n - 1} of {n} cells" in text
    assert "Dequantise-then-bf16: 0.75-0.75x" in text
    assert report_bwd.findings([], [], []) == ["- FP8 backward: nothing measured yet"]


def test_the_chapter_cells_are_the_kernels_head_dims_with_16k_tokens():
    cases = race_bwd.CHAPTER_CASES
    assert all(H == 16 and B * S == 16384 for _, B, H, S, D, _ in cases)
    assert {D for *_, D, _ in cases} == {64, 128} and all(name.startswith(f"d{D}-") for name, *_, D, _ in cases)
    cases = [c for c in cases if c[4] == 128]
    assert {(S, causal) for _, _, _, S, _, causal in cases} >= {(4096, False), (8192, False), (8192, True),
                                                               (16384, False)}
