"""lab.ring: ring attention, checked on the CPU. The layout and the LSE merge in one process, then the real
ring over torch.distributed's gloo backend with world sizes 2-4 (one process per rank), against full
attention on the whole sequence: causal (zig-zag) and not, GQA, uneven shard boundaries."""
from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch

from lab.ring import attention as ring
from lab.decode import splits


def _inputs(B, Hq, Hkv, S, D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, S, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=gen, dtype=torch.float64)
    return q, k, torch.randn(B, Hkv, S, D, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("seqlen", [1, 5, 37, 64])
def test_shards_cover_the_sequence_once(world, seqlen):
    for causal in (False, True):
        covered = sorted(p for r in range(world) for b, e in ring.shard_chunks(seqlen, world, r, causal)
                         for p in range(b, e))
        assert covered == list(range(seqlen))
        x = torch.arange(seqlen, dtype=torch.float64).view(1, 1, seqlen, 1)
        shards = [ring.shard(x, world, r, causal) for r in range(world)]
        assert torch.equal(ring.unshard(shards, seqlen, causal), x)


def test_zigzag_balances_causal_work():
    zig, flat = ring.causal_work(8192, 4), ring.causal_work(8192, 4, zigzag=False)
    assert max(zig) - min(zig) <= 8192 // 8  # equal up to one chunk of rounding
    assert max(flat) / min(flat) > 6  # contiguous shards: the last rank does ~7x the first's work


def test_lse_merge_is_the_split_k_combine():
    gen = np.random.default_rng(0)
    o = gen.standard_normal((3, 5, 2, 8))
    lse = gen.standard_normal((3, 5, 2))
    lse[0, 0, 1] = -np.inf  # an empty part
    lse[1, 1, :] = -np.inf  # a row that saw no key at all
    want_o, want_l = splits.merge_partials(o, lse)
    got_o, got_l = ring.lse_merge(*(torch.from_numpy(a) for a in (o[..., 0, :], lse[..., 0], o[..., 1, :], lse[..., 1])))
    np.testing.assert_allclose(got_o.numpy(), want_o, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(got_l.numpy()), np.isneginf(want_l))
    finite = np.isfinite(want_l)
    np.testing.assert_allclose(got_l.numpy()[finite], want_l[finite], rtol=1e-12)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [5, 37, 64])
def test_emulated_ring_equals_full_attention(world, causal, seqlen):
    q, k, v = _inputs(2, 6, 2, seqlen, 16)
    ref, _ = ring.reference_attend(q, k, v, causal)
    out = ring.emulate_ring(q, k, v, world, causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, seqlen, causal, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        q, k, v = _inputs(2, 6, 2, seqlen, 16, seed=seqlen)
        mine = [ring.shard(t, world, rank, causal) for t in (q, k, v)]
        out = ring.ring_attention(*mine, is_causal=causal)
        ref, _ = ring.reference_attend(q, k, v, causal)
        err = float((out - ring.shard(ref, world, rank, causal)).abs().max()) if out.numel() else 0.0
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"rank": rank, "rows": out.shape[2], "max_abs": err}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ring_over_gloo_equals_full_attention(world, causal, tmp_path, ranks):
    seqlen = 37  # uneven: no shard boundary falls on a multiple of the world size
    path = str(tmp_path / "result")
    ranks(_worker, (world, _free_port(), seqlen, causal, path), world)
    results = [json.load(open(f"{path}.{r}")) for r in range(world)]
    assert sum(r["rows"] for r in results) == seqlen
    assert max(r["max_abs"] for r in results) < 1e-12, results
