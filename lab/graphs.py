"""CUDA-graph capture of the public ops, as serving engines use them: capture once, copy new inputs into
the captured buffers, replay.

What must hold (issue 11): the call path makes no host synchronisation (a `.min()`/`.max()` on
`cache_seqlens` used to invalidate the capture), the workspace sizes and split plan depend only on
shapes (the plan is chosen for the cache capacity S_cache at capture), and a replay with new contents,
new `cache_seqlens` values among them, gives the answer eager mode gives on the same inputs.

check_* replays `trials` times with fresh random inputs and lengths and compares every replay with an
eager call on the same inputs (bit-identical: the same kernels with the same plan) and with the float64
reference (lab.check's tolerance, relative to SDPA's own error). time_* puts replay beside eager timing.
"""
from __future__ import annotations

from . import bench, check, record
from .cases import Case, DecodeCase


def _capture(fn):
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


def _fill(gen, *tensors):
    for t in tensors:
        t.copy_(check._draw(t.shape, gen, t.device, t.dtype))


def check_decode(case: DecodeCase, trials: int = 3, seed: int = 0) -> dict:
    """Capture lab.ops.decode with cache_seqlens, replay with new q/k/v and new lengths (0..S_cache and
    out-of-range ones, which the kernels clamp)."""
    import torch

    from . import ops

    gen = torch.Generator().manual_seed(seed)  # lab.check draws on the CPU generator, then copies
    dtype = check.DTYPES[case.dtype]
    q = torch.empty(case.B, case.Hq, case.q_len, case.D, device="cuda", dtype=dtype)
    k = torch.empty(case.B, case.Hkv, case.kv_len, case.D, device="cuda", dtype=dtype)
    v = torch.empty_like(k)
    seqlens = torch.full((case.B,), case.kv_len, device="cuda", dtype=torch.int32)
    _fill(gen, q, k, v)
    graph, out = _capture(lambda: ops.decode(q, k, v, seqlens))
    results = []
    for t in range(trials):
        _fill(gen, q, k, v)
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

    gen = torch.Generator().manual_seed(seed)
    dtype = check.DTYPES[case.dtype]
    q = torch.empty(case.B, case.Hq, case.Sq, case.D, device="cuda", dtype=dtype)
    k = torch.empty(case.B, case.Hkv, case.Sk, case.D, device="cuda", dtype=dtype)
    v = torch.empty_like(k)
    _fill(gen, q, k, v)
    gqa = case.Hq != case.Hkv
    graph, out = _capture(lambda: ops.attention(q, k, v, is_causal=case.causal, enable_gqa=gqa))
    results = []
    for _ in range(trials):
        _fill(gen, q, k, v)
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
    import torch

    from . import ops

    gen = torch.Generator().manual_seed(1)
    dtype = check.DTYPES[case.dtype]
    if isinstance(case, DecodeCase):
        q = torch.empty(case.B, case.Hq, case.q_len, case.D, device="cuda", dtype=dtype)
        k = torch.empty(case.B, case.Hkv, case.kv_len, case.D, device="cuda", dtype=dtype)
        call, impl = (lambda: ops.decode(q, k, v)), "lab.ops.decode"
    else:
        q = torch.empty(case.B, case.Hq, case.Sq, case.D, device="cuda", dtype=dtype)
        k = torch.empty(case.B, case.Hkv, case.Sk, case.D, device="cuda", dtype=dtype)
        gqa = case.Hq != case.Hkv
        call, impl = (lambda: ops.attention(q, k, v, is_causal=case.causal, enable_gqa=gqa)), "lab.ops.attention"
    v = torch.empty_like(k)
    _fill(gen, q, k, v)
    graph, _ = _capture(call)
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
