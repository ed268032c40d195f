"""The masks' backward on the GPU (bwd v08 through lab.ops.attention's autograd): gradient checks against float64
autograd of lab.masks.reference (with the builds that drop the softcap's derivative or the window, which must
fail), and the race of the backward against FlexAttention's compiled backward and SDPA with an explicit mask.
Chapter n13_masks runs them: `checks()` is the one entry for every dense gradient check.

A gradient check has three yardsticks, each an error against float64 autograd on the same inputs (`judge`):
- sdpa: SDPA's own gradient error (the window as an explicit boolean mask, a sink as one more key of zeros whose
  mask entry is its logit) on the problem without the softcap, which SDPA cannot express, plus the rounding of the
  exact gradient and of dS's dLSE term to the dtype (dlse_rounding); d sinks': its formula on SDPA's 16-bit O;
- flash: the flash backward's own equations in float64 (lab.masks.emulate.backward's, on whole score matrices in
  grad_yardstick.flash_grads: P from the exact LSE,
  Delta = rowsum(dO o O16) - dLSE with O16 the float64 output rounded to the dtype, dS = P o (dP - Delta), d sinks
  = -sum exp(sink - LSE) Delta): the error the formulation brings by itself, since Delta (and every d sinks, a sum
  of Delta) is taken from a 16-bit O;
- eager: the same attention done eagerly in the dtype by torch autograd (recorded, not judged on).
Ours passes when max |ours - float64| <= 3 x max(sdpa's, flash's) + lab.check's floor (lab.check.compare on the
elementwise larger of the two error patterns, so its rel_l2 rule holds too).
"""
from __future__ import annotations

import os
import time

import torch

from .. import bench, check, ops, record
from . import backward as mbwd, reference, spec
from .gpu import CHAPTER, GEN, GRID_BWD_SINKS, GRID_MASKS, GRID_SIZES, draw
from .grad_yardstick import judge, keep_worst, report

def check_bwd(name, B, Hq, Hkv, Sq, Sk, D, dtype, causal, window, cap, sink, lower_right=False, defines=None,
              expect_fail=False, trials=2, custom_op=False, forward="public", sink_rule=False):
    """custom_op: through lab::attention_masked and its registered autograd (what torch.compile traces) instead
    of the eager autograd.Function the public op takes. forward="eager": the backward kernel alone, fed the
    float64 reference's output (rounded to the dtype) and LSE (float32, the sink's share included) in place of the
    masked forward's, so a backward is checked apart from its forward. sink_rule: d sinks must also be within
    check.MULTIPLIER x the flash formulation's own error (+ the floor) alone, SDPA's yardstick left out; where the
    public forward's output and LSE carry more error than the formulation's 16-bit O, the excess is split off
    (sink_split) and the backward is held to its own part."""
    mask = spec.make_mask(causal, window, cap)
    offset = Sk - Sq if lower_right else 0
    scale = D ** -0.5
    worst = None
    for trial in range(trials):
        GEN.manual_seed(hash(("bwd", name, Sq, Sk, D, trial)) % 2**31)
        magnitude = 2.0 if trial == trials - 1 else 1.0
        q = draw(B, Hq, Sq, D, dtype=dtype, magnitude=magnitude).requires_grad_()
        k = draw(B, Hkv, Sk, D, dtype=dtype, magnitude=magnitude).requires_grad_()
        v = draw(B, Hkv, Sk, D, dtype=dtype).requires_grad_()
        dout = draw(B, Hq, Sq, D, dtype=dtype)
        sinks = (torch.randn(Hq, generator=GEN) * 2).cuda().requires_grad_() if sink else None
        dlse = torch.randn(B, Hq, Sq, generator=GEN).cuda()
        inputs = (q, k, v) + ((sinks,) if sink else ())
        # ours: through the public op and autograd (the kernel's defines through lab.masks.backward's launch)
        if forward == "eager":
            r_out, r_lse = reference.attend(q.detach(), k.detach(), v.detach(), mask, scale, offset,
                                            sinks.detach() if sink else None)
            out, lse = r_out.to(dtype), r_lse.float()
            dl = torch.where(torch.isfinite(lse), dlse, 0.0)
            dq, dk, dv, ds = mbwd.launch_backward(dout, q, k, v, out, lse, dl, sinks, sink, mask.left, mask.right,
                                                  offset, mask.softcap, scale, defines=defines)
            got = (dq, dk, dv) + ((ds,) if sink else ())
        elif defines:
            out, lse = ops.attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv, window_size=window,
                                     softcap=cap, sinks=sinks, return_lse=True,
                                     causal_variant="lower_right" if lower_right else "upper_left")
            dl = torch.where(torch.isfinite(lse), dlse, 0.0).detach()
            dq, dk, dv, ds = mbwd.launch_backward(dout, q, k, v, out.detach(), lse.detach(), dl, sinks, sink,
                                                  mask.left, mask.right, offset, mask.softcap, scale,
                                                  defines=defines)
            got = (dq, dk, dv) + ((ds,) if sink else ())
        else:
            if custom_op:
                from . import op as mop
                out, lse = mop._masked_op(q, k, v, sinks, mask.left, mask.right, offset, mask.softcap, scale,
                                          mop.masked_version(q.device))
            else:
                out, lse = ops.attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=Hq != Hkv,
                                         window_size=window, softcap=cap, sinks=sinks, return_lse=True,
                                         causal_variant="lower_right" if lower_right else "upper_left")
            dl = torch.where(torch.isfinite(lse), dlse, 0.0).detach()
            lse_used = torch.where(torch.isfinite(lse), lse, 0.0)
            got = torch.autograd.grad((out.float() * dout.float()).sum() + (lse_used * dl).sum(), inputs)
        metrics = judge(got, q, k, v, dout, dl, sinks, mask, scale, offset)
        if sink_rule and sink:
            metrics["dsinks"].update(sink_split(got[3], q, k, v, dout, dl, sinks, mask, scale, offset, out, lse))
        worst, failed = keep_worst(worst, metrics)
        if failed:
            break
    case = dict(name=name, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Sk=Sk, D=D, dtype=str(dtype).split(".")[-1], causal=causal,
                window=[mask.left, mask.right], softcap=cap, sinks=sink, offset=offset, custom_op=custom_op,
                forward=forward)
    ok = report("bwd", case, worst, expect_fail, defines, q.device)
    if sink_rule and sink and not expect_fail:
        m = worst[0]["dsinks"]
        bound = check.MULTIPLIER * m["flash_max_abs"] + check.ABS_FLOOR
        own = m["max_abs"] <= bound or m["bwd_own_max_abs"] <= bound
        tag = "ok  " if m["max_abs"] <= bound else "FWD " if own else "BAD "
        print(f"{tag}dsinks {name} D {D} ({forward} forward): max_abs {m['max_abs']:.3g} vs {check.MULTIPLIER:g} x "
              f"flash {m['flash_max_abs']:.3g} + floor = {bound:.3g} (ratio to flash "
              f"{m['max_abs'] / max(m['flash_max_abs'], 1e-30):.2f}); the backward's own {m['bwd_own_max_abs']:.3g}, "
              f"the forward's O and LSE {m['fwd_share_max_abs']:.3g}", flush=True)
        ok = ok and own
    return ok


def sink_split(dsinks, q, k, v, dout, dlse, sinks, mask, scale, offset, out, lse) -> dict:
    """d sinks' error split in two, by its formula -sum exp(sink - LSE_i) (rowsum(dO O)_i - dLSE_i) in float64:
    the backward's own (ours against the formula on the forward's O and LSE it was given) and the forward's share
    (the formula on those against the formula on the exact O and LSE)."""
    r_out, r_lse = reference.attend(q.detach(), k.detach(), v.detach(), mask, scale, offset, sinks.detach())

    def formula(o, l):
        p = torch.exp(sinks.detach().double()[None, :, None] - l.detach().double())
        return -torch.nan_to_num(p * ((dout.double() * o.detach().double()).sum(-1) - dlse.double()), 0.0).sum((0, 2))
    given = formula(out, lse)
    return {"bwd_own_max_abs": float((dsinks.double() - given).abs().max()),
            "fwd_share_max_abs": float((given - formula(r_out, r_lse)).abs().max())}


def checks(packed: bool = True, wide: bool = False) -> int:
    """Every gradient check of the masked backward, the one entry: the grid (lab.masks.gpu's GRID_MASKS x
    GRID_SIZES at D 128 and 64), the sink cases of GRID_BWD_SINKS at D 128 and 64, cross lengths, fp16, a long
    sequence, the custom op, the builds that must fail, (wide) wide_checks at D 192 / 256, then (packed)
    lab.masks.gpu_varlen.checks(). Returns how many were not ok."""
    bad = 0
    bf16, fp16 = torch.bfloat16, torch.float16
    for D in (128, 64):
        for name, causal, window, cap, sink in GRID_MASKS:
            for B, Hq, Hkv, Sq, Sk in GRID_SIZES:
                w = (Sk, Sk) if window == "S" else (Sk + 100, -1) if window == "S+" else window
                bad += not check_bwd(name, B, Hq, Hkv, Sq, Sk, D, bf16, causal, w, cap, sink)
    for D in (128, 64):
        for name, B, Hq, Hkv, Sq, Sk, causal, window, cap, lower_right in GRID_BWD_SINKS:
            bad += not check_bwd(name, B, Hq, Hkv, Sq, Sk, D, bf16, causal, window, cap, True, lower_right)
    for lower_right in (False, True):
        for Sq, Sk in ((65, 1025), (1025, 65)):
            bad += not check_bwd("cross", 1, 4, 2, Sq, Sk, 128, bf16, True, (200, 0), 0.0, True, lower_right)
    bad += not check_bwd("fp16", 1, 4, 2, 1025, 1025, 128, fp16, True, (256, 0), 20.0, True)
    bad += not check_bwd("fp16", 1, 4, 2, 1025, 1025, 64, fp16, False, (30, 40), 0.0, False)
    bad += not check_bwd("long", 1, 2, 1, 4097, 4097, 128, bf16, True, (1000, 0), 30.0, True, trials=1)
    bad += not check_bwd("custom-op", 2, 4, 2, 1025, 1025, 128, bf16, True, (100, 0), 20.0, True, custom_op=True)
    # the builds that must fail: the softcap's derivative dropped; the window forgotten on the tiles it crosses
    bad += not check_bwd("no-softcap-grad", 1, 4, 2, 1025, 1025, 128, bf16, True, (256, 0), 10.0, False,
                         defines={"LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD": 1}, expect_fail=True)
    bad += not check_bwd("no-window", 1, 4, 2, 1025, 1025, 128, bf16, True, (64, 0), 0.0, False,
                         defines={"LAB_BWD_MASK_BUG_NO_WINDOW": 1}, expect_fail=True)
    print(f"checks bwd done: {bad} bad", flush=True)
    if wide:  # D 192 / 256 (bwd v21) through the public op: wide_checks, a few minutes more
        bad += wide_checks("public", packed=packed)
    if packed:
        from . import gpu_varlen
        bad += gpu_varlen.checks()
    return bad


# The wide head dims' cells (D 192 / 256, masked bwd v21): Gemma-2's local and global layers (window, softcap 50,
# GQA 16 / 8), sinks with S_q != S_k both ways, causal top-left and bottom-right, S 65 / 300 / 1000:
# (name, B, H_q, H_kv, S_q, S_k, causal, window_size, softcap, sinks, lower_right).
GRID_WIDE = [("gemma-local", 1, 16, 8, 1000, 1000, True, (256, 0), 50.0, False, False),
             ("gemma-global", 1, 16, 8, 300, 300, True, None, 50.0, False, False),
             ("causal-ul", 1, 4, 2, 300, 1000, True, None, 0.0, False, False),
             ("causal-lr", 1, 4, 2, 1000, 300, True, None, 0.0, False, True),
             ("sym", 2, 4, 2, 65, 65, False, (20, 10), 0.0, False, False),
             ("sink-lr", 1, 4, 2, 300, 1000, True, None, 0.0, True, True),
             ("sink-lr-window", 1, 4, 2, 300, 1000, True, (256, 0), 0.0, True, True),
             ("sink-lr-tall", 1, 4, 2, 1000, 300, True, None, 0.0, True, True),
             ("w0sink", 1, 4, 2, 65, 65, False, (0, 0), 0.0, True, False),
             ("all", 2, 8, 4, 1000, 1000, True, (128, 0), 50.0, True, False),
             ("capnc-sink", 1, 4, 4, 300, 300, False, None, 50.0, True, False)]


def wide_checks(forward: str = "public", packed: bool = True, dims=(256, 192), trials: int = 2, names=None,
                extras: bool = True) -> int:
    """The masked backward at D 192 / 256 (bwd v21): GRID_WIDE at both dims (d sinks also within 3x the flash
    formulation's own error), fp16, the build without the softcap's derivative (must fail), then (packed) the
    packed calls at both dims through lab.ops.attention_varlen. forward="eager" takes the forward's output and LSE
    from the float64 reference (check_bwd), so the backward is checked apart from the masked wide forward; the packed
    checks need the public forward. Returns how many were not ok."""
    bad = 0
    bf16, fp16 = torch.bfloat16, torch.float16
    for D in dims:
        for name, B, Hq, Hkv, Sq, Sk, causal, window, cap, sink, lower_right in GRID_WIDE:
            if names is not None and name not in names:
                continue
            bad += not check_bwd(name, B, Hq, Hkv, Sq, Sk, D, bf16, causal, window, cap, sink, lower_right,
                                 forward=forward, sink_rule=True, trials=trials)
    if extras:
        bad += not check_bwd("fp16", 1, 4, 2, 1000, 1000, dims[0], fp16, True, (256, 0), 50.0, True, forward=forward,
                             sink_rule=True, trials=trials)
        bad += not check_bwd("no-softcap-grad", 1, 4, 2, 1000, 1000, dims[0], bf16, True, (256, 0), 10.0, False,
                             defines={"LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD": 1}, expect_fail=True, forward=forward)
    print(f"checks wide bwd ({forward} forward) done: {bad} bad", flush=True)
    if packed:
        from .gpu_varlen import check_varlen_bwd
        docs = [1, 0, 63, 65, 300, 0, 130]
        for D in dims:
            bad += not check_varlen_bwd("wide-all", docs, docs, 4, 2, D, bf16, True, (100, 0), 50.0, True,
                                        trials=trials)
        bad += not check_varlen_bwd("wide-cross", [1025, 3, 0, 300], [700, 5, 9, 300], 16, 8, 256, bf16, True,
                                    (256, 0), 0.0, False, trials=trials)
        print(f"checks wide bwd packed done: {bad} bad", flush=True)
    return bad


def table(rows: list[dict], names=None):
    """The recorded check_bwd rows of the sink cases (GRID_BWD_SINKS and the grid's one-key rows, or `names`) that
    carry the flash and eager yardsticks: per gradient, our max abs error beside the three yardsticks' and the
    tolerance. A lab.publish.tables.Table, or None after printing that no such row is recorded."""
    from ..publish.tables import Table

    names = set(names or [c[0] for c in GRID_BWD_SINKS] + ["w0sink"])
    lines = [[r["case"]["name"], f"{r['case']['Sq']}x{r['case']['Sk']}", r["case"]["D"], str(r["case"]["window"]),
              g, m["max_abs"], m["sdpa_max_abs"], m["flash_max_abs"], m["eager_max_abs"], m["tol_max_abs"],
              "yes" if m["passed"] else "NO"]
             for r in rows if r["case"]["name"] in names and not r["case"].get("packed")
             for g, m in r["check"].items() if "flash_max_abs" in m and g != "dv"]
    if not lines:
        print("no recorded gradient check of the sink cases carries the flash and eager yardsticks yet")
        return None
    return Table(["case", "S_q x S_k", "D", "window", "grad", "ours max abs", "SDPA's", "flash formulation's",
                  "eager bf16's", "tolerance", "pass"], lines,
                 f"max abs errors against float64 autograd; tolerance = {check.MULTIPLIER:g} x max(SDPA's, the flash "
                 f"formulation's) + {check.ABS_FLOOR:.1e}")


# ------------------------------------------------------------------ race

@bench.flex_race
def race(budget_s: float) -> None:
    """Backward alone (torch.autograd.grad with retain_graph over one forward) and forward + backward, public op, in
    GPU time (bench.GpuTimeTimer: the host issues each call while the GPU sleeps, so a row holds its GPU work, as
    in training, where the host runs ahead; the dense backward's race in n10 is timed the same way)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    timer = bench.GpuTimeTimer()
    start = time.time()
    H, D, dt = 16, 128, torch.bfloat16
    stop = dict(budget_s=0.4, max_reps=20, min_reps=5)

    def emit(feature, S, extra, fns, ins):
        if time.time() - start > budget_s:
            print(f"race-bwd: budget spent, skipping {feature} S={S} {extra}", flush=True)
            return
        dout = torch.randn(1, H, S, D, device="cuda", dtype=dt)
        calls = {}
        for name, fn in fns.items():
            try:
                out = fn()
            except Exception as e:  # a backend refusing the shape is reported, not timed
                calls[name] = (lambda e=e: (_ for _ in ()).throw(e), None)
                continue
            calls[name] = (lambda out=out: torch.autograd.grad(out, ins, dout, retain_graph=True, allow_unused=True),
                           None)
            calls[name + "+fwd"] = (lambda fn=fn: torch.autograd.grad(fn(), ins, dout, allow_unused=True), None)
        times = bench.time_interleaved(calls, timer=timer, **stop)
        row = {k: (t.median_ms if hasattr(t, "median_ms") else str(t)) for k, t in times.items()}
        ratios = {}  # each peer's time over ours, backward alone and forward + backward apart
        for name, t in row.items():
            base = row.get("lab+fwd" if name.endswith("+fwd") else "lab")
            if name not in ("lab", "lab+fwd"):
                ratios[name] = t / base if isinstance(t, float) and isinstance(base, float) else None
        extra_fields = {f"overhead{s}": row["lab" + s] / row["lab_masked_plain" + s] for s in ("", "+fwd")
                        if isinstance(row.get("lab" + s), float) and isinstance(row.get("lab_masked_plain" + s), float)}
        record.append({"kind": "race_bwd", "feature": feature, "case": {"B": 1, "H": H, "S": S, "D": D,
                                                                       "dtype": "bfloat16", **extra},
                       "timer": "gpu_time", "median_ms": row, "ratio_vs_lab": ratios, **extra_fields}, chapter=CHAPTER)
        print(f"race-bwd {feature} S={S} {extra}: " + ", ".join(
            f"{k} {v if isinstance(v, str) else round(v, 3)}" for k, v in row.items()), flush=True)

    for S in (4096, 16384):
        GEN.manual_seed(S)
        q, k, v = (draw(1, H, S, D, dtype=dt).requires_grad_() for _ in range(3))
        ins = (q, k, v)
        rows = torch.arange(S, device="cuda")
        for W in (1024, 4096):
            def mask_mod(b, h, qi, ki, W=W):
                return (qi >= ki) & (qi - ki <= W)
            bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
            dense = spec.visible(rows, rows, S, 0, spec.make_mask(True, (W, 0), 0.0))[None, None]
            fns = {"lab": lambda W=W: ops.attention(q, k, v, is_causal=True, window_size=(W, 0)),
                   "flex": lambda bm=bm: flex(q, k, v, block_mask=bm),
                   "lab_dense_causal": lambda: ops.attention(q, k, v, is_causal=True)}
            for backend in ("efficient", "cudnn"):
                fns["sdpa_" + backend] = lambda backend=backend, dense=dense: bench.sdpa_runner(
                    backend, q, k, v, attn_mask=dense)()
            emit("window", S, {"window": W}, fns, ins)
        causal_bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cuda")

        def capped(score, b, h, qi, ki):
            return 30.0 * torch.tanh(score / 30.0)
        sinks = torch.randn(H, device="cuda").requires_grad_()
        plain = lambda: ops.attention(q, k, v, is_causal=True, window_size=(-1, -1))  # noqa: E731
        emit("softcap", S, {"softcap": 30.0, "causal": True}, {
            "lab": lambda: ops.attention(q, k, v, is_causal=True, softcap=30.0), "lab_masked_plain": plain,
            "lab_dense_causal": lambda: ops.attention(q, k, v, is_causal=True),
            "flex": lambda: flex(q, k, v, score_mod=capped, block_mask=causal_bm)}, ins)
        emit("sinks", S, {"causal": True, "sinks_requires_grad": True}, {
            "lab": lambda: ops.attention(q, k, v, is_causal=True, sinks=sinks), "lab_masked_plain": plain,
            "lab_dense_causal": lambda: ops.attention(q, k, v, is_causal=True)}, ins + (sinks,))


@bench.flex_race
def wide_race(budget_s: float, cells=None) -> list[dict]:
    """Forward + backward at D 256 (the public op, autograd, as users train) against FlexAttention's compiled
    forward + backward with the same score_mod / mask_mod, GQA 16 / 8, bf16, in GPU time (bench.GpuTimeTimer);
    cells: (name, B, S, window W or None, softcap), Gemma-2's local (W 4096) and global layers, Gemma-3's local
    (W 1024, no softcap) by default; with a softcap ours is also timed without it (the softcap's cost). Returns the
    rows (median ms, Flex's time over ours)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    timer, start, rows = bench.GpuTimeTimer(), time.time(), []
    Hq, Hkv, D, dt = 16, 8, 256, torch.bfloat16
    for name, B, S, W, cap in cells or [("gemma2-local", 1, 8192, 4096, 50.0), ("gemma2-global", 1, 8192, None, 50.0),
                                        ("gemma3-local", 1, 8192, 1024, 0.0), ("gemma2-local", 2, 4096, 4096, 50.0)]:
        if time.time() - start > budget_s:
            print(f"race-wide: budget spent, skipping {name} S={S}", flush=True)
            continue
        GEN.manual_seed(S)
        q = draw(B, Hq, S, D, dtype=dt).requires_grad_()
        k, v = (draw(B, Hkv, S, D, dtype=dt).requires_grad_() for _ in range(2))
        dout = draw(B, Hq, S, D, dtype=dt)

        def mask_mod(b, h, qi, ki, W=W):
            return (qi >= ki) & (qi - ki <= W) if W is not None else qi >= ki

        def capped(score, b, h, qi, ki, cap=cap):
            return cap * torch.tanh(score / cap)
        bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
        fns = {"lab": lambda W=W, cap=cap: ops.attention(q, k, v, is_causal=True, window_size=(W, 0) if W else None,
                                                         softcap=cap, enable_gqa=True),
               "flex": lambda bm=bm, cap=cap: flex(q, k, v, score_mod=capped if cap else None, block_mask=bm,
                                                   enable_gqa=True)}
        if cap:  # the softcap's cost: ours on the same window without it
            fns["lab_nocap"] = lambda W=W: ops.attention(q, k, v, is_causal=True, window_size=(W, 0) if W else None,
                                                         enable_gqa=True)
        calls = {n: (lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), dout), None) for n, fn in fns.items()}
        times = bench.time_interleaved(calls, timer=timer, budget_s=1.0, max_reps=20, min_reps=5)
        ms = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
        ratio = ms["flex"] / ms["lab"] if all(isinstance(ms[x], float) for x in ("flex", "lab")) else None
        plain = ms.get("lab_nocap")
        cap_cost = ms["lab"] / plain if isinstance(plain, float) and isinstance(ms["lab"], float) else None
        row = {"kind": "race_bwd", "feature": "wide", "case": {"name": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S,
               "D": D, "window": W, "softcap": cap, "dtype": "bfloat16"}, "timer": "gpu_time", "median_ms": ms,
               "flex_over_lab": ratio, "softcap_over_none": cap_cost}
        record.append(row, chapter=os.environ.get("LAB_CHAPTER", CHAPTER))
        rows.append(row)
        print(f"race-wide {name} B={B} S={S} W={W} cap={cap}: lab fwd+bwd {ms['lab']} ms, flex {ms['flex']} ms, "
              f"flex/lab {ratio if ratio is None else round(ratio, 3)}, ours without softcap {ms.get('lab_nocap')} ms "
              f"(softcap/none {cap_cost if cap_cost is None else round(cap_cost, 3)})", flush=True)
    return rows


def sanitize_calls() -> None:
    """One small dense and one packed masked backward at D 256 (bwd v21: window, softcap, sinks, GQA; the forward's
    output and LSE from the float64 reference) for compute-sanitizer: `python -m lab.masks.gpu_bwd sanitize`."""
    from . import varlen_bwd

    mask, scale, dt = spec.make_mask(True, (100, 0), 50.0), 256 ** -0.5, torch.bfloat16
    q, dout = draw(1, 4, 130, 256, dtype=dt), draw(1, 4, 130, 256, dtype=dt)
    k, v = draw(1, 2, 200, 256, dtype=dt), draw(1, 2, 200, 256, dtype=dt)
    sinks = torch.randn(4, generator=GEN).cuda()
    out, lse = reference.attend(q, k, v, mask, scale, 70, sinks)
    mbwd.launch_backward(dout, q, k, v, out.to(dt), lse.float(), torch.zeros_like(lse, dtype=torch.float32), sinks,
                         True, mask.left, mask.right, 70, mask.softcap, scale)
    lens = [1, 0, 65, 130]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, dout = draw(sum(lens) + 3, 4, 256, dtype=dt), draw(sum(lens) + 3, 4, 256, dtype=dt)
    k, v = draw(sum(lens), 2, 256, dtype=dt), draw(sum(lens), 2, 256, dtype=dt)
    out, lse = reference.attend_varlen(q, k, v, cu, cu, mask, scale, sinks)
    varlen_bwd.launch(dout, q, k, v, out.to(dt), lse.float(), None, cu, cu, sinks, True, max(lens), max(lens),
                      mask.left, mask.right, mask.softcap, scale)
    torch.cuda.synchronize()
    print("sanitize calls done bwd wide", flush=True)


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["sanitize"]:
        sanitize_calls()
