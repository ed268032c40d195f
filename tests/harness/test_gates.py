"""Gates: declared as data, judged against records; no data is never a pass."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest

from lab import gates

GPU = {"gpu": "NVIDIA H100 80GB HBM3"}
CPU = {"gpu": "cpu"}
FLASH_GATE = {"chapter": "n6_fa2", "name": "v02 >= 1.0x flash", "metric": "ratios.sdpa-flash", "op": ">=",
              "value": 1.0, "gpu_only": True,
              "query": {"kind": "fwd", "impl": "v02", "D": 128, "Sk": 8192, "causal": False}}


def fwd(ratio, env=GPU, D=128, S=8192, causal=False):
    return {"kind": "fwd", "impl": "v02", "env": env, "ratios": {"sdpa-flash": ratio},
            "case": {"name": "big", "D": D, "Sq": S, "Sk": S, "causal": causal}}


def test_threshold_pass_and_fail_report_the_worst_value():
    passed = gates.evaluate(FLASH_GATE, [fwd(1.2), fwd(1.05)])
    assert passed["status"] == "pass" and passed["measured"] == 1.05 and passed["rows"] == 2
    failed = gates.evaluate(FLASH_GATE, [fwd(1.2), fwd(0.9)])
    assert failed["status"] == "fail" and failed["passed"] is False and failed["measured"] == 0.9


def test_case_filters_select_only_the_declared_shape():
    result = gates.evaluate(FLASH_GATE, [fwd(0.5, D=64), fwd(0.5, causal=True), fwd(1.3)])
    assert result["status"] == "pass" and result["rows"] == 1


def test_cpu_rows_never_satisfy_a_gpu_gate():
    result = gates.evaluate(FLASH_GATE, [fwd(5.0, env=CPU)])
    assert result["status"] == "no data" and result["passed"] is None
    assert gates.evaluate(FLASH_GATE, [])["status"] == "no data"


def test_all_op_with_globs_lists_and_not():
    gate = {"chapter": "n3_harness", "name": "wrong kernels fail", "metric": "check.passed", "op": "all",
            "value": False, "query": {"kind": "check", "impl": "selftest: *", "not": {"impl": "*control*"}}}
    rows = [{"kind": "check", "impl": f"selftest: {name}", "env": CPU, "check": {"passed": name == "control"}}
            for name in ("control", "missing scale", "one unwritten row")]
    result = gates.evaluate(gate, rows)
    assert result["status"] == "pass" and result["measured"] == "2/2 rows"
    rows[1]["check"]["passed"] = True  # a wrong kernel slipping through fails the gate
    assert gates.evaluate(gate, rows)["status"] == "fail"
    assert gates.matches({"kind": "check"}, {"kind": ["fwd", "check"]})


def test_a_gate_naming_default_follows_the_registry_per_shape_and_gpu():
    """"impl": "default" selects the rows of the version lab.ops runs for that row's shape on that row's GPU:
    on Hopper v05 for causal D=64 up to 4096 queries and v07 above, v04 elsewhere (lab.registry)."""
    gate = {"chapter": "n9_hopper", "name": "default passes", "metric": "check.passed", "op": "all", "value": True,
            "gpu_only": True, "query": {"kind": "check", "impl": "default"}}

    def check(impl, Sq, capability, passed=True):
        return {"kind": "check", "impl": impl, "env": {"gpu": "G", "capability": capability},
                "check": {"passed": passed}, "case": {"D": 64, "Sq": Sq, "Sk": Sq, "causal": True}}
    rows = [check("v05", 2048, "9.0"), check("v07", 4097, "9.0"), check("v07", 2048, "9.0", passed=False),
            check("v04", 2048, "9.0", passed=False), check("v04", 2048, "8.0")]
    result = gates.evaluate(gate, rows)  # v07 at 2048 and v04 on Hopper are not the default: not counted
    assert result["status"] == "pass" and result["rows"] == 3
    rows.append(check("v05", 256, "9.0", passed=False))  # the default failing fails the gate
    assert gates.evaluate(gate, rows)["status"] == "fail"
    decode = {"kind": "check", "impl": "v07", "env": {"gpu": "G"}, "check": {"passed": True},
              "case": {"Hq": 32, "Hkv": 32, "q_len": 1, "kv_len": 64, "D": 128}}
    assert gates.matches(decode, {"impl": "default"}) and not gates.matches({**decode, "impl": "v01"}, {"impl": "default"})
    assert not gates.matches({"kind": "check", "impl": "v04"}, {"impl": "default"})  # no shape: no default


def test_dotted_metric_and_type_mismatch_fail_without_crashing():
    assert gates.field({"ratios": {"sdpa-flash": 2.0}}, "ratios.sdpa-flash") == 2.0
    assert gates.field({"caught": {"one unwritten row": True}}, "caught.one unwritten row") is True
    assert gates.field({"a": 1}, "a.b") is None
    row = {"kind": "build", "step": "cached", "seconds": "slow", "env": CPU}
    gate = {"chapter": "n2", "name": "cached", "metric": "seconds", "op": "<=", "value": 1, "query": {"kind": "build"}}
    assert gates.evaluate(gate, [row])["status"] == "fail"


def test_repository_gates_file_is_valid_and_covers_the_chapters():
    from lab import toc

    declared = gates.load_gates()
    chapters = {g["chapter"] for g in declared}
    book = toc.chapters()
    assert chapters <= set(book), f"gates of chapters that are not in _toc.yml: {sorted(chapters - set(book))}"
    assert len(chapters) >= 6  # n2-n7 at least: every chapter that measures something has gates
    assert all(gates.evaluate(g, [])["status"] == "no data" for g in declared)


def test_bad_gate_file_is_rejected(tmp_path):
    path = tmp_path / "gates.json"
    path.write_text(json.dumps([{"chapter": "x", "name": "y", "query": {}, "metric": "m", "op": "~"}]))
    with pytest.raises(ValueError, match="unknown op"):
        gates.load_gates(path)
    assert gates.load_gates(tmp_path / "absent.json") == []
