"""Sweeps: every case timed for our kernels and every SDPA backend in one process, one record per row.

Time what users call: the row that stands for "ours" times the public op exactly as a user
calls it, `lab.ops.attention(...)` / `lab.ops.decode(...)`, validation and split plan included, and its
`impl` is exactly PUBLIC_FWD / PUBLIC_DECODE. A pre-resolved launcher (ops.fwd_call_factory / decode_call_factory) may
run beside it as a diagnostic "kernel only" row; the difference between the two is the host overhead.

A chapter calls fwd_sweep(cases, {PUBLIC_FWD: public_attention(), kernel_only("v04"): ops.fwd_call_factory("v04")})
or decode_sweep(...); the rows land in the run's records.jsonl and come back as a list for tables and plots.
"""
from __future__ import annotations

from functools import partial

from . import bench, record
from .cases import Case, DecodeCase, decode_kv_bytes
from .check import DTYPES


PUBLIC_FWD = "lab.ops.attention"
PUBLIC_DECODE = "lab.ops.decode"


def kernel_only(version: str) -> str:
    """The impl name of a diagnostic row that times a pre-resolved launcher, not the public op."""
    return f"{version} (kernel only)"


def public_attention(version=None):
    """make(q, k, v, is_causal) -> lab.ops.attention(...) as a user writes it (output allocated per call)."""
    from . import ops

    def make(q, k, v, is_causal):
        gqa = q.shape[1] != k.shape[1]
        return lambda: ops.attention(q, k, v, is_causal=is_causal, enable_gqa=gqa, version=version)
    make.version = lambda q, is_causal=False: ops.attention_version(q, version, is_causal)
    return make


def public_decode(version=None, num_splits=None):
    """make(q, k, v, seqlens) -> lab.ops.decode(...) as a user writes it (seqlens None for a uniform batch)."""
    from . import ops

    def make(q, k, v, seqlens):
        return lambda: ops.decode(q, k, v, seqlens, version=version, num_splits=num_splits)
    return make


def _inputs_fwd(case: Case, seed: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = DTYPES[case.dtype]
    shape_q, shape_kv = (case.B, case.Hq, case.Sq, case.D), (case.B, case.Hkv, case.Sk, case.D)
    return [torch.randn(s, generator=gen, device="cuda", dtype=dtype) for s in (shape_q, shape_kv, shape_kv)]


FLOP_KINDS = ("fwd", "bwd", "fwd+bwd", "bwd-kernel")  # work counted in FLOPs against the matmul ceiling; decode in bytes


def _row(kind, impl, case, timing, work, ceilings, extra=None):
    row = {"kind": kind, "impl": impl, "case": case.as_dict()}
    if isinstance(timing, bench.Timing):
        row["timing"] = timing.as_dict()
        if kind in FLOP_KINDS:
            row["tflops"] = work / timing.median_ms / 1e9
            row["frac_ceiling"] = row["tflops"] / ceilings["bf16_matmul_tflops"]
        else:
            row["gbps"] = work / timing.median_ms / 1e6
            row["frac_ceiling"] = row["gbps"] / ceilings["copy_gbps"]
    else:
        row["unsupported"] = timing
    row.update(extra or {})
    return row


def _sdpa_call(q, k, v, is_causal: bool, backend: str) -> tuple:
    """SDPA as time_interleaved takes it: torch's own dispatch, with the backend's context entered around the timed
    call (outside the timer), not a forced runner that enters it inside each call."""
    return bench.sdpa_runner("default", q, k, v, is_causal), partial(bench.sdpa_backend, backend)


# SDPA backends timed in rounds of their own, after the others: the math backend materialises B*H*S_q*S_k
# fp32 scores and runs for milliseconds to tens of them; inside a round it slowed the rows timed after it
# (H200 n9 session 20261123-034524: sdpa-default 7-10 % under sdpa-cudnn, the same kernel, and lab.ops.attention
# 13-16 % under its own kernel-only row, in exactly the six cells where math ran). A correctness reference,
# not a competitor, so it need not share the others' rounds.
TIMED_ALONE = ("math",)


def fwd_sweep(cases: list[Case], kernels: dict, backends=bench.BACKENDS, progress: bool = True,
              memory: bool = False, **stop) -> list[dict]:
    """kernels: {impl: make(q, k, v, is_causal) -> zero-arg callable}. Returns the recorded rows.

    memory=True also records each implementation's peak extra memory for one call that allocates its
    own output, as a user would call it: SDPA itself, and the public op for ours (kernel-only rows reuse
    a preallocated output, so they get none).
    """
    from tqdm.std import tqdm

    ceilings = bench.ceilings()
    rows = []
    for i, case in enumerate(tqdm(cases, desc="fwd sweep", disable=not progress, mininterval=5)):
        q, k, v = _inputs_fwd(case, seed=i)
        flops = bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal)
        calls, times, mems = {}, {}, {}
        for backend in backends:
            if backend == "math" and case.B * case.Hq * case.Sq * case.Sk * 4 > bench.MATH_MAX_SCORE_BYTES:
                times[backend] = "skipped: scores would not fit (math backend materialises them)"
                continue
            calls[backend] = _sdpa_call(q, k, v, case.causal, backend)
        fns = {impl: make(q, k, v, case.causal) for impl, make in kernels.items()}
        rounds = {name: call for name, call in calls.items() if name not in TIMED_ALONE}
        timed = bench.time_interleaved({**rounds, **{("ours", impl): (fn, None) for impl, fn in fns.items()}}, **stop)
        for name in calls.keys() - rounds.keys():
            timed.update(bench.time_interleaved({name: calls[name]}, **stop))
        for backend in backends:
            if backend in calls:
                times[backend] = timed[backend]
                if memory and isinstance(times[backend], bench.Timing):
                    with bench.sdpa_backend(backend):
                        mems[backend] = bench.peak_extra_bytes(calls[backend][0])
            rows.append(record.append(_row("fwd", f"sdpa-{backend}", case, times[backend], flops, ceilings,
                                           {"peak_extra_bytes": mems.get(backend)})))
        for impl, make in kernels.items():
            fn, t = fns[impl], timed[("ours", impl)]
            extra = {"ratios": bench.ratios(t, times) if isinstance(t, bench.Timing) else {}}
            extra["flags"] = bench.flagged(extra["ratios"])
            if hasattr(make, "version"):
                extra["version"] = make.version(q, case.causal)
            if memory and impl == PUBLIC_FWD and isinstance(t, bench.Timing):
                extra["peak_extra_bytes"] = bench.peak_extra_bytes(fn)
                extra["memory_ratios"] = {f"sdpa-{b}": extra["peak_extra_bytes"] / m for b, m in mems.items() if m}
            rows.append(record.append(_row("fwd", impl, case, t, flops, ceilings, extra)))
        del q, k, v
    return rows


ROUNDS = 5  # fwd_rounds' default: enough for a median and a range, little enough for every cell of a sweep


def fwd_rounds(cases: list[Case], kernels: dict, peers=("cudnn",), rounds: int = ROUNDS, progress: bool = True,
               inputs=None, **stop) -> list[dict]:
    """Each case in `rounds` interleaved rounds, fresh inputs each round: every kernel of `kernels` ({impl:
    make(q, k, v, is_causal)}, as fwd_sweep's) beside each SDPA backend in `peers`. A race times one input set in
    one pass, so a cell within a few percent of a peer reads above it in one run and below it in the next; the
    median of the per-round ratios, with their range, is the reading a target is judged on.

    Returns the recorded rows, kind "fwd_rounds", one per (case, kernel): `median_ms_per_round` of every call and,
    per peer, `ratio_rounds["sdpa-<peer>"]` = {per_round: peer ms / ours ms, median, min, max} (None where a call
    was refused in every round). `inputs(case, seed)` -> (q, k, v) is the sweep's (CUDA, seeded) unless given."""
    import statistics

    from tqdm.std import tqdm

    inputs = inputs or _inputs_fwd
    rows = []
    for case in tqdm(cases, desc="fwd rounds", disable=not progress, mininterval=5):
        per = {}
        for r in range(rounds):
            q, k, v = inputs(case, seed=10_000 + r)  # seeds of their own: the race's inputs are seeds 0..len-1
            calls = {("ours", impl): (make(q, k, v, case.causal), None) for impl, make in kernels.items()}
            calls.update({f"sdpa-{peer}": _sdpa_call(q, k, v, case.causal, peer) for peer in peers})
            timed = bench.time_interleaved(calls, **stop)
            for name, t in timed.items():
                key = name[1] if isinstance(name, tuple) else name
                per.setdefault(key, []).append(t.median_ms if isinstance(t, bench.Timing) else None)
            del q, k, v
        for impl in kernels:
            ratios = {}
            for peer in peers:
                pairs = [p / o for p, o in zip(per[f"sdpa-{peer}"], per[impl]) if p and o]
                ratios[f"sdpa-{peer}"] = ({"per_round": pairs, "median": statistics.median(pairs), "min": min(pairs),
                                           "max": max(pairs)} if pairs else None)
            rows.append(record.append({"kind": "fwd_rounds", "impl": impl, "case": case.as_dict(), "rounds": rounds,
                                       "median_ms_per_round": per, "ratio_rounds": ratios}))
    return rows


def _inputs_decode(case: DecodeCase, seed: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = DTYPES[case.dtype]
    q = torch.randn(case.B, case.Hq, case.q_len, case.D, generator=gen, device="cuda", dtype=dtype)
    k = torch.randn(case.B, case.Hkv, case.kv_len, case.D, generator=gen, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    seqlens = torch.tensor(case.lengths(), dtype=torch.int32, device="cuda")
    return q, k, v, seqlens


def case_inputs(case, seed: int = 0):
    """(q, k, v, the call's fourth argument) of a forward or decode case, as a public-op maker takes them:
    is_causal for a forward case; None (every sequence the full cache) for a uniform decode case."""
    if isinstance(case, DecodeCase):
        q, k, v, seqlens = _inputs_decode(case, seed)
        return q, k, v, seqlens if case.seqlens else None
    return (*_inputs_fwd(case, seed), case.causal)


def decode_sweep(cases: list[DecodeCase], kernels: dict, backends=("flash", "cudnn", "efficient", "default"),
                 progress: bool = True, **stop) -> list[dict]:
    """kernels: {impl: make(q, k, v, seqlens) -> zero-arg callable}.

    SDPA has no per-sequence lengths: for a mixed batch it gets a padding mask over the longest
    sequence (the flash backend takes no mask and reports unsupported), and its bandwidth is still
    counted on the bytes that must move, the same as ours.
    """
    import torch
    from tqdm.std import tqdm

    ceilings = bench.ceilings()
    rows = []
    for i, case in enumerate(tqdm(cases, desc="decode sweep", disable=not progress, mininterval=5)):
        q, k, v, seqlens = _inputs_decode(case, seed=i)
        work = bench.decode_bytes(case.lengths(), case.Hq, case.Hkv, case.q_len, case.D)
        cache = decode_kv_bytes(case)
        size = {"cache_bytes": cache, "cache_ge_1gb": cache >= 2**30}  # gates: >= 90% of copy bandwidth there
        mask = None
        if case.seqlens:
            mask = (torch.arange(case.kv_len, device="cuda")[None, :] < seqlens[:, None])[:, None, None, :]
        calls = {backend: (bench.sdpa_runner("default", q, k, v, False, attn_mask=mask), partial(bench.sdpa_backend, backend))
                 for backend in backends}
        calls.update({("ours", impl): (make(q, k, v, seqlens if case.seqlens else None), None)  # uniform: no seqlens
                      for impl, make in kernels.items()})
        timed = bench.time_interleaved(calls, **stop)
        times = {backend: timed[backend] for backend in backends}
        for backend in backends:
            rows.append(record.append(_row("decode", f"sdpa-{backend}", case, times[backend], work, ceilings, size)))
        for impl in kernels:
            t = timed[("ours", impl)]
            extra = {"ratios": bench.ratios(t, times) if isinstance(t, bench.Timing) else {}, **size}
            extra["flags"] = bench.flagged(extra["ratios"])
            rows.append(record.append(_row("decode", impl, case, t, work, ceilings, extra)))
        del q, k, v
    return rows

