"""Timing: CUDA events, warm-up, L2 flush between runs, median and IQR with an adaptive stop.

Performance is a ratio measured in the same process: every kernel row carries t_backend / t_ours for
each SDPA backend (forced with torch.nn.attention.sdpa_kernel) and its fraction of a measured ceiling.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

from . import record
from .backends import BACKENDS  # noqa: F401  (re-exported: lab.backends holds the one list)

SPEEDUP_FLAG = 10.0  # a ratio above this gets a second look before anyone believes it
MATH_MAX_SCORE_BYTES = 4 * 2**30  # the math backend materialises B*H*Sq*Sk scores in fp32


@dataclass
class Timing:
    median_ms: float
    q1_ms: float
    q3_ms: float
    n: int

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "iqr_ms": self.iqr_ms}


def summarize(times_ms: list[float]) -> Timing:
    if not times_ms:
        raise ValueError("no timings to summarize")
    if len(times_ms) == 1:
        return Timing(times_ms[0], times_ms[0], times_ms[0], 1)
    q1, median, q3 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return Timing(median, q1, q3, len(times_ms))


def should_stop(times_ms: list[float], elapsed_s: float, min_reps: int = 10, max_reps: int = 200,
                rel_iqr: float = 0.03, budget_s: float = 2.0) -> bool:
    """Stop when the spread is small (IQR/median), or the repetition or time budget is spent."""
    if len(times_ms) >= max_reps or (elapsed_s >= budget_s and len(times_ms) >= 3):
        return True
    if len(times_ms) < min_reps:
        return False
    t = summarize(times_ms)
    return t.iqr_ms <= rel_iqr * t.median_ms


class CudaTimer:
    """Times one call with a pair of CUDA events after flushing L2 (so each run starts cold)."""

    def __init__(self):
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self._flush = torch.empty(max(2 * getattr(props, "L2_cache_size", 64 * 2**20), 64 * 2**20) // 4,
                                  dtype=torch.float32, device="cuda")
        self._torch = torch

    def __call__(self, fn) -> float:
        torch = self._torch
        self._flush.zero_()
        self._settle()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _settle(self) -> None:
        """GPU work queued between the flush and the timed window: none here. A subclass that queues a GPU sleep
        keeps the host's launch ahead of the window, which tells host time from GPU time in a cold call (how
        the public op's gap to its kernel-only row was read: outputs/driver_logs/README.md)."""


class GpuTimeTimer(CudaTimer):
    """CudaTimer with a GPU sleep (~1 ms) queued between the flush and the timed window: the host issues the
    call while the GPU sleeps, so the window holds the call's GPU work alone, not its host time. What a
    training loop whose host runs ahead of the GPU sees; CudaTimer's cold call is what a lone call costs."""

    def __init__(self, sleep_cycles: int = 2_000_000):
        super().__init__()
        self._cycles = sleep_cycles

    def _settle(self) -> None:
        self._torch.cuda._sleep(self._cycles)


def time_fn(fn, timer=None, warmup: int = 3, **stop) -> Timing:
    """Median time of fn() in ms. `timer(fn) -> ms` is injectable (tests use a fake one)."""
    return time_interleaved({"fn": (fn, None)}, timer, warmup, first_run=lambda _: None, **stop)["fn"]


def time_interleaved(calls: dict, timer=None, warmup: int = 3, first_run=None, **stop) -> dict:
    """{name: (fn, context or None)} -> {name: Timing, or why it cannot run}, timed in rounds.

    Each round times every call once, in turn, so a slow drift of the GPU's clocks (power, heat) reaches all
    of them alike and cancels in their ratios; timing one call's repetitions back to back put a whole drift
    between two rows of one table. `context()` (e.g. an SDPA backend) is entered around each timed call,
    outside the timer. Rounds stop when every call meets should_stop's rule; the time budget is per call.
    A call that raises on its first run (a backend refusing the shape) is reported, not timed
    (`first_run(fn) -> None or why`, try_run unless injected).
    """
    import contextlib

    timer, first_run = timer or CudaTimer(), first_run or try_run
    ctx = {name: (context or contextlib.nullcontext) for name, (_, context) in calls.items()}
    result, live = {}, {}
    for name, (fn, _) in calls.items():
        with ctx[name]():
            first = first_run(fn)
            if first is not None:
                result[name] = first
                continue
            for _ in range(warmup):
                timer(fn)
        live[name] = []
    start = time.perf_counter()
    while live:
        for name, times in live.items():
            with ctx[name]():
                times.append(timer(calls[name][0]))
        elapsed = (time.perf_counter() - start) / len(live)
        if all(should_stop(times, elapsed, **stop) for times in live.values()):
            break
    result.update({name: summarize(times) for name, times in live.items()})
    return {name: result[name] for name in calls}


# ------------------------------------------------------------------ work formulas

def attention_flops(B: int, H: int, Sq: int, Sk: int, D: int, causal: bool) -> float:
    """4*B*H*Sq*Sk*D (two matmuls, 2 FLOP per multiply-add).

    Causal with Sq == Sk: halved, the convention of published FlashAttention numbers. Causal with
    Sq != Sk: the exact count of visible (query, key) pairs under SDPA's top-left mask,
    sum_i min(i + 1, Sk), so a short query block against a long cache is not over-credited.
    """
    if not causal:
        pairs = Sq * Sk
    elif Sq == Sk:
        pairs = Sq * Sk / 2
    else:
        full = min(Sq, Sk)
        pairs = full * (full + 1) / 2 + max(Sq - Sk, 0) * Sk
    return 4.0 * B * H * pairs * D


def decode_bytes(lengths: list[int], Hq: int, Hkv: int, q_len: int, D: int, element_bytes: int = 2) -> int:
    """Bytes that must move: each sequence's visible K and V once, plus Q read and O written."""
    kv = 2 * sum(lengths) * Hkv * D * element_bytes
    qo = 2 * len(lengths) * Hq * q_len * D * element_bytes
    return kv + qo


# ------------------------------------------------------------------ SDPA backends and ceilings

def sdpa_backend(backend: str):
    """A context forcing SDPA to one backend ('default': torch's own dispatch).

    Sweeps time inside it, so entering the context is not part of the measured time: at the seed sizes
    a kernel takes ~10 us, about what entering and leaving the context costs on the host.
    """
    import contextlib

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend == "default":
        return contextlib.nullcontext()
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                        "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend])


def sdpa_runner(backend: str, q, k, v, is_causal=False, scale=None, attn_mask=None):
    """A zero-argument callable running SDPA forced to one backend ('default' = torch's own dispatch).

    Sweeps instead time the 'default' runner inside sdpa_backend(...), keeping the context out of the timing.
    """
    import torch.nn.functional as F

    gqa = k.shape[1] != q.shape[1]
    sdpa_backend(backend)  # an unknown backend fails here, not at the first call

    def call():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                              enable_gqa=gqa)
    if backend == "default":
        return call

    def forced():
        with sdpa_backend(backend):  # a fresh context each call: torch's sdpa_kernel is single-use
            return call()
    return forced


def why(err: BaseException) -> str:
    """One line naming why a candidate cannot run: the error's first sentence or two, never a compiler log.
    "CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has ..." -> "CUDA out of memory. Tried to allocate
    16.00 GiB."; torch.compile's recompile limit gets its own words."""
    if type(err).__name__ == "FailOnRecompileLimitHit":
        return "torch.compile hit its recompile limit (one compiled graph per shape and mask)"
    line = next((l.strip() for l in str(err).splitlines() if l.strip()), type(err).__name__)
    sentences = line.split(". ")
    short = ". ".join(sentences[:2]) + ("." if len(sentences) > 2 else "")
    if len(short) <= 120:
        return short
    cut = short[:117]
    # at a word's end where there is one, so a number is never cut into a smaller one ("equal to 128" -> "12...")
    cut = cut[:cut.rfind(" ")] if " " in cut[60:] else cut
    return cut.rstrip() + "..."


def _refusals() -> tuple:
    """What a candidate that cannot run raises: a backend rejecting the shape, out of memory, and torch.compile
    refusing to compile once more (the races make that an error instead of an eager fallback: flex_scope)."""
    refusals = (RuntimeError, ValueError)
    try:
        from torch._dynamo.exc import FailOnRecompileLimitHit
    except ImportError:  # an older torch: the limit falls back to eager, with no exception
        return refusals
    return (*refusals, FailOnRecompileLimitHit)


def try_run(fn) -> str | None:
    """Run fn once: None if it ran, else why it cannot run (a backend that rejects the shape, out of memory)."""
    import torch

    try:
        fn()
        torch.cuda.synchronize()
    except _refusals() as err:
        torch.cuda.synchronize()
        return f"unsupported: {why(err)}"
    return None


# FlexAttention is compiled with dynamic=False: one graph per shape, block mask and score function. A race walks
# more of them than torch.compile's default recompile limit (8); past it dynamo ran flex_attention eagerly, which
# materialises the scores (16 GiB at S = 16384: the H100's backward race recorded FlexAttention as "out of
# memory"). The races run inside flex_scope: a limit that fits every graph a race compiles, and a limit hit that
# raises (try_run names it in one line) instead of falling back to eager.
FLEX_RECOMPILE_LIMIT = 256


def flex_scope():
    """torch._dynamo's config for one race (a context manager): FLEX_RECOMPILE_LIMIT graphs per function, and
    an error, not an eager fallback, past it. Options a torch version lacks are left out."""
    import torch._dynamo.config as config

    wanted = {"recompile_limit": FLEX_RECOMPILE_LIMIT, "cache_size_limit": FLEX_RECOMPILE_LIMIT,
              "accumulated_recompile_limit": 4 * FLEX_RECOMPILE_LIMIT,
              "accumulated_cache_size_limit": 4 * FLEX_RECOMPILE_LIMIT,
              "fail_on_recompile_limit_hit": True, "fail_on_cache_limit_hit": True}
    known = getattr(config, "_config", None) or {}
    present = {k: v for k, v in wanted.items() if k in known or hasattr(config, k)}
    if "recompile_limit" in present:  # newer torch: the cache_size_* names are aliases of these
        for alias in ("cache_size_limit", "accumulated_cache_size_limit", "fail_on_cache_limit_hit"):
            present.pop(alias, None)
    if "accumulated_recompile_limit" in present:
        present["accumulated_recompile_limit"] = max(present["accumulated_recompile_limit"],
                                                     config.accumulated_recompile_limit)
    return config.patch(**present)


def flex_race(race):
    """Decorator: the race runs inside flex_scope."""
    import functools

    @functools.wraps(race)
    def scoped(*args, **kwargs):
        with flex_scope():
            return race(*args, **kwargs)
    return scoped


def try_time(fn, **stop) -> Timing | str:
    """Time fn, or return why it cannot run (a backend that rejects the shape, or out of memory)."""
    return try_run(fn) or time_fn(fn, **stop)


def peak_extra_bytes(fn) -> int:
    """Peak memory fn allocates beyond what is already allocated (one call)."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


_ceilings: dict | None = None


def ceilings() -> dict:
    """Copy bandwidth (GB/s, read + write) and bf16 matmul rate (TFLOP/s), measured once per run and cached.

    Cached in the run's folder, so later chapters of the same session reuse the same numbers.
    """
    global _ceilings
    if _ceilings is not None:
        return _ceilings
    cache = record.run_dir() / "ceilings.json"
    if cache.exists():
        _ceilings = json.loads(cache.read_text())
        return _ceilings
    import torch

    src = torch.randn(2**29 // 2, device="cuda", dtype=torch.bfloat16)  # 512 MiB, far beyond L2
    dst = torch.empty_like(src)
    copy = time_fn(lambda: dst.copy_(src), min_reps=20)
    copy_gbps = 2 * src.numel() * 2 / copy.median_ms / 1e6
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = time_fn(lambda: a @ b, min_reps=10)
    tflops = 2 * n**3 / mm.median_ms / 1e9
    del src, dst, a, b
    _ceilings = {"copy_gbps": copy_gbps, "bf16_matmul_tflops": tflops,
                 "copy_timing": copy.as_dict(), "matmul_timing": mm.as_dict()}
    cache.write_text(json.dumps(_ceilings, indent=1))
    for name in ("copy_gbps", "bf16_matmul_tflops"):
        record.append({"kind": "ceiling", "name": name, "value": _ceilings[name]})
    return _ceilings


def ratios(ours: Timing, backends: dict) -> dict:
    """t_backend / t_ours for every backend that ran (>1: ours is faster)."""
    out = {}
    for name, t in backends.items():
        if isinstance(t, Timing):
            out[f"sdpa-{name}"] = t.median_ms / ours.median_ms
    return out


def flagged(ratio_map: dict) -> list[str]:
    return [f"{k}: {v:.1f}x > {SPEEDUP_FLAG:g}x, take a second look" for k, v in ratio_map.items() if v > SPEEDUP_FLAG]
