"""masked v12 on the GPU (the masked forward at D 192 / 256): lab.masks.gpu's correctness grid at the wide head dims
(the same yardstick, pass rule, poisoned outputs and fresh inputs per trial; uneven S 1 / 65 / 300 / 1000 / 4097,
GQA 16/8, both causal alignments, Gemma-2's softcap 50 and window 4096, sinks, packed sequences, the softcap's
floor), two wrong builds that must fail, the public ops as users call them, and the race against FlexAttention in
Gemma-2's shapes at D 256. checks_wide() is its entry (lab.masks.gpu.checks takes D 64 / 128 only).
"""
from __future__ import annotations

import os
import time

import torch

from .. import bench, check, ops, record
from . import op as mop, reference, spec
from .gpu import CHAPTER, GEN, GRID_MASKS, check_cap_floor, check_dense, check_varlen, draw, sdpa_error

# The grid's masks plus Gemma-2's (softcap 50; its local layers' window 4096 with softcap 50) at D 192 / 256, uneven S
# (1, 65, 300 with GQA 16/8, 1000) and S 4097 at D 256 for the masks in GRID_MASKS_LONG.
GRID_MASKS_WIDE = GRID_MASKS + [("cap50", True, None, 50.0, False), ("gemma2", True, (4095, 0), 50.0, True)]
GRID_SIZES_WIDE = [(2, 4, 2, 1, 1), (1, 4, 4, 65, 65), (1, 16, 8, 300, 300), (2, 4, 2, 1000, 1000)]
GRID_MASKS_LONG = ("w64c", "sym", "cap50", "gemma2")
# The wrong builds that must fail: the window dropped (v08-v11's control) and only its edge mask dropped (v12's).
WRONG_WIDE = ({"LAB_FWD_MASK_BUG_NO_WINDOW": 1}, {"LAB_FWD_MASK_WIDE_BUG_NO_EDGE": 1})


def checks_wide(version: str = "v12") -> int:
    """masked v12's grid: dense cells (both causal alignments, fp16, (B, S, H, D) strides), the softcap's floor, the
    wrong builds, packed sequences, then the public ops as users call them (the padded D 200, D_qk != D_v, varlen)."""
    bad = 0
    bf16, fp16 = torch.bfloat16, torch.float16
    for D in (256, 192):
        for name, causal, window, cap, sink in GRID_MASKS_WIDE:
            long = [(1, 2, 1, 4097, 4097)] if D == 256 and name in GRID_MASKS_LONG else []
            for B, Hq, Hkv, Sq, Sk in GRID_SIZES_WIDE + long:
                w = (Sk, Sk) if window == "S" else (Sk + 100, -1) if window == "S+" else window
                bad += not check_dense(version, name, B, Hq, Hkv, Sq, Sk, D, bf16, causal, w, cap, sink)
        for lower_right in (False, True):
            for Sq, Sk in ((65, 1025), (1025, 65), (300, 1000)):
                bad += not check_dense(version, "cross", 1, 16, 8, Sq, Sk, D, bf16, True, (200, 0), 50.0, True,
                                       lower_right)
        bad += not check_dense(version, "fp16", 1, 4, 2, 1000, 1000, D, fp16, True, (256, 0), 50.0, True)
        bad += not check_dense(version, "fp16", 1, 4, 2, 65, 300, D, fp16, False, (30, 40), 0.0, False)
        bad += not check_dense(version, "bshd", 2, 4, 2, 1000, 1000, D, bf16, True, (256, 0), 30.0, True, layout="bshd")
        for causal, window, cap, sink in ((True, None, 0.0, False), (True, (100, 0), 50.0, True),
                                          (False, (20, 20), 30.0, False), (False, None, 0.0, True)):
            bad += not check_varlen(version, "packed", [0, 5, 1025, 63, 0, 300], [0, 5, 1025, 63, 7, 300], 16, 8, D,
                                    bf16, causal, window, cap, sink)
            bad += not check_varlen(version, "cross", [5, 70, 1, 0, 200], [9, 64, 30, 12, 0], 4, 2, D, bf16, causal,
                                    window, cap, sink)
    for cap, dtype in ((50.0, bf16), (5.0, bf16), (50.0, fp16), (60.0, bf16)):
        bad += not check_cap_floor(version, cap, dtype, D=256)
    for defines in WRONG_WIDE:
        for D in (256, 192):
            bad += not check_dense(version, "wrong", 1, 4, 2, 1025, 1025, D, bf16, True, (64, 0), 0.0, False,
                                   defines=defines, expect_fail=True)
    print(f"checks {version} dense, packed and wrong builds done: {bad} bad", flush=True)
    return bad + public_wide()


def public_wide() -> int:
    """The public ops at the wide head dims, as users call them (their own allocation, the one-crossing path where it
    applies): Gemma-2's D 256 with GQA 16/8, window, softcap 50 and sinks; D 200 (padded to 256); D_qk 192 with
    D_v 256; a packed call at D 200."""
    bad = 0
    for name, d_qk, d_v in (("gemma2", 256, 256), ("pad200", 200, 200), ("qk192-v256", 192, 256)):
        GEN.manual_seed(d_qk * 1000 + d_v)
        q, k, v = draw(2, 16, 300, d_qk, dtype=torch.bfloat16), draw(2, 8, 700, d_qk, dtype=torch.bfloat16), \
            draw(2, 8, 700, d_v, dtype=torch.bfloat16)
        sinks = torch.randn(16, generator=GEN).cuda()
        out, lse = ops.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(100, 0), softcap=50.0,
                                 sinks=sinks, return_lse=True, causal_variant="lower_right")  # offset 400
        ref, ref_lse = reference.attend(q, k, v, spec.make_mask(True, (100, 0), 50.0), None, 400, sinks)
        pub = check.compare(out, ref, ref + sdpa_error(q, k, v, spec.make_mask(True, (100, 0), 0.0), d_qk ** -0.5,
                                                       400, sinks))
        bad += not _public_row(f"lab.ops.attention({name})", pub, lse, ref_lse, q)
    lens = [0, 5, 1025, 63, 300]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k = draw(int(cu[-1]), 8, 200, dtype=torch.bfloat16), draw(int(cu[-1]), 4, 200, dtype=torch.bfloat16)
    mask = spec.make_mask(True, (64, 0), 50.0)
    out, lse = ops.attention_varlen(q, k, k, cu, cu, max(lens), max(lens), is_causal=True, window_size=(64, 0),
                                    softcap=50.0, return_lse=True)
    ref, ref_lse = reference.attend_varlen(q, k, k, cu.tolist(), cu.tolist(), mask, 200 ** -0.5, None)
    err = torch.zeros_like(ref)
    c = cu.tolist()
    for b in range(len(lens)):
        if lens[b]:
            sl = lambda t: t[c[b]:c[b + 1]].transpose(0, 1)[None]  # noqa: E731
            err[c[b]:c[b + 1]] = sdpa_error(sl(q), sl(k), sl(k), mask, 200 ** -0.5, 0)[0].transpose(0, 1)
    bad += not _public_row("lab.ops.attention_varlen(pad200)", check.compare(out, ref, ref + err), lse, ref_lse, q)
    print(f"public wide done: {bad} bad", flush=True)
    return bad


def _public_row(impl, pub, lse, ref_lse, q):
    finite = torch.isfinite(ref_lse)
    lse_err = float((lse.double() - ref_lse)[finite].abs().max()) if finite.any() else 0.0
    ok = pub["passed"] and lse_err < 1e-2
    record.append({"kind": "check", "impl": impl, "version": mop.masked_version(q.device, head_dim=256), "ok": ok,
                   "check": {**{k: pub[k] for k in ("passed", "max_abs", "tol_max_abs")}, "lse_max_abs": lse_err}},
                  chapter=CHAPTER)
    print(("ok  " if ok else "BAD ") + f"{impl} max_abs {pub['max_abs']:.3g} tol {pub['tol_max_abs']:.3g} "
          f"lse {lse_err:.3g}", flush=True)
    return ok


# Gemma-2-shaped race cells at D 256, causal: (B, H_q, H_kv, S, feature); window 4096 is transformers' sliding_window
# (query i sees keys i - 4095 .. i), "local" Gemma-2's local layers (window and softcap 50 together).
RACE_WIDE = [(1, 16, 8, 8192, "window"), (1, 16, 8, 8192, "softcap"), (2, 8, 4, 4096, "window"),
             (2, 8, 4, 4096, "softcap"), (1, 16, 8, 8192, "local")]


@bench.flex_race
def race_wide(budget_s: float, cells=None) -> list:
    """masked v12 through lab.ops.attention against FlexAttention (torch.compile'd, same mask_mod / score_mod,
    enable_gqa) at D 256; beside them the dense default (v10) and this kernel's plain causal call. Returns the
    rows' ratios flex / lab."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    start, D, dt, W, cap = time.time(), 256, torch.bfloat16, 4095, 50.0
    ratios = []

    def capped(score, b, h, qi, ki):
        return cap * torch.tanh(score / cap)

    for B, H, Hkv, S, feature in cells or RACE_WIDE:
        if time.time() - start > budget_s:
            print(f"race_wide: budget spent, skipping {feature} S={S}", flush=True)
            continue
        GEN.manual_seed(S + H)
        q, k, v = draw(B, H, S, D, dtype=dt), draw(B, Hkv, S, D, dtype=dt), draw(B, Hkv, S, D, dtype=dt)
        window = feature in ("window", "local")
        softcap = cap if feature in ("softcap", "local") else 0.0

        def mask_mod(b, h, qi, ki, window=window):
            return (qi >= ki) & (qi - ki <= W) if window else qi >= ki
        bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
        kw = dict(is_causal=True, enable_gqa=True, window_size=(W, 0) if window else None, softcap=softcap)
        calls = {"lab": (lambda: ops.attention(q, k, v, **kw), None),
                 "flex": (lambda: flex(q, k, v, score_mod=capped if softcap else None, block_mask=bm,
                                       enable_gqa=True), None),
                 "lab_masked_plain": (lambda: ops.attention(q, k, v, is_causal=True, enable_gqa=True,
                                                            window_size=(-1, -1)), None),
                 "lab_dense_default": (lambda: ops.attention(q, k, v, is_causal=True, enable_gqa=True), None)}
        times = bench.time_interleaved(calls, budget_s=0.5, max_reps=30, min_reps=5)
        row = {n: (t.median_ms if hasattr(t, "median_ms") else str(t)) for n, t in times.items()}
        ours = row["lab"]
        ratio = row["flex"] / ours if isinstance(row["flex"], float) and isinstance(ours, float) else None
        case = {"B": B, "H": H, "Hkv": Hkv, "S": S, "D": D, "dtype": "bfloat16", "causal": True,
                "window": [W, 0] if window else None, "softcap": softcap}
        record.append({"kind": "race", "feature": f"wide-{feature}", "case": case, "median_ms": row,
                       "ratio_vs_lab": {n: (t / ours if isinstance(t, float) and isinstance(ours, float) else None)
                                        for n, t in row.items() if n != "lab"}},
                      chapter=os.environ.get("LAB_CHAPTER", CHAPTER))  # the chapter that runs it (n16, n13)
        print(f"race_wide {feature} B={B} H={H}/{Hkv} S={S}: " + ", ".join(
            f"{n} {t if isinstance(t, str) else round(t, 3)}" for n, t in row.items()) +
            f" | flex/lab {ratio if ratio is None else round(ratio, 3)}", flush=True)
        ratios.append(ratio)
    return ratios
