"""lab/bench.py: statistics, the adaptive stop, time_fn with a fake timer, work formulas, ratios. CPU only."""
from __future__ import annotations

import itertools
import statistics

import pytest

from lab import bench
from lab.bench import Timing


# ------------------------------------------------------------------ summarize

def test_summarize_known_data():
    t = bench.summarize([5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0, 4.0, 6.0])
    assert (t.median_ms, t.q1_ms, t.q3_ms, t.n) == (5.0, 3.0, 7.0, 9)
    assert t.iqr_ms == 4.0
    assert t.as_dict() == {"median_ms": 5.0, "q1_ms": 3.0, "q3_ms": 7.0, "n": 9, "iqr_ms": 4.0}


@pytest.mark.parametrize("data", [
    [1.0, 2.0],
    [0.3, 0.1, 0.2, 10.0],
    [1.5, 1.4, 1.6, 1.45, 1.55, 9.0, 1.52, 1.48, 1.51, 1.49, 1.5],
])
def test_summarize_agrees_with_statistics(data):
    t = bench.summarize(data)
    q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    assert t.median_ms == pytest.approx(statistics.median(data))
    assert t.q1_ms == pytest.approx(q1) and t.q3_ms == pytest.approx(q3)
    assert t.q1_ms <= t.median_ms <= t.q3_ms
    assert t.n == len(data)


def test_summarize_single_and_empty():
    assert bench.summarize([2.5]) == Timing(2.5, 2.5, 2.5, 1)
    with pytest.raises(ValueError, match="no timings"):
        bench.summarize([])


# ------------------------------------------------------------------ should_stop

def test_should_stop_on_small_iqr_after_min_reps():
    steady = [1.0, 1.01, 0.99, 1.0, 1.0, 1.005, 0.995, 1.0, 1.0, 1.0]
    assert bench.should_stop(steady, elapsed_s=0.0, min_reps=10) is True
    assert bench.should_stop(steady[:9], elapsed_s=0.0, min_reps=10) is False  # never before min_reps
    assert bench.should_stop([1.0] * 4, elapsed_s=0.0, min_reps=5) is False


def test_should_stop_keeps_going_while_spread_is_large():
    noisy = [1.0, 2.0] * 10
    assert bench.should_stop(noisy, elapsed_s=0.1, min_reps=10, rel_iqr=0.03) is False
    assert bench.should_stop(noisy, elapsed_s=0.1, min_reps=10, rel_iqr=1.0) is True  # IQR 1.0 <= 1.0 x median 1.5


def test_should_stop_on_max_reps():
    noisy = [1.0, 3.0] * 100
    assert bench.should_stop(noisy[:199], elapsed_s=0.0) is False
    assert bench.should_stop(noisy[:200], elapsed_s=0.0) is True
    assert bench.should_stop(noisy[:7], elapsed_s=0.0, min_reps=10, max_reps=7) is True


def test_should_stop_on_time_budget_with_at_least_three_samples():
    noisy = [1.0, 3.0, 1.0, 3.0]
    assert bench.should_stop(noisy[:3], elapsed_s=2.0, budget_s=2.0) is True
    assert bench.should_stop(noisy[:3], elapsed_s=1.99, budget_s=2.0) is False
    assert bench.should_stop(noisy[:2], elapsed_s=100.0, budget_s=2.0) is False  # too few samples for a median
    assert bench.should_stop([], elapsed_s=100.0) is False


# ------------------------------------------------------------------ time_fn with an injected timer

class FakeTimer:
    """timer(fn) -> ms: calls fn (like the CUDA timer) and returns the next value of `values`."""

    def __init__(self, values):
        self.values = iter(values)
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return next(self.values)


class Counter:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


def test_time_fn_runs_warmup_and_excludes_it():
    fn = Counter()
    timer = FakeTimer(itertools.chain([1000.0, 1000.0, 1000.0], itertools.repeat(2.0)))
    t = bench.time_fn(fn, timer=timer, warmup=3, min_reps=10)
    assert fn.n == 13 and timer.calls == 13  # 3 warm-up + 10 timed
    assert t == Timing(2.0, 2.0, 2.0, 10)  # the 1000 ms warm-up calls are not in the statistics


def test_time_fn_without_warmup():
    fn = Counter()
    t = bench.time_fn(fn, timer=FakeTimer(itertools.repeat(0.5)), warmup=0, min_reps=4)
    assert fn.n == 4 and t.n == 4 and t.median_ms == 0.5


def test_time_fn_stops_at_max_reps_on_noisy_timings():
    fn = Counter()
    t = bench.time_fn(fn, timer=FakeTimer(itertools.cycle([1.0, 2.0, 3.0])), warmup=2, min_reps=5, max_reps=30,
                      budget_s=1e9)
    assert t.n == 30 and fn.n == 32
    assert t.median_ms == 2.0 and t.q1_ms == 1.0 and t.q3_ms == 3.0


def test_time_fn_stops_on_time_budget():
    fn = Counter()
    t = bench.time_fn(fn, timer=FakeTimer(itertools.cycle([1.0, 5.0])), warmup=1, min_reps=50, budget_s=0.0)
    assert t.n == 3 and fn.n == 4  # the budget is spent at once: the 3-sample floor


# ------------------------------------------------------------------ time_interleaved: rounds over several calls

class Logged:
    """A zero-arg call that appends its name to a shared log."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self):
        self.log.append(self.name)


def test_time_interleaved_times_the_calls_in_turn_after_their_warmup():
    log = []
    calls = {"a": (Logged("a", log), None), "b": (Logged("b", log), None)}
    timer = FakeTimer(itertools.cycle([1.0, 2.0]))  # a always 1 ms, b always 2 ms, once the rounds start
    t = bench.time_interleaved(calls, timer=timer, warmup=1, first_run=lambda fn: fn(), min_reps=4)
    # first run and one warm-up each (a a b b), then rounds a b a b ... until both have 4 samples
    assert log == ["a", "a", "b", "b"] + ["a", "b"] * 4
    assert t["a"] == Timing(1.0, 1.0, 1.0, 4) and t["b"] == Timing(2.0, 2.0, 2.0, 4)


def test_time_interleaved_reports_a_refusing_call_and_keeps_the_order():
    log = []
    calls = {"refused": (Logged("refused", log), None), "ok": (Logged("ok", log), None)}
    first = lambda fn: "unsupported: no" if fn.name == "refused" else fn()  # noqa: E731
    t = bench.time_interleaved(calls, timer=FakeTimer(itertools.repeat(3.0)), warmup=0, first_run=first, min_reps=3)
    assert list(t) == ["refused", "ok"] and t["refused"] == "unsupported: no" and t["ok"].n == 3
    assert "refused" not in log  # never timed (first_run here does not call it)


def test_time_interleaved_enters_each_calls_context_around_its_timed_runs():
    import contextlib
    log = []

    @contextlib.contextmanager
    def backend():
        log.append("enter")
        yield
        log.append("exit")

    calls = {"sdpa": (Logged("sdpa", log), backend), "ours": (Logged("ours", log), None)}
    bench.time_interleaved(calls, timer=FakeTimer(itertools.repeat(1.0)), warmup=0, first_run=lambda fn: fn(),
                           min_reps=2)
    assert log == ["enter", "sdpa", "exit", "ours"] + ["enter", "sdpa", "exit", "ours"] * 2


def test_time_interleaved_stops_on_the_per_call_budget_when_a_call_stays_noisy():
    calls = {"steady": (Counter(), None), "noisy": (Counter(), None)}
    timer = FakeTimer(itertools.cycle([1.0, 1.0, 1.0, 9.0]))  # steady gets 1, noisy alternates 1 and 9
    t = bench.time_interleaved(calls, timer=timer, warmup=0, first_run=lambda fn: fn(), min_reps=5, budget_s=0.0)
    assert t["steady"].n == t["noisy"].n == 3  # the budget is spent at once: every call stops at the 3-sample floor


# ------------------------------------------------------------------ work formulas

def visible_pairs(Sq, Sk):
    return sum(1 for i in range(Sq) for j in range(Sk) if j <= i)  # SDPA's top-left causal mask


def test_attention_flops_non_causal():
    assert bench.attention_flops(2, 3, 5, 7, 64, False) == 4 * 2 * 3 * 5 * 7 * 64


@pytest.mark.parametrize("S", [1, 64, 4097])
def test_attention_flops_causal_square_is_exactly_half(S):
    assert bench.attention_flops(2, 4, S, S, 128, True) == bench.attention_flops(2, 4, S, S, 128, False) / 2


@pytest.mark.parametrize("Sq, Sk", [(5, 3), (3, 5), (1, 7), (7, 1), (63, 1025), (1025, 65)])
def test_attention_flops_causal_rectangular_counts_visible_pairs(Sq, Sk):
    B, H, D = 3, 2, 64
    assert bench.attention_flops(B, H, Sq, Sk, D, True) == visible_pairs(Sq, Sk) * 4 * B * H * D


def test_attention_flops_causal_known_values():
    assert bench.attention_flops(1, 1, 5, 3, 1, True) == 4 * 12  # rows see 1, 2, 3, 3, 3 keys
    assert bench.attention_flops(1, 1, 3, 5, 1, True) == 4 * 6   # rows see 1, 2, 3 keys
    assert bench.attention_flops(1, 1, 1, 7, 1, True) == 4 * 1


def test_decode_bytes_by_hand():
    # K and V: 2 x (10 + 20 keys) x 2 heads x 64 x 2 B = 15360; Q and O: 2 x 2 seqs x 8 heads x 1 x 64 x 2 B = 4096
    assert bench.decode_bytes([10, 20], Hq=8, Hkv=2, q_len=1, D=64) == 15360 + 4096
    assert bench.decode_bytes([4], Hq=4, Hkv=4, q_len=3, D=16, element_bytes=4) == 2 * 4 * 4 * 16 * 4 + 2 * 4 * 3 * 16 * 4


# ------------------------------------------------------------------ ratios and flags

def test_ratios_and_flags():
    ours = Timing(1.0, 0.9, 1.1, 10)
    backends = {"flash": Timing(2.0, 2.0, 2.0, 10), "math": Timing(12.0, 12.0, 12.0, 10),
                "cudnn": "unsupported: no kernel", "efficient": Timing(10.0, 10.0, 10.0, 10)}
    r = bench.ratios(ours, backends)
    assert r == {"sdpa-flash": 2.0, "sdpa-math": 12.0, "sdpa-efficient": 10.0}  # strings (did not run) left out
    flags = bench.flagged(r)
    assert len(flags) == 1 and flags[0].startswith("sdpa-math: 12.0x > 10x")  # exactly 10x is not flagged
    assert bench.flagged({"sdpa-flash": 0.5}) == []


def test_sdpa_runner_cpu_backends_agree():
    import torch

    q = torch.randn(1, 2, 8, 16)
    k = torch.randn(1, 1, 8, 16)
    v = torch.randn(1, 1, 8, 16)
    default = bench.sdpa_runner("default", q, k, v, is_causal=True)()
    forced = bench.sdpa_runner("math", q, k, v, is_causal=True)()
    assert default.shape == (1, 2, 8, 16)  # GQA is enabled from the head counts
    torch.testing.assert_close(default, forced)
    with pytest.raises(KeyError):
        bench.sdpa_runner("triton", q, k, v)


# ------------------------------------------------------------------ fwd_sweep: which rows share rounds

def test_fwd_sweep_times_the_math_backend_in_rounds_of_its_own(monkeypatch):
    """The math backend runs for milliseconds per call and slowed the rows timed after it inside a round (n9,
    H200): the sweep times it alone, after the rounds that hold every other backend and ours."""
    import torch

    from lab import cases, record, sweep

    groups = []

    def fake_interleaved(calls, **stop):
        groups.append(set(calls))
        return {name: Timing(1.0, 1.0, 1.0, 3) for name in calls}

    tiny = torch.zeros(1, 1, 1, 64)
    monkeypatch.setattr(sweep, "_inputs_fwd", lambda case, seed: [tiny, tiny, tiny])
    monkeypatch.setattr(bench, "ceilings", lambda: {"bf16_matmul_tflops": 1000.0, "copy_gbps": 3000.0})
    monkeypatch.setattr(bench, "time_interleaved", fake_interleaved)
    monkeypatch.setattr(record, "append", lambda row: row)
    case = cases.Case("t", B=1, Hq=1, Hkv=1, Sq=1, Sk=1, D=64, dtype="bfloat16", causal=False)
    rows = sweep.fwd_sweep([case], {"ours": lambda q, k, v, c: (lambda: None)}, progress=False)
    assert groups == [{"flash", "cudnn", "efficient", "default", ("ours", "ours")}, {"math"}]
    assert sorted(r["impl"] for r in rows) == sorted([f"sdpa-{b}" for b in bench.BACKENDS] + ["ours"])


def test_fwd_rounds_judges_a_cell_on_fresh_inputs_each_round(monkeypatch):
    """Every round draws its own inputs (seeds no race uses), times ours and the peer in one interleaved round, and
    the row holds each round's ratio with their median and range; a peer refused in every round gives None."""
    import torch

    from lab import cases, record, sweep

    seeds, recorded = [], []

    def inputs(case, seed):
        seeds.append(seed)
        return [torch.full((1, 1, 2, 8), float(seed))] * 3

    # ms a call by round: ours 2.0, 2.0, 1.0; the peer 1.9, 2.2, 1.05 -> peer / ours 0.95, 1.1, 1.05
    ms = {"ours": iter([2.0] * 4 + [2.0] * 4 + [1.0] * 4), "sdpa": iter([1.9] * 4 + [2.2] * 4 + [1.05] * 4)}

    class Timer:
        def __call__(self, fn):
            return next(ms[fn.who])

    def make(q, k, v, is_causal):
        call = lambda: None  # noqa: E731
        call.who = "ours"
        return call

    def runner(backend, q, k, v, is_causal=False):
        call = lambda: None  # noqa: E731
        call.who = "sdpa"
        return call
    monkeypatch.setattr(bench, "sdpa_runner", runner)
    monkeypatch.setattr(record, "append", lambda row: recorded.append(row) or row)
    case = cases.Case("t", B=1, Hq=1, Hkv=1, Sq=2, Sk=2, D=8, dtype="float32", causal=True)
    rows = sweep.fwd_rounds([case], {"ours": make}, peers=("cudnn",), rounds=3, progress=False, inputs=inputs,
                            timer=Timer(), warmup=1, first_run=lambda fn: None, min_reps=3, max_reps=3)
    assert seeds == [10_000, 10_001, 10_002] and rows == recorded and len(rows) == 1
    row = rows[0]
    assert row["kind"] == "fwd_rounds" and row["impl"] == "ours" and row["case"]["causal"] and row["rounds"] == 3
    assert row["median_ms_per_round"] == {"ours": [2.0, 2.0, 1.0], "sdpa-cudnn": [1.9, 2.2, 1.05]}
    got = row["ratio_rounds"]["sdpa-cudnn"]
    assert got["per_round"] == pytest.approx([0.95, 1.1, 1.05])
    assert (got["median"], got["min"], got["max"]) == pytest.approx((1.05, 0.95, 1.1))
    # a peer that refuses the shape in every round: no ratio, not a zero
    rows = sweep.fwd_rounds([case], {"ours": lambda *a: (lambda: None)}, rounds=2, progress=False, inputs=inputs,
                            timer=lambda fn: 1.0, warmup=0, first_run=lambda fn: "unsupported: no kernel" if
                            getattr(fn, "who", "") == "sdpa" else None, min_reps=3, max_reps=3)
    assert rows[0]["ratio_rounds"] == {"sdpa-cudnn": None}
    assert rows[0]["median_ms_per_round"]["sdpa-cudnn"] == [None, None]


# ------------------------------------------------------------------ a peer that cannot run: one line, and flex's scope

def test_why_is_one_line_naming_the_reason():
    oom = RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of 79.18 GiB of "
                       "which 11.35 GiB is free. Including non-PyTorch memory, this process has 67 GiB in use.\n"
                       "W1127 03:00:05 torch/_dynamo/convert_frame.py:1743] [0/8] a compiler log line")
    assert bench.why(oom) == "CUDA out of memory. Tried to allocate 16.00 GiB."
    long = ValueError("x" * 300)
    assert len(bench.why(long)) == 120 and bench.why(long).endswith("...")
    # cut at a word's end: a peer's reason never reads as another number
    declined = RuntimeError("no engine - python or backend - proposed a plan for this graph (the backend declined: "
                            "hidden_dim should be equal to 128 for FP8 backward)")
    assert bench.why(declined).endswith(" should be equal to...") and len(bench.why(declined)) <= 120
    from torch._dynamo.exc import FailOnRecompileLimitHit

    assert "recompile limit" in bench.why(FailOnRecompileLimitHit("Hard failure due to fail_on_recompile_limit_hit"))


def test_try_run_names_a_recompile_limit_in_one_line(monkeypatch):
    import torch
    from torch._dynamo.exc import FailOnRecompileLimitHit

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def refused():
        raise FailOnRecompileLimitHit("Hard failure due to fail_on_recompile_limit_hit")
    reason = bench.try_run(refused)
    assert reason.startswith("unsupported: torch.compile hit its recompile limit") and "\n" not in reason


def test_flex_races_compile_every_graph_and_never_fall_back_to_eager():
    """Inside a race, torch.compile keeps a graph per shape and mask well past the default 8, and hitting the limit
    raises (no eager flex_attention, which materialises the scores); outside, torch's own settings are back."""
    import torch._dynamo.config as config

    before = (config.recompile_limit, config.fail_on_recompile_limit_hit)
    seen = []

    @bench.flex_race
    def race():
        seen.append((config.recompile_limit, config.fail_on_recompile_limit_hit))
    race()
    assert seen == [(bench.FLEX_RECOMPILE_LIMIT, True)] and bench.FLEX_RECOMPILE_LIMIT >= 64
    assert (config.recompile_limit, config.fail_on_recompile_limit_hit) == before
    from lab.backward import race as bwd_race
    from lab.masks import gpu, gpu_bwd

    assert all(getattr(f, "__wrapped__", None) for f in (bwd_race.race, gpu.race, gpu_bwd.race))


def test_a_compiled_function_past_the_default_limit_keeps_compiling_in_the_scope():
    """Twelve shapes through one torch.compile(dynamic=False) function: past 8 outside the scope dynamo runs it
    eagerly (uncompiled); inside, every shape gets its graph."""
    import torch

    torch._dynamo.reset()
    frames = []

    def backend(gm, example_inputs):
        frames.append(tuple(example_inputs[0].shape))
        return gm.forward

    fn = torch.compile(lambda x: x * 2 + 1, backend=backend, dynamic=False)
    with bench.flex_scope():
        for n in range(1, 13):
            fn(torch.ones(n))
    assert len(frames) == 12
    torch._dynamo.reset()
