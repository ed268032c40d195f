"""The packed (varlen) backward on the GPU: lab.ops.attention_varlen's gradients (bwd v08 through
lab.masks.varlen_bwd) against float64 autograd of lab.masks.reference.attend_varlen, empty sequences, rows of no
sequence, GQA, window, softcap and sinks with their gradient included; a build that forgets the window on the
tiles it crosses must fail. Records are check_bwd rows of chapter n13 (the masked backward's gate counts them).

Yardstick: SDPA's error pattern on each sequence as its own dense call (lab.masks.gpu_bwd's, the softcap left
out), laid on the float64 gradients, plus the 16-bit rounding of the exact gradient and of dS's dLSE term; d sinks
by its formula with SDPA's 16-bit O, plus the spread of that formula under O's rounding (grad_yardstick.SIGMAS).
The gradients' memory and the workspace are NaN-poisoned before each call.

race(): packed documents against FlexAttention's compiled document mask and one length against the dense op,
forward and backward through the public op in GPU time, with the backward's two layouts side by side. The A/B runs
behind the packed calls' records (grids, passes, profile) are in lab.masks.gpu_varlen_ab.
"""
from __future__ import annotations

import json
import time

import torch

from .. import bench, check, ops
from . import dense_route, op as mop, reference, spec, varlen_bwd
from .gpu import CHAPTER, GEN, draw
from .grad_yardstick import SIGMAS, _sdpa_grads, dlse_rounding, keep_worst, report, rounding_var


def _per_sequence(fn, cu_q, cu_k, *packed):
    """fn(b, offset, (1, H, S, D) views of q, k, v, dout, dlse) per sequence with rows and keys; returns a list of
    (b, results)."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    q, k, v, dout, dlse = packed
    done = []
    for b in range(len(cq) - 1):
        rq, rk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if cq[b + 1] > cq[b] and ck[b + 1] > ck[b]:
            views = [t[r].transpose(0, 1)[None] for t, r in ((q, rq), (k, rk), (v, rk), (dout, rq))]
            done.append((rq, rk, fn(ck[b + 1] - ck[b] - (cq[b + 1] - cq[b]), *views, dlse[:, rq][None])))
    return done


def check_varlen_bwd(name, lens_q, lens_k, Hq, Hkv, D, dtype, causal, window, cap, sink, defines=None,
                     expect_fail=False, trials=2, stray=5):
    """stray: packed rows after the last sequence (they belong to none: zero gradients)."""
    mask = spec.make_mask(causal, window, cap)
    scale = D ** -0.5
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    tq, tk = sum(lens_q) + stray, sum(lens_k) + stray
    worst = None
    for trial in range(trials):
        GEN.manual_seed(hash(("varlen-bwd", name, tuple(lens_q), D, trial)) % 2**31)
        magnitude = 2.0 if trial == trials - 1 else 1.0
        q = draw(tq, Hq, D, dtype=dtype, magnitude=magnitude).requires_grad_()
        k = draw(tk, Hkv, D, dtype=dtype, magnitude=magnitude).requires_grad_()
        v = draw(tk, Hkv, D, dtype=dtype).requires_grad_()
        dout = draw(tq, Hq, D, dtype=dtype)
        dlse = torch.randn(Hq, tq, generator=GEN).cuda()
        sinks = (torch.randn(Hq, generator=GEN) * 2).cuda().requires_grad_() if sink else None
        inputs = (q, k, v) + ((sinks,) if sink else ())
        out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal, scale=scale,
                                        window_size=window, softcap=cap, sinks=sinks, return_lse=True)
        dl = torch.where(torch.isfinite(lse), dlse, 0.0).detach()
        # freed blocks of the gradients' sizes start as NaN (an unwritten gradient row fails); a named build's
        # workspace is filled with NaN by its launch (poison_workspace: a freed block of its size, poisoned while
        # another of that size was alive, was not reliably the one the launch got)
        check._poison_allocator(q, k, v)
        if defines:
            dq, dk, dv, ds = varlen_bwd.launch(dout, q, k, v, out.detach(), lse.detach(), dl, cu_q, cu_k, sinks, sink,
                                               max(lens_q), max(lens_k), mask.left, mask.right, mask.softcap, scale,
                                               defines=defines, poison_workspace=True)  # (unwritten: NaN)
            got = (dq, dk, dv) + ((ds,) if sink else ())
        else:
            used = torch.where(torch.isfinite(lse), lse, 0.0)
            got = torch.autograd.grad((out.float() * dout.float()).sum() + (used * dl).sum(), inputs)
        ref_in = [t.detach().double().requires_grad_() for t in inputs]
        r_out, r_lse = reference.attend_varlen(*ref_in[:3], cu_q, cu_k, mask, scale, ref_in[3] if sink else None)
        r_used = torch.where(torch.isfinite(r_lse), r_lse, 0.0)
        want = torch.autograd.grad((r_out * dout.double()).sum() + (r_used * dl.double()).sum(), ref_in)
        # the yardstick's error pattern, sequence by sequence (SDPA's dense call and its float64 twin)
        plain = spec.Mask(mask.left, mask.right, 0.0)
        pattern = [torch.zeros_like(w, dtype=torch.float64) for w in want[:3]]
        s_out = torch.zeros_like(r_out)

        def one(offset, qb, kb, vb, db, lb):
            s = _sdpa_grads(qb, kb, vb, db, mask, scale, offset, sinks)
            p_in = [t.detach().double().requires_grad_() for t in (qb, kb, vb)]
            p_out, _ = reference.attend(*p_in, plain, scale, offset, sinks.detach() if sink else None)
            p = torch.autograd.grad((p_out * db.double()).sum(), p_in)
            _, b_lse = reference.attend(qb.detach(), kb.detach(), vb.detach(), mask, scale, offset,
                                        sinks.detach() if sink else None)
            lt = dlse_rounding(qb.detach(), kb.detach(), mask, scale, offset, b_lse, lb, dtype) + (0.0,)
            return s[0], [(sg.double() - pg).abs() + abs(t) for sg, pg, t in zip(s[1:], p, lt)]

        for rq, rk, (so, errs) in _per_sequence(one, cu_q, cu_k, q.detach(), k.detach(), v.detach(), dout, dl):
            s_out[rq] = so[0].transpose(0, 1).double()
            for i, (e, r) in enumerate(zip(errs, (rq, rk, rk))):
                pattern[i][r] += e[0].transpose(0, 1)
        metrics = {}
        for label, g, w, e in zip(("dq", "dk", "dv"), got, want, pattern):
            metrics[label] = check.compare(g, w, w + e + (w.to(dtype).double() - w).abs())
        if sink:
            p_sink = torch.exp(sinks.detach().double()[:, None] - r_lse.detach())

            def dsink(o):
                return -(torch.nan_to_num(p_sink * ((dout.double() * o).sum(-1).t() - dl.double()), 0.0)).sum(1)
            exact = dsink(r_out.detach())
            var = rounding_var(r_out, dout, dtype).sum(-1).t()  # (H_q, rows); rows of no sequence have p_sink 0
            sigma = torch.nan_to_num(p_sink ** 2 * var, 0.0).sum(1).sqrt()
            yard = (want[3] + (dsink(s_out) - exact).abs() + (dsink(r_out.detach().to(dtype).double()) - exact).abs()
                    + SIGMAS * sigma)
            metrics["dsinks"] = check.compare(got[3], want[3], yard)
        worst, failed = keep_worst(worst, metrics)
        if failed:
            break
    case = dict(name=name, packed=True, lens_q=list(lens_q), lens_k=list(lens_k), stray_rows=stray, Hq=Hq, Hkv=Hkv,
                D=D, dtype=str(dtype).split(".")[-1], causal=causal, window=[mask.left, mask.right], softcap=cap,
                sinks=sink)
    return report("bwd_varlen", case, worst, expect_fail, defines, q.device)

def checks(defines=None) -> int:
    """The packed backward's grid: empty sequences (either side), uneven lengths across tile edges, one sequence
    longer than the rest, S_q != S_k per sequence (bottom-right), D 64 / 128, fp16 / bf16, GQA; then the wrong builds,
    which must fail. defines: a candidate build of bwd v08 for every row (the wrong builds on top of it); then the
    calls go through varlen_bwd.launch rather than autograd."""
    bf16, fp16 = torch.bfloat16, torch.float16
    docs_q, docs_k = [1, 0, 63, 65, 200, 0, 130], [1, 7, 63, 65, 200, 0, 97]
    long_q = [1025, 3, 0, 300]
    cases = [("causal", docs_q, docs_q, 128, bf16, True, None, 0.0, False),
             ("window", docs_q, docs_q, 128, bf16, True, (40, 0), 0.0, False),
             ("cross", docs_q, docs_k, 128, bf16, True, (64, 0), 0.0, True),
             ("all", docs_q, docs_k, 64, bf16, True, (100, 0), 30.0, True),
             ("noncausal", docs_q, docs_k, 64, fp16, False, (20, 30), 5.0, True),
             ("full", docs_q, docs_k, 128, fp16, False, None, 0.0, True),
             ("long", long_q, long_q, 128, bf16, True, (256, 0), 50.0, True),
             ("causal-cross", docs_q, docs_k, 128, bf16, True, None, 0.0, True),
             ("causal-d64", docs_q, docs_k, 64, fp16, True, None, 0.0, False)]
    bad = 0
    for name, lq, lk, D, dtype, causal, window, cap, sink in cases:
        bad += not check_varlen_bwd(name, lq, lk, 4, 2, D, dtype, causal, window, cap, sink, defines)
    docs = [700, 1, 0, 1300, 129, 2048, 64]
    bad += not check_varlen_bwd("docs-mqa", docs, docs, 4, 1, 64, bf16, True, None, 0.0, False, defines, trials=1)
    bad += not check_varlen_bwd("docs-window", docs, docs, 4, 2, 128, fp16, True, (300, 0), 0.0, True, defines,
                                trials=1)
    base = dict(defines or {})
    bad += not check_varlen_bwd("no-window", long_q, long_q, 4, 2, 128, bf16, True, (64, 0), 0.0, False,
                                defines={**base, "LAB_BWD_MASK_BUG_NO_WINDOW": 1}, expect_fail=True)
    # the causal steps (no window) with the diagonal forgotten on the tiles it crosses
    bad += not check_varlen_bwd("no-diagonal", docs_q, docs_k, 4, 2, 128, bf16, True, None, 0.0, False,
                                defines={**base, "LAB_BWD_MASK_BUG_NO_WINDOW": 1}, expect_fail=True)
    # the packed producer with every sequence's keys read from the first one's rows
    bad += not check_varlen_bwd("no-offset", docs_q, docs_q, 4, 2, 128, bf16, True, None, 0.0, False,
                                defines={**base, "LAB_BWD_PACKED_BUG_NO_OFFSET": 1}, expect_fail=True)
    # the pre-pass leaving dq_accum unzeroed (NaN-poisoned: it must fail)
    bad += not check_varlen_bwd("no-zero", docs_q, docs_q, 4, 2, 128, bf16, True, None, 0.0, False,
                                defines={**base, "LAB_BWD_PACKED_BUG_NO_ZERO": 1}, expect_fail=True, trials=1)
    if base.get("LAB_BWD_PACKED_BLOCK_CONVERT", 1):  # the block convert with two rows of each eight swapped
        bad += not check_varlen_bwd("tile-rows", docs_q, docs_q, 4, 2, 128, bf16, True, None, 0.0, False,
                                    defines={**base, "LAB_BWD_PACKED_BUG_TILE_ROWS": 1}, expect_fail=True, trials=1)
    print(f"checks varlen bwd {defines or ''} done: {bad} bad", flush=True)
    return bad


# ------------------------------------------------------------------ the forward's packed grid

def check_packed_fwd(name, lens_q, lens_k, Hq, Hkv, D, dtype, causal, window, cap, sink, defines=None,
                     expect_fail=False) -> bool:
    """fwd v11's packed call (its persistent grid unless `defines` say otherwise) against the float64 reference,
    with lab.masks.gpu.check_varlen's yardstick (SDPA's error on each sequence); O and LSE NaN-poisoned first, so a
    tile the grid never visits fails. Records a check row of chapter n13."""
    from .. import record
    from .gpu import packed_reference
    mask = spec.make_mask(causal, window, cap)
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    GEN.manual_seed(hash(("packed-fwd", name, D)) % 2**31)
    q = draw(sum(lens_q), Hq, D, dtype=dtype)
    k, v = draw(sum(lens_k), Hkv, D, dtype=dtype), draw(sum(lens_k), Hkv, D, dtype=dtype)
    sinks = (torch.randn(Hq, generator=GEN) * 2).cuda() if sink else None
    scale = D ** -0.5
    out = torch.full_like(q, float("nan"))
    lse = torch.full((Hq, q.shape[0]), float("nan"), device="cuda")
    mop.launch(q, k, v, out, lse, mask, scale, 0, sinks, cu_q, cu_k, max(lens_q), max(lens_k), "v11",
               defines=defines)
    ref, ref_lse, yard = packed_reference(q, k, v, cu_q, cu_k, lens_q, lens_k, mask, scale, sinks)
    metrics = check.compare(out, ref, yard)
    lse_err = (lse.double() - ref_lse).nan_to_num(float("inf"))
    lse_err[torch.isinf(ref_lse) & (lse == ref_lse)] = 0.0  # -inf where the reference has -inf (no key, no sink)
    metrics["lse_max_abs"] = float(lse_err.abs().max()) if lse_err.numel() else 0.0
    passed = metrics["passed"] and metrics["lse_max_abs"] < 1e-2
    ok = passed != expect_fail
    case = dict(name=name, lens_q=lens_q, lens_k=lens_k, Hq=Hq, Hkv=Hkv, D=D, dtype=str(dtype).split(".")[-1],
                causal=causal, window=[mask.left, mask.right], softcap=cap, sinks=sink)
    record.append({"kind": "check", "impl": "v11-varlen", "case": case, "defines": defines or {},
                   "expect_fail": expect_fail, "ok": ok,
                   "check": {k: metrics[k] for k in ("passed", "max_abs", "rel_l2", "nan", "mismatches",
                                                     "sdpa_max_abs", "tol_max_abs", "lse_max_abs")}}, chapter=CHAPTER)
    print(("ok  " if ok else "BAD ") + f"packed fwd {name} {case} {defines or ''} max_abs {metrics['max_abs']:.3g} "
          f"tol {metrics['tol_max_abs']:.3g} lse {metrics['lse_max_abs']:.3g} nan {metrics['nan']} "
          f"expect_fail {expect_fail}", flush=True)
    return ok


# Uneven documents for the packed grid: empty sequences on both sides, a tile edge on each side of 128, one long
# sequence among short ones (the PAIR units of the short ones are mostly empty), S_q != S_k per sequence, rows
# before a bottom-right diagonal (tiles with no key).
PACKED_FWD_CASES = (("docs", [0, 5, 1025, 63, 0, 300, 128, 129], [0, 5, 1025, 63, 7, 300, 128, 129]),
                    ("long-short", [2000, 1, 3, 130, 0, 257], [2000, 1, 3, 130, 0, 257]),
                    ("cross", [5, 70, 1, 0, 200, 400], [9, 64, 30, 12, 0, 1]))
PACKED_FWD_MASKS = ((True, None, 0.0, False), (True, (100, 0), 0.0, True), (False, (20, 20), 30.0, False),
                    (False, None, 0.0, True), (True, None, 50.0, True))


def packed_fwd_checks(defines=None, quick: bool = False) -> int:
    """The packed forward's grid (cases x masks at D 128 and 64, bf16; fp16 and GQA 8:1 on two rows), then the
    scheduler's wrong build (every unit's light tile skipped), which must fail. quick: a subset of the grid (each
    case, each head dim, the causal, window + sink, softcap and two-sided rows). Returns how many went wrong."""
    bad = 0
    for D in (128, 64):
        for c, (name, lq, lk) in enumerate(PACKED_FWD_CASES):
            for m, (causal, window, cap, sink) in enumerate(PACKED_FWD_MASKS):
                if not quick or (m + c + (D == 64)) % 4 == 0 or (m == 0 and (D == 128 or c == 1)):
                    bad += not check_packed_fwd(name, lq, lk, 4, 2, D, torch.bfloat16, causal, window, cap, sink,
                                                defines)
    docs = [700, 1, 0, 1300, 129, 2048, 64]
    bad += not check_packed_fwd("fp16-gqa", docs, docs, 8, 1, 128, torch.float16, True, (300, 0), 20.0, True, defines)
    if not quick:
        bad += not check_packed_fwd("fp16-gqa", docs, docs, 8, 1, 64, torch.float16, True, None, 0.0, False, defines)
    wrong = {**(defines or {}), "LAB_FWD_MASK_BUG_PAIR_ONE": 1}
    bad += not check_packed_fwd("pair-one", docs, docs, 4, 2, 128, torch.bfloat16, True, None, 0.0, False, wrong,
                                expect_fail=True)
    print(f"checks packed fwd {defines or ''} done: {bad} bad", flush=True)
    return bad


# ------------------------------------------------------------------ race and profile

# Packed documents of the race (causal, H 16, bf16): twelve documents of 23k tokens; 512-4096-token documents at D 64
# and 128; one length (8 x 2048) against the dense op on the same tokens.
DOCS12 = [2048, 3072, 1200, 4096, 517, 1900, 2500, 640, 3300, 1024, 1800, 1003]
DOCS_MIXED = [512, 4096, 1536, 777, 3000, 2048, 1100, 2600]
SLOT_MAJOR = {"LAB_BWD_PACKED_HEAD_MINOR": 0}  # the packed grid's other order (attn_bwd_packed_sm90.cuh)
Q64 = {"LAB_BWD_PACKED_D64_Q128": 0}  # D 64 packed with 64 queries a step (bwd/v08_masks.cu)
RACE_CELLS = (("docs12", DOCS12, 128), ("one-length", [2048] * 8, 128), ("docs-mixed", DOCS_MIXED, 64),
              ("docs-mixed", DOCS_MIXED, 128), ("one-length", [2048] * 8, 64))


def _cell(lens, D, H=16, dtype=torch.bfloat16):
    total = sum(lens)
    GEN.manual_seed(total + D)
    q, k, v = (draw(total, H, D, dtype=dtype).requires_grad_() for _ in range(3))
    dout = draw(total, H, D, dtype=dtype)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    return q, k, v, dout, cu


@bench.flex_race
def race(budget_s: float = 240.0, cells=RACE_CELLS, flex_too: bool = True, variants: bool = False,
         jsonl: str | None = None, packed_builds=()) -> list:
    """Forward, backward alone (autograd.grad with retain_graph over one forward) and forward + backward through the
    public op, in GPU time (bench.GpuTimeTimer), against FlexAttention's compiled document mask (flex_too: False
    leaves it out of the one-length cells, which race the dense op); the backward's two layouts (varlen_bwd.launch)
    side by side, and with `variants` the packed kernel's other grid order and D 64 config; packed_builds: more
    (label, defines) builds of the packed backward's kernel call beside the default ("kernel_packed_<label>"), and the
    public op's backward on each ("lab_<label>": varlen_bwd.DEFINES set around the call). Returns the rows it printed;
    each is also appended to `jsonl` as it is done."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    timer, start, rows = bench.GpuTimeTimer(), time.time(), []
    for name, lens, D in cells:
        if time.time() - start > budget_s:
            print(f"race-varlen: budget spent, skipping {name} D {D}", flush=True)
            continue
        q, k, v, dout, cu, H = *_cell(lens, D), 16
        mx, total, ins = max(lens), sum(lens), None
        doc = torch.repeat_interleave(torch.arange(len(lens), device="cuda"), torch.tensor(lens, device="cuda"))
        bm = create_block_mask(lambda b, h, qi, ki: (doc[qi] == doc[ki]) & (qi >= ki), None, None, total, total,
                               device="cuda")
        ins = (q, k, v)
        fns = {"lab": (lambda: ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False),
                       dout)}
        if flex_too or len(set(lens)) > 1:
            fns["flex"] = (lambda: flex(*(t.transpose(0, 1)[None] for t in ins), block_mask=bm),
                           dout.transpose(0, 1)[None])
        if len(set(lens)) == 1:  # the default call (check_cu_seqlens=True): its host copy of cu_seqlens picks
            fns["labchk"] = (lambda: ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True),  # the dense route
                             dout)
            fns["labchk11"] = (lambda: ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, version=  # named:
                               "v11"), dout)  # the same checked call on the packed kernel (no route)
            cu_host = cu.cpu()  # cu_seqlens on the host: the route with no device sync
            fns["labhost"] = (lambda: ops.attention_varlen(q, k, v, cu_host, cu_host, mx, mx, is_causal=True), dout)

            def dense():
                return ops.attention(*(t.view(len(lens), mx, H, D).transpose(1, 2) for t in ins), is_causal=True)
            fns["dense"] = (dense, dout.view(len(lens), mx, H, D).transpose(1, 2))
        calls = {}
        for key, (fn, g) in fns.items():
            out = fn()
            calls[key] = (lambda out=out, g=g: torch.autograd.grad(out, ins, g, retain_graph=True), None)
            calls[key + "+fwd"] = (lambda fn=fn, g=g: torch.autograd.grad(fn(), ins, g), None)
            calls[key + "_fwd"] = (lambda fn=fn: _no_grad(fn), None)
        with torch.no_grad():
            o, lse = ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, return_lse=True)
        if len(set(lens)) == 1:  # diagnostic: the dense route's GPU work without the host copy that picks it
            route_args = (q.detach(), k.detach(), v.detach(), cu, cu, None, mx, mx, -1, 0, 0.0, D ** -0.5, None)
            calls["route_fwd"] = (lambda: dense_route.dense_impl(*route_args, want_lse=False,
                                                                 shape=(len(lens), mx, mx)), None)
        kernels = (("packed", "packed", None), ("padded", "padded", None))
        if variants:
            kernels += (("packed_slot_major", "packed", SLOT_MAJOR),) + ((("packed_q64", "packed", Q64),) if D == 64
                                                                        else ())
        kernels += tuple(("packed_" + label, "packed", defines) for label, defines in packed_builds)
        for label, layout, defines in kernels:
            calls["kernel_" + label] = (lambda layout=layout, defines=defines: varlen_bwd.launch(
                dout, q, k, v, o, lse, None, cu, cu, None, False, mx, mx, -1, 0, 0.0, D ** -0.5, layout=layout,
                defines=defines), None)
        lab_out = ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False)
        for label, defines in packed_builds:
            calls["lab_" + label] = (lambda defines=defines: _with_defines(
                defines, lambda: torch.autograd.grad(lab_out, ins, dout, retain_graph=True)), None)
        times = bench.time_interleaved(calls, timer=timer, budget_s=0.3, max_reps=21, min_reps=7)
        ms = {key: (t.median_ms if hasattr(t, "median_ms") else str(t)) for key, t in times.items()}
        iqr = {key: t.iqr_ms for key, t in times.items() if hasattr(t, "iqr_ms")}
        quartiles = {key: [t.q1_ms, t.q3_ms, t.n] for key, t in times.items() if hasattr(t, "q1_ms")}

        def ratio(a, b):
            return ms[a] / ms[b] if isinstance(ms.get(a), float) and isinstance(ms.get(b), float) else None
        row = {"cell": name, "lens": lens, "H": H, "D": D, "tokens": total, "median_ms": ms, "q1_q3_n": quartiles,
               "flex_over_lab": {s: ratio("flex" + s, "lab" + s) for s in ("_fwd", "", "+fwd")},
               "lab_over_dense": {s: ratio("lab" + s, "dense" + s) for s in ("_fwd", "", "+fwd")},
               "checked_over_dense": {s: ratio("labchk" + s, "dense" + s) for s in ("_fwd", "", "+fwd")},
               "checked_packed_over_route": {s: ratio("labchk11" + s, "labchk" + s) for s in ("_fwd", "", "+fwd")},
               "host_cu_over_dense": {s: ratio("labhost" + s, "dense" + s) for s in ("_fwd", "", "+fwd")},
               "route_over_dense_fwd": ratio("route_fwd", "dense_fwd"),
               "padded_over_packed": ratio("kernel_padded", "kernel_packed"),
               "slot_major_over_head_minor": ratio("kernel_packed_slot_major", "kernel_packed"),
               "q64_over_q128": ratio("kernel_packed_q64", "kernel_packed"),
               "builds_over_default": {label: [ratio("kernel_packed_" + label, "kernel_packed"),
                                               ratio("lab_" + label, "lab")] for label, _ in packed_builds},
               "flex_over_builds": {label: ratio("flex", "lab_" + label) for label, _ in packed_builds}}
        _keep(rows, row, jsonl)
        print(f"race-varlen {name} D {D} ({total} tokens): " + ", ".join(
            f"{key} {v if isinstance(v, str) else round(v, 3)} (iqr {iqr.get(key, 0):.3f})" for key, v in ms.items()),
            flush=True)
        print(f"  Flex / lab (fwd, bwd, fwd+bwd): {row['flex_over_lab']}; lab / dense: {row['lab_over_dense']}; "
              f"checked lab / dense: {row['checked_over_dense']}; cu_seqlens on the host / dense: "
              f"{row['host_cu_over_dense']}; checked v11 / checked route: "
              f"{row['checked_packed_over_route']}; route's GPU work / dense fwd: "
              f"{row['route_over_dense_fwd']}; "
              f"padded / packed backward: {row['padded_over_packed']}; slot-major / head-minor grid: "
              f"{row['slot_major_over_head_minor']}; D 64's 64 / 128 queries a step: {row['q64_over_q128']}; "
              f"builds / default (kernel call, public backward): {row['builds_over_default']}; Flex / builds' "
              f"backward: {row['flex_over_builds']}", flush=True)
    return rows


def _with_defines(defines, fn):
    """fn() with the packed backward of every call that names no build run as `defines` (varlen_bwd.default_build)."""
    with varlen_bwd.default_build(varlen_bwd.LAYOUT, defines):
        return fn()


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def _keep(rows: list, row: dict, jsonl: str | None) -> None:
    """Keep a row, and append it to `jsonl` as it is done (a run cut by its limit keeps the rows before)."""
    rows.append(row)
    if jsonl:
        with open(jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")


# What bounds the packed backward: its GPU time split by kernel (torch.profiler over the public op's backward), the
# dK/dV kernel's rate against the bf16 matmul ceiling and each memory pass's bandwidth against the copy ceiling.
BWD_PARTS = (("dK/dV kernel", ("bwd_dkdv",)), ("pre-pass", ("bwd_pre",)), ("dQ convert", ("convert_dq",)),
             ("stray rows", ("zero_stray",)), ("sink gradient", ("sink_grad",)))


def bwd_part(kernel: str) -> str:
    """The part of the packed backward a kernel's name belongs to (BWD_PARTS; "other" for any kernel of torch's)."""
    return next((part for part, keys in BWD_PARTS if any(key in kernel for key in keys)), "other")


def bwd_bound(lens, D: int, H: int, parts_us: dict, element_bytes: int = 2) -> dict:
    """From one backward's GPU time by part (us): the dK/dV kernel's TFLOP/s (2.5 times the causal forward's FLOPs of
    each sequence) and the bytes each pass moves at least (live rows only: the pre-pass reads O and dO, zeroes the fp32
    dQ accumulator and reads LSE, writes Delta and LSE log2 e; the convert reads the accumulator and writes dQ) with
    their GB/s."""
    flops = sum(2.5 * bench.attention_flops(1, H, s, s, D, True) for s in lens)
    rows = sum(lens) * H
    moved = {"pre-pass": rows * (2 * D * element_bytes + 4 * D + 12), "dQ convert": rows * D * (4 + element_bytes)}
    total = sum(parts_us.values())
    main = parts_us.get("dK/dV kernel")
    return {"total_us": total, "parts_us": dict(parts_us),
            "main_tflops": flops / main / 1e6 if main else None,
            "passes_gbps": {part: moved[part] / parts_us[part] / 1e3 for part in moved if parts_us.get(part)}}


def kernel_times(fn, steps: int = 3) -> list:
    """torch.profiler's kernel table of fn(), warmed twice (builds, plans), then `steps` calls: [(kernel name, calls
    per fn(), GPU us per fn())], the longest first."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total)
    return [(e.key, e.count // steps, e.device_time_total / steps) for e in events]


def bwd_breakdown(lens, D: int = 128, steps: int = 3) -> dict:
    """torch.profiler of the public op's backward alone (autograd.grad with retain_graph over one forward, as race
    times it) on one cell, bf16, causal, H 16: bwd_bound of its GPU time per backward by part."""
    q, k, v, dout, cu = _cell(lens, D)
    mx = max(lens)
    out = ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False)
    parts: dict = {}
    for kernel, _, us in kernel_times(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), steps):
        parts[bwd_part(kernel)] = parts.get(bwd_part(kernel), 0.0) + us
    return bwd_bound(lens, D, 16, parts)
