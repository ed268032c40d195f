"""Correctness: a kernel against a float64 reference, judged by SDPA's own error in the same dtype.

Pass rule (per trial): the kernel's max abs error against the float64 reference is at most
MULTIPLIER x SDPA's max abs error against that reference + ABS_FLOOR, its relative L2 error at most
MULTIPLIER x SDPA's + REL_FLOOR, and it has no NaN or inf. Every trial draws fresh randn inputs
(seeded; the seed is recorded), the last trial uses large-magnitude q and k so the softmax is peaked,
and the output is NaN-poisoned before each run so an unwritten element fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import record
from .cases import Case, DecodeCase

MULTIPLIER = 3.0
ABS_FLOOR = 2.0**-14  # fp16's smallest normal: covers cases where SDPA happens to be exact
REL_FLOOR = 1e-6
PEAKED_MAGNITUDE = 3.0  # q and k scaled by this: scores' std grows 9x, softmax close to one-hot
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def resolve_device(device: str = "auto") -> torch.device:
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but torch sees no GPU")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


# ------------------------------------------------------------------ references

def reference(q, k, v, is_causal=False, scale=None, seqlens=None):
    """float64 attention by plain math, (B, H, S, D), GQA by head groups, SDPA's top-left causal mask.

    seqlens (decode): sequence b sees only its first seqlens[b] keys. Computed one batch element at a
    time to bound memory. Returns float64 on the inputs' device.
    """
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(B, Hq, Sq, v.shape[-1], dtype=torch.float64, device=q.device)
    for b in range(B):
        length = k.shape[2] if seqlens is None else int(seqlens[b])
        kb = k[b, :, :length].double().repeat_interleave(Hq // Hkv, dim=0)
        vb = v[b, :, :length].double().repeat_interleave(Hq // Hkv, dim=0)
        scores = (q[b].double() @ kb.transpose(-1, -2)) * scale
        if is_causal:
            allowed = torch.ones(Sq, length, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~allowed, float("-inf"))
        out[b] = torch.softmax(scores, dim=-1) @ vb
    return out


def sdpa(q, k, v, is_causal=False, scale=None, seqlens=None):
    """PyTorch SDPA in the inputs' dtype (default dispatch): the error yardstick.

    Flash and cuDNN return NaN for scale <= 0 (torch 2.11; seen on the H200 and, at head dims 32-120, on the
    H100), so such a scale runs as the same problem rewritten exactly: scale < 0 as (-q, |scale|) (negation is
    exact in fp16/bf16); scale == 0 as 2^-100 (every weight still rounds to exactly uniform)."""
    if scale is not None and scale <= 0:
        q, scale = (-q, -scale) if scale < 0 else (q, 2.0**-100)
    gqa = k.shape[1] != q.shape[1]
    if seqlens is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=gqa)
    parts = [F.scaled_dot_product_attention(q[b:b + 1], k[b:b + 1, :, :int(n)], v[b:b + 1, :, :int(n)],
                                            scale=scale, enable_gqa=gqa) for b, n in enumerate(seqlens)]
    return torch.cat(parts)


# ------------------------------------------------------------------ metrics

def compare(out: torch.Tensor, ref: torch.Tensor, yardstick: torch.Tensor, max_listed: int = 5) -> dict:
    """Metrics of `out` against the float64 `ref`, and the pass rule against `yardstick` (SDPA). Gradients'
    tensors may arrive attached to a graph; the metrics are plain numbers, so none of it is recorded."""
    out, ref, yardstick = out.detach(), ref.detach(), yardstick.detach()
    out64 = out.double()
    err = (out64 - ref).abs()
    finite = torch.isfinite(out64)
    sd_err = (yardstick.double() - ref).abs()
    sd_max = float(sd_err.max()) if sd_err.numel() else 0.0
    ref_norm = float(ref.norm()) or 1.0
    sd_rel = float((yardstick.double() - ref).norm()) / ref_norm
    tol = MULTIPLIER * sd_max + ABS_FLOOR
    bad = ~(err <= tol)  # NaN compares False, so unwritten (poisoned) elements count as mismatches
    listed = [tuple(int(i) for i in idx) for idx in bad.nonzero()[:max_listed].tolist()]
    max_abs = float(err[finite].max()) if finite.any() else float("nan")
    rel_l2 = float((out64 - ref)[finite].norm()) / ref_norm if finite.any() else float("nan")
    nan, inf = int(out64.isnan().sum()), int(out64.isinf().sum())
    passed = nan == 0 and inf == 0 and max_abs <= tol and rel_l2 <= MULTIPLIER * sd_rel + REL_FLOOR
    return {"passed": bool(passed), "max_abs": max_abs, "mean_abs": float(err[finite].mean()) if finite.any() else float("nan"),
            "rel_l2": rel_l2, "nan": nan, "inf": inf, "mismatches": int(bad.sum()), "first_mismatches": listed,
            "sdpa_max_abs": sd_max, "sdpa_rel_l2": sd_rel, "tol_max_abs": tol,
            "rule": f"max_abs <= {MULTIPLIER:g} x SDPA's + {ABS_FLOOR:.1e}, rel_l2 <= {MULTIPLIER:g} x SDPA's, no NaN/inf"}


def error_map(out: torch.Tensor, ref: torch.Tensor):
    """Max error by (head, query position), over batch and head dim: layout and mask bugs show as bands.

    Unwritten (NaN) elements show as +inf.
    """
    err = (out.double() - ref).abs().nan_to_num(nan=float("inf"))
    return err.amax(dim=(0, 3)).cpu().numpy()


# ------------------------------------------------------------------ trials

@dataclass
class CheckResult:
    impl: str
    case: object
    trials: list = field(default_factory=list)  # metrics dict per trial, with seed and magnitude
    heatmap: object = None  # error map of the worst trial (numpy, heads x query positions)

    @property
    def passed(self) -> bool:
        return all(t["passed"] for t in self.trials)

    @property
    def worst(self) -> dict:
        return max(self.trials, key=lambda t: (not t["passed"], t["nan"], t["max_abs"] if t["max_abs"] == t["max_abs"] else 1e30))

    def summary(self) -> dict:
        w = self.worst
        return {"impl": self.impl, "case": self.case.name, "passed": self.passed, "max_abs": w["max_abs"],
                "sdpa_max_abs": w["sdpa_max_abs"], "rel_l2": w["rel_l2"], "nan": w["nan"], "mismatches": w["mismatches"]}

    def __repr__(self) -> str:
        w = self.worst
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict} {self.impl} {self.case.label}: max_abs {w['max_abs']:.3g} (SDPA {w['sdpa_max_abs']:.3g}, "
                f"tol {w['tol_max_abs']:.3g}), rel_l2 {w['rel_l2']:.3g}, NaN {w['nan']}, mismatches {w['mismatches']}"
                + (f" first at {w['first_mismatches'][:3]}" if w["mismatches"] else ""))


def _draw(shape, gen, device, dtype, magnitude=1.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * magnitude).to(device=device, dtype=dtype)


def _draw_layout(shape, gen, device, dtype, magnitude, layout):
    """(B, H, S, D) tensor; layout "bshd" gives a (B, S, H, D) buffer viewed through a transpose."""
    if layout == "bhsd":
        return _draw(shape, gen, device, dtype, magnitude)
    if layout != "bshd":
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    B, H, S, D = shape
    return _draw((B, S, H, D), gen, device, dtype, magnitude).transpose(1, 2)


def _run_trials(results: dict, one_trial, trials: int, seed: int, peaked: bool, extra: dict | None) -> dict:
    """Fresh inputs each trial (the last one peaked); keep every trial's metrics and the worst heatmap.

    results maps an output's name to its CheckResult; one_trial(gen, magnitude) draws inputs, runs the
    kernel into poisoned outputs and returns {name: (output, float64 reference, SDPA's output)}. With
    `extra`, each result is recorded (a "grad" field names the output when there are several).
    """
    worst = dict.fromkeys(results, -1.0)
    for trial in range(trials + (1 if peaked else 0)):
        magnitude = PEAKED_MAGNITUDE if trial == trials else 1.0
        outputs = one_trial(torch.Generator().manual_seed(seed * 1000 + trial), magnitude)
        for name, (out, ref, yardstick) in outputs.items():
            metrics = compare(out, ref, yardstick)
            metrics.update(seed=seed * 1000 + trial, magnitude=magnitude)
            results[name].trials.append(metrics)
            score = math.inf if not metrics["passed"] else metrics["max_abs"]
            if score > worst[name]:
                worst[name], results[name].heatmap = score, error_map(out, ref)
    if extra is not None:
        for name, result in results.items():
            record.append({"kind": "check", "impl": result.impl, "case": result.case.as_dict(), **extra,
                           **({"grad": name} if len(results) > 1 else {}), "check": _record_view(result)})
    return results


def _one(result: CheckResult, one_trial, trials, seed, peaked, extra) -> CheckResult:
    """_run_trials for a single output."""
    return _run_trials({"out": result}, lambda gen, magnitude: {"out": one_trial(gen, magnitude)}, trials, seed,
                       peaked, extra)["out"]


def check_forward(run, case: Case, impl: str, trials: int = 3, seed: int = 0, device=None, peaked: bool = True,
                  scale: float | None = None, save: bool = True, layout: str = "bhsd") -> CheckResult:
    """run(q, k, v, is_causal, scale, out) must write attention into `out` (poisoned with NaN first).

    layout="bshd" hands the kernel (B, S, H, D) buffers viewed as (B, H, S, D): strides, not shapes, differ.
    """
    device = device or resolve_device()
    dtype = DTYPES[case.dtype]

    def one_trial(gen, magnitude):
        q = _draw_layout((case.B, case.Hq, case.Sq, case.D), gen, device, dtype, magnitude, layout)
        k = _draw_layout((case.B, case.Hkv, case.Sk, case.D), gen, device, dtype, magnitude, layout)
        v = _draw_layout((case.B, case.Hkv, case.Sk, case.D), gen, device, dtype, 1.0, layout)
        out = torch.full(q.shape, float("nan"), dtype=dtype, device=device)
        run(q, k, v, case.causal, scale, out)
        return out, reference(q, k, v, case.causal, scale), sdpa(q, k, v, case.causal, scale)

    return _one(CheckResult(impl, case), one_trial, trials, seed, peaked, {"layout": layout} if save else None)


def check_decode(run, case: DecodeCase, impl: str, trials: int = 3, seed: int = 0, device=None,
                 peaked: bool = True, scale: float | None = None, save: bool = True) -> CheckResult:
    """run(q, k_cache, v_cache, cache_seqlens, scale, out) must write decode attention into `out`."""
    device = device or resolve_device()
    dtype = DTYPES[case.dtype]
    lengths = case.lengths()
    seqlens = torch.tensor(lengths, dtype=torch.int32, device=device)

    def one_trial(gen, magnitude):
        q = _draw((case.B, case.Hq, case.q_len, case.D), gen, device, dtype, magnitude)
        k = _draw((case.B, case.Hkv, case.kv_len, case.D), gen, device, dtype, magnitude)
        v = _draw((case.B, case.Hkv, case.kv_len, case.D), gen, device, dtype)
        out = torch.full_like(q, float("nan"))
        run(q, k, v, seqlens, scale, out)
        return (out, reference(q, k, v, False, scale, seqlens=lengths),
                sdpa(q, k, v, False, scale, seqlens=lengths))

    return _one(CheckResult(impl, case), one_trial, trials, seed, peaked, {} if save else None)


def _record_view(result: CheckResult) -> dict:
    w = result.worst
    return {"passed": result.passed, "trials": len(result.trials), "seeds": [t["seed"] for t in result.trials],
            **{k: w[k] for k in ("max_abs", "mean_abs", "rel_l2", "nan", "inf", "mismatches", "first_mismatches",
                                 "sdpa_max_abs", "sdpa_rel_l2", "tol_max_abs", "rule")}}


def run_set(run, cases, impl: str, kind: str = "forward", progress: bool = True, show_failures: int = 2,
            **kwargs) -> list[CheckResult]:
    """Check a list of cases with a progress bar; the first failures draw their error heatmaps.

    kind: "forward", "decode", "backward" (dQ, dK, dV) or "fwd+bwd" (out too), the last two via check_backward."""
    from tqdm.std import tqdm

    loop = tqdm(cases, desc=f"check {impl}", disable=not progress or len(cases) < 8, leave=False, mininterval=5)
    if kind in ("backward", "fwd+bwd"):  # run(q, k, v, is_causal, scale, dout) -> (out, dq, dk, dv); one result per tensor
        results = [r for case in loop for r in check_backward(run, case, impl, include_forward=kind == "fwd+bwd",
                                                              **kwargs).values()]
    else:
        checker = check_forward if kind == "forward" else check_decode
        results = [checker(run, case, impl, **kwargs) for case in loop]
    if show_failures:
        from . import plot

        for failed in [r for r in results if not r.passed][:show_failures]:
            plot.error_heatmap(failed)
    return results



# ------------------------------------------------------------------ backward

GRADS = ("dq", "dk", "dv")


def reference_grads(q, k, v, dout, is_causal=False, scale=None):
    """float64 (out, dq, dk, dv) of `reference` by autograd; dk/dv summed over each GQA group. Also inside a
    backward or under no_grad, where autograd is off: grad mode is turned on for this graph."""
    with torch.enable_grad():
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        out = reference(q64, k64, v64, is_causal, scale)
        grads = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return (out.detach(), *grads)


def sdpa_grads(q, k, v, dout, is_causal=False, scale=None, backend: str = "default"):
    """SDPA's (out, dq, dk, dv) in the inputs' dtype, forced to `backend`: the backward error yardstick.

    The math backend's bf16 backward is more accurate than any fused kernel's (n10's first H200 session,
    20261122-215723-h200-74ca9702a2: a fused backward at ~3.5x math's relative L2 error), so it is no yardstick
    for one. A scale <= 0 runs as sdpa() rewrites it, exactly: autograd through the rewritten query (-q) gives dq
    back with its sign.
    """
    from .bench import sdpa_backend

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    with sdpa_backend(backend):
        if group > 1 and backend != "default":  # a forced backend may not take enable_gqa: expand, grads sum back
            out = sdpa(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal, scale)
        else:
            out = sdpa(q, k, v, is_causal, scale)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    return (out.detach(), *grads)


def _poison_allocator(*tensors):
    """Fill freed caching-allocator blocks of these sizes with NaN: gradients that the binding allocates
    with at::empty then start as NaN wherever the kernel does not write (the backward's poisoned output)."""
    for t in tensors:
        torch.full(t.shape, float("nan"), dtype=t.dtype, device=t.device)


def check_backward(run, case: Case, impl: str, trials: int = 2, seed: int = 0, device=None, peaked: bool = True,
                   scale: float | None = None, save: bool = True, layout: str = "bhsd", yardstick: str = "default",
                   include_forward: bool = False) -> dict:
    """run(q, k, v, is_causal, scale, dout) -> (out, dq, dk, dv). Each gradient is judged like the forward:
    against the float64 autograd reference, with SDPA's backward (backend `yardstick`) error as the yardstick.

    Returns {"dq": CheckResult, "dk": ..., "dv": ...} (plus "out" with include_forward: the forward-plus-
    backward mode). NaN never passes; the gradients' memory is NaN-poisoned before every run.
    """
    device = device or resolve_device()
    dtype = DTYPES[case.dtype]
    names = (("out",) if include_forward else ()) + GRADS
    results = {name: CheckResult(f"{impl}:{name}", case) for name in names}

    def one_trial(gen, magnitude):
        q = _draw_layout((case.B, case.Hq, case.Sq, case.D), gen, device, dtype, magnitude, layout)
        k = _draw_layout((case.B, case.Hkv, case.Sk, case.D), gen, device, dtype, magnitude, layout)
        v = _draw_layout((case.B, case.Hkv, case.Sk, case.D), gen, device, dtype, 1.0, layout)
        dout = _draw((case.B, case.Hq, case.Sq, case.D), gen, device, dtype)
        _poison_allocator(q, k, v)
        got = run(q, k, v, case.causal, scale, dout)
        ref = reference_grads(q, k, v, dout, case.causal, scale)
        yard = sdpa_grads(q, k, v, dout, case.causal, scale, yardstick)
        triples = dict(zip(("out",) + GRADS, zip(got, ref, yard)))
        return {name: triples[name] for name in names}

    extra = {"layout": layout, "mode": "fwd+bwd" if include_forward else "bwd", "yardstick": yardstick}
    return _run_trials(results, one_trial, trials, seed, peaked, extra if save else None)


def backward_passed(results: dict) -> bool:
    return all(r.passed for r in results.values())
