"""lab.ring.train on the CPU: the one-block decoder trained with its sequence sharded over gloo (world sizes 2
and 3, zig-zag causal, uneven length) gives the one-device run's loss curve to float64 rounding."""
from __future__ import annotations

import json

import pytest
import torch

from lab.ring import train
from tests.ring.test_dist import _free_port

STEPS, BATCH, SEQLEN, VOCAB = 6, 2, 37, 32


def _model():
    torch.manual_seed(0)
    return train.TinyDecoder(vocab=VOCAB, dim=32, heads=4, kv_heads=2, max_len=64).double()


def _worker(rank, world, port, path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        losses = train.train_losses(_model(), train.make_batches(STEPS, BATCH, SEQLEN, VOCAB))
        with open(f"{path}.{rank}", "w") as f:
            json.dump(losses, f)
    finally:
        dist.destroy_process_group()


def test_the_loss_falls_on_one_device():
    losses = train.train_losses(_model(), train.make_batches(30, BATCH, SEQLEN, VOCAB), lr=0.5)
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_training_matches_one_device(world, tmp_path, ranks):
    want = train.train_losses(_model(), train.make_batches(STEPS, BATCH, SEQLEN, VOCAB))
    path = str(tmp_path / "losses")
    ranks(_worker, (world, _free_port(), path), world)
    for rank in range(world):
        got = json.load(open(f"{path}.{rank}"))
        assert got == pytest.approx(want, rel=1e-10, abs=1e-12), (rank, got, want)


def test_positions_cover_the_sequence_once():
    for world in (1, 2, 3, 4):
        seen = torch.cat([train.positions_of(SEQLEN, world, r) for r in range(world)])
        assert sorted(seen.tolist()) == list(range(SEQLEN))
