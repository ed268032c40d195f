"""The narrow backward on the GPU (bwd v20: the gradients of a call at D_qk = D_v, a multiple of 8 below 128 that is no
kernel width, read and written unpadded): lab.ops.attention's gradients through lab.check against float64 with the
padded path made impossible, the gradients equal bit for bit to the padded call's (same kernel code, zero columns;
with a gradient through the LSE too), the build that leaves the last 8-column block of dQ, dK and dV unwritten
(which must fail), deterministic mode (which pads and runs v18), and the race of the narrow call, the padded call
and SDPA's backends over lab.cases.head_dim_cases in one process (evidence:
outputs/driver_logs/20261127-h100-narrow-bwd-371e4b7/). Needs CUDA.
"""
from __future__ import annotations

import torch

from .. import bench, cases, check, ops, record, sweep
from ..cases import Case
from ..fwd.narrow_gpu import SHAPES, padded_attention, unpadded
from ..publish import tables
from . import harness

DIMS = (8, 32, 56, 72, 80, 96, 120)
BUG = {"LAB_BWD_BUG_NARROW_SHORT": None}  # common/hopper/attn_fwd_sm90.cuh's narrow_stores, wrong on purpose


def same_as_padded(shape, D: int, dtype: str, causal: bool, scale=None, through_lse: bool = False) -> bool:
    """The narrow call's output and gradients (with through_lse, a gradient through the returned LSE as well) equal
    the padded call's bit for bit: the same kernels' arithmetic with the zero columns fetched by TMA, not copied.
    Holds for dQ only where each of its elements sums at most two key blocks' atomics (S_k <= 256: a + b = b + a);
    beyond, their order varies from run to run, as v14's does."""
    B, Hq, Hkv, Sq, Sk = shape
    gen = torch.Generator(device="cuda").manual_seed(D * 7 + Sq)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(B, h, s, D, device="cuda", generator=gen).to(dt) for h, s in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    dout = torch.randn(B, Hq, Sq, D, device="cuda", generator=gen).to(dt)
    dlse = torch.randn(B, Hq, Sq, device="cuda", generator=gen)
    got = []
    for call in (lambda a, b, c: ops.attention(a, b, c, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv,
                                               return_lse=True),
                 lambda a, b, c: padded_attention(scale)(a, b, c, causal)()):
        a, b, c = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = call(a, b, c)
        outs, grads = ((out, lse), (dout, dlse)) if through_lse else ((out,), (dout,))
        got.append((out.detach(), *torch.autograd.grad(outs, (a, b, c), grads)))
    return all(torch.equal(x, y) for x, y in zip(*got))


def narrow_bwd_checks(quick: bool = False, dims=DIMS) -> int:
    """Gradient checks at every shape of lab.fwd.narrow_gpu.SHAPES and `dims` through the public op's autograd, the
    default scale in (B, H, S, D) and -0.3 in (B, S, H, D) views, with the padded path refused; bit-for-bit equality
    with the padded call (and through the LSE) at 32, 80 and 96; the bug build must fail; deterministic mode pads.
    Returns the number of failures."""
    fails = total = 0

    def tally(ok: bool, *label):
        nonlocal fails, total
        fails, total = fails + (not ok), total + 1
        print("PASS" if ok else "FAIL", *label, flush=True)

    with unpadded():
        for D in dims[::3] if quick else dims:
            for i, (shape, dtype, causal) in enumerate(SHAPES):
                case = Case(f"hdnb-{D}-{i}", *shape, D, dtype, causal)
                for scale, layout in ((None, "bhsd"), (-0.3, "bshd")):
                    res = check.check_backward(harness.autograd_runner(), case, "lab.ops.attention", trials=1,
                                               scale=scale, layout=layout)
                    ok = check.backward_passed(res)
                    tally(ok, "grads", case.label, scale, layout, "" if ok else [repr(r) for r in res.values()])
    for D, dtype in ((32, "bfloat16"), (80, "float16"), (96, "bfloat16")):
        for shape, causal in (((2, 4, 2, 65, 130), True), ((1, 6, 2, 1025, 63), False)):
            tally(same_as_padded(shape, D, dtype, causal), "equal to the padded call", D, dtype, shape, causal)
        tally(same_as_padded((2, 4, 2, 130, 130), D, dtype, True, scale=-0.3, through_lse=True),
              "equal to the padded call with a gradient through the LSE, scale -0.3", D, dtype)
    for D in (80, 32):
        case = Case(f"hdnb-bug-{D}", 1, 4, 2, 65, 130, D, "bfloat16", True)
        wrong = check.check_backward(harness.bwd_runner("v20", defines=BUG), case, "v20 LAB_BWD_BUG_NARROW_SHORT",
                                     trials=1, save=False)
        tally(not check.backward_passed(wrong), f"v20 build without the last column block at D {D} fails (as it must)")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:  # deterministic mode: the padded call and v18, whose two runs agree bit for bit
        case = Case("hdnb-det-80", 1, 4, 2, 130, 130, 80, "bfloat16", True)
        res = check.check_backward(harness.autograd_runner(), case, "lab.ops.attention (deterministic)", trials=1)
        tally(check.backward_passed(res), "deterministic mode at D 80 (padded, v18)")
    finally:
        torch.use_deterministic_algorithms(previous)
    print(f"narrow backward checks: {total - fails}/{total} pass", flush=True)
    return fails


def narrow_bwd_race(quick: bool = False, dims=(32, 80, 96), modes=("bwd", "fwd+bwd")) -> list[dict]:
    """The public op (narrow) and the padded call against SDPA's backends over lab.cases.head_dim_cases at `dims`, each
    cell's calls timed in rounds (lab.bench.time_interleaved, GPU time); rows recorded with kind `mode`."""
    from .harness import _step, flops, make_step, sdpa_step

    grid = cases.head_dim_cases(head_dims=dims)
    if quick:
        grid = [c for c in grid if "s2048" in c.name]
    ceilings, rows, padded_call = bench.ceilings(), [], padded_attention()
    for i, case in enumerate(grid):
        q, k, v = sweep._inputs_fwd(case, seed=i)
        dout = sweep._inputs_fwd(case, seed=10_000 + i)[0]
        for mode in modes:
            makers = {"lab.ops.attention": lambda: harness.ours_step(mode, q, k, v, case.causal, dout),
                      "lab.ops.attention (padded)": lambda: _step(lambda a, b, c: padded_call(a, b, c, case.causal)()[0],
                                                                  mode, q, k, v, dout)}
            for backend in ("flash", "cudnn", "efficient"):
                makers[f"sdpa-{backend}"] = lambda b=backend: sdpa_step(b, mode, q, k, v, case.causal, dout)
            steps = {name: make_step(make) for name, make in makers.items()}
            times = bench.time_interleaved({n: (f, None) for n, f in steps.items() if not isinstance(f, str)},
                                           timer=bench.GpuTimeTimer(), budget_s=0.5, max_reps=40, min_reps=5)
            times.update({n: f for n, f in steps.items() if isinstance(f, str)})
            work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, mode)
            sdpa = {b: times[f"sdpa-{b}"] for b in ("flash", "cudnn", "efficient")}
            padded = times["lab.ops.attention (padded)"]
            for name, t in times.items():
                extra = {"flops": work, "timer": "gpu_time"}
                if not name.startswith("sdpa-") and isinstance(t, bench.Timing):
                    extra["ratios"] = bench.ratios(t, sdpa)
                    if name == "lab.ops.attention" and isinstance(padded, bench.Timing):
                        extra["x_padded"] = padded.median_ms / t.median_ms
                        print(mode, case.name, f"narrow {t.median_ms:.4f} ms, padded {padded.median_ms:.4f} ms: "
                              f"{extra['x_padded']:.3f}x", flush=True)
                rows.append(record.append(sweep._row(mode, name, case, t, work, ceilings, extra)))
        del q, k, v, dout
    for mode in modes:
        for impl in ("lab.ops.attention", "lab.ops.attention (padded)"):
            print(mode, impl, tables.race([r for r in rows if r["kind"] == mode], impl=impl,
                                          backends=("flash", "cudnn", "efficient")), flush=True)
    return rows


STEPS_OFF = {"LAB_BWD_NARROW_QK_STEPS": "0"}  # bwd/v20_narrow.cu: Sᵀ and dPᵀ over every k16 step of the width


def steps_ab(dims=(32, 80, 96), seqlens=(512, 2048, 8192)) -> list[dict]:
    """bwd v20 kernel-level (the pre-pass, the kernel and the convert pass on the forward's out and LSE) with its
    k16 steps cut to the head dim (the default) against the build that runs every step of the width, GPU time in
    rounds over lab.cases.head_dim_cases at `dims` and `seqlens`; dK and dV must agree bit for bit, dQ (atomics) as
    closely as two runs of one build do.
    Rows recorded with kind 'bwd_steps_ab'; returns them."""
    from ..op_common import _scale
    from .op import _bwd_impl

    rows = []
    grid = cases.head_dim_cases(head_dims=dims, seqlens=seqlens)
    for i, case in enumerate(grid):
        q, k, v = sweep._inputs_fwd(case, seed=i)
        dout = sweep._inputs_fwd(case, seed=10_000 + i)[0]
        gqa = case.Hq != case.Hkv
        with torch.no_grad():
            out, lse = ops.attention(q, k, v, is_causal=case.causal, enable_gqa=gqa, return_lse=True)
        scale = _scale(None, case.D)

        def call(defines):
            return lambda: _bwd_impl(dout, q, k, v, out, lse, None, case.causal, scale, False, "v20", defines)
        # dK and dV come from one CTA's registers: the same bits or not. dQ is added by atomics in whatever order the
        # key blocks finish, so it is set beside the default build's own second run.
        first, full, again = call(None)(), call(STEPS_OFF)(), call(None)()
        same = torch.equal(first[1], full[1]) and torch.equal(first[2], full[2])
        dq_diff = {"vs_all_steps": float((first[0].float() - full[0].float()).abs().max()),
                   "rerun": float((first[0].float() - again[0].float()).abs().max())}
        times = bench.time_interleaved({"steps": (call(None), None), "all steps": (call(STEPS_OFF), None)},
                                       timer=bench.GpuTimeTimer(), budget_s=0.5, max_reps=40, min_reps=5)
        t, full = times["steps"], times["all steps"]
        row = {"kind": "bwd_steps_ab", "case": case.as_dict(), "timer": "gpu_time", "dk_dv_same_bits": same,
               "dq_max_abs_diff": dq_diff,
               "median_ms": {n: x.median_ms for n, x in times.items() if isinstance(x, bench.Timing)}}
        if isinstance(t, bench.Timing) and isinstance(full, bench.Timing):
            row["speedup"] = full.median_ms / t.median_ms
        rows.append(record.append(row))
        print(case.name, row["median_ms"], f"x {row.get('speedup', float('nan')):.3f}",
              "dK, dV same bits" if same else "dK, dV BITS DIFFER", "dQ max diff", dq_diff, flush=True)
        del q, k, v, dout, out, lse
    return rows
