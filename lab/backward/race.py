"""The backward's race as users call it: the public op's backward (torch.autograd.grad on a recorded graph) and
its training step (forward plus backward) against SDPA forced to each backend and FlexAttention, timed in
rounds in one process (lab.bench.time_interleaved: a clock drift reaches every candidate alike).

Rows are recorded with kind 'bwd' or 'fwd+bwd' and impl 'lab.ops.attention', 'sdpa-<backend>' or 'flex'; the
public op's row carries its ratios against every other candidate that ran.
"""
from __future__ import annotations

import torch

from .. import bench, record
from .harness import flops, make_step, ours_step, route_step, sdpa_step

ROUTE = "lab.ops.attention (Python route)"

_flex_compiled = None


def flex_step(mode: str, q, k, v, is_causal: bool, dout=None):
    """FlexAttention (compiled once per process, recompiled per shape by torch) with the same mask: a causal
    block mask or none. Its backward is the one torch.compile generates for it."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from .harness import _step

    global _flex_compiled
    if _flex_compiled is None:
        _flex_compiled = torch.compile(flex_attention, dynamic=False)
    mask = None
    if is_causal:
        mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, q.shape[2], k.shape[2], device=q.device)
    gqa = q.shape[1] != k.shape[1]
    return _step(lambda a, b, c: _flex_compiled(a, b, c, block_mask=mask, enable_gqa=gqa), mode, q, k, v, dout)


@bench.flex_race
def race(cases, modes=("bwd", "fwd+bwd"), backends=("flash", "cudnn", "efficient"), flex=True, route=False,
         progress: bool = True, **stop) -> list[dict]:
    """Time every case in every mode, all candidates interleaved in rounds; returns the recorded rows.
    flex: True, False, or a predicate on the case (FlexAttention compiles once per shape: tens of seconds).
    route: the same for the public op's Python route (ROUTE: the default call's kernels without its C++ node)."""
    from tqdm.std import tqdm

    from ..sweep import _inputs_fwd, _row

    ceilings_ = bench.ceilings()
    rows = []
    work_items = [(i, case, mode) for i, case in enumerate(cases) for mode in modes]
    for i, case, mode in tqdm(work_items, desc="backward race", disable=not progress, mininterval=5):
        q, k, v = _inputs_fwd(case, seed=i)
        dout = _inputs_fwd(case, seed=10_000 + i)[0]
        makers = {"lab.ops.attention": lambda: ours_step(mode, q, k, v, case.causal, dout)}
        for backend in backends:
            makers[f"sdpa-{backend}"] = lambda b=backend: sdpa_step(b, mode, q, k, v, case.causal, dout)
        if flex(case) if callable(flex) else flex:
            makers["flex"] = lambda: flex_step(mode, q, k, v, case.causal, dout)
        if route(case) if callable(route) else route:
            makers[ROUTE] = lambda: route_step(mode, q, k, v, case.causal, dout)
        steps, refused = {}, {}
        for name, make in makers.items():
            made = make_step(make)
            (refused if isinstance(made, str) else steps)[name] = made
        times = bench.time_interleaved({name: (fn, None) for name, fn in steps.items()}, **stop)
        times.update(refused)
        work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, mode)
        ours = times["lab.ops.attention"]
        others = {name: t for name, t in times.items() if name != "lab.ops.attention"}
        for name, t in others.items():
            rows.append(record.append(_row(mode, name, case, t, work, ceilings_, {"flops": work})))
        ratios = {name: t.median_ms / ours.median_ms for name, t in others.items()
                  if isinstance(t, bench.Timing)} if isinstance(ours, bench.Timing) else {}
        extra = {"ratios": ratios, "flops": work, "flags": bench.flagged(ratios)}
        rows.append(record.append(_row(mode, "lab.ops.attention", case, ours, work, ceilings_, extra)))
        del q, k, v, dout, steps
    return rows


def ablation(name: str) -> tuple[str, dict | None]:
    """'v04:LAB_BWD_PERSIST_DS_BUFS=1,OTHER=2' -> ('v04', {'LAB_BWD_PERSIST_DS_BUFS': '1', 'OTHER': '2'}); 'v02' -> ('v02', None)."""
    version, _, switches = name.partition(":")
    if not switches:
        return version, None
    pairs = [item.partition("=") for item in switches.split(",")]
    if any(not key or not sep for key, sep, _ in pairs):
        raise ValueError(f"{name!r}: switches are KEY=VALUE, comma-separated")
    return version, {key: value for key, _, value in pairs}


def versions(cases, names=None, progress: bool = True, **stop) -> list[dict]:
    """A diagnostic beside the race, timed with bench.GpuTimeTimer (the host's time hidden behind a GPU sleep,
    so only GPU work is in the window): every backward version that runs on this GPU called kernel-level (the
    forward's lse computed once, no autograd), the public op's backward and SDPA-cuDNN's (both through
    torch.autograd.grad), in rounds. Rows: kind 'bwd-kernel', ratios against 'sdpa-cudnn (GPU time)'.

    names: versions (default: every one in the registry), each optionally with compile-time switches as
    'v04:LAB_BWD_PERSIST_DS_BUFS=1' (an ablation: the version rebuilt with that macro)."""
    from tqdm.std import tqdm

    from .. import ops
    from ..op_common import _scale
    from ..registry import BWD
    from ..sweep import _inputs_fwd, _row
    from .op import _bwd_impl

    capability = tuple(torch.cuda.get_device_capability())
    variants = {name: ablation(name) for name in (names or BWD)}
    runnable = {name: (version, defines) for name, (version, defines) in variants.items()
                if not BWD[version].capabilities or capability in BWD[version].capabilities}
    ceilings_ = bench.ceilings()
    timer = bench.GpuTimeTimer()
    rows = []
    for i, case in enumerate(tqdm(cases, desc="backward versions", disable=not progress, mininterval=5)):
        q, k, v = _inputs_fwd(case, seed=i)
        dout = _inputs_fwd(case, seed=10_000 + i)[0]
        with torch.no_grad():
            out, lse = ops.attention(q, k, v, is_causal=case.causal, enable_gqa=case.Hq != case.Hkv, return_lse=True)
        scale = _scale(None, case.D)
        base = "sdpa-cudnn (GPU time)"
        calls = {base: (sdpa_step("cudnn", "bwd", q, k, v, case.causal, dout), None),
                 "lab.ops.attention (GPU time)": (ours_step("bwd", q, k, v, case.causal, dout), None)}
        for name, (version, defines) in runnable.items():
            if case.D not in BWD[version].head_dims:
                continue
            calls[f"bwd-{name} (kernel-level)"] = (
                lambda n=version, d=defines: _bwd_impl(dout, q, k, v, out, lse, None, case.causal, scale, False, n,
                                                       defines=d), None)
        times = bench.time_interleaved(calls, timer=timer, **stop)
        work = flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal, "bwd")
        for impl, t in times.items():
            extra = {"flops": work, "timer": "gpu-time"}
            if impl != base and isinstance(t, bench.Timing) and isinstance(times[base], bench.Timing):
                extra["ratios"] = {"sdpa-cudnn": times[base].median_ms / t.median_ms}
            rows.append(record.append(_row("bwd-kernel", impl, case, t, work, ceilings_, extra)))
        del q, k, v, dout, out, lse
    return rows
