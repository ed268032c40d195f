"""lab.ring.run under torchrun on the CPU (gloo, 2 processes, tiny sizes): what CI and n12_ring's CPU mode run.
Its rows (checks, scaling, communication, timelines, largest sequence) carry world_size and efficiency and
are CPU rows; the transport's pieces (StepClock, the compute-only stand-in, the serial mode) on their own;
the findings and figures from the rows; the gates of n12 count only GPU rows."""
from __future__ import annotations

import json
import socket

import matplotlib
import pytest
import torch

from lab import gates, record
from lab.ring import attention as ring
from lab.ring import comm as dist_comm
from lab.ring import report as dist_report
from lab.ring import report_bwd as dist_report_bwd

# pytest-xdist (make test): the module's tests stay on one worker, so the torchrun run is made once, by its module fixture
pytestmark = pytest.mark.xdist_group("test_dist_run")

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def rows(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("ring")
    mp_ = pytest.MonkeyPatch()
    mp_.setenv("LAB_SESSION_DIR", str(folder))
    request.addfinalizer(mp_.undo)
    found = dist_report.launch(2, "cpu", timeout=300)
    assert found == [r for r in record.read(folder / record.RECORDS)]  # only this run's rows, all of them
    return found


def test_torchrun_cpu_run_records_every_stage(rows):
    kinds = {r["kind"] for r in rows}
    assert kinds == {"check", "ring-scale", "ring-comm", "ring-timeline", "ring-largest-step", "ring-largest",
                     "grad-check", "ring-train", "ring-scale-fwd-bwd", "ring-comm-bwd", "ring-torch-cp",
                     "ring-torch-cp-race", "ring-largest-fwd-bwd-step", "ring-largest-fwd-bwd"}
    assert all(r["world_size"] == 2 and r["chapter"] == "n12_ring" and r["env"]["gpu"] == "cpu" for r in rows)
    assert all(r["commit"] and r["env"]["torch"] for r in rows)  # lab.record's common fields


def test_checks_pass_and_the_no_lse_merge_fails(rows):
    checks = dist_report.of(rows, "check")
    good = [r for r in checks if not r.get("expected_fail")]
    bad = [r for r in checks if r.get("expected_fail")]
    assert len(good) == 6 and all(r["check"]["passed"] for r in good)
    assert {(r["case"]["name"], r["case"]["causal"]) for r in good} >= {("ring-gqa", True), ("ring-uneven", False)}
    assert bad and not any(r["check"]["passed"] for r in bad)


def test_gradient_checks_pass_and_the_block_lse_backward_fails(rows):
    grads = dist_report.of(rows, "grad-check")
    good = [r for r in grads if not r.get("expected_fail")]
    bad = [r for r in grads if r.get("expected_fail")]
    assert len(good) == 18 and all(r["check"]["passed"] for r in good)  # 3 cases x causal and not x dQ, dK, dV
    assert {r["grad"] for r in good} == {"dq", "dk", "dv"}
    assert {(r["case"]["name"], r["case"]["causal"]) for r in good} >= {("ring-grad-gqa", True), ("ring-grad-uneven", False)}
    assert len(bad) == 6 and not any(r["check"]["passed"] for r in bad)


def test_the_sharded_model_trains_like_one_device(rows):
    (run,) = dist_report.of(rows, "ring-train")
    assert len(run["losses"]) == len(run["losses_single"]) == run["case"]["steps"] == 6
    assert run["max_rel_diff"] < 1e-10 and run["losses"][-1] < run["losses"][0]


def test_scaling_and_communication_rows(rows):
    (scale,) = dist_report.of(rows, "ring-scale")
    assert scale["efficiency"] == pytest.approx(
        record.scaling_efficiency(scale["single"]["median_ms"], scale["timing"]["median_ms"], 2))
    # the yardstick of the front page's ring row: SDPA on one device over the whole sequence (math on the CPU)
    assert set(scale["sdpa"]) == {"sdpa-math"} and scale["sdpa"]["sdpa-math"]["median_ms"] > 0
    assert scale["ratios"] == {"sdpa-math": pytest.approx(scale["sdpa"]["sdpa-math"]["median_ms"]
                                                          / scale["timing"]["median_ms"])}
    (comm,) = dist_report.of(rows, "ring-comm")
    assert comm["comm_ratio"] == pytest.approx(comm["timing"]["median_ms"] / comm["compute_only"]["median_ms"])
    lines = [r for r in dist_report.of(rows, "ring-timeline") if r.get("pass", "forward") == "forward"]
    assert {(r["mode"], r["rank"]) for r in lines} == {(m, k) for m in ("overlap", "serial", "compute-only") for k in (0, 1)}
    for r in lines:
        assert [s["step"] for s in r["steps"]] == [0, 1]
        assert all(s["compute_end_ms"] >= s["compute_start_ms"] >= 0 for s in r["steps"])
        transfers = [s for s in r["steps"] if "comm_start_ms" in s]
        assert len(transfers) == (0 if r["mode"] == "compute-only" else 1)  # W - 1 transfers
        if r["mode"] == "serial":  # the transfer ends before that step's compute starts
            assert transfers[0]["comm_end_ms"] <= r["steps"][0]["compute_start_ms"]


def test_forward_plus_backward_scaling_and_the_backward_ring_rows(rows):
    (scale,) = dist_report.of(rows, "ring-scale-fwd-bwd")
    assert scale["efficiency"] == pytest.approx(
        record.scaling_efficiency(scale["single"]["median_ms"], scale["timing"]["median_ms"], 2))
    assert scale["single_peak_gib"] > 0 and scale["case"]["S"] == 512
    (comm,) = dist_report.of(rows, "ring-comm-bwd")
    assert comm["comm_ratio"] == pytest.approx(comm["timing"]["median_ms"] / comm["compute_only"]["median_ms"])
    lines = [r for r in dist_report.of(rows, "ring-timeline") if r.get("pass") == "backward"]
    assert {(r["mode"], r["rank"]) for r in lines} == {(m, k) for m in ("overlap", "serial", "compute-only") for k in (0, 1)}
    for r in lines:  # W compute steps; W - 1 K/V transfers (steps 0..W-2) and W dK/dV sums (steps W..2W-1)
        assert [s["step"] for s in r["steps"] if "compute_start_ms" in s] == [0, 1]
        transfers = sorted(s["step"] for s in r["steps"] if "comm_start_ms" in s)
        assert transfers == ([] if r["mode"] == "compute-only" else [0, 2, 3])
        if r["mode"] == "serial":  # each K/V transfer ends before its step's compute starts
            first = next(s for s in r["steps"] if s["step"] == 0)
            assert first["comm_end_ms"] <= first["compute_start_ms"]


def test_torch_context_parallel_rows_say_what_ran(rows):
    """On the CPU torch's ring has no SDPA kernel to dispatch to: every configuration's error is recorded, and
    the race row has no speedup (its gate: no data), never a number."""
    tried = dist_report.of(rows, "ring-torch-cp")
    assert {(r["backend"], r["rotate"]) for r in tried} == {("math", "allgather"), ("math", "alltoall")}
    for r in tried:
        assert ("timing" in r) != ("error" in r) and r["lab"]["median_ms"] > 0
        assert r["speedup"] == (r["timing"]["median_ms"] / r["lab"]["median_ms"] if "timing" in r else None)
    (race,) = dist_report.of(rows, "ring-torch-cp-race")
    ran = [r for r in tried if "timing" in r]
    assert (race["speedup"] is None) == (not ran) and len(race["errors"]) == len(tried) - len(ran)


def test_largest_forward_plus_backward_rows(rows):
    steps = dist_report.of(rows, "ring-largest-fwd-bwd-step")
    assert [(r["devices"], r["case"]["S"]) for r in steps] == [(d, s) for d in (1, 2) for s in (512, 1024, 2048)]
    assert all(r["finite"] and len(r["memory"]) == r["devices"] for r in steps)
    best = {r["devices"]: r for r in dist_report.of(rows, "ring-largest-fwd-bwd")}
    assert set(best) == {1, 2} and all(r["S"] == 2048 and r["projected_fit_tokens"] > 2048 for r in best.values())


def test_largest_sequence_rows(rows):
    steps = dist_report.of(rows, "ring-largest-step")
    assert [r["case"]["S"] for r in steps] == [512, 1024, 2048] and all(r["finite"] for r in steps)
    (best,) = dist_report.of(rows, "ring-largest")
    assert best["S"] == 2048 and len(best["memory"]) == 2 and best["peak_gib"] > 0


def test_findings_figures_and_tables_from_the_rows(rows, tmp_path):
    text = "\n".join(dist_report.findings(rows))
    assert "checks: 6/6 pass" in text and "gradient checks (dQ, dK, dV through autograd): 18/18 pass" in text
    assert "efficiency" in text and "target judged on GPUs only" in text
    assert "not GPU numbers" in text
    assert dist_report.timeline_figure(rows, path=tmp_path / "t.png") and (tmp_path / "t.png").stat().st_size
    assert dist_report.layout_figure(16, 4, path=tmp_path / "l.png")
    assert "8/8 checks as expected" in dist_report.check_table(rows).markdown()
    assert "compute only" in dist_report.timing_table(rows).markdown()
    assert "forward+backward" in dist_report.timing_table(rows).markdown()
    assert dist_report.timeline_figure(rows, path=tmp_path / "b.png", which="backward")
    assert dist_report_bwd.loss_figure(rows, path=tmp_path / "loss.png") and (tmp_path / "loss.png").stat().st_size
    assert "24/24 gradient checks as expected" in dist_report_bwd.grad_check_table(rows).markdown()
    assert "math" in dist_report_bwd.torch_cp_table(rows).markdown()
    assert len(dist_report_bwd.largest_table(rows).rows) == 6
    for needle in ("forward+backward scaling at S=512", "backward communication:", "torch's context parallel did not run",
                   "longest forward+backward of one layer", "training: 6 steps"):
        assert needle in text, needle


def test_n12_gates_count_gpu_rows_only(rows):
    declared = [g for g in gates.load_gates() if g["chapter"] == "n12_ring" and g.get("gpu_only")]
    assert len(declared) == 11  # beside them, the emulated backward's two gates count CPU rows too
    assert all(gates.evaluate(g, rows)["status"] == "no data" for g in declared)
    as_gpu = [dict(r, env={**r["env"], "gpu": "NVIDIA H200"}) for r in rows]
    found = {g["name"]: gates.evaluate(g, as_gpu)["status"] for g in declared}
    assert found["every ring check passes (causal and not, GQA, uneven shards)"] == "pass"
    assert found["a ring that merges without LSE weights fails the check"] == "pass"
    assert found["every ring gradient check passes (dQ, dK, dV; causal and not, GQA, uneven shards)"] == "pass"
    assert found["a ring backward with each block's own LSE fails the gradient check"] == "pass"
    assert found["the sharded model's loss curve matches one device's (relative difference <= 0.02)"] == "pass"
    # the CPU preset's shape is not the gate's (S = 256k, GQA 32/8), and torch's ring could not run on the CPU
    assert found["forward+backward scaling efficiency >= 0.9 on 2 GPUs at S=256k, causal, D=128, GQA 32/8"] == "no data"
    assert found["the lab's ring >= 1.0x torch's context parallel over SDPA (its fastest configuration), forward+backward, "
                 "same shapes"] == "no data"
    assert found["backward communication hidden: backward ring with transfers <= 1.1x compute-only"] in ("pass", "fail")


def test_record_fills_world_size_from_torchrun(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    row = record.append({"kind": "x"}, chapter="n12_ring", folder=tmp_path, env={"gpu": "cpu"})
    assert row["world_size"] == 2
    assert record.append({"kind": "x", "world_size": 4}, folder=tmp_path, env={})["world_size"] == 4
    monkeypatch.delenv("RANK")
    assert "world_size" not in record.append({"kind": "x"}, folder=tmp_path, env={})
    assert record.scaling_efficiency(100.0, 50.0, 2) == 1.0
    assert record.scaling_efficiency(100.0, 62.5, 2) == 0.8


def test_multicast_off_and_the_session_command():
    assert dist_comm.multicast_off() == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                         "NVSHMEM_DISABLE_NVLS": "1"}
    assert "--chapters n12_ring --device cuda" in dist_report.SESSION_COMMAND and "$OUT" in dist_report.SESSION_COMMAND


def test_step_clock_and_the_compute_only_stand_in():
    clock = ring.StepClock(cuda=False)
    clock.mark(0, "compute", "start")
    clock.mark(0, "compute", "end")
    (step,) = clock.steps()
    assert step["step"] == 0 and 0 <= step["compute_start_ms"] <= step["compute_end_ms"]
    kv = torch.ones(2, 1, 2, 5, 4)
    assert dist_comm.transfer(kv, 5, (0, 0), None, 0, None, None, communicate=False).wait() is kv
    other = dist_comm.transfer(kv, 3, (0, 0), None, 0, None, None, communicate=False).wait()
    assert other.shape == (2, 1, 2, 3, 4) and not other.any()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        gen = torch.Generator().manual_seed(3)
        q, k, v = (torch.randn(1, h, 37, 8, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
        ref, _ = ring.reference_attend(q, k, v, True)
        mine = [ring.shard(t, world, rank, True) for t in (q, k, v)]
        clock = ring.StepClock(cuda=False)
        serial = ring.ring_attention(*mine, is_causal=True, overlap=False, clock=clock)
        alone = ring.ring_attention(*mine, is_causal=True, communicate=False)
        own = ring.shard(ref, world, rank, True)
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"serial": float((serial - own).abs().max()), "steps": clock.steps(),
                       "alone_shape": list(alone.shape), "own_shape": list(own.shape)}, f)
    finally:
        dist.destroy_process_group()


def test_serial_ring_over_gloo_world_3(tmp_path, ranks):
    """overlap=False gives the same result; the clock has W steps and W - 1 transfers, each ended before its
    step's compute; communicate=False runs the same steps with no transfer (shapes only: stand-in shards)."""
    path = str(tmp_path / "result")
    ranks(_worker, (3, _free_port(), path), 3)
    for rank in range(3):
        result = json.load(open(f"{path}.{rank}"))
        assert result["serial"] < 1e-12
        assert result["alone_shape"] == result["own_shape"]
        steps = result["steps"]
        assert len(steps) == 3 and sum("comm_end_ms" in s for s in steps) == 2
        assert all(s["comm_end_ms"] <= s["compute_start_ms"] for s in steps if "comm_end_ms" in s)
