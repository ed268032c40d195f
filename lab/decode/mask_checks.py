"""GPU checks of lab.ops.decode's masks (lab.decode.masks): a window, a softcap, sinks and all three, contiguous and
paged, against a float64 reference, judged by lab.check's rule against the same math run eagerly in the inputs'
dtype (lab.check.compare: max error at most a small multiple of that one's, no NaN / inf).

The output the op allocates starts as NaN (the allocator's free blocks are poisoned first), so an unwritten row
fails; page_errors starts at -1 and must come back 0. `defines` builds the kernel with them and calls the binding
directly: the wrong build LAB_DECODE_BUG_SINK_PER_SPLIT (the sink in every split's partial) must fail.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import build, check, op_common, ops
from .emulate_masks import key_range
from .emulate_paged import block_table, to_pages


@dataclass(frozen=True)
class MaskCase:
    name: str
    B: int
    Hq: int
    Hkv: int
    q_len: int
    S: int                      # the cache's capacity (contiguous S_cache, or max_pages * page_size)
    D: int
    lengths: tuple              # per sequence
    causal: bool = False
    window: tuple | None = None  # (left, right)
    softcap: float = 0.0
    sinks: bool = False
    page_size: int = 0          # 0: contiguous
    dtype: str = "bfloat16"
    sink_shift: float = 0.0     # added to the drawn sinks (N(0, 2^2)): a sink worth many keys


def cases(dims=(128,)) -> list[MaskCase]:
    """The set: each mask alone and all three, contiguous and paged (page 16 and 64), q_len 1 and 4 causal, GQA 8:1
    and 1:1, lengths 0, 1, shorter than the window, uneven and full."""
    out = []
    for D in dims:
        lens = (0, 1, 77, 300, 1000, 1537)
        for paged in (0, 16, 64):
            tag = f"p{paged}" if paged else "c"
            out += [
                MaskCase(f"win128-{tag}-D{D}", 6, 32, 4, 1, 1537, D, lens, window=(128, -1), page_size=paged),
                MaskCase(f"win128c-q4-{tag}-D{D}", 6, 32, 4, 4, 1537, D, lens, True, (128, 0), page_size=paged),
                MaskCase(f"softcap-{tag}-D{D}", 6, 16, 2, 1, 1537, D, lens, softcap=50.0, page_size=paged),
                MaskCase(f"sinks-q4-{tag}-D{D}", 6, 16, 2, 4, 1537, D, lens, True, sinks=True, page_size=paged),
                MaskCase(f"all-q4-{tag}-D{D}", 6, 64, 8, 4, 1537, D, lens, True, (100, 0), 30.0, True, paged),
            ]
        out.append(MaskCase(f"all-q1-mha-D{D}", 3, 8, 8, 1, 700, D, (700, 5, 129), False, (64, 3), 20.0, True))
        out.append(MaskCase(f"win-wide-q4-D{D}", 3, 8, 1, 4, 5000, D, (5000, 4097, 33), True, (4096, 0), 0.0, True, 64,
                            "float16"))
    return out


def _visible(n: int, q_len: int, case: MaskCase, device) -> torch.Tensor:
    left, right = case.window or (-1, -1)
    mask = torch.zeros(q_len, n, dtype=torch.bool, device=device)
    for t in range(q_len):
        lo, hi = key_range(n, q_len, t, left, right, case.causal)
        if hi > lo:
            mask[t, lo:hi] = True
    return mask


def masked_math(q, k, v, lengths, case: MaskCase, sinks, scale: float, dtype) -> torch.Tensor:
    """The masked decode written out with torch ops in `dtype` (float64: the reference; the inputs' dtype: the
    eager yardstick, scores and P rounded to it, the softmax in float32). A row that sees nothing: 0."""
    B, Hq, T, D = q.shape
    group = Hq // k.shape[1]
    exact = dtype == torch.float64
    out = torch.zeros(q.shape, dtype=torch.float64 if exact else q.dtype, device=q.device)
    for b, n in enumerate(lengths):
        kb = k[b, :, :n].to(dtype).repeat_interleave(group, 0)
        vb = v[b, :, :n].to(dtype).repeat_interleave(group, 0)
        s = (q[b].to(dtype) @ kb.transpose(-1, -2)) * scale
        if case.softcap:
            s = torch.tanh(s / case.softcap) * case.softcap
        s = s.to(torch.float64 if exact else torch.float32).masked_fill(~_visible(n, T, case, q.device), float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.to(s.dtype)[:, None, None].expand(Hq, T, 1)], dim=-1)
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        if sinks is not None:
            p = p[..., :-1]
        out[b] = (p.to(dtype) @ vb).to(out.dtype)  # n = 0: an empty sum, zeros
    return out


def inputs(case: MaskCase, seed: int, device="cuda") -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    q = torch.randn(case.B, case.Hq, case.q_len, case.D, generator=gen, device=device).to(dtype)
    k = torch.randn(case.B, case.Hkv, case.S, case.D, generator=gen, device=device).to(dtype)
    v = torch.randn(case.B, case.Hkv, case.S, case.D, generator=gen, device=device).to(dtype)
    sinks = (torch.randn(case.Hq, generator=gen, device=device) * 2 + case.sink_shift).float() if case.sinks else None
    a = dict(q=q, k=k, v=v, sinks=sinks, seqlens=torch.tensor(case.lengths, dtype=torch.int32, device=device))
    if case.page_size:
        import numpy as np
        table, pages = block_table(case.B, case.S, case.page_size, np.random.default_rng(seed), spare_pages=3)
        a["table"] = torch.from_numpy(table).to(device)
        for name, cache in (("k_pages", k), ("v_pages", v)):
            paged = to_pages(cache.float().cpu().numpy(), table, pages, case.page_size)
            a[name] = torch.from_numpy(paged).to(device, dtype)
    return a


def check_case(case: MaskCase, num_splits=None, version=None, defines=None, trials: int = 2, seed: int = 0) -> dict:
    """One case, `trials` fresh draws: the worst lab.check.compare row, with the case's name and the call's plan."""
    scale = 1.0 / math.sqrt(case.D)
    worst = None
    for trial in range(trials):
        a = inputs(case, seed + trial)
        flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda") if case.page_size else None
        kc, vc = (a["k_pages"], a["v_pages"]) if case.page_size else (a["k"], a["v"])
        check._poison_allocator(a["q"])
        if defines is None:
            out = ops.decode(a["q"], kc, vc, a["seqlens"], scale, num_splits, version, block_table=a.get("table"),
                             is_causal=case.causal, page_errors=flags, window_size=case.window, softcap=case.softcap,
                             sinks=a["sinks"])
        else:  # the named build through the binding (the wrong build's check)
            left, right = case.window or (-1, -1)
            address = ops.launcher(ops.DECODE, version or "v07", defines)
            error, out, _ = build.binding().module.decode_masked_call(
                address, a["q"], kc, vc, a["seqlens"], a.get("table"), flags,
                op_common._scale(scale, case.D), num_splits or 1, case.causal, left, 0 if case.causal else right,
                case.softcap, a["sinks"])
            if error:
                raise RuntimeError(error)
        if flags is not None and bool(flags.any()):
            out = torch.full_like(out, float("nan"))  # a false or unwritten flag fails
        ref = masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], scale, torch.float64)
        eager = masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], scale, getattr(torch, case.dtype))
        row = check.compare(out, ref, eager)
        if worst is None or not row["passed"] or row["max_abs"] > worst["max_abs"]:
            worst = row
        if not row["passed"]:
            break
    return {"case": case.name, "splits": num_splits, "version": version, **worst}
