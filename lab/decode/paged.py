"""Paged decoding on the GPU side: paged inputs of a PagedCase, the float64 check, and the race of chapter n11.

The layout and the CPU algorithm are lab.decode.emulate_paged's (NumPy); this module builds the same layout in torch
(any device), checks lab.ops.decode(..., block_table=...) against a float64 reference computed on the
contiguous cache the pages were cut from, and times the public op beside our contiguous decode and SDPA on
the same data made contiguous.
"""
from __future__ import annotations

import math

import torch

from .. import bench, check, record, sweep
from ..cases import PagedCase
from ..check import DTYPES, CheckResult
from ..sweep import PUBLIC_DECODE

SPARE_PAGES = 3  # pages in the pool that no sequence uses: a shuffled table never maps 1:1 onto the pool
CONTIGUOUS = f"{PUBLIC_DECODE} contiguous"  # the race's row (and ratio key) of our decode on the contiguous cache
DEFAULT_CALL = f"{PUBLIC_DECODE} (no page_errors)"  # the call users make: flags read at a later call, no host sync
EAGER_CHECK = f"{PUBLIC_DECODE} (eager flag check)"  # the same call's rows recorded while it read its flags at once


def block_table(batch: int, kv_len: int, page_size: int, generator=None, device="cpu", spare: int = SPARE_PAGES):
    """(table (B, max_pages) int32 on device, num_pages): the B * max_pages pages of a pool of num_pages in a
    random order (lab.decode.emulate_paged.block_table's rule, in torch)."""
    max_pages = -(-kv_len // page_size)
    num_pages = batch * max_pages + spare
    order = torch.randperm(num_pages, generator=generator, device=generator.device if generator is not None else "cpu")
    return order[:batch * max_pages].view(batch, max_pages).to(device=device, dtype=torch.int32), num_pages


def to_pages(cache: torch.Tensor, table: torch.Tensor, num_pages: int, page_size: int) -> torch.Tensor:
    """The contiguous cache (B, Hkv, S, D) in pages (num_pages, page_size, Hkv, D) through `table`."""
    batch, heads, seqlen, dim = cache.shape
    max_pages = table.shape[1]
    padded = torch.zeros(batch, heads, max_pages * page_size, dim, dtype=cache.dtype, device=cache.device)
    padded[:, :, :seqlen] = cache
    blocks = padded.view(batch, heads, max_pages, page_size, dim).permute(0, 2, 3, 1, 4)
    pages = torch.zeros(num_pages, page_size, heads, dim, dtype=cache.dtype, device=cache.device)
    pages[table.reshape(-1).long()] = blocks.reshape(batch * max_pages, page_size, heads, dim)
    return pages


def visible(length: int, q_len: int, causal: bool, device) -> torch.Tensor:
    """Bool (q_len, length): token i sees key j (bottom-right causal, or everything)."""
    keys = torch.arange(length, device=device)
    limit = torch.full((q_len,), length, device=device) if not causal else \
        length - q_len + torch.arange(q_len, device=device) + 1
    return keys[None, :] < limit[:, None]


def reference(q, k, v, lengths, causal: bool, scale: float | None = None) -> torch.Tensor:
    """float64 attention on the contiguous cache, sequence b over its first lengths[b] keys, bottom-right
    causal; a token that sees no key gets 0 (the kernel's convention)."""
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lengths):
        mask = visible(n, T, causal, q.device)
        if n == 0 or not mask.any():
            continue
        kb = k[b, :, :n].double().repeat_interleave(group, 0)
        vb = v[b, :, :n].double().repeat_interleave(group, 0)
        scores = (q[b].double() @ kb.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no key: 0
        out[b] = weights @ vb
    return out


def yardstick(q, k, v, lengths, causal: bool, scale: float | None = None) -> torch.Tensor:
    """SDPA in the inputs' dtype on the same sequences (a bool mask for causal); rows with no key: 0."""
    gqa = q.shape[1] != k.shape[1]
    parts = []
    for b, n in enumerate(lengths):
        mask = visible(n, q.shape[2], causal, q.device)
        if n == 0:
            parts.append(torch.zeros_like(q[b:b + 1]))
            continue
        o = torch.nn.functional.scaled_dot_product_attention(
            q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], attn_mask=mask if causal else None, scale=scale,
            enable_gqa=gqa)
        parts.append(torch.where(mask.any(-1)[None, None, :, None], o, torch.zeros_like(o)))
    return torch.cat(parts)


def paged_inputs(case: PagedCase, generator, device, magnitude: float = 1.0):
    """q, contiguous k and v, their pages, the shuffled table and cache_seqlens (int32) of one trial. Drawn on
    the generator's device (a CUDA generator for the race's multi-GB caches), then moved to `device`."""
    dtype = DTYPES[case.dtype]

    def draw(*shape, scale=magnitude):
        x = torch.randn(shape, generator=generator, dtype=torch.float32, device=generator.device)
        return (x * scale).to(device=device, dtype=dtype)

    q = draw(case.B, case.Hq, case.q_len, case.D)
    k = draw(case.B, case.Hkv, case.kv_len, case.D)
    v = draw(case.B, case.Hkv, case.kv_len, case.D, scale=1.0)
    table, num_pages = block_table(case.B, case.kv_len, case.page_size, generator, device)
    seqlens = torch.tensor(case.lengths(), dtype=torch.int32, device=device)
    return dict(q=q, k=k, v=v, k_pages=to_pages(k, table, num_pages, case.page_size),
                v_pages=to_pages(v, table, num_pages, case.page_size), table=table, seqlens=seqlens)


def gen_on(device, seed: int) -> torch.Generator:
    """A generator on `device` (a CUDA device's own, so a trial's inputs never cross from the host), seeded."""
    device = torch.device(device)
    return torch.Generator(device=device if device.type == "cuda" else "cpu").manual_seed(seed)


def check_paged(case: PagedCase, impl: str = PUBLIC_DECODE, num_splits=None, trials: int = 3, seed: int = 0,
                device=None, peaked: bool = True, scale: float | None = None, save: bool = True,
                defines: dict | None = None, version: str | None = None) -> CheckResult:
    """lab.ops.decode(q, k_pages, v_pages, cache_seqlens, block_table=..., is_causal=case.causal) against the
    float64 reference on the contiguous cache, judged by SDPA's error (lab.check's rule). The op allocates its
    output, so the allocator's free blocks of that size are NaN-poisoned first (lab.check's backward rule);
    page_errors starts at -1 and must come back 0. defines: build decode v03 with them and call the binding
    directly (the self-test's wrong kernel, LAB_PAGED_BUG_IDENTITY, which ignores the table). version: a paged
    version by name (None: lab.ops.decode's choice; with defines, v03)."""
    from .. import build, op_common, ops

    device = device or check.resolve_device()
    lengths = case.lengths()

    def one_trial(gen, magnitude):
        # Draw where the check runs, from the trial's seed: on the CPU's generator the K and V of a 7 x 8 x 4097 x
        # 128 batch (up to 16 KV heads at D 256) cost seconds a trial, most of chapter n11's check cells.
        gen = gen_on(device, gen.initial_seed())
        a = paged_inputs(case, gen, device, magnitude)
        flags = torch.full((case.B,), -1, dtype=torch.int32, device=device)
        check._poison_allocator(a["q"])
        if defines is None:
            out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], scale, num_splits,
                             block_table=a["table"], is_causal=case.causal, page_errors=flags, version=version)
        else:
            out = build.binding().decode_paged_call(
                ops.launcher(ops.DECODE, version or "v03", defines), a["q"], a["k_pages"], a["v_pages"], a["seqlens"], a["table"],
                flags, op_common._scale(scale, case.D), num_splits or 1, case.causal)[0]
        if bool(flags.any()):
            out = torch.full_like(out, float("nan"))  # a false (or unwritten) flag fails the check
        return (out, reference(a["q"], a["k"], a["v"], lengths, case.causal, scale),
                yardstick(a["q"], a["k"], a["v"], lengths, case.causal, scale))

    return check._one(CheckResult(impl, case), one_trial, trials, seed, peaked, {"layout": "paged"} if save else None)


def graph_check(case: PagedCase, seed: int = 0, save: bool = True) -> dict:
    """lab.ops.decode(..., block_table=..., page_errors=...) captured once in a CUDA graph, then replayed with
    new cache_seqlens and block_table contents: the same table, a reshuffled one over the same pool, then a
    table with a page id past the pool. Each replay must equal an eager call bit for bit (flags included) and,
    where no flag is set, pass the float64 check. One row, kind "graph"."""
    from .. import graphs, ops

    a = paged_inputs(case, torch.Generator().manual_seed(seed), "cuda")
    q, kp, vp = a["q"], a["k_pages"], a["v_pages"]
    seqlens, table, flags = a["seqlens"].clone(), a["table"].clone(), torch.zeros(case.B, dtype=torch.int32, device="cuda")

    def call(errors):
        return ops.decode(q, kp, vp, seqlens, block_table=table, is_causal=case.causal, page_errors=errors)
    graph, out = graphs.capture(lambda: call(flags))  # warm-up (build, split plan) outside the capture
    bad = a["table"].clone()
    bad[-1, 0] = kp.shape[0] + 5
    lengths = case.lengths()
    replays = [(lengths[::-1], a["table"]), ([max(0, n - 17) for n in lengths], a["table"][:, torch.randperm(
        table.shape[1], generator=torch.Generator().manual_seed(seed + 1))]), (lengths, bad)]
    results = []
    for new_lengths, new_table in replays:
        seqlens.copy_(torch.tensor(new_lengths, dtype=torch.int32))
        table.copy_(new_table)
        graph.replay()
        eager_flags = torch.zeros_like(flags)
        eager = call(eager_flags)
        same = bool(torch.equal(out, eager)) and bool(torch.equal(flags, eager_flags))
        passed = same
        for b in [b for b in range(case.B) if int(flags[b]) == 0]:  # this replay's keys of b, in order
            k, v = (pages[table[b].long()].flatten(0, 1)[:new_lengths[b]].transpose(0, 1)[None] for pages in (kp, vp))
            ref = reference(q[b:b + 1], k, v, [new_lengths[b]], case.causal)
            passed &= check.compare(out[b:b + 1], ref, yardstick(q[b:b + 1], k, v, [new_lengths[b]], case.causal))["passed"]
        results.append({"lengths": new_lengths, "bit_identical": same, "flags": flags.tolist(), "passed": passed})
    want_flags = [0] * (case.B - 1) + [1]
    row = {"kind": "graph", "impl": PUBLIC_DECODE, "case": case.as_dict(), "replays": results,
           "passed": all(r["passed"] for r in results) and results[-1]["flags"] == want_flags}
    return record.append(row) if save else row


def race_calls(case: PagedCase, a: dict, flags: torch.Tensor) -> dict:
    """The race's five calls on one case's data (paged_inputs' dict `a`, a page_errors buffer `flags`), as
    lab.bench.time_interleaved takes them ({name: (fn, context or None)}): SDPA's cuDNN and flash backends on the
    contiguous cache, our contiguous decode (CONTIGUOUS), the public op on the paged cache with page_errors
    (PUBLIC_DECODE: the graph-safe call, no host sync) and without it (DEFAULT_CALL: the call users make, its flags
    read at a later call by lab.decode.deferred, no host sync either; before that it read them at once, a host sync
    a call, and its rows are named EAGER_CHECK)."""
    from functools import partial

    from .. import ops

    q, k, v, kp, vp, table, seqlens = (a[n] for n in ("q", "k", "v", "k_pages", "v_pages", "table", "seqlens"))
    mask = visible(case.kv_len, case.q_len, True, q.device) if case.causal else None
    calls = {f"sdpa-{backend}": (bench.sdpa_runner("default", q, k, v, False, attn_mask=mask),
                                 partial(bench.sdpa_backend, backend)) for backend in ("cudnn", "flash")}
    calls[CONTIGUOUS] = (lambda: ops.decode(q, k, v, is_causal=case.causal), None)
    calls[PUBLIC_DECODE] = (lambda: ops.decode(q, kp, vp, seqlens, block_table=table, is_causal=case.causal,
                                               page_errors=flags), None)
    calls[DEFAULT_CALL] = (lambda: ops.decode(q, kp, vp, seqlens, block_table=table, is_causal=case.causal), None)
    return calls


def paged_sweep(cases: list[PagedCase], progress: bool = True, **stop) -> list[dict]:
    """The race: per case, on one set of data, race_calls' five calls timed in rounds (lab.bench.time_interleaved,
    as the other chapters' races: each round times every call once, so every call's host path runs after the
    others', as inside a model step; outputs/driver_logs/20261127-h100-paged-rounds-d878422/ measured what the order
    moves). Bandwidth on the bytes that must move; ratios t_other / t_paged (sdpa-*, and CONTIGUOUS), and on the
    CONTIGUOUS row t_sdpa / t_contiguous. Rows are kind "paged"; their case carries `tokens` (batch x length), the x axis of the
    chapter's plots."""
    from tqdm.std import tqdm

    from .. import ops

    ceilings = bench.ceilings()
    rows = []
    for i, case in enumerate(tqdm(cases, desc="paged sweep", disable=not progress, mininterval=5)):
        a = paged_inputs(case, torch.Generator(device="cuda").manual_seed(i), "cuda")
        flags = torch.zeros(case.B, dtype=torch.int32, device="cuda")
        work = bench.decode_bytes(case.lengths(), case.Hq, case.Hkv, case.q_len, case.D)
        cache = 2 * sum(case.lengths()) * case.Hkv * case.D * 2
        size = {"cache_bytes": cache, "cache_ge_1gb": cache >= 2**30, "page_size": case.page_size}
        timed = bench.time_interleaved(race_calls(case, a, flags), **stop)
        ops.check_page_errors()  # the default call's flags, all of them: a good table never raises
        times = {backend: timed[f"sdpa-{backend}"] for backend in ("cudnn", "flash")}
        for backend in ("cudnn", "flash"):
            rows.append(record.append(_row(f"sdpa-{backend}", case, times[backend], work, ceilings, size)))
        contiguous = timed[CONTIGUOUS]
        mine = dict(size, ratios=bench.ratios(contiguous, times) if isinstance(contiguous, bench.Timing) else {})
        rows.append(record.append(_row(CONTIGUOUS, case, contiguous, work, ceilings, mine)))
        for impl in (PUBLIC_DECODE, DEFAULT_CALL):
            t = timed[impl]
            extra = dict(size, ratios=bench.ratios(t, times) if isinstance(t, bench.Timing) else {})
            if isinstance(t, bench.Timing) and isinstance(contiguous, bench.Timing):
                extra["ratios"][CONTIGUOUS] = contiguous.median_ms / t.median_ms
            extra["flags"] = bench.flagged(extra["ratios"])
            rows.append(record.append(_row(impl, case, t, work, ceilings, extra)))
        del a
    return rows


def _row(impl, case, timing, work, ceilings, extra):
    """lab.sweep's row (kind "paged", GB/s on the bytes that must move), its case with `tokens` (batch x length)."""
    row = sweep._row("paged", impl, case, timing, work, ceilings, extra)
    row["case"]["tokens"] = sum(case.lengths())
    return row


def serving_lengths(batch: int, max_len: int, seed: int = 0) -> list[int]:
    """Long-tailed cache lengths, as a server's batch holds them: log-normal around 1k keys (sigma 1.2), clipped to
    [1, max_len], the longest set to max_len (one long conversation)."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.exp(torch.randn(batch, generator=gen, dtype=torch.float64) * 1.2 + math.log(1024.0))
    lengths = [int(min(max(1.0, x), max_len)) for x in draws.tolist()]
    lengths[int(torch.randint(batch, (1,), generator=gen))] = max_len
    return lengths


def serving_race(batch: int = 64, max_len: int = 16384, page_size: int = 16, dtype: str = "bfloat16", seed: int = 0,
                 split_chunk: int = 2048, save: bool = True) -> list[dict]:
    """The serving view: one decode step over a ragged batch (serving_lengths), timed eager (lab.bench's CudaTimer)
    and as a CUDA-graph replay (captured once, lab.graphs.capture), for the paged public op (page_errors given),
    the same op with splits of at most `split_chunk` keys of the capacity (a plan for ragged batches: the long
    sequences' keys spread over more blocks), and the contiguous op on the padded cache with cache_seqlens. GB/s on
    the bytes that must move (the lengths' K and V). Rows kind "serving"."""
    from .. import bench, graphs, ops

    lengths = serving_lengths(batch, max_len, seed)
    case = PagedCase(f"serve-b{batch}-p{page_size}", batch, 32, 8, 1, max_len, 128, dtype, tuple(lengths), page_size)
    a = paged_inputs(case, torch.Generator(device="cuda").manual_seed(seed), "cuda")
    flags = torch.zeros(batch, dtype=torch.int32, device="cuda")
    splits = -(-max_len // split_chunk)
    calls = {PUBLIC_DECODE: lambda: ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"],
                                               block_table=a["table"], page_errors=flags),
             f"{PUBLIC_DECODE} num_splits={splits}": lambda: ops.decode(a["q"], a["k_pages"], a["v_pages"],
                                                                        a["seqlens"], None, splits,
                                                                        block_table=a["table"], page_errors=flags),
             CONTIGUOUS: lambda: ops.decode(a["q"], a["k"], a["v"], a["seqlens"])}
    work = bench.decode_bytes(lengths, case.Hq, case.Hkv, case.q_len, case.D)
    rows = []
    for impl, fn in calls.items():
        graph, _ = graphs.capture(fn)
        for mode, timed in (("eager", fn), ("graph", graph.replay)):
            t = bench.time_fn(timed)
            rows.append({"kind": "serving", "impl": impl, "mode": mode, "case": case.as_dict(),
                         "median_us": t.median_ms * 1e3, "gbps": work / t.median_ms / 1e6, "bytes": work,
                         "tokens": sum(lengths),
                         "lengths": {"min": min(lengths), "median": sorted(lengths)[batch // 2], "max": max(lengths)}})
    contiguous = {r["mode"]: r["median_us"] for r in rows if r["impl"] == CONTIGUOUS}
    for r in rows:  # t(contiguous) / t(this call), same mode
        r["ratios"] = {CONTIGUOUS: contiguous[r["mode"]] / r["median_us"]}
    del a
    return [record.append(r) for r in rows] if save else rows
