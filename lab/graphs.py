"""CUDA-graph capture of the public ops, as serving engines use them: capture once, copy new inputs into
the captured buffers, replay.

What must hold for a serving loop to capture a call: the call path makes no host synchronisation (a
`.min()`/`.max()` on `cache_seqlens` used to invalidate the capture), the workspace sizes and split plan depend only on
shapes (the plan is chosen for the cache capacity S_cache at capture), and a replay with new contents,
new `cache_seqlens` values among them, gives the answer eager mode gives on the same inputs.

check_* replays `trials` times with fresh random inputs and lengths and compares every replay with an
eager call on the same inputs (bit-identical: the same kernels with the same plan) and with the float64
reference (lab.check's tolerance, relative to SDPA's own error). time_* puts replay beside eager timing.
"""
from __future__ import annotations

from . import bench, check, record, sweep
from .cases import Case, DecodeCase


def capture(fn):
    """Warm up on a side stream (builds and loads the kernel outside the capture), then capture fn()."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _refill(case, seed: int, *buffers):
    """Copy a fresh draw of the case's q, k, v (lab.sweep.case_inputs) into the captured buffers."""
    for buffer, new in zip(buffers, sweep.case_inputs(case, seed)[:3]):
        buffer.copy_(new)


def check_decode(case: DecodeCase, trials: int = 3, seed: int = 0) -> dict:
    """Capture lab.ops.decode with cache_seqlens, replay with new q/k/v and new lengths (0..S_cache and
    out-of-range ones, which the kernels clamp)."""
    import torch

    from . import ops

    gen = torch.Generator().manual_seed(seed)  # the lengths of each replay
    q, k, v, _ = sweep.case_inputs(case, seed)
    seqlens = torch.full((case.B,), case.kv_len, device="cuda", dtype=torch.int32)
    graph, out = capture(lambda: ops.decode(q, k, v, seqlens))
    results = []
    for t in range(trials):
        _refill(case, seed + 1 + t, q, k, v)
        lengths = torch.randint(1, case.kv_len + 1, (case.B,), generator=gen, dtype=torch.int32)
        if t == trials - 1 and case.B >= 2:  # out of range: clamped to [0, S_cache] on the device
            lengths[0], lengths[1] = case.kv_len + 1000, -5
        seqlens.copy_(lengths)
        out.fill_(float("nan"))  # poison: a replay that writes nothing fails
        graph.replay()
        replayed = out.clone()
        eager = ops.decode(q, k, v, seqlens)
        clamped = lengths.clamp(0, case.kv_len)
        seen = (clamped > 0).nonzero().flatten().tolist()  # length 0 attends to nothing: zeros, checked apart
        sub = lambda t: t[seen]
        cmp = check.compare(sub(replayed), check.reference(sub(q), sub(k), sub(v), seqlens=clamped[seen]),
                            check.sdpa(sub(q), sub(k), sub(v), seqlens=clamped[seen]))
        empty_rows_zero = bool((replayed[(clamped == 0).to(replayed.device)] == 0).all())
        identical = bool(torch.equal(replayed, eager))
        results.append({**cmp, "passed": cmp["passed"] and empty_rows_zero, "empty_rows_zero": empty_rows_zero,
                        "identical_to_eager": identical, "lengths": lengths.tolist()})
    passed = all(r["passed"] and r["identical_to_eager"] for r in results)
    return record.append({"kind": "graph", "impl": "lab.ops.decode", "case": case.as_dict(), "passed": passed,
                          "trials": results})


def check_attention(case: Case, trials: int = 3, seed: int = 0) -> dict:
    """Capture lab.ops.attention, replay with new q/k/v."""
    import torch

    from . import ops

    q, k, v, _ = sweep.case_inputs(case, seed)
    gqa = case.Hq != case.Hkv
    graph, out = capture(lambda: ops.attention(q, k, v, is_causal=case.causal, enable_gqa=gqa))
    results = []
    for t in range(trials):
        _refill(case, seed + 1 + t, q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        replayed = out.clone()
        eager = ops.attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)
        cmp = check.compare(replayed, check.reference(q, k, v, case.causal), check.sdpa(q, k, v, case.causal))
        results.append({**cmp, "identical_to_eager": bool(torch.equal(replayed, eager))})
    passed = all(r["passed"] and r["identical_to_eager"] for r in results)
    return record.append({"kind": "graph", "impl": "lab.ops.attention", "case": case.as_dict(), "passed": passed,
                          "trials": results})


def time_replay(case, **stop) -> dict:
    """Eager public-op time beside graph-replay time of the same call (L2 flushed before each, as always)."""
    q, k, v, arg = sweep.case_inputs(case, seed=1)
    decode = isinstance(case, DecodeCase)
    call = (sweep.public_decode() if decode else sweep.public_attention())(q, k, v, arg)
    impl = sweep.PUBLIC_DECODE if decode else sweep.PUBLIC_FWD
    graph, _ = capture(call)
    eager = bench.time_fn(call, **stop)
    replay = bench.time_fn(graph.replay, **stop)
    return record.append({"kind": "graph-timing", "impl": impl, "case": case.as_dict(),
                          "eager": eager.as_dict(), "replay": replay.as_dict(),
                          "replay_speedup": eager.median_ms / replay.median_ms})


def table(check_rows: list[dict], timing_rows: list[dict]):
    """Replays checked (worst trial) and replay time beside eager time."""
    from .publish.tables import Table

    lines = []
    for r in check_rows:
        worst = max(r["trials"], key=lambda t: t["max_abs"] if t["max_abs"] == t["max_abs"] else float("inf"))
        lines.append([r["impl"], r["case"]["name"], "PASS" if r["passed"] else "FAIL", len(r["trials"]),
                      all(t["identical_to_eager"] for t in r["trials"]), worst["max_abs"], float("nan"), float("nan")])
    for r in timing_rows:
        lines.append([r["impl"], r["case"]["name"], "timed", "", "", float("nan"), r["eager"]["median_ms"] * 1e3,
                      r["replay"]["median_ms"] * 1e3])
    return Table(["op", "case", "verdict", "replays", "bit-identical to eager", "max abs err", "eager us",
                  "graph replay us"], lines, "torch.cuda.graph capture: replays with new inputs, and replay timing")
