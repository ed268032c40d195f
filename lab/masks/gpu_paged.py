"""The paged prefill on the GPU (lab.masks.paged: fwd v11 with a block table): chunked-prefill shapes against the
float64 reference, the wrong build that ignores the table, bad tables, and the race against the same call on a
contiguous packed cache.

Every case scatters packed keys into the pages of a shuffled table, in a cache whose other rows and pages hold NaN
(a read of any of them shows), with table entries past a sequence's pages set far outside the cache (a read of one
would fault under memcheck). The output and LSE are NaN before the launch. Yardstick: lab.masks.gpu's, SDPA's error
pattern per sequence on the contiguous keys (the softcap left out), laid on the float64 reference.
"""
from __future__ import annotations

import torch

from .. import bench, check, ops
from . import op as mop, paged, reference, spec
from .paged import PAGED_VERSION
from .gpu import GEN, draw, packed_reference

# (name, lens_q, lens_k, H_q, H_kv, D, dtype, causal, window, softcap, sinks, page_size): chunks of 1-512 queries at
# the end of 1-8192 keys, uneven lengths, empty sequences, GQA / MHA / MQA, page sizes 16-256 (48: boxes of 16 rows).
BF16, FP16 = torch.bfloat16, torch.float16
CASES = [("chunk-causal-p64", [512, 1, 300, 129], [4096, 777, 8192, 129], 8, 2, 128, BF16, True, None, 0.0, False, 64),
         ("chunk-p16-d64", [1, 64, 257, 512, 7], [8000, 64, 1000, 3000, 20], 4, 4, 64, FP16, True, None, 0.0, False,
          16),
         ("window-sink-p256", [200, 512, 33, 1], [5000, 512, 2000, 4097], 8, 1, 128, BF16, True, (1024, 0), 0.0, True,
          256),
         ("softcap-p48", [128, 63, 65, 0], [1500, 63, 700, 5], 4, 2, 64, BF16, True, None, 30.0, False, 48),
         ("noncausal-p32", [100, 0, 50, 7], [3000, 10, 0, 1], 4, 2, 128, FP16, False, None, 5.0, True, 32),
         ("b8-p128-gqa", [512, 1, 17, 256, 511, 128, 3, 64], [8192, 4000, 17, 2048, 6000, 128, 1000, 640], 8, 2, 128,
          FP16, True, (2048, 0), 0.0, True, 128)]


def make_cache(k, v, lens_k, page_size: int, spare: int = 5, max_pages: int | None = None):
    """(key_cache, value_cache, block_table) holding packed k, v (total_k, H_kv, D) in shuffled pages; NaN elsewhere;
    entries past a sequence's pages set to 2^30 (never to be read)."""
    needed = [-(-n // page_size) for n in lens_k]
    num_pages = sum(needed) + spare
    width = max_pages or max(max(needed), 1)
    perm = torch.randperm(num_pages, generator=GEN).tolist()
    kc = torch.full((num_pages, page_size, *k.shape[1:]), float("nan"), dtype=k.dtype, device=k.device)
    vc = torch.full_like(kc, float("nan"))
    table = torch.full((len(lens_k), width), 1 << 30, dtype=torch.int32)
    at, row = 0, 0
    for b, n in enumerate(lens_k):
        for i in range(needed[b]):
            page, rows = perm[at], min(page_size, n - i * page_size)
            kc[page, :rows] = k[row + i * page_size:row + i * page_size + rows]
            vc[page, :rows] = v[row + i * page_size:row + i * page_size + rows]
            table[b, i] = page
            at += 1
        row += n
    return kc, vc, table.cuda()


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def check_case(name, lens_q, lens_k, Hq, Hkv, D, dtype, causal, window, cap, sink, page_size, defines=None,
               expect_fail=False) -> bool:
    mask = spec.make_mask(causal, window, cap)
    GEN.manual_seed(hash((name, D)) % 2**31)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = draw(sum(lens_q) + 3, Hq, D, dtype=dtype)  # 3 rows of no sequence
    k, v = draw(sum(lens_k), Hkv, D, dtype=dtype), draw(sum(lens_k), Hkv, D, dtype=dtype)
    sinks = (torch.randn(Hq, generator=GEN) * 2).cuda() if sink else None
    kc, vc, table = make_cache(k, v, lens_k, page_size)
    scale = D ** -0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((Hq, q.shape[0]), float("nan"), device="cuda")
    errors = torch.full((len(lens_q),), -7, dtype=torch.int32, device="cuda")
    mop.launch(q, kc, vc, out, lse, mask, scale, 0, sinks, cu_q, cu_k, max(lens_q), max(lens_k), "v11", defines,
               paged=(table, errors))
    ref, ref_lse, yard = packed_reference(q, k, v, cu_q, cu_k, lens_q, lens_k, mask, scale, sinks)
    rows = int(cu_q[-1])
    metrics = check.compare(out[:rows], ref[:rows], yard[:rows])
    finite = torch.isfinite(ref_lse[:, :rows])
    lse_err = float((lse[:, :rows].double() - ref_lse[:, :rows])[finite].abs().max()) if finite.any() else 0.0
    inf_agree = bool((torch.isneginf(lse[:, :rows]) == torch.isneginf(ref_lse[:, :rows])).all())
    flags_ok = not bool(errors.any())
    passed = metrics["passed"] and lse_err < 1e-2 and inf_agree and flags_ok
    # the public call (default path, host-checked table) gives the same bits
    same = True
    if defines is None:
        with torch.no_grad():
            pub, pub_lse = ops.attention_varlen(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                                scale=scale, window_size=window, softcap=cap, sinks=sinks,
                                                return_lse=True, block_table=table)
            served = torch.full_like(errors, -7)  # the serving call (one crossing of the binding): the same bits
            srv, srv_lse = ops.attention_varlen(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal,
                                                scale=scale, window_size=window, softcap=cap, sinks=sinks,
                                                return_lse=True, block_table=table, page_errors=served,
                                                check_cu_seqlens=False)
            crossed = paged.serving(q, kc, vc, cu_q, cu_k, max(lens_q), max(lens_k), causal, scale, window, cap, sinks,
                                    False, table, served) is not None  # (not the full path's fallback)
        same = crossed and not bool(served.any()) and all(
            bool(torch.equal(a[:rows], out[:rows])) and bool(torch.equal(b[:, :rows], lse[:, :rows]))
            for a, b in ((pub, pub_lse), (srv, srv_lse)))
        passed = passed and same
    ok = passed != expect_fail
    print(("ok  " if ok else "BAD ") + f"{name}{' ' + str(defines) if defines else ''}: "
          f"max_abs {metrics['max_abs']:.3g} "
          f"tol {metrics['tol_max_abs']:.3g} nan {metrics['nan']} lse {lse_err:.3g} inf_agree {inf_agree} "
          f"flags {errors.tolist()} public (checked and serving)==launch {same} passed={passed}", flush=True)
    return ok


def check_bad_tables(defines=None) -> bool:
    """Sequence 1 has a page index -1, sequence 2 one equal to num_pages, sequence 3 more keys than its row holds,
    sequence 4 (no queries: no CTA computes it, one still reports it) a page index -5: flags [0, 1, 1, 2, 1], those
    sequences zero (LSE -inf), sequence 0 right; the host check raises first; the deferred flags raise at
    check_page_errors. With defines: that build's launch (paged_impl), flags and zeros only."""
    lens_q, lens_k, ps, D = [64, 64, 64, 64, 0], [1000, 1000, 1000, 1100, 500], 64, 128
    GEN.manual_seed(7)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q = draw(sum(lens_q), 4, D, dtype=BF16)
    k, v = draw(sum(lens_k), 2, D, dtype=BF16), draw(sum(lens_k), 2, D, dtype=BF16)
    sinks = torch.randn(4, generator=GEN).cuda()
    kc, vc, table = make_cache(k, v, lens_k, ps)
    table = table[:, :16].contiguous()  # 1024 keys a row: sequence 3 (1100 keys) is too long
    table[1, 3] = -1
    table[2, 15] = kc.shape[0]
    table[4, 2] = -5
    errors = torch.full((5,), -7, dtype=torch.int32, device="cuda")
    kw = dict(is_causal=True, sinks=sinks, return_lse=True, block_table=table)
    with torch.no_grad():
        if defines:
            out, lse = paged.paged_impl(q, kc, vc, cu_q, cu_k, sinks, table, errors, 64, 1100, -1, 0, 0.0,
                                        D ** -0.5, defines=defines)
        else:
            out, lse = ops.attention_varlen(q, kc, vc, cu_q, cu_k, 64, 1100, check_cu_seqlens=False,
                                            page_errors=errors, **kw)
        ref, ref_lse = reference.attend_varlen(q[:64], k[:1000], v[:1000], [0, 64], [0, 1000],
                                               spec.make_mask(True, None, 0.0), D ** -0.5, sinks)
        good = check.compare(out[:64], ref, ref)["max_abs"] < 2e-2
        zero = bool((out[64:] == 0).all()) and bool(torch.isneginf(lse[:, 64:]).all())
        flags = errors.tolist() == [0, 1, 1, 2, 1]
        raised = []
        for call in () if defines else (lambda: ops.attention_varlen(q, kc, vc, cu_q, cu_k, 64, 1100, **kw),
                     lambda: (ops.attention_varlen(q, kc, vc, cu_q, cu_k, 64, 1100, check_cu_seqlens=False, **kw),
                              paged.check_page_errors())):
            try:
                call()
                raised.append(False)
            except ValueError as error:
                raised.append(True)
                print("  raised:", str(error)[:160], flush=True)
    ok = good and zero and flags and all(raised)
    print(("ok  " if ok else "BAD ") + f"bad tables{' ' + str(defines) if defines else ''}: flags {errors.tolist()} seq0 right {good} zeros {zero} "
          f"host check / deferred raised {raised}", flush=True)
    return ok


def checks() -> int:
    """Every case, the build that ignores the table (it must fail), the bad tables."""
    bad = checks_default()
    bad += not check_case(*CASES[0], defines={"LAB_FWD_MASK_BUG_IGNORE_TABLE": 1}, expect_fail=True)
    print(f"paged checks with the wrong build done: {bad} bad", flush=True)
    return bad


def checks_default() -> int:
    """Every case and the bad tables on the default build alone (no second build)."""
    bad = sum(not check_case(*case) for case in CASES)
    bad += not check_bad_tables()
    print(f"paged checks done: {bad} bad", flush=True)
    return bad


# The race's rounds: at least RACE_MIN_REPS, then until the interquartile range is within RACE_REL_IQR of the median
# (or the budget is spent). bench.should_stop's defaults (10 rounds, 3 %) stop a cold 0.45 ms call after its first ten
# rounds with an interquartile range of about 3 %, as wide as the gap the 0.95x gate judges: two sessions of those
# defaults read 0.966 and 0.945 for the same kernels. A round of the four calls costs ~3 ms, so 60 rounds a cell are
# under a second.
RACE_MIN_REPS, RACE_REL_IQR = 60, 0.01


def race(budget_s: float = 3.0) -> list:
    """Chunked prefill (B 4, 512 new queries after 8192 - 512 cached keys, H 32 / 8, causal, bf16): the paged call
    (page_errors given, no host check: the serving call) against the same call on a contiguous packed cache."""
    rows = []
    for D, ps in ((128, 16), (128, 64), (128, 256), (64, 64)):
        GEN.manual_seed(ps + D)
        lens_q, lens_k = [512] * 4, [8192] * 4
        cu_q, cu_k = _cu(lens_q), _cu(lens_k)
        q = draw(sum(lens_q), 32, D, dtype=BF16)
        k, v = draw(sum(lens_k), 8, D, dtype=BF16), draw(sum(lens_k), 8, D, dtype=BF16)
        kc, vc, table = make_cache(k, v, lens_k, ps)
        errors = torch.zeros(4, dtype=torch.int32, device="cuda")

        def paged_call():
            return ops.attention_varlen(q, kc, vc, cu_q, cu_k, 512, 8192, is_causal=True, check_cu_seqlens=False,
                                        block_table=table, page_errors=errors)

        def packed_call():
            return ops.attention_varlen(q, k, v, cu_q, cu_k, 512, 8192, is_causal=True, check_cu_seqlens=False)
        out = torch.empty_like(q)
        mask = spec.make_mask(True, None, 0.0)

        def paged_launch():  # the kernel alone (lab.masks.op.launch): no Python checks, no allocation
            mop.launch(q, kc, vc, out, None, mask, D ** -0.5, 0, None, cu_q, cu_k, 512, 8192, "v11",
                       paged=(table, errors))

        def packed_launch():
            mop.launch(q, k, v, out, None, mask, D ** -0.5, 0, None, cu_q, cu_k, 512, 8192, "v11")
        with torch.no_grad():
            same = (paged_call() - packed_call()).abs().max().item()
            crossing = paged.serving(q, kc, vc, cu_q, cu_k, 512, 8192, True, None, None, 0.0, None, False, table,
                                     errors) is not None  # the serving call took the one crossing (not the full path)
            t = bench.time_interleaved({"paged": (paged_call, None), "packed": (packed_call, None),
                                        "paged_launch": (paged_launch, None), "packed_launch": (packed_launch, None)},
                                       budget_s=budget_s, min_reps=RACE_MIN_REPS, rel_iqr=RACE_REL_IQR)
        ratio = t["packed"].median_ms / t["paged"].median_ms
        kernel = t["packed_launch"].median_ms / t["paged_launch"].median_ms
        spread = t["packed"].q1_ms / t["paged"].q3_ms, t["packed"].q3_ms / t["paged"].q1_ms  # IQR ends crossed
        rows.append((D, ps, t["paged"].median_ms, t["packed"].median_ms, ratio, kernel))
        print(f"race D {D} page {ps}: public op paged {t['paged'].median_ms:.3f} ms, packed {t['packed'].median_ms:.3f}"
              f" ms, packed/paged {ratio:.3f} (IQR {spread[0]:.3f}-{spread[1]:.3f}, n {t['paged'].n}; target >= 0.95);"
              f" launch only paged {t['paged_launch'].median_ms:.3f} ms, packed {t['packed_launch'].median_ms:.3f} ms,"
              f" packed/paged {kernel:.3f}; max |diff| {same:.3g}; one crossing {crossing}", flush=True)
    return rows


def host_times(D: int = 128, page_size: int = 64, n: int = 300) -> dict:
    """Host time of one call (us, median of n; the GPU idle before each, so the call's Python and C++ work up to its
    launch is what the clock holds) on a race cell: the paged serving call (one crossing), the same through the full
    Python path (version named: checks, pack, the ctypes launch) and the packed call (lab.masks.fast's crossing)."""
    import time
    q, k, v, cu_q, cu_k, (kc, vc, table), _ = race_cell(D, page_size)
    errors = torch.zeros(4, dtype=torch.int32, device="cuda")
    kw = dict(is_causal=True, check_cu_seqlens=False)
    calls = {"paged serving (one crossing)": lambda: ops.attention_varlen(q, kc, vc, cu_q, cu_k, 512, 8192, **kw,
                                                                          block_table=table, page_errors=errors),
             "paged, full Python path": lambda: ops.attention_varlen(q, kc, vc, cu_q, cu_k, 512, 8192, **kw,
                                                                     block_table=table, page_errors=errors,
                                                                     version=PAGED_VERSION),
             "packed (one crossing)": lambda: ops.attention_varlen(q, k, v, cu_q, cu_k, 512, 8192, **kw)}
    times = {}
    with torch.no_grad():
        for name, call in calls.items():
            samples = []
            for i in range(n + 10):
                torch.cuda.synchronize()
                start = time.perf_counter()
                call()
                if i >= 10:
                    samples.append((time.perf_counter() - start) * 1e6)
            samples.sort()
            times[name] = samples[n // 2]
            print(f"host time D {D} page {page_size}, {name}: median {samples[n // 2]:.1f} us (IQR "
                  f"{samples[n // 4]:.1f}-{samples[3 * n // 4]:.1f}, n {n})", flush=True)
    return times


def cold_gap(D: int = 128, page_size: int = 64, budget_s: float = 0.4) -> None:
    """Where a cold public call's time beyond its kernel goes: the paged serving call and the packed call, public and
    launch only (lab.masks.op.launch), each timed cold with its host time in (CudaTimer, as race) and with the host's
    work outside the window (GpuTimeTimer), in the same rounds."""
    q, k, v, cu_q, cu_k, (kc, vc, table), _ = race_cell(D, page_size)
    errors, out = torch.zeros(4, dtype=torch.int32, device="cuda"), torch.empty_like(q)
    mask = spec.make_mask(True, None, 0.0)
    kw = dict(is_causal=True, check_cu_seqlens=False)
    calls = {"paged": lambda: ops.attention_varlen(q, kc, vc, cu_q, cu_k, 512, 8192, **kw, block_table=table,
                                                    page_errors=errors),
             "packed": lambda: ops.attention_varlen(q, k, v, cu_q, cu_k, 512, 8192, **kw),
             "paged_launch": lambda: mop.launch(q, kc, vc, out, None, mask, D ** -0.5, 0, None, cu_q, cu_k, 512, 8192,
                                                PAGED_VERSION, paged=(table, errors)),
             "packed_launch": lambda: mop.launch(q, k, v, out, None, mask, D ** -0.5, 0, None, cu_q, cu_k, 512, 8192,
                                                 PAGED_VERSION)}
    with torch.no_grad():
        for name, timer in (("cold, host in", bench.CudaTimer()), ("GPU time", bench.GpuTimeTimer())):
            t = bench.time_interleaved({n: (c, None) for n, c in calls.items()}, timer=timer, budget_s=budget_s)
            print(f"cold_gap D {D} page {page_size}, {name}: " + "; ".join(
                f"{n} {t[n].median_ms:.4f} ms (IQR {t[n].q1_ms:.4f}-{t[n].q3_ms:.4f})" for n in calls), flush=True)


def sanitize_calls() -> None:
    """What compute-sanitizer runs (no float64 reference: the checks do that): paged calls at page size 16 and 48
    (several boxes a tile, NaN past the keys) and 256, causal and windowed, then the bad tables (page_errors, the host
    check and the deferred flags)."""
    with torch.no_grad():
        for ps, D, window in ((16, 64, None), (48, 128, (100, 0)), (256, 128, None)):
            lens_q, lens_k = [1, 130, 0, 64], [300, 1000, 5, 64]
            k, v = draw(sum(lens_k), 2, D, dtype=BF16), draw(sum(lens_k), 2, D, dtype=BF16)
            kc, vc, table = make_cache(k, v, lens_k, ps)
            errors = torch.full((4,), -7, dtype=torch.int32, device="cuda")
            out = ops.attention_varlen(draw(sum(lens_q), 4, D, dtype=BF16), kc, vc, _cu(lens_q), _cu(lens_k), 130,
                                       1000, is_causal=True, window_size=window, block_table=table,
                                       page_errors=errors, check_cu_seqlens=False)
            print(f"page {ps} D {D}: flags {errors.tolist()} finite {bool(torch.isfinite(out).all())}", flush=True)
        check_bad_tables()
    torch.cuda.synchronize()


def race_cell(D: int, page_size: int):
    """The race's tensors for one cell (race's draw and seed): q, k, v packed, the shuffled cache and its table, and
    the same keys as an identity-table cache (the packed k, v seen as pages, pages in order: the same bytes as the
    contiguous call, read through the table)."""
    GEN.manual_seed(page_size + D)
    lens_q, lens_k = [512] * 4, [8192] * 4
    q = draw(sum(lens_q), 32, D, dtype=BF16)
    k, v = draw(sum(lens_k), 8, D, dtype=BF16), draw(sum(lens_k), 8, D, dtype=BF16)
    kc, vc, table = make_cache(k, v, lens_k, page_size)
    n = sum(lens_k) // page_size
    ident = torch.arange(n, dtype=torch.int32, device="cuda").view(4, -1)
    view = (n, page_size, 8, D)
    return q, k, v, _cu(lens_q), _cu(lens_k), (kc, vc, table), (k.view(view), v.view(view), ident)


def race_builds(builds: dict, cells=((128, 16), (128, 64), (128, 256), (64, 64)), budget_s: float = 0.4,
                timer=None, contiguous_defines=None) -> list:
    """Kernel-only A/B of paged builds (name -> defines or None) against the contiguous call on the race's cells,
    GPU time (bench.GpuTimeTimer: the host's launch outside the window), in alternating rounds; each build on the
    shuffled table, the default build also on the identity table. Prints contiguous / paged per build.
    contiguous_defines: the contiguous call's build (None: the default)."""
    rows = []
    mask = spec.make_mask(True, None, 0.0)
    for D, ps in cells:
        q, k, v, cu_q, cu_k, shuffled, ident = race_cell(D, ps)
        out, errors = torch.empty_like(q), torch.zeros(4, dtype=torch.int32, device="cuda")

        def call(kc, vc, table, defines):
            return lambda: mop.launch(q, kc, vc, out, None, mask, D ** -0.5, 0, None, cu_q, cu_k, 512, 8192, "v11",
                                      defines, paged=None if table is None else (table, errors))
        calls = {"contiguous": (call(k, v, None, contiguous_defines), None), "identity": (call(*ident, None), None)}
        calls.update({name: (call(*shuffled, defines), None) for name, defines in builds.items()})
        with torch.no_grad():
            t = bench.time_interleaved(calls, timer=timer or bench.GpuTimeTimer(), budget_s=budget_s)
        base = t["contiguous"]
        line = [f"D {D} page {ps}: contiguous{' ' + str(contiguous_defines) if contiguous_defines else ''} "
                f"{base.median_ms:.4f} ms"]
        for name in calls:
            if name != "contiguous":
                ratio = base.median_ms / t[name].median_ms
                spread = (base.q1_ms / t[name].q3_ms, base.q3_ms / t[name].q1_ms)
                rows.append((D, ps, name, t[name].median_ms, base.median_ms, ratio, spread))
                line.append(f"{name} {t[name].median_ms:.4f} ({ratio:.3f}x, IQR {spread[0]:.3f}-{spread[1]:.3f})")
        print("; ".join(line), flush=True)
    return rows


def profile_calls() -> None:
    """What ncu profiles (python -m lab.masks.gpu_paged profile, -k regex:attn_fwd_v11 -c 4): one launch each of the
    contiguous call at D 128, the paged call at page 16 and 256 (shuffled table), and page 256 on the identity
    table, in that order."""
    mask = spec.make_mask(True, None, 0.0)
    for i, ps in enumerate((16, 16, 256, 256)):
        q, k, v, cu_q, cu_k, shuffled, ident = race_cell(128, ps)
        out, errors = torch.empty_like(q), torch.zeros(4, dtype=torch.int32, device="cuda")
        kc, vc, table = (k, v, None) if i == 0 else ident if i == 3 else shuffled
        mop.launch(q, kc, vc, out, None, mask, 128 ** -0.5, 0, None, cu_q, cu_k, 512, 8192, "v11",
                   paged=None if table is None else (table, errors))
        torch.cuda.synchronize()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["profile"]:
        profile_calls()
