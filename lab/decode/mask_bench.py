"""Masked decode against plain decode on the same cache (lab.ops.decode, the public call), in interleaved rounds
(lab.bench.time_interleaved), and the plain kernel against its build without the mask steps (LAB_DECODE_NO_MASKS,
kernels/common/decode_masks.cuh): does a plain call pay for the masks? One row per (cell, call): median ms and the
ratio plain / call (>= 1: the call is as fast as plain decode or faster).

Two timers: GpuTimeTimer (the GPU's work alone, the host's launch hidden behind a GPU sleep) and CudaTimer (a cold
call as a lone user sees it, host time included), each after an L2 flush.
"""
from __future__ import annotations

import math

import torch

from .. import bench, build, op_common, ops
from ..registry import DECODE, SPLIT_RULE, default_decode_version, paged_versions
from ..kernels import resolve_version
from .checks import _num_splits
from .plan import ragged_splits

CELLS = [(B, S, D, page) for D in (128, 64) for B in (8, 32) for S in (4096, 16384) for page in (0, 64)]
VARIANTS = {  # name: lab.ops.decode's mask arguments (q_len 1; GPT-OSS: sinks with a 128-key window)
    "sinks": dict(sinks=True),
    "softcap50": dict(softcap=50.0),
    "win4096": dict(window_size=(4096, -1)),
    "win128+sinks": dict(window_size=(128, -1), sinks=True),
    "win128+softcap+sinks": dict(window_size=(128, -1), softcap=50.0, sinks=True),
}


def _cell(B, S, D, page, Hq=32, Hkv=8, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, 1, D, device="cuda", generator=gen).bfloat16()
    sinks = torch.randn(Hq, device="cuda", generator=gen)
    seqlens = torch.full((B,), S, dtype=torch.int32, device="cuda")
    if page:
        pages = B * S // page
        k = torch.randn(pages, page, Hkv, D, device="cuda", generator=gen).bfloat16()
        v = torch.randn(pages, page, Hkv, D, device="cuda", generator=gen).bfloat16()
        table = torch.randperm(pages, device="cuda", generator=gen).int().reshape(B, S // page)
        flags = torch.zeros(B, dtype=torch.int32, device="cuda")
        return q, k, v, seqlens, sinks, dict(block_table=table, page_errors=flags)
    k = torch.randn(B, Hkv, S, D, device="cuda", generator=gen).bfloat16()
    v = torch.randn(B, Hkv, S, D, device="cuda", generator=gen).bfloat16()
    return q, k, v, seqlens, sinks, {}


def _kernel_calls(q, k, v, seqlens, paged, D):
    """The plain kernel, as built for lab.ops and without the mask steps, through the binding with one plan."""
    heads_kv = k.shape[2] if paged else k.shape[1]
    if paged:
        name = resolve_version(None, DECODE, D, paged_versions(heads_kv))
        capacity = paged["block_table"].shape[1] * k.shape[1]
        splits = ragged_splits(_num_splits(None, q.shape[0], heads_kv, capacity, q.device, SPLIT_RULE.get(name, name)),
                               capacity)
    else:
        name = default_decode_version(q.shape[1], heads_kv, 1, D)
        splits = _num_splits(None, q.shape[0], heads_kv, k.shape[2], q.device, SPLIT_RULE.get(name, name))
    bind, scale = build.binding(), op_common._scale(None, D)
    calls = {}
    for tag, defines in (("kernel", None), ("kernel-nomasks", {"LAB_DECODE_NO_MASKS": 1})):
        address = ops.launcher(DECODE, name, defines)
        if paged:
            calls[tag] = (lambda a=address: bind.decode_paged_call(a, q, k, v, seqlens, paged["block_table"],
                                                                   paged["page_errors"], scale, splits, False), None)
        else:
            calls[tag] = (lambda a=address: bind.decode_call(a, q, k, v, seqlens, scale, splits), None)
    return name, splits, calls


def run(cells=CELLS, budget_s: float = 0.25, max_reps: int = 60, variants=None, timers=("gpu", "cold")) -> list[dict]:
    """Rows for `cells` (B, S, D, page; page 0: contiguous), the calls of `variants` (names of VARIANTS; None: all)
    beside plain decode and the kernel A/B, under `timers`."""
    rows = []
    for B, S, D, page in cells:
        q, k, v, seqlens, sinks, paged = _cell(B, S, D, page)
        calls = {"plain": (lambda: ops.decode(q, k, v, seqlens, **paged), None)}
        for name, kw in VARIANTS.items():
            if variants is not None and name not in variants:
                continue
            kw = {**kw, "sinks": sinks} if kw.get("sinks") else kw
            calls[name] = (lambda kw=kw: ops.decode(q, k, v, seqlens, **paged, **kw), None)
        version, splits, kernels = _kernel_calls(q, k, v, seqlens, paged, D)
        calls.update(kernels)
        gbytes = 2 * k.numel() * k.element_size() / 1e9
        for timer_name, timer in (("gpu", bench.GpuTimeTimer()), ("cold", bench.CudaTimer())):
            if timer_name not in timers:
                continue
            timings = bench.time_interleaved(calls, timer, budget_s=budget_s, max_reps=max_reps)
            plain = timings["plain"].median_ms
            for name, t in timings.items():
                if isinstance(t, str):
                    rows.append(dict(B=B, S=S, D=D, page=page, timer=timer_name, call=name, error=t))
                    continue
                base = timings["kernel-nomasks"].median_ms if name == "kernel" else plain
                rows.append(dict(B=B, S=S, D=D, page=page, timer=timer_name, call=name, version=version,
                                 splits=splits, median_ms=round(t.median_ms, 4), iqr_ms=round(t.iqr_ms, 4),
                                 vs=("kernel-nomasks" if name == "kernel" else "plain"),
                                 ratio=round(base / t.median_ms, 3), tb_s=round(gbytes / t.median_ms, 2)))
        calls.clear()  # the cell's tensors go with the calls that hold them
        kernels.clear()
        torch.cuda.empty_cache()
    return rows


def table(rows) -> str:
    lines = ["B     S     D  page timer call                   ms       ratio  (vs)            TB/s"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['B']:<5} {r['S']:<5} {r['D']:<3} {r['page']:<4} {r['timer']:<5} {r['call']:<22} "
                         f"{r['error']}")
            continue
        lines.append(f"{r['B']:<5} {r['S']:<5} {r['D']:<3} {r['page']:<4} {r['timer']:<5} {r['call']:<22} "
                     f"{r['median_ms']:<8.4f} {r['ratio']:<6.3f} ({r['vs']:<14}) {r['tb_s']:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    import json
    import sys

    rows = run()
    print(table(rows))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    worst = min((r["ratio"] for r in rows if r.get("timer") == "gpu" and r.get("call") not in ("plain",)
                 and "ratio" in r), default=math.nan)
    print(f"worst gpu-timer ratio: {worst}")
