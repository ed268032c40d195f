"""The transport under lab.ring's ring: the process group, the comm stream, one step's K/V transfer, and
the per-step clock from which the chapter draws its overlap timeline.

- init_process_group: NCCL on GPUs (one GPU per local rank), gloo on the CPU, from torchrun's environment;
  NVLink multicast off first (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1),
  as the GPU machines require.
- transfer(): batch_isend_irecv of this rank's K/V to the next rank and of the previous rank's into a new
  buffer. On a GPU it is queued on comm_stream: NCCL's kernels wait for that stream, the stream waits for
  them, and the compute stream waits for it only when it needs the shard (wait()). With communicate=False it
  moves nothing and hands back a stand-in shard of the right length (the compute-only time).
- StepClock: CUDA events on the stream that did the work, or wall-clock on the CPU, where a helper thread
  waits for gloo's transfer so that its end is timed as it happens.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import nullcontext

import torch

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_off() -> dict:
    """Set the three variables that keep NVLink multicast off (before NCCL starts); returns them."""
    for name, value in MULTICAST_OFF.items():
        os.environ[name] = value
    return {name: os.environ[name] for name in MULTICAST_OFF}


def init_process_group(device: str = "auto"):
    """torch.distributed.init_process_group from torchrun's environment: NCCL on GPUs (one per local rank,
    NVLink multicast off), gloo on the CPU. Returns the torch.device this rank computes on."""
    import torch.distributed as dist

    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    multicast_off()
    here = torch.device("cpu")
    if cuda:
        here = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(here)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", **({"device_id": here} if cuda else {}))
    return here


class StepClock:
    """When each step's compute and transfer started and ended, in ms from the clock's creation: CUDA
    events recorded on the stream doing the work, or wall-clock on the CPU (one rank's own time axis)."""

    def __init__(self, cuda: bool):
        self.cuda, self.marks = cuda, []
        self.origin = self._now(None)

    def _now(self, stream):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def mark(self, step: int, what: str, edge: str, stream=None):
        self.marks.append((step, what, edge, self._now(stream)))  # list.append: safe from the waiter thread

    def steps(self) -> list[dict]:
        """[{step, compute_start_ms, compute_end_ms, comm_start_ms, comm_end_ms}, ...] (synchronizes)."""
        if self.cuda:
            torch.cuda.synchronize()
        rows = {}
        for step, what, edge, value in self.marks:
            ms = self.origin.elapsed_time(value) if self.cuda else (value - self.origin) * 1e3
            rows.setdefault(step, {"step": step})[f"{what}_{edge}_ms"] = ms
        return [rows[s] for s in sorted(rows)]


_COMM_STREAMS: dict = {}


def comm_stream(device) -> "torch.cuda.Stream":
    """The stream the K/V transfers are queued on, one per GPU (NCCL's kernels wait for it)."""
    if device not in _COMM_STREAMS:
        _COMM_STREAMS[device] = torch.cuda.Stream(device)
    return _COMM_STREAMS[device]


class _Transfer:
    """One ring step's send of `kv` to the next rank and receive of the previous rank's shard (n rows)."""

    def __init__(self, kv, n: int, peers: tuple, group, step: int, clock, stream):
        import torch.distributed as dist

        self.stream, self.error, self.waiter, self.done = stream, None, None, False
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            self.incoming = kv.new_empty(kv.shape[0], kv.shape[1], kv.shape[2], n, kv.shape[4])
            if clock:
                clock.mark(step, "comm", "start", stream)
            self.works = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, peers[0], group),
                                                 dist.P2POp(dist.irecv, self.incoming, peers[1], group)])
            if stream is not None:  # the comm stream waits for NCCL; the event after it is the transfer's end
                for work in self.works:
                    work.wait()
                if clock:
                    clock.mark(step, "comm", "end", stream)
        if stream is None and clock:  # gloo: a thread sees the end as it happens, the main thread computes
            self.waiter = threading.Thread(target=self._wait_cpu, args=(step, clock), daemon=True)
            self.waiter.start()

    def _wait_cpu(self, step, clock):
        try:
            for work in self.works:
                work.wait()
            clock.mark(step, "comm", "end")
        except Exception as err:  # raised in wait(), on the main thread
            self.error = err

    def wait(self):
        """The received shard, ready for the current stream (a second call returns it again)."""
        if self.done:
            return self.incoming
        self.done = True
        if self.stream is not None:
            torch.cuda.current_stream().wait_stream(self.stream)
            self.incoming.record_stream(torch.cuda.current_stream())  # freed later: not before compute used it
        elif self.waiter is not None:
            self.waiter.join()
            if self.error:
                raise self.error
        else:
            for work in self.works:
                work.wait()
        return self.incoming


class _Local:
    """communicate=False: no transfer; the next step computes on a stand-in shard of the right length."""

    def __init__(self, kv, n: int):
        self.incoming = kv if kv.shape[3] == n else kv.new_zeros(kv.shape[0], kv.shape[1], kv.shape[2], n, kv.shape[4])

    def wait(self):
        return self.incoming


def transfer(kv, n: int, peers: tuple, group, step: int, clock, stream, communicate: bool = True):
    """Start step `step`'s exchange (peers: global ranks to send to and receive from); .wait() gives the shard."""
    return _Transfer(kv, n, peers, group, step, clock, stream) if communicate else _Local(kv, n)
