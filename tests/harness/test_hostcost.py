"""lab.hostcost's sampling on the CPU: the GPU calls stubbed, the order of the calls and the medians checked."""
from __future__ import annotations

import torch

from lab import hostcost


def _stub_cuda(monkeypatch, log):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))


def test_paired_idle_takes_the_ops_in_turn_reversing_each_round(monkeypatch):
    log = []
    _stub_cuda(monkeypatch, log)
    fns = {name: (lambda name=name: log.append(name)) for name in ("sdpa", "ours")}
    us = hostcost.host_us_paired(fns, calls=4, warmup=1)
    calls = [x for x in log if x in ("sdpa", "ours")]
    assert calls[:2] == ["sdpa", "ours"]  # the warm-up
    assert calls[2:] == ["sdpa", "ours", "ours", "sdpa", "sdpa", "ours", "ours", "sdpa"]
    timed = log[log.index("sync") + 1:]  # after the warm-up's synchronize: one synchronize before every call
    assert all(timed[i] == "sync" for i in range(0, 16, 2)) and timed[-1] == "sync"
    assert set(us) == {"sdpa", "ours"} and all(v >= 0 for v in us.values())


def test_paired_busy_queues_one_sleep_for_every_call_and_no_synchronize_between(monkeypatch):
    log = []
    _stub_cuda(monkeypatch, log)
    fns = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
    hostcost.host_us_paired(fns, calls=3, busy=True, warmup=0)
    assert log[1] == ("sleep", hostcost.SLEEP_CYCLES_PER_CALL * 3 * 2)
    assert log[2:] == ["a", "b", "b", "a", "a", "b", "sync"]


def test_paired_medians_are_each_ops_own(monkeypatch):
    _stub_cuda(monkeypatch, [])
    ticks = {"fast": 1, "slow": 3}

    class Clock:
        now = 0.0

    def advance(name):
        Clock.now += ticks[name] * 1e-6

    monkeypatch.setattr(hostcost.time, "perf_counter", lambda: Clock.now)
    fns = {name: (lambda name=name: advance(name)) for name in ticks}
    us = hostcost.host_us_paired(fns, calls=5, warmup=0)
    assert abs(us["fast"] - 1) < 1e-6 and abs(us["slow"] - 3) < 1e-6
    assert abs(hostcost.host_us(fns["slow"], calls=3, warmup=0) - 3) < 1e-6
