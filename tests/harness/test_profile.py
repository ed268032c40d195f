"""lab/profile/ without a GPU: the raw-CSV parser and the decision tree on exports made on an H200
(tests/fixtures/ncu_raw_*.csv, provenance in ncu_fixtures.json), the ncu command line, and the clear
message when ncu is missing or cannot read the counters."""
from __future__ import annotations

import json
import stat

import pytest

from lab import cases, paths, profile
from tests.conftest import FIXTURES

PROVENANCE = json.loads((FIXTURES / "ncu_fixtures.json").read_text())["files"]


def _raw(name: str) -> dict:
    kernels = profile.parse_raw_csv((FIXTURES / name).read_text())
    assert len(kernels) == 1, "each fixture holds exactly one profiled launch"
    return kernels[0]


def _metrics(name: str) -> dict:
    m = profile.summarize(_raw(name))
    m["host_us_per_call"] = PROVENANCE[name]["host_us_per_call"]
    return m


# ------------------------------------------------------------------ parser

def test_parser_reads_units_and_numbers():
    raw = _raw("ncu_raw_fwd_v04.csv")
    assert raw["_units"]["gpu__time_duration.sum"] == "ns"
    m = profile.summarize(raw)
    assert m["duration_us"] == pytest.approx(raw["gpu__time_duration.sum"] / 1e3)
    assert "attn_fwd_v04_kernel" in m["kernel"]
    assert m["registers"] > 0 and m["smem_bytes"] > 0
    assert 0 < m["occupancy_pct"] <= 100 and 0 < m["l2_hit_pct"] <= 100
    assert m["local_bytes"] == 0  # v04 does not spill (ptxas says the same)
    assert len(m["stalls"]) == 5 and m["stalls"][0]["cycles_per_issue"] >= m["stalls"][-1]["cycles_per_issue"]
    assert all(s["reason"] != "selected" for s in m["stalls"]), "issuing is not a stall"
    assert m["tensor_pct"] == raw["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"]


def test_parser_thousands_separators_and_rejects_other_pages():
    text = '"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum"\n"","","byte","usecond"\n' \
           '"0","k","1,234,567","2.5"\n'
    [row] = profile.parse_raw_csv(text)
    assert row["dram__bytes_read.sum"] == 1234567.0
    assert profile.summarize(row)["duration_us"] == 2.5
    with pytest.raises(ValueError, match="raw-page"):
        profile.parse_raw_csv("Section: GPU Speed Of Light Throughput\n  Duration  usecond  1.2\n")


def test_bank_conflicts_loads_and_stores_counted():
    raw = _raw("ncu_raw_fwd_v01.csv")
    m = profile.summarize(raw)
    assert m["bank_conflicts_ld"] == raw["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"] > 0
    assert m["bank_conflicts_st"] == raw["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"] > 0
    wavefronts = (raw["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"]
                  + raw["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"])
    assert m["bank_conflict_frac"] == pytest.approx((m["bank_conflicts_ld"] + m["bank_conflicts_st"]) / wavefronts)


# ------------------------------------------------------------------ the four known answers

@pytest.mark.parametrize("name", [n for n, p in PROVENANCE.items() if p["known"]])
def test_tree_on_known_answers(name):
    verdict = profile.decide(_metrics(name))
    assert verdict["label"] == PROVENANCE[name]["known"], verdict["reason"]


def test_v01_is_a_shared_memory_bound_ffma_chain():
    verdict = profile.decide(_metrics("ncu_raw_fwd_v01.csv"))
    assert verdict["label"] == "memory:shared"
    assert verdict["pipe"] == "fma", "the busiest pipe of the scalar kernel is the FMA pipe"
    assert verdict["stall"] == "short_scoreboard", "its warps wait on shared memory"


def test_decode_at_its_byte_floor():
    case = profile.find_case(PROVENANCE["ncu_raw_decode_v02.csv"]["case"])
    row = profile.row_from_raw(_raw("ncu_raw_decode_v02.csv"), "decode:v02", case, "decode/v02_mma.cu", 136.6)
    assert row["metrics"]["bytes_over_floor"] == pytest.approx(1.0, abs=0.05)
    assert row["verdict"]["label"] == "memory:dram" and "byte floor" in row["verdict"]["reason"]
    assert row["source_hash"] and row["case"]["name"] == case.name and row["tree"] == profile.TREE


def test_wgmma_kernel_gets_its_own_advice():
    verdict = profile.decide(_metrics("ncu_raw_sdpa_cudnn.csv"))
    assert verdict["label"] == "compute:tensor" and "wgmma already" in verdict["action"]
    assert "wgmma on Hopper" in profile.decide(_metrics("ncu_raw_fwd_v04.csv"))["action"]


# ------------------------------------------------------------------ thresholds are data

def test_thresholds_are_data():
    m = _metrics("ncu_raw_fwd_v04.csv")
    assert profile.decide(m, {"compute_pct": 60.0})["bound"] == "latency"  # the old bar, written down in TREE
    seed = _metrics("ncu_raw_seed_small.csv")
    assert profile.decide(seed, {"launch_us": 1.0})["label"] == "launch", "the host-time rule still holds"
    assert profile.decide(seed, {"launch_us": 1.0, "launch_host_ratio": 100.0})["bound"] == "latency"


def _synthetic(**values):
    base = {"duration_us": 500.0, "sm_pct": 20.0, "memory_pct": 20.0, "dram_pct": 10.0, "l2_pct": 10.0,
            "l1_pct": 10.0, "pipes": {"fma": 10.0}, "stalls": [{"reason": "long_scoreboard"}]}
    return {**base, **values}


def test_memory_levels_farthest_first():
    assert profile.decide(_synthetic(dram_pct=80, l2_pct=90, memory_pct=90))["unit"] == "dram"
    assert profile.decide(_synthetic(dram_pct=20, l2_pct=90, memory_pct=90))["unit"] == "l2"
    conflicts = profile.decide(_synthetic(l1_pct=85, memory_pct=85, bank_conflict_frac=0.45))
    assert conflicts["label"] == "memory:shared" and "bank-conflict" in conflicts["action"]


def test_latency_names_its_stall_and_dram_floor_advice():
    verdict = profile.decide(_synthetic())
    assert verdict["label"] == "latency:long_scoreboard" and "bytes in flight" in verdict["action"]
    assert "re-reads" in profile.decide(_synthetic(dram_pct=90, memory_pct=90, bytes_over_floor=2.0))["action"]


# ------------------------------------------------------------------ targets and the ncu command

def test_kernel_filters_come_from_the_sources():
    fwd, dec = profile.find_case("fwd-d128-s2048"), profile.find_case("dec-h8-b8-kv16384")
    assert profile.kernel_regex("fwd:v01", fwd) == "attn_fwd_v01_kernel"
    assert profile.kernel_regex("decode:v02", dec) == "mma_partial_kernel"  # not the shared combine kernel
    assert profile.kernel_source("op:decode", dec) == "decode/v07_swizzle.cu"  # GQA rows at D 128: lab.ops.decode picks v07
    assert profile.kernel_regex("decode:v07", dec) == "warpring_partial_kernel"  # not the shared combine kernel
    assert profile.kernel_source("sdpa:flash", fwd) is None
    with pytest.raises(ValueError, match="target"):
        profile.parse_target("fwd")
    with pytest.raises(ValueError, match="v99"):
        profile.parse_target("fwd:v99")
    with pytest.raises(ValueError, match="no case set"):
        profile.find_case("no-such-case")


def test_bench_fwd_cells_off_the_default_lengths_are_found():
    case = profile.find_case("fwd-d64-s4096-c", "bfloat16")  # n9's full race times S 4096, bench-fwd's list does not
    assert (case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal) == (8, 32, 4096, 4096, 64, True)
    assert profile.find_case("fwd-d128-s4096").causal is False
    with pytest.raises(ValueError, match="no case set"):
        profile.find_case("fwd-d64-s4096-x")


def test_backward_targets_profile_the_backward():
    case = profile.find_case("bwd-d128-s4096")
    assert profile.kernel_source("bwd:v02", case) == "bwd/v02_wgmma.cu"
    assert profile.kernel_regex("bwd:v02", case) == "bwd_dkdv_v02"  # its own kernel, not the shared convert pass
    # v14 includes a header that includes the one defining its kernel template: the nearest definition is found
    assert profile.kernel_regex("bwd:v14", case) == "bwd_dkdv_stagger"
    assert profile.kernel_regex("sdpa-bwd:cudnn", case) == profile.SDPA_BWD_KERNELS["cudnn"]
    assert profile.work_flops(case, "bwd:v02") == 2.5 * profile.work_flops(case)
    assert profile.byte_floor(case, "sdpa-bwd:cudnn") == 2 * profile.byte_floor(case)
    with pytest.raises(ValueError, match="v99"):
        profile.parse_target("bwd:v99")


def test_measured_flops_match_the_formula_where_nothing_is_padded():
    case = profile.find_case("fwd-d128-s2048")
    m = profile.summarize(_raw("ncu_raw_fwd_v04.csv"))
    assert m["tensor_flops"] == profile.work_flops(case)  # every MMA of a non-causal S=2048 tile grid is useful
    assert m["measured_flops"] >= m["tensor_flops"] and m["fp32_flops"] > 0
    dec = profile.summarize(_raw("ncu_raw_decode_v02.csv"))  # 4 query rows per KV head fill 16-row MMA tiles
    assert dec["tensor_flops"] == pytest.approx(4 * profile.work_flops(profile.find_case("dec-h8-b8-kv16384")), rel=0.01)


def test_reports_kept_within_the_run_budget(session_dir, monkeypatch):
    folder = session_dir / "ncu"
    folder.mkdir(parents=True)
    big = folder / "first.ncu-rep"
    big.write_bytes(b"x" * (profile.RUN_REP_BUDGET - 100))
    new = folder / "second.ncu-rep"
    new.write_bytes(b"x" * 1000)
    monkeypatch.setattr(profile.ncu, "run_ncu", lambda *a, **k: (new, "sections"))
    monkeypatch.setattr(profile.ncu, "export_raw", lambda rep: (FIXTURES / "ncu_raw_seed_small.csv").read_text())
    monkeypatch.setattr(profile.ncu, "ncu_version", lambda: "test")
    row = profile.measure("op:attention", "Small")
    assert row["ncu"]["report"] is None and not new.exists(), "over the run's budget: only the record stays"
    assert row["verdict"]["label"] == "launch" and row["kind"] == "profile"
    assert (session_dir / "records.jsonl").read_text().count('"kind": "profile"') == 1


def test_byte_floor_and_flops_use_the_lab_formulas():
    dec = profile.find_case("dec-h8-b8-kv16384")
    assert profile.byte_floor(dec) >= cases.decode_kv_bytes(dec)
    fwd = profile.find_case("fwd-d128-s2048")
    assert profile.byte_floor(fwd) == 4 * fwd.B * fwd.Hq * fwd.Sq * fwd.D * 2


def test_ncu_command_leaves_clocks_alone():
    cmd = profile.ncu_command("ncu", ["python"], "attn_fwd_v04_kernel", 3, paths.ROOT / "x", nvtx=True)
    joined = " ".join(cmd)
    assert "--clock-control none" in joined and "-k regex:attn_fwd_v04_kernel" in joined
    assert "--launch-skip 3" in joined and "--launch-count 1" in joined and "--nvtx-include" in joined
    assert cmd[-1] == "python"


def test_missing_ncu_is_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setattr(profile.ncu, "find_ncu", lambda: None)
    with pytest.raises(profile.ProfileUnavailable, match="not installed"):
        profile.run_ncu("fwd:v04", "Small", tmp_path)


def test_counter_permission_error_is_explained(monkeypatch, tmp_path):
    fake = tmp_path / "ncu"  # an ncu that fails the way a locked-down driver makes it fail
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(profile.ncu, "find_ncu", lambda: str(fake))
    with pytest.raises(profile.ProfileUnavailable, match="ERR_NVGPUCTRPERM.*NVreg_RestrictProfilingToAdminUsers"):
        profile.run_ncu("fwd:v04", "Small", tmp_path / "out")
    assert "gVisor" in profile.explain_failure("==ERROR== Failed to initialize the profiler: LibraryNotLoaded")
    assert "'flash'" in profile.explain_failure("==WARNING== No kernels were profiled.", "flash", 3)


def test_source_regions_finds_the_hot_stretch_and_its_reasons():
    header = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
              '"stall_wait","stall_math","stall_wait (Not Issued)"')
    body = [f'"0x{i:x}","{op}","{n}","1","{w}","{m}","0"' for i, (op, n, w, m) in enumerate(
        [("FMNMX R1, R2, R3", 1, 1, 0)] * 4 + [("@!P0 MUFU.EX2 R4, R4", 90, 80, 10)] * 4 + [("NOP", 0, 0, 0)] * 4)]
    text = '"Kernel Name","k"\n' + header + "\n" + "\n".join(body) + "\n"
    regs = profile.source_regions(text, block=4, floor=0.05)
    assert [r["first"] for r in regs] == [4]  # the first block holds 1 % of the samples, the last none
    assert abs(regs[0]["share"] - 360 / 364) < 1e-9
    assert regs[0]["stalls"][0] == ("wait", 320) and regs[0]["ops"] == [("MUFU.EX2", 4)]
    with pytest.raises(ValueError, match="source-page"):
        profile.source_regions("a,b\n1,2\n")
