"""A/B runs of the packed (varlen) calls on the GPU, each behind a record under outputs/experiments: the packed
forward's grids (ab_packed: the persistent grid against the per-tile one and two waves, beside the dense op), the
packed backward's passes around its dK/dV kernel (ab_passes), torch.profiler's kernel table of one forward +
backward in each backward layout (profile), and small calls for compute-sanitizer (sanitize_packed). The checks and
the race a chapter runs are in lab.masks.gpu_varlen.
"""
from __future__ import annotations

import torch

from .. import bench, ops
from . import op as mop, spec, varlen_bwd
from .gpu import draw
from .gpu_varlen import DOCS12, _cell, _keep, _no_grad, _with_defines, kernel_times

PER_TILE = {"LAB_FWD_MASK_PACKED_PERSIST": 0}  # the packed grid before: one CTA per (sequence, head, query tile)
NO_ROW_BOUND = {"LAB_FWD_MASK_PACKED_ROW_BOUND": 0}  # the persistent grid's masked tiles by mask_window_wg
WAVES2 = {"LAB_FWD_MASK_PACKED_WAVES": 2}  # two persistent CTAs per multiprocessor, started as SMs free up


def _medians(times: dict) -> tuple[dict, dict]:
    """bench.time_interleaved's answer as {call: median ms} and {call: [q1 ms, q3 ms, n]} (calls that ran only)."""
    ms = {key: t.median_ms for key, t in times.items() if hasattr(t, "median_ms")}
    return ms, {key: [t.q1_ms, t.q3_ms, t.n] for key, t in times.items() if hasattr(t, "q1_ms")}


def _ms_text(ms: dict, quart: dict) -> str:
    return ", ".join(f"{key} {v:.4f} [{quart[key][0]:.4f}, {quart[key][1]:.4f}]" for key, v in ms.items())


def ab_packed(cells=(("one-length", [2048] * 8, 128), ("one-length", [2048] * 8, 64), ("docs12", None, 128)),
              builds=(("persist", None), ("per_tile", PER_TILE), ("waves2", WAVES2)), budget_s: float = 0.5,
              jsonl: str | None = None):
    """Kernel GPU time (bench.GpuTimeTimer, rounds interleaved) of fwd v11's packed call in each build against the
    dense op on the same tokens (one length: the public lab.ops.attention, causal), bf16, H 16, causal."""
    timer, rows = bench.GpuTimeTimer(), []
    for name, lens, D in cells:
        lens = lens or DOCS12
        q, k, v, _, cu = _cell(lens, D)
        q, k, v = q.detach(), k.detach(), v.detach()
        mx, mask = max(lens), spec.make_mask(True, None, 0.0)
        out = torch.empty_like(q)
        calls = {label: ((lambda d=d: mop.launch(q, k, v, out, None, mask, D ** -0.5, 0, None, cu, cu, mx, mx, "v11",
                                                 defines=d)), None) for label, d in builds}
        if len(set(lens)) == 1:
            views = [t.view(len(lens), mx, 16, D).transpose(1, 2) for t in (q, k, v)]
            calls["dense"] = (lambda: _no_grad(lambda: ops.attention(*views, is_causal=True)), None)
            calls["lab_unchecked"] = (lambda: _no_grad(lambda: ops.attention_varlen(
                q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False)), None)
        ms, quart = _medians(bench.time_interleaved(calls, timer=timer, budget_s=budget_s, max_reps=41, min_reps=11))
        row = {"cell": name, "lens": lens, "D": D, "H": 16, "median_ms": ms, "q1_q3_n": quart,
               "over_dense": {key: ms[key] / ms["dense"] for key in ms if "dense" in ms},
               "persist_over_per_tile": ms.get("persist", 0) / ms["per_tile"] if "per_tile" in ms else None}
        _keep(rows, row, jsonl)
        print(f"ab-packed {name} D {D}: " + _ms_text(ms, quart) +
              f"; over dense {({k_: round(v, 3) for k_, v in row['over_dense'].items()})}; persist / per tile "
              f"{row['persist_over_per_tile']}", flush=True)
    return rows


def sanitize_packed() -> None:
    """Small packed forward calls for compute-sanitizer (memcheck, racecheck): uneven lengths, empty sequences on
    both sides, S_q != S_k, rows with no key (a bottom-right diagonal), D 128 and 64, with and without sinks."""
    for D, lq, lk, causal, sink in ((128, [0, 5, 300, 63, 0, 129], [0, 5, 300, 63, 7, 129], True, True),
                                    (64, [5, 70, 1, 0, 200], [9, 64, 30, 12, 0], True, False)):
        cu_q = torch.tensor([0] + torch.tensor(lq).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + torch.tensor(lk).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        q = draw(sum(lq), 4, D, dtype=torch.bfloat16)
        k, v = draw(sum(lk), 2, D, dtype=torch.bfloat16), draw(sum(lk), 2, D, dtype=torch.bfloat16)
        out, lse = torch.empty_like(q), torch.empty(4, q.shape[0], device="cuda")
        sinks = torch.zeros(4, device="cuda") if sink else None
        mop.launch(q, k, v, out, lse, spec.make_mask(causal, None, 0.0), D ** -0.5, 0, sinks, cu_q, cu_k,
                   max(lq), max(lk), "v11")
        torch.cuda.synchronize()
        print(f"sanitize packed fwd D {D} lens {lq} / {lk}: finite {bool(torch.isfinite(out).all())}", flush=True)





PROFILE_BUILDS = (("packed", "packed", None), ("padded", "padded", None))


def profile(cells=(("docs12", DOCS12, 128), ("one-length", [2048] * 8, 128)), steps: int = 3,
            builds=PROFILE_BUILDS) -> dict:
    """torch.profiler of forward + backward through the public op in each build, (label, layout, defines) of the
    backward (both layouts by default): {cell/label: [(kernel, calls, total us)]}, every kernel's time summed over
    `steps` calls (printed as a table)."""
    tables = {}
    for name, lens, D in cells:
        q, k, v, dout, cu = _cell(lens, D)
        mx = max(lens)
        for label, layout, defines in builds:
            with varlen_bwd.default_build(layout, defines):
                table = [(kernel[:90], count, us) for kernel, count, us in kernel_times(
                    lambda: torch.autograd.grad(ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True,
                                                                     check_cu_seqlens=False), (q, k, v), dout), steps)]
            tables[f"{name}/D{D}/{label}"] = table
            total = sum(t for _, _, t in table)
            print(f"profile {name} D {D} {label}: {total:.0f} us of GPU time per forward + backward", flush=True)
            for kernel, count, us in table[:14]:
                print(f"  {us:9.1f} us {100 * us / total:5.1f} %  x{count:<3d} {kernel}", flush=True)
    return tables


THREAD_CONVERT = {"LAB_BWD_PACKED_BLOCK_CONVERT": 0}  # the per-thread dQ convert (the default before the block one)


def ab_passes(cells=(("one-length", [2048] * 8, 128), ("docs12", DOCS12, 128)),
              builds=(("thread_convert", THREAD_CONVERT),), budget_s: float = 0.6, jsonl: str | None = None) -> list:
    """GPU time (bench.GpuTimeTimer, rounds interleaved) of the packed backward's kernel call (varlen_bwd.launch) and
    of the public op's backward (autograd over one forward, varlen_bwd.DEFINES set around it) in the default build and
    each of `builds`, bf16, causal, H 16; no FlexAttention (race() has it). Returns the rows it printed."""
    timer, rows = bench.GpuTimeTimer(), []
    for name, lens, D in cells:
        q, k, v, dout, cu = _cell(lens, D)
        mx, ins = max(lens), (q, k, v)
        with torch.no_grad():
            o, lse = ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, return_lse=True)
        out = ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False)
        calls = {}
        for label, defines in (("default", None),) + tuple(builds):
            calls["kernel_" + label] = (lambda defines=defines: varlen_bwd.launch(
                dout, q, k, v, o, lse, None, cu, cu, None, False, mx, mx, -1, 0, 0.0, D ** -0.5, layout="packed",
                defines=defines), None)
            calls["lab_" + label] = (lambda defines=defines: _with_defines(
                defines, lambda: torch.autograd.grad(out, ins, dout, retain_graph=True)), None)
        ms, quart = _medians(bench.time_interleaved(calls, timer=timer, budget_s=budget_s, max_reps=41, min_reps=11))
        row = {"cell": name, "lens": lens, "D": D, "H": 16, "median_ms": ms, "q1_q3_n": quart,
               "default_over": {label: [ms["kernel_default"] / ms["kernel_" + label],
                                        ms["lab_default"] / ms["lab_" + label]] for label, _ in builds}}
        _keep(rows, row, jsonl)
        print(f"ab-passes {name} D {D}: " + _ms_text(ms, quart) +
              f"; default / build (kernel call, public backward): {row['default_over']}", flush=True)
    return rows
