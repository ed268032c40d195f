"""The ring tests' ranks: one process per rank, started by a fork server that has torch and lab.ring loaded.

mp.spawn starts each rank from a fresh interpreter that imports torch again (about 2 CPU-seconds a rank, some 130
over the family); a fork server forks each rank from one process that imported them once. The ranks are still
separate processes with their own gloo group, as under torchrun."""
from __future__ import annotations

import pytest
import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "numpy", "lab.ring.attention", "lab.decode.splits"]


def start_ranks(fn, args, nprocs: int) -> None:
    """mp.spawn(fn, args, nprocs, join=True) through the fork server: fn(rank, *args) in each of nprocs processes."""
    mp.set_forkserver_preload(PRELOAD)  # read when the fork server first starts; later calls change nothing
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")


@pytest.fixture
def ranks():
    return start_ranks
