"""lab.ops.decode's default paged call (no page_errors) on CPU: its flags are read at a later call, never waited for.

Two halves. The Python layer (lab.decode.deferred, op, fast) over a fake binding whose "GPU" computes the kernel's
flags from the table and completes a call when the test says: no host read of a device tensor in the call, the
error at the next call and at lab.ops.check_page_errors(), the polling of other decode calls, nothing read under
torch.compile. Then the binding's own queue (lab/binding.cpp, "the deferred call's page flags"), in its CPU check
build (tests/product/test_binding_checks.py's build), where events complete when page_flags_cpu_complete says: the error
one call later, a wait only when asked or when the queue is full, the queue bounded, slots reused, nothing queued
or read under graph capture.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lab import build, kernels, ops
from lab.decode import deferred, emulate_paged
from lab.decode import checks, paged_op
from lab.decode import op as decode_op

BF16 = torch.bfloat16
E_INDEX, E_SHORT = emulate_paged.PAGE_E_INDEX, emulate_paged.PAGE_E_SHORT
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy")


class FakeGPU:
    """The binding's deferred entry points over a queue of (call, flags) that a call's "kernel" fills from the
    table (as the kernel flags it) and that completes when the test says. Its own table reads are not counted."""

    def __init__(self, reads):
        self.reads, self.pending, self.done_upto, self.calls = reads, [], 0, 0
        self.log = []

    def _retire(self, upto):
        with self.reads.paused():  # the binding's own read of its host copy
            bad = [(0, call, flags) for call, flags in self.pending if call <= upto and flags.any()]
        self.pending = [(c, f) for c, f in self.pending if c > upto]
        return bad

    def decode_paged_deferred(self, launcher, q, k, v, seqlens, table, scale, splits, causal):
        self.log.append("deferred")
        bad = self._retire(self.done_upto)
        if bad:
            return "", None, bad
        with self.reads.paused():
            lengths = seqlens.tolist() if seqlens is not None else [table.shape[1] * k.shape[1]] * q.shape[0]
            slots = [table[b, :-(-n // k.shape[1])].tolist() for b, n in enumerate(lengths)]
        capacity = table.shape[1] * k.shape[1]
        flags = torch.tensor([(E_SHORT if n > capacity else 0) | (E_INDEX if any(not 0 <= s < k.shape[0] for s in row)
                                                                 else 0) for n, row in zip(lengths, slots)],
                             dtype=torch.int32)
        flags.host_copy = True  # what the binding hands back: a copy on the host, free to read
        self.calls += 1
        self.pending.append((self.calls, flags))
        return "", torch.zeros_like(q), []

    def page_flags_check(self, wait):
        self.log.append(f"check wait={wait}")
        bad = self._retire(self.calls if wait else self.done_upto)
        return "", bad, len(self.pending)

    def decode_paged_call(self, launcher, q, k, v, seqlens, table, errors, scale, splits, causal):  # the custom op's
        self.log.append("op")
        return "", torch.zeros_like(q), errors

    def decode_auto(self, launcher, q, k, v, seqlens, scale, splits):
        self.log.append("contiguous")
        return "", torch.zeros_like(q)

    def decode_call(self, launcher, q, k, v, seqlens, scale, splits):
        self.log.append("contiguous")
        return "", torch.zeros_like(q)


class HostReads:
    """Counts the calls that read a tensor's values on the host (a sync on a CUDA tensor), but for the binding's
    host copies of the flags."""

    def __init__(self, monkeypatch):
        self.count, self.active = 0, True
        for name in HOST_READS:
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(real))

    def _counting(self, real):
        def read(tensor, *args, **kwargs):
            self.count += self.active and not getattr(tensor, "host_copy", False)
            return real(tensor, *args, **kwargs)
        return read

    def paused(self):
        reads = self

        class Pause:
            def __enter__(self):
                reads.active = False

            def __exit__(self, *exc):
                reads.active = True
        return Pause()


def _as_if_on_a_gpu(monkeypatch, binding, address: int) -> None:
    """lab.ops.decode over `binding` with CPU tensors standing in for CUDA ones: the device check off, every
    launcher at `address`, 132 SMs, no plan kept from an earlier test, and lab.decode.deferred's `queued` flag put
    back afterwards (a call through the queue sets it; left set, a later test's decode call would poll a binding
    that is not there)."""
    monkeypatch.setattr(build, "binding", lambda: binding)
    monkeypatch.setattr(deferred, "queued", False)
    for glue in (checks, paged_op):  # the contiguous call's checks and the paged call's
        monkeypatch.setattr(glue, "_check_cuda", lambda query: None)
    for glue in (decode_op, paged_op):
        monkeypatch.setattr(glue, "launcher", lambda table, version, defines=None: address)
    monkeypatch.setattr(checks, "sm_count", lambda device: 132)
    decode_op._decode_plans.clear()
    kernels.plans.clear()


@pytest.fixture
def gpu(monkeypatch):
    """CPU tensors stand in for CUDA ones (the device check off, launcher addresses faked), the binding faked."""
    reads = HostReads(monkeypatch)
    fake = FakeGPU(reads)
    binding = SimpleNamespace(module=fake, decode_paged_call=build._raising(fake.decode_paged_call),
                              decode_call=build._raising(fake.decode_call))
    _as_if_on_a_gpu(monkeypatch, binding, address=1)
    yield fake
    decode_op._decode_plans.clear()
    kernels.plans.clear()


def _inputs(B=3, num_pages=12, page=16, max_pages=4, lengths=(64, 10, 33)):
    q = torch.randn(B, 8, 1, 128, dtype=BF16)
    kc, vc = (torch.randn(num_pages, page, 2, 128, dtype=BF16) for _ in range(2))
    table = torch.arange(B * max_pages, dtype=torch.int32).view(B, max_pages)
    return q, kc, vc, table, torch.tensor(lengths, dtype=torch.int32)


def test_default_call_queues_its_flags_and_reads_nothing(gpu, monkeypatch):
    q, kc, vc, table, seqlens = _inputs()
    full = []
    real = paged_op._check_paged
    monkeypatch.setattr(paged_op, "_check_paged", lambda *a: full.append(1) or real(*a))
    for _ in range(5):
        out = ops.decode(q, kc, vc, seqlens, block_table=table)
    assert out.shape == q.shape and gpu.log == ["deferred"] * 5
    assert len(full) == 1  # the first call by the full path, then one crossing each
    assert gpu.reads.count == 0 and len(gpu.pending) == 5 and deferred.queued


def test_bad_table_raises_at_the_next_call_naming_the_call_and_sequences(gpu):
    q, kc, vc, table, seqlens = _inputs()
    ops.decode(q, kc, vc, seqlens, block_table=table)
    bad = table.clone()
    bad[1, 0] = 99  # sequence 1's first page: outside the 12 pages
    ops.decode(q, kc, vc, seqlens, block_table=bad)  # call 2: returns, flags queued
    ops.decode(q, kc, vc, seqlens, block_table=table)  # call 2 has not run on the "GPU" yet: no error, no wait
    assert gpu.reads.count == 0 and "check wait=True" not in gpu.log
    gpu.done_upto = 3
    with pytest.raises(ValueError, match=r"call 2 on cuda:0: block_table is bad for sequence\(s\) 1 \(a page index "
                                         r"outside \[0, num_pages\)\).*outputs for those sequences are zero"):
        ops.decode(q, kc, vc, seqlens, block_table=table)
    assert gpu.log[-1] == "deferred" and len(gpu.pending) == 0  # the failing call launched nothing
    ops.decode(q, kc, vc, seqlens, block_table=table)  # reported once: the next call runs


def test_check_page_errors_waits_and_raises(gpu):
    q, kc, vc, table, seqlens = _inputs()
    ops.check_page_errors()  # nothing queued: returns at once, nothing asked of the binding
    assert gpu.log == []
    ops.decode(q, kc, vc, seqlens.clone().fill_(65), block_table=table)  # 65 keys > 4 pages of 16
    with pytest.raises(ValueError, match=r"sequence\(s\) 0 \(cache_seqlens longer .*1 \(.*2 \("):
        ops.check_page_errors()
    assert gpu.log[-1] == "check wait=True" and not deferred.queued
    ops.check_page_errors()  # reported once


def test_good_tables_never_raise(gpu):
    q, kc, vc, table, seqlens = _inputs()
    with gpu.reads.paused():  # (the test's own indexing)
        tables = [table[:, torch.randperm(4)] for _ in range(20)]
    for step, shuffled in enumerate(tables):
        ops.decode(q, kc, vc, seqlens, block_table=shuffled)
        gpu.done_upto = step  # the GPU one call behind
    ops.check_page_errors()
    assert gpu.reads.count == 0


def test_other_decode_calls_poll_while_flags_are_queued(gpu):
    q, kc, vc, table, seqlens = _inputs()
    k = torch.randn(3, 2, 100, 128, dtype=BF16)
    ops.decode(q, k, k)
    assert "check wait=False" not in gpu.log  # nothing queued: no crossing for the poll
    bad = table.clone()
    bad[2, 1] = -1
    ops.decode(q, kc, vc, seqlens, block_table=bad)
    ops.decode(q, k, k)  # not run yet: polled, nothing to report
    assert gpu.log[-2:] == ["check wait=False", "contiguous"]
    gpu.done_upto = 1
    with pytest.raises(ValueError, match=r"sequence\(s\) 2 \(a page index outside"):
        ops.decode(q, k, k)
    assert not deferred.queued
    ops.decode(q, k, k)
    assert gpu.log[-1] == "contiguous" and gpu.reads.count == 0


def test_page_errors_call_reads_nothing_and_queues_nothing(gpu):
    q, kc, vc, table, seqlens = _inputs()
    flags = torch.full((3,), -1, dtype=torch.int32)
    ops.decode(q, kc, vc, seqlens, block_table=table, page_errors=flags)
    assert gpu.log == ["op"] and gpu.reads.count == 0 and not deferred.queued


def test_torch_compile_reads_no_flags(gpu):
    """Traced by dynamo, the default call is the custom op: no deferred entry, no poll, even with flags queued."""
    q, kc, vc, table, seqlens = _inputs()
    ops.decode(q, kc, vc, seqlens, block_table=table)  # eager: one queued
    gpu.log.clear()
    compiled = torch.compile(lambda *a: ops.decode(*a[:4], block_table=a[4]) + 1, backend="eager", fullgraph=True)
    out = compiled(q, kc, vc, seqlens, table)
    assert out.shape == q.shape and gpu.log == ["op"]


def test_error_text_for_several_calls():
    bad = [(0, 3, torch.tensor([0, E_INDEX], dtype=torch.int32)),
           (1, 7, torch.tensor([E_SHORT | E_INDEX, 0], dtype=torch.int32))]
    text = str(deferred.error(bad))
    assert "call 3 on cuda:0: block_table is bad for sequence(s) 1 (a page index outside [0, num_pages))" in text
    assert "call 7 on cuda:1: block_table is bad for sequence(s) 0 (a page index outside [0, num_pages) and " \
           "cache_seqlens longer than the block table" in text
    assert "lab.ops.check_page_errors()" in text and "page_errors=" in text


# ------------------------------------------------------------------ the binding's queue (CPU check build)

@pytest.fixture
def queue(cpu_binding, monkeypatch):  # noqa: F811
    """lab.ops over the CPU check build: the real queue, events done when page_flags_cpu_complete says."""
    module = cpu_binding.module
    module.page_flags_cpu_capture(False)
    module.page_flags_cpu_complete(-1)
    module.page_flags_check(True)  # an empty queue to start from
    _as_if_on_a_gpu(monkeypatch, cpu_binding, address=0)
    yield module
    module.page_flags_cpu_capture(False)
    module.page_flags_cpu_complete(-1)
    module.page_flags_check(True)
    decode_op._decode_plans.clear()
    kernels.plans.clear()


def test_binding_raises_one_call_later(queue):
    q, kc, vc, table, seqlens = _inputs()
    _, spare, _, waits = queue.page_flags_state()
    ops.decode(q, kc, vc, seqlens, block_table=table)
    queue.page_flags_cpu_write(torch.tensor([0, E_INDEX, 0], dtype=torch.int32))  # the kernel's flags of that call
    calls = queue.page_flags_state()[2]
    ops.decode(q, kc, vc, seqlens, block_table=table)  # the bad call still "running": no error, no wait
    assert queue.page_flags_state()[0] == 2 and queue.page_flags_state()[3] == waits
    queue.page_flags_cpu_complete(-1)
    with pytest.raises(ValueError, match=rf"call {calls} on cuda:0: block_table is bad for sequence\(s\) 1 \(a page"):
        ops.decode(q, kc, vc, seqlens, block_table=table)
    # both retired, the failing call launched and queued nothing, the two slots spare again
    assert queue.page_flags_state()[:3] == (0, max(spare, 2), calls + 1)
    ops.decode(q, kc, vc, seqlens, block_table=table)


def test_binding_check_waits_for_every_call(queue):
    q, kc, vc, table, seqlens = _inputs()
    for _ in range(3):
        ops.decode(q, kc, vc, seqlens, block_table=table)
    queue.page_flags_cpu_write(torch.tensor([E_SHORT, 0, 0], dtype=torch.int32))
    assert queue.page_flags_check(False)[1:] == ([], 3)  # no wait: nothing done yet
    with pytest.raises(ValueError, match=r"sequence\(s\) 0 \(cache_seqlens longer"):
        ops.check_page_errors()
    assert queue.page_flags_state()[0] == 0
    ops.check_page_errors()


def test_binding_queue_is_bounded_and_reuses_its_slots(queue):
    q, kc, vc, table, seqlens = _inputs()
    _, spare, _, waits = queue.page_flags_state()
    for _ in range(100):  # the GPU never catches up: from 64 queued on, each call waits for the oldest
        ops.decode(q, kc, vc, seqlens, block_table=table)
    pending, spare_now, _, waits_now = queue.page_flags_state()
    assert pending == 64 and waits_now - waits == 100 - 64 and pending + spare_now <= max(spare, 65)
    queue.page_flags_cpu_complete(-1)
    for _ in range(50):  # the GPU keeps up: one slot, reused
        ops.decode(q, kc, vc, seqlens, block_table=table)
        queue.page_flags_cpu_complete(-1)
    assert queue.page_flags_state()[0] == 1 and sum(queue.page_flags_state()[:2]) == pending + spare_now


def test_binding_under_capture_queues_and_reads_nothing(queue):
    q, kc, vc, table, seqlens = _inputs()
    ops.decode(q, kc, vc, seqlens, block_table=table)
    queue.page_flags_cpu_write(torch.tensor([E_INDEX, 0, 0], dtype=torch.int32))
    queue.page_flags_cpu_complete(-1)
    queue.page_flags_cpu_capture(True)
    before = queue.page_flags_state()
    ops.decode(q, kc, vc, seqlens, block_table=table)  # captured: the earlier bad call is not read, nothing queued
    ops.check_page_errors()  # nor here
    assert queue.page_flags_state() == before
    queue.page_flags_cpu_capture(False)
    with pytest.raises(ValueError, match=r"sequence\(s\) 0"):
        ops.check_page_errors()
