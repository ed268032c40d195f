"""The yardsticks of the masks' gradient checks (lab.masks.gpu_bwd's dense checks and lab.masks.gpu_varlen's packed
ones share them): SDPA's own gradient error, the flash formulation's own error, the eager dtype autograd's error, the
verdict (`judge`), and the check's record (`report`). The rule is written out in lab.masks.gpu_bwd's docstring.
"""
from __future__ import annotations

import torch

from .. import check, record
from . import backward as mbwd, reference, spec
from .gpu import CHAPTER, sdpa_masked

_FIELDS = ("passed", "max_abs", "rel_l2", "nan", "mismatches", "sdpa_max_abs", "flash_max_abs", "eager_max_abs",
           "tol_max_abs")
_LABELS = ("dq", "dk", "dv", "dsinks")
# d sinks = -sum over rows of p_sink (rowsum(dO O) - dLSE) sums thousands of O's 16-bit rounding errors, so its
# realised error is a random walk: one other rounding of O (SDPA's output, or the float64 O rounded) can land near
# zero by chance and make a tolerance of a few times it fail a correct kernel (one packed draw of 24 on an H200 did,
# with the backward exact to 1e-6 on the O and LSE it was given). The yardstick therefore also holds SIGMAS standard
# deviations of that sum under independent rounding of every O element (rounding_var): with the rule's multiplier a
# correct kernel's share, itself one rounding of O, must land 6 of them out to fail.
SIGMAS = 2.0


def rounding_var(out, dout, dtype) -> torch.Tensor:
    """Per element, the variance that rounding `out` (float64) to `dtype` brings to dO . O: (dO spacing)^2 / 12,
    spacing the dtype's gap between neighbours at |out| (rounding to nearest leaves an error uniform in half a gap
    either way). Sum it over the head dim and weigh it by p_sink^2 for the variance of d sinks' rounding share."""
    bits = 7 if dtype == torch.bfloat16 else 10 if dtype == torch.float16 else 23
    _, exponent = torch.frexp(out.detach().double().nan_to_num(0.0))
    spacing = torch.ldexp(torch.ones_like(out, dtype=torch.float64), exponent - 1 - bits)
    return (dout.double() * spacing) ** 2 / 12


def _sdpa_grads(q, k, v, dout, mask, scale, offset, sinks):
    """SDPA's (out, dq, dk, dv) in q's dtype on the problem without softcap; rows that see nothing give 0."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    y = sdpa_masked(q, k, v, mask, scale, offset, sinks)
    grads = torch.autograd.grad(y, (q, k, v), dout)
    return (y.detach().nan_to_num(0.0),) + tuple(g.nan_to_num(0.0) for g in grads)


def dlse_rounding(q, k, mask, scale, offset, lse, dlse, dtype):
    """The error that rounding dS to the 16-bit dtype brings to dQ and dK through the dLSE term alone: dS =
    P (dP - dO.O + dLSE) (times 1 - tanh^2 with softcap) is rounded before the dQ and dK GEMMs, in SDPA's
    backward as in ours, but SDPA takes no dLSE, so its error pattern never holds this term's share. Where the
    rest of dS is (nearly) zero, e.g. a row that sees one key, dS is the dLSE term and this is its whole error.
    Float64 (B, H, S, D) inputs; returns (dq error, dk error) patterns, dk summed over each GQA group."""
    group = q.shape[1] // k.shape[1]
    qd, kd = q.double(), k.double().repeat_interleave(group, 1)
    s = scale * (qd @ kd.transpose(-1, -2))
    dcap = 1.0
    if mask.softcap > 0:
        t = torch.tanh(s / mask.softcap)
        s, dcap = mask.softcap * t, 1.0 - t * t
    seen = spec.visible(torch.arange(q.shape[2], device=q.device), torch.arange(k.shape[2], device=q.device),
                        k.shape[2], offset, mask)
    safe = torch.where(torch.isfinite(lse), lse, 0.0).double()
    ds = torch.where(seen, torch.exp(torch.where(seen, s, 0.0) - safe[..., None]), 0.0) * dlse.double()[..., None] * dcap
    err = ds.to(dtype).double() - ds
    dk = scale * (err.transpose(-1, -2) @ qd)
    return scale * (err @ kd), dk.view(k.shape[0], k.shape[1], group, *dk.shape[2:]).sum(2)


def eager_grads(q, k, v, dout, dlse, sinks, mask, scale, offset):
    """The attention done eagerly in q's dtype by torch autograd (matmuls, softcap, a softmax whose last column is
    the sink, logsumexp): the gradients of sum(out dO) + sum(LSE dLSE) as that dtype gives them, in float64.
    Rows that see nothing (no sink) give 0."""
    inputs = [t.detach().clone().requires_grad_() for t in (q, k, v) + (() if sinks is None else (sinks,))]
    group, Sq, Sk = q.shape[1] // k.shape[1], q.shape[2], k.shape[2]
    kr, vr = (t.repeat_interleave(group, 1) for t in inputs[1:3])
    s = (inputs[0] @ kr.transpose(-1, -2)) * scale
    if mask.softcap > 0:
        s = mask.softcap * torch.tanh(s / mask.softcap)
    seen = spec.visible(torch.arange(Sq, device=q.device), torch.arange(Sk, device=q.device), Sk, offset, mask)
    s = s.masked_fill(~seen, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, inputs[3].to(q.dtype).view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    empty = torch.isneginf(s).all(-1, keepdim=True)
    s = s.masked_fill(empty, 0.0)  # a row of no key and no sink: a softmax of zeros, then dropped
    out = torch.softmax(s, -1).masked_fill(empty, 0.0)[..., :Sk] @ vr
    lse = torch.logsumexp(s, -1).masked_fill(empty[..., 0], 0.0)
    grads = torch.autograd.grad((out.float() * dout.float()).sum() + (lse.float() * dlse.float()).sum(), inputs)
    return [g.double() for g in grads]


def flash_grads(q, k, v, dout, dlse, sinks, mask, scale, offset, out, lse):
    """The flash backward's equations (lab.masks.emulate.backward's) in float64 from the exact LSE and the float64
    output `out` rounded to q's dtype: Delta = rowsum(dO O) - dLSE, P = exp(S - LSE), dV = P^T dO,
    dS = P (dO V^T - Delta) (times 1 - tanh^2 with softcap), dQ = scale dS K, dK = scale dS^T Q, d sinks =
    -sum_rows exp(sink - LSE) Delta. Whole score matrices on q's device, not the emulation's tiles: in float64 the
    tile order moves nothing the yardstick can see (tests/masks/test_masks_sink_grads.py holds the two together),
    and on a GPU the chapter's checks take seconds instead of minutes of NumPy. -> (dq, dk, dv[, d sinks])."""
    dtype, group = q.dtype, q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    qd, do = q.detach().double(), dout.detach().double()
    kr, vr = (t.detach().double().repeat_interleave(group, 1) for t in (k, v))
    lse = lse.detach().double()
    delta = (do * out.detach().to(dtype).double()).sum(-1) - (0.0 if dlse is None else dlse.detach().double())
    s = scale * (qd @ kr.transpose(-1, -2))
    t = torch.tanh(s / mask.softcap) if mask.softcap > 0 else None
    if t is not None:
        s = mask.softcap * t
    Sq, Sk = q.shape[2], k.shape[2]
    seen = spec.visible(torch.arange(Sq, device=q.device), torch.arange(Sk, device=q.device), Sk, offset, mask)
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    p = torch.where(seen, torch.exp(torch.where(seen, s, 0.0) - safe[..., None]), 0.0)
    dv = p.transpose(-1, -2) @ do
    ds = p * (do @ vr.transpose(-1, -2) - delta[..., None])
    if t is not None:
        ds = ds * (1.0 - t * t)
    dq = scale * (ds @ kr)
    dk = scale * (ds.transpose(-1, -2) @ qd)
    B, Hkv = k.shape[:2]
    grads = [dq] + [g.view(B, Hkv, group, *g.shape[2:]).sum(2) for g in (dk, dv)]
    if sinks is not None:
        grads.append(-(torch.exp(sinks.detach().double()[None, :, None] - lse) * delta).sum((0, 2)))
    return grads


def judge(got, q, k, v, dout, dlse, sinks, mask, scale, offset) -> dict:
    """Metrics per gradient (dq, dk, dv[, dsinks]) of `got` against float64 autograd of lab.masks.reference, judged
    on the sdpa and flash yardsticks, the eager one recorded beside them (module docstring). q, k, v in the dtype,
    dlse 0 where LSE is -inf, sinks None or (H_q,). Any device: the CPU tests give it a faked `got`."""
    dtype, sink = q.dtype, sinks is not None
    inputs = [t.detach() for t in (q, k, v) + ((sinks,) if sink else ())]
    ref_in = [t.double().requires_grad_() for t in inputs]
    r_out, r_lse = reference.attend(*ref_in[:3], mask, scale, offset, ref_in[3] if sink else None)
    r_used = torch.where(torch.isfinite(r_lse), r_lse, 0.0)
    want = torch.autograd.grad((r_out * dout.double()).sum() + (r_used * dlse.double()).sum(), ref_in)
    r_out, r_lse = r_out.detach(), r_lse.detach()
    # sdpa: SDPA's error pattern on the problem without softcap (dlse has no SDPA counterpart: dout only), plus the
    # rounding of the exact gradient to the dtype, plus the rounding of dS's dLSE term to the dtype (dlse_rounding):
    # the last two matter where SDPA's problem has (nearly) exact zeros that ours does not, e.g. a row that sees one
    # key has dS = P (dP - D) = 0 without dLSE, which SDPA cannot be given, and dS = P dLSE with it.
    plain = spec.Mask(mask.left, mask.right, 0.0)
    p_in = [t.double().requires_grad_() for t in inputs]
    p_out, _ = reference.attend(*p_in[:3], plain, scale, offset, p_in[3] if sink else None)
    p_grads = torch.autograd.grad((p_out * dout.double()).sum(), p_in[:3])
    s_out, *s_grads = _sdpa_grads(*inputs[:3], dout, mask, scale, offset, inputs[3] if sink else None)
    lse_terms = dlse_rounding(*inputs[:2], mask, scale, offset, r_lse, dlse, dtype) + (0.0,)
    sdpa = [(sg.double() - pg).abs() + (w.to(dtype).double() - w).abs() + abs(lt)
            for sg, pg, w, lt in zip(s_grads, p_grads, want, lse_terms)]
    if sink:  # d sinks' formula with SDPA's 16-bit O, and with the float64 O rounded to the dtype
        p_sink = torch.exp(inputs[3].double()[None, :, None] - r_lse)

        def dsink(o):
            return -(p_sink * ((dout.double() * o).sum(-1) - dlse.double())).sum((0, 2))
        exact = dsink(r_out)
        sigma = (p_sink ** 2 * rounding_var(r_out, dout, dtype).sum(-1)).sum((0, 2)).sqrt()
        sdpa.append((dsink(s_out.double()) - exact).abs() + (dsink(r_out.to(dtype).double()) - exact).abs()
                    + SIGMAS * sigma)
    flash = flash_grads(*inputs[:3], dout, dlse, inputs[3] if sink else None, mask, scale, offset, r_out, r_lse)
    eager = eager_grads(*inputs[:3], dout, dlse, inputs[3] if sink else None, mask, scale, offset)
    metrics = {}
    for label, g, w, s_err, f, e in zip(_LABELS, got, want, sdpa, flash, eager):
        f_err = (f - w).abs()
        metrics[label] = check.compare(g, w, w + torch.maximum(s_err, f_err))
        metrics[label].update(sdpa_max_abs=_max(s_err), flash_max_abs=_max(f_err), eager_max_abs=_max((e - w).abs()))
    return metrics


def _max(err) -> float:
    return float(err.max()) if err.numel() else 0.0


def keep_worst(worst, metrics):
    """(the trial to report: the first that fails, else the nearest its tolerance; whether this one failed)."""
    passed = all(m["passed"] for m in metrics.values())
    score = max(m["max_abs"] / max(m["tol_max_abs"], 1e-30) for m in metrics.values())
    if worst is None or not passed or score > worst[1]:
        worst = (metrics, score, passed)
    return worst, not passed


def report(prefix: str, case: dict, worst, expect_fail: bool, defines, device) -> bool:
    """One check_bwd record (impl prefix_<masked backward version>[-bug]) and its printed line; True when ok."""
    metrics, score, passed = worst
    ok = passed != expect_fail
    bug = "-" + "-".join(k.lower().replace("lab_bwd_mask_bug_", "") for k in defines) if defines else ""
    record.append({"kind": "check_bwd", "impl": f"{prefix}_{mbwd.masked_bwd_version(device)}{bug}", "case": case,
                   "expect_fail": expect_fail, "ok": ok, "passed": passed, "worst_ratio": score,
                   "check": {g: {k: m[k] for k in _FIELDS if k in m} for g, m in metrics.items()}}, chapter=CHAPTER)
    print(("ok  " if ok else "BAD ") + f"{prefix}{bug} {case['name']} {case} worst max_abs/tol {score:.3g} "
          f"passed={passed} " + " ".join(f"{g} {m['max_abs']:.3g}/{m['tol_max_abs']:.3g}" + (
              f" (flash {m['flash_max_abs']:.3g}, eager {m['eager_max_abs']:.3g})" if "flash_max_abs" in m else "")
              for g, m in metrics.items()), flush=True)
    return ok
