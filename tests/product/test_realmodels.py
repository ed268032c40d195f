"""lab.realmodels (chapter n16): the check modules' rows normalised into one kind, the targets judged the same way by the
findings and by chapters/gates.json, every miss named with its number, and the model matrix's CPU part end to end."""
import pytest

from lab import gates, realmodels

GPU_ENV = {"gpu": "NVIDIA H200"}


def _model(name, passed=True, fallbacks=(), dtype="bfloat16"):
    impl = {"logits": 0.01, "tokens_equal": 0.5, "grads": 0.02, "grads_missing": [], "fallbacks": []}
    return {"kind": "model-matrix", "model": name, "dtype": dtype, "head_dim": 256, "refused": {},
            "impls": {"eager": impl, "sdpa": impl, "lab": {**impl, "fallbacks": list(fallbacks)}},
            "pass": passed, "why": "" if passed else "logits 0.5 > 0.021"}


def _varlen(name, bwd, dense=None):
    one = {"median_ms": {"flex": 1.2, "labhost": 0.8, "labhost_fwd": 0.25},
           "host_cu_over_dense": {"_fwd": 1.0, "": 1.0, "+fwd": 1.0}} if dense else {}
    return {"cell": name, "D": 128, "tokens": 16384,
            "flex_over_lab": {"_fwd": 2.0, "": bwd, "+fwd": 1.9},
            "lab_over_dense": {"_fwd": 1.01, "": 1.02, "+fwd": dense} if dense else dict.fromkeys(("_fwd", "", "+fwd")),
            **one}


def _decode(call, timer, ratio):
    return {"B": 8, "S": 16384, "D": 128, "page": 64, "timer": timer, "call": call, "median_ms": 0.1, "ratio": ratio}


def _all_rows(good: bool) -> list[dict]:
    rows = realmodels.model_rows([_model("gemma2"), _model("llama", passed=good,
                                                            fallbacks=() if good else ("lab attention fell back",))])
    rows += realmodels.wide_fwd_rows(realmodels.WIDE_FWD[:2], [2.4, 1.1 if good else 0.93])
    rows += realmodels.wide_bwd_rows([{"case": {"name": "gemma2-local", "B": 1, "S": 8192, "D": 256},
                                       "flex_over_lab": 3.9 if good else 0.8}])
    rows += realmodels.decode_rows([_decode("plain", "gpu", 1.0), _decode("sinks", "gpu", 0.99 if good else 0.9),
                                    _decode("sinks", "cold", 0.5), _decode("kernel", "gpu", 0.5)])
    rows += realmodels.paged_rows([(128, 64, 0.2, 0.2 * (1.0 if good else 0.9), 1.0 if good else 0.9, 1.0)])
    rows += realmodels.varlen_rows([_varlen("docs12", 2.0 if good else 1.2), _varlen("one-length", 2.0,
                                                                                     1.03 if good else 1.08)])
    rows.append(realmodels.checks_row("decode", "masked decode", 0 if good else 2, 5))
    return [{**r, "chapter": realmodels.CHAPTER, "env": GPU_ENV} for r in rows]


def test_normalised_rows_carry_their_targets():
    rows = _all_rows(good=True)
    assert {r["kind"] for r in rows} == {realmodels.KIND}
    decode = [r for r in rows if r["section"] == "decode" and "ratio" in r]
    assert [(r["stage"], r["target"]) for r in decode] == [("masked vs plain (gpu)", 0.95), ("masked vs plain (cold)",
                                                                                           None)]  # plain, kernel out
    varlen = {(r["cell"].split()[0], r["stage"]): r for r in rows if r["section"] == "varlen"}
    assert varlen[("docs12", "bwd vs flex")]["target"] == 1.5 and varlen[("docs12", "fwd vs flex")]["target"] is None
    assert ("docs12", "one-length fwd+bwd vs dense") not in varlen  # no dense peer for uneven documents
    assert varlen[("one-length", "one-length fwd+bwd vs dense")]["op"] == "<="
    # the route's call (cu_seqlens on the host) beside the gated unchecked one, ungated; only where it ran
    host = varlen[("one-length", "bwd vs flex, cu_seqlens on the host")]
    assert host["ratio"] == pytest.approx(1.5) and host["target"] is None
    assert varlen[("one-length", "one-length fwd+bwd vs dense, cu_seqlens on the host")]["target"] is None
    assert ("one-length", "fwd vs flex, cu_seqlens on the host") not in varlen  # no Flex forward in that row
    assert ("docs12", "bwd vs flex, cu_seqlens on the host") not in varlen
    assert not any(realmodels.miss(r) for r in rows)


@pytest.mark.parametrize("good", [True, False])
def test_the_gates_judge_what_the_findings_say(good):
    """Every n16 gate finds rows, and passes on the good rows and fails on the bad ones; the findings name each
    miss with its number."""
    rows = _all_rows(good)
    mine = [g for g in gates.load_gates() if g["chapter"] == realmodels.CHAPTER]
    assert len(mine) >= 9
    results = [gates.evaluate(g, rows) for g in mine]
    assert all(r["status"] == ("pass" if good else "fail") for r in results), results
    text = "\n".join(realmodels.findings(rows))
    if good:
        assert "MISS" not in text and "2 of 2 models pass" in text and "fell back nowhere" in text
    else:
        for number in ("0.930", "0.800", "0.900", "1.200", "1.080"):
            assert "MISS" in text and number in text, (number, text)
        assert "llama fails: logits 0.5" in text and "fell back in 1: llama (1)" in text
        assert "decode: 2 checks failed" in text


def test_a_cell_that_did_not_run_is_a_miss_not_a_pass():
    rows = realmodels.wide_fwd_rows(realmodels.WIDE_FWD[:2], [1.5, None])
    assert [realmodels.miss(r) for r in rows] == [False, True]
    assert any("not run" in line for line in realmodels.findings(rows))
    assert "not run" in realmodels.ratio_table(rows).markdown()


def test_unknown_section_is_refused():
    with pytest.raises(ValueError, match="unknown section"):
        realmodels.run_gpu("gemma")


def test_plot_and_tables(tmp_path, close_figures):
    rows = _all_rows(good=False)
    realmodels.plot(rows, path=tmp_path / "ratios.png")
    assert (tmp_path / "ratios.png").stat().st_size > 0
    table = realmodels.models_table([r for r in rows if r["section"] == "models"]).markdown()
    assert "gemma2" in table and "lab fallbacks" in table
    assert "MISS" in realmodels.ratio_table(rows).markdown()


def test_the_matrix_cpu_part_normalises(session_dir):
    pytest.importorskip("transformers")
    from lab import models

    rows = realmodels.model_rows([models.compare("gemma2", "cpu")])
    assert rows[0]["pass"] and rows[0]["dtype"] == "float32"
    assert rows[0]["fallbacks"] == 1  # a CPU runs no kernel: the adapter says so once
    assert "float32 (a CPU" in realmodels.findings(rows)[0]


def test_run_gpu_names_a_cell_its_race_skipped(session_dir, monkeypatch):
    """A race that drops a cell past its budget (returns nothing for it) leaves a 'not run' miss, never a shifted
    ratio; the rows are appended to the run's records with the chapter's name."""
    from lab import record
    from lab.masks import gpu_varlen, gpu_wide

    monkeypatch.setattr(gpu_wide, "race_wide", lambda budget_s, cells: [] if cells[0][4] == "softcap" else [2.5])
    rows = realmodels.run_gpu("wide-fwd", 60.0, checks=False)
    assert [(r["cell"].split()[0], r["ratio"]) for r in rows] == [("local", 2.5), ("softcap", None), ("window", 2.5)]
    assert any("MISS: wide-fwd softcap" in line and "not run" in line for line in realmodels.findings(rows))

    done = {"cell": "docs12", "D": 128, "tokens": 23100, "flex_over_lab": {"_fwd": 1.1, "": 1.7, "+fwd": 1.5},
            "lab_over_dense": {"_fwd": None, "": None, "+fwd": None}}
    monkeypatch.setattr(gpu_varlen, "race", lambda budget_s, cells: [done] if cells[0][0] == "docs12" else [])
    from lab import bench
    split = gpu_varlen.bwd_bound([2048] * 8, 128, 16, {"dK/dV kernel": 700.0, "pre-pass": 60.0})
    monkeypatch.setattr(gpu_varlen, "bwd_breakdown", lambda lens, D: split)
    monkeypatch.setattr(bench, "ceilings", lambda: {"copy_gbps": 4000.0, "bf16_matmul_tflops": 750.0})
    rows = realmodels.run_gpu("varlen", 60.0, checks=False)
    bwd = {r["cell"].split()[0]: r["ratio"] for r in rows if r["stage"] == "bwd vs flex"}
    assert bwd == {"docs12": 1.7, "one-length": None}
    assert [(r["cell"], r["bound"]) for r in rows if r["stage"] == "bwd kernels"] == [("docs12 D128 (23100 tokens)",
                                                                                      split)]
    stored = record.load(session_dir.parent, kind=realmodels.KIND)
    assert len(stored) == 3 + len(rows) and {r["chapter"] for r in stored} == {realmodels.CHAPTER}


def test_the_backward_bound_is_named_from_its_kernels():
    """gpu_varlen's split of a packed backward: kernels by part, the dK/dV kernel's TFLOP/s from the causal FLOPs,
    each pass's bytes over its time; the finding names each against the run's ceilings, and the row is not gated."""
    from lab.masks import gpu_varlen
    assert gpu_varlen.bwd_part("void bwd_dkdv_packed<Cfg<128>, __nv_bfloat16, false, false>(...)") == "dK/dV kernel"
    assert gpu_varlen.bwd_part("void lab::bwd_pre_packed<__nv_bfloat16, 128>(MaskBwdParams)") == "pre-pass"
    assert gpu_varlen.bwd_part("convert_dq_packed_tile<C, T>") == "dQ convert"
    assert gpu_varlen.bwd_part("Memset (Device)") == "other"
    lens, H, D = [2048] * 8, 16, 128
    bound = gpu_varlen.bwd_bound(lens, D, H, {"dK/dV kernel": 746.0, "pre-pass": 66.0, "dQ convert": 48.0,
                                               "stray rows": 2.0})
    flops = 8 * 2.5 * 4 * H * 2048 * 2048 / 2 * D  # causal: half the pairs
    assert bound["total_us"] == 862.0 and abs(bound["main_tflops"] - flops / 746e-6 / 1e12) < 1e-6
    rows = 8 * 2048 * H
    assert abs(bound["passes_gbps"]["pre-pass"] - rows * (2 * D * 2 + 4 * D + 12) / 66e-6 / 1e9) < 1e-6
    assert abs(bound["passes_gbps"]["dQ convert"] - rows * D * 6 / 48e-6 / 1e9) < 1e-6
    row = realmodels.bound_row("one-length", D, 16384, bound, {"copy_gbps": 4070.4, "bf16_matmul_tflops": 744.6,
                                                               "copy_timing": {}})
    assert not realmodels.miss(row) and row["ceilings"] == {"copy_gbps": 4070.4, "bf16_matmul_tflops": 744.6}
    text = realmodels.findings([row])[-1]
    assert text.startswith("- varlen backward at one-length D128 (16384 tokens): 862 us of GPU time")
    for piece in ("dK/dV kernel 746 us (87 %) at 461 TFLOP/s (bf16 matmul ceiling 745)",
                  "pre-pass 66 us at 4115 GB/s", "dQ convert 48 us at 4194 GB/s", "(copy ceiling 4070 GB/s)",
                  "stray rows 2 us"):
        assert piece in text, (piece, text)
    assert realmodels.ratio_table([row]).rows == []  # shown by the findings, not as a ratio
