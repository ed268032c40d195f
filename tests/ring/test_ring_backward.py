"""lab.ring.backward on the CPU: the ring's gradients against float64 autograd of full attention, emulated in one
process and over gloo with world sizes 2-4 (causal zig-zag and not, GQA, uneven shards), and the deliberately
wrong ring (each block's own lse in place of the merged one) failing the same check."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from lab.ring import attention as ring
from lab.ring import backward as ring_bwd
from tests.ring.test_dist import _free_port, _inputs


def full_grads(q, k, v, dout, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [5, 37, 64])
def test_emulated_ring_gradients_equal_full_attention(world, causal, seqlen):
    q, k, v = _inputs(2, 6, 2, seqlen, 16, seed=seqlen)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    got = ring_bwd.emulate_ring_backward(q, k, v, dout, world, causal)
    for name, a, b in zip(("dq", "dk", "dv"), got, full_grads(q, k, v, dout, causal)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_ring_without_the_merged_lse_fails(world, causal):
    q, k, v = _inputs(1, 4, 2, 37, 16, seed=3)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    wrong = ring_bwd.emulate_ring_backward(q, k, v, dout, world, causal, block_lse=True)
    want = full_grads(q, k, v, dout, causal)
    worst = max(float((a - b).abs().max()) for a, b in zip(wrong, want))
    assert worst > 1e-2, worst


def test_the_block_backward_is_the_float64_gradient_of_one_block():
    q, k, v = _inputs(2, 4, 2, 9, 8, seed=1)
    dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for causal in (False, True):
        out, lse = ring.reference_attend(q, k, v, causal)
        got = ring_bwd.reference_attend_backward(q, k, v, out, dout, lse, causal)
        for a, b in zip(got, full_grads(q, k, v, dout, causal)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def _worker(rank, world, port, seqlen, causal, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        q, k, v = _inputs(2, 6, 2, seqlen, 16, seed=seqlen)
        dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
        mine = [ring.shard(t, world, rank, causal).requires_grad_() for t in (q, k, v)]
        out = ring.ring_attention(*mine, is_causal=causal)
        grads = torch.autograd.grad(out, mine, ring.shard(dout, world, rank, causal))
        want = [ring.shard(g, world, rank, causal) for g in full_grads(q, k, v, dout, causal)]
        err = max(float((a - b).abs().max()) if a.numel() else 0.0 for a, b in zip(grads, want))
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"rank": rank, "max_abs": err, "shapes": [list(g.shape) for g in grads]}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_gradients_over_gloo_equal_full_attention(world, causal, tmp_path, ranks):
    seqlen = 37  # uneven: no shard boundary falls on a multiple of the world size
    path = str(tmp_path / "result")
    ranks(_worker, (world, _free_port(), seqlen, causal, path), world)
    results = [json.load(open(f"{path}.{r}")) for r in range(world)]
    assert max(r["max_abs"] for r in results) < 1e-10, results


def _modes_worker(rank, world, port, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        seqlen = 37
        q, k, v = _inputs(1, 4, 2, seqlen, 8, seed=5)
        dout = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
        mine = [ring.shard(t, world, rank, True) for t in (q, k, v, dout)]
        out, lse = ring.ring_forward(*mine[:3], is_causal=True)
        want = [ring.shard(g, world, rank, True) for g in full_grads(q, k, v, dout, True)]
        clock = ring.StepClock(cuda=False)
        serial = ring_bwd.ring_attention_backward(*mine[:3], out, lse, mine[3], True, overlap=False, clock=clock)
        alone = ring_bwd.ring_attention_backward(*mine[:3], out, lse, mine[3], True, communicate=False)
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"serial": max(float((a - b).abs().max()) for a, b in zip(serial, want)), "steps": clock.steps(),
                       "alone": [list(g.shape) for g in alone], "want": [list(g.shape) for g in want]}, f)
    finally:
        dist.destroy_process_group()


def test_serial_and_compute_only_backward_over_gloo_world_3(tmp_path, ranks):
    """overlap=False gives the same gradients, each K/V transfer ended before its step's compute; W - 1 K/V
    transfers and W dK/dV sums; communicate=False runs the same steps with no transfer (shapes only)."""
    path = str(tmp_path / "result")
    ranks(_modes_worker, (3, _free_port(), path), 3)
    for rank in range(3):
        result = json.load(open(f"{path}.{rank}"))
        assert result["serial"] < 1e-10 and result["alone"] == result["want"]
        steps = {s["step"]: s for s in result["steps"]}
        assert sorted(s for s in steps if "comm_start_ms" in steps[s]) == [0, 1, 3, 4, 5]
        assert all(steps[s]["comm_end_ms"] <= steps[s]["compute_start_ms"] for s in (0, 1))
