"""Writes chapters/n10_backward.ipynb (sources only, no outputs): python tests/cuda/bwd_make_chapter.py"""
from __future__ import annotations

from chapter_writer import Chapter

chapter = Chapter("n10_backward")
md, code = chapter.md, chapter.code


md(r"""
# n10 · The backward pass

**What you will learn:** how FlashAttention-2 computes the gradients of attention without storing P,
what the backward kernel (`kernels/bwd/v01_mma.cu`) does tile by tile, whether each gradient is right on
every `tests` case, why dQ is a race and what the deterministic mode costs, how the backward races SDPA's,
and whether a small model trains the same with `lab.ops.attention` as with SDPA.

## The algorithm

The forward saves O and the natural-log LSE per query row (`lab.ops.attention(..., return_lse=True)` gives
the same numbers), never P. With s = scale · q·k:

| step | formula | where |
|---|---|---|
| the D term | Δ_i = Σ_d dO_id · O_id − dLSE_i | pre-pass `bwd_pre`, one float per row |
| recompute | P_ij = exp(s_ij − LSE_i) | every tile, from Q, K and LSE |
| dV | dV_j = Σ_i P_ij dO_i | registers of the K/V block's CTA |
| dP | dP_ij = dO_i · V_j | |
| dS | dS_ij = P_ij (dP_ij − Δ_i) | |
| dK | dK_j = scale Σ_i dS_ij Q_i | registers of the K/V block's CTA |
| dQ | dQ_i = scale Σ_j dS_ij K_j | fp32 atomics, or a separate pass |

One CTA per 64-key block of one KV head keeps K_j, V_j in shared memory and dK_j, dV_j in registers,
and walks every (query head of its GQA group, query block): the GQA sum of dK and dV is a loop, with
no reduction. dQ_i receives a contribution from every key block, i.e. from many CTAs at once.

## Memory traffic

What must move is small: Q, O, dO, dQ (query side), K, V, dK, dV (key side) once each, plus the LSE.
What the tiling adds: every K/V CTA streams all query blocks of its group (Q, dO, LSE, Δ) from L2, and in
the atomic mode adds a float32 dQ tile per (key block, query block): S_k/64 read-modify-writes of the
whole dQ in float32, served by L2 atomics. The separate dQ pass replaces those atomics by recomputing S and
dP once more (7 matmuls per tile pair instead of 5).
""")

code("""
device = "auto"  # "auto" | "cuda" | "cpu"
dtype = "bfloat16"
cases = "full"  # "full": every tests case and bench-fwd S in {512, 2048, 8192, 16384}; "quick": a subset
reps = 2  # trials per correctness check (plus one peaked trial)
""", tags=["parameters"])

code("""
import numpy as np
import torch
from lab import backward, backward_harness, bench, build, cases as case_sets, chapter, check, ops, record
from lab.emulate_backward import backward_reference, flash_backward_emulated, hbm_bytes, relative_error
ch = chapter.start("n10_backward", device)
""")

md("""
## The algorithm, emulated (CPU and GPU)

`lab.emulate_backward.flash_backward_emulated` runs the kernel's tile order in float32 NumPy (pre-pass,
K/V blocks outside, query blocks inside, dQ by "atomics" in a chosen CTA order or by a separate pass), here
against the closed-form float64 gradients, causal with S_q ≠ S_k and GQA 4/2, for three scales.
""")

code("""
rng = np.random.default_rng(1)
q, k, v = rng.standard_normal((1, 4, 130, 64)), rng.standard_normal((1, 2, 200, 64)), rng.standard_normal((1, 2, 200, 64))
do = rng.standard_normal(q.shape)
for scale in (None, -0.3, 0.0):
    ref = backward_reference(q, k, v, do, True, scale)
    for mode in ("atomic", "separate"):
        emu = flash_backward_emulated(q, k, v, do, True, scale, block_m=64, block_n=64, dq_mode=mode)
        errs = {n: relative_error(a, b) for n, a, b in zip(("dq", "dk", "dv"), emu, ref)}
        record.append({"kind": "emulation", "impl": f"FA2 backward, {mode} dQ (NumPy)", "scale": scale, "rel_l2": errs})
        print(f"scale {scale!s:>5}, dQ {mode:8}: relative L2 error " + ", ".join(f"{n} {e:.1e}" for n, e in errs.items()))
bug = flash_backward_emulated(q, k, v, do, True, no_delta=True)
ref = backward_reference(q, k, v, do, True)
print("without the D term: " + ", ".join(f"{n} {relative_error(a, b):.2f}" for n, a, b in zip(("dq", "dk", "dv"), bug, ref)))
""")

md("""
## The race, emulated

In the atomic mode each K/V CTA adds its dS·K into the same float32 dQ rows; the GPU runs the CTAs in
whatever order they are scheduled, and float32 addition is not associative. Three CTA orders of the same
problem: how many dQ elements differ in their bits, and by how much. The separate pass has one order.
""")

code("""
q2, k2, v2 = rng.standard_normal((1, 2, 64, 64)), rng.standard_normal((1, 2, 512, 64)), rng.standard_normal((1, 2, 512, 64))
do2 = rng.standard_normal(q2.shape)
ctas = 2 * 512 // 64
orders = {"launch": list(range(ctas)), "reversed": list(reversed(range(ctas))), "shuffled": list(rng.permutation(ctas))}
for mode in ("atomic", "separate"):
    dqs = {name: flash_backward_emulated(q2, k2, v2, do2, dq_mode=mode, cta_order=o)[0] for name, o in orders.items()}
    base = dqs["launch"]
    for name, dq in dqs.items():
        if name != "launch":
            print(f"{mode:8} {name:8} vs launch order: {int((dq != base).sum()):5d} of {dq.size} dQ elements differ, "
                  f"max |diff| {float(np.abs(dq - base).max()):.1e}")
""")

md("""
## The kernel

`kernels/bwd/v01_mma.cu`: `mma.sync.m16n8k16` with fp32 accumulation, `ldmatrix` (`.trans` where an operand is
stored the other way round), `cp.async` double buffering of Q, dO, LSE and Δ, padded shared-memory rows.
Each warp owns 16 keys: it computes Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ with keys as the mma rows, so Pᵀ and dSᵀ
come out of the accumulators already in the A-operand layout of dV += Pᵀ dO and dK += dSᵀ Q (as P does
for P·V in the forward). Registers, shared memory and spills per instantiation:
""")

code("""
source = backward.BWD["v01"].source
rows_res = build.build_kernel(source).resources if ch.gpu else build.compile_check(sources=[build.paths.KERNELS / source])
print(build.resource_table(rows_res))
""")

md("Cut from the kernel file by its `// [lab:dkdv-tile]` markers, so this is the code that ran:")

code("""
from IPython.display import Markdown
from lab import source as kernel_source
Markdown(kernel_source.markdown(source, "dkdv-tile"))
""")

md("""
## Correctness of each gradient (GPU)

Every `tests` case (uneven sizes 1, 63, 65, 1025, 4097, S_q ≠ S_k both ways, causal and not, GQA and MQA,
fp16 and bf16), in both dQ modes, through `lab.check.check_backward`: dQ, dK and dV against the gradients of
the float64 reference (autograd), each judged by SDPA's own backward error in the same dtype (max abs error
≤ 3× SDPA's + 2⁻¹⁴, relative L2 ≤ 3× SDPA's, no NaN); gradients NaN-poisoned before each run. Then the
public op's autograd path (forward plus backward) and any finite scale. SDPA's flash and cuDNN return NaN for
scale ≤ 0 on this torch, and the math backend's bf16 backward is more accurate than any fused kernel's (the first
GPU run of this chapter judged the scale cases by it: ours at ~3.5× its relative error), so for scale ≤ 0 the
yardstick is SDPA's default backend on the same problem rewritten exactly (`lab.check.sdpa_grads`: −q with |scale|,
or scale 2⁻¹⁰⁰ for 0).
""")

code("""
def summary(results_by_case):
    lines = []
    for label, res in results_by_case:
        worst = {n: r.worst for n, r in res.items()}
        lines.append((label, all(r.passed for r in res.values()),
                      *[f"{worst[n]['max_abs']:.2e} / {worst[n]['sdpa_max_abs']:.2e}" for n in ("dq", "dk", "dv")]))
    import pandas as pd
    return pd.DataFrame(lines, columns=["case", "passed", "dQ max abs (ours / SDPA)", "dK", "dV"])

test_cases = case_sets.tests_cases() if cases == "full" else case_sets.tests_cases()[::4]
if not ch.skip("backward correctness"):
    checked = []
    for det in (False, True):
        run = backward_harness.bwd_runner("v01", deterministic=det)
        mode = "det" if det else "atomic"
        checked += [(f"{c.label} [{mode}]", check.check_backward(run, c, f"bwd-v01-{mode}", trials=reps)) for c in test_cases]
    checked += [(f"{c.label} [public op, fwd+bwd]", check.check_backward(backward_harness.autograd_runner(), c, "lab.ops.attention", trials=1, include_forward=True))
                for c in test_cases[::3]]
    scale_case = case_sets.Case("bwd-scale", 2, 4, 2, 130, 65, 64, dtype, True)
    checked += [(f"{scale_case.label} scale {s}", check.check_backward(backward_harness.bwd_runner(), scale_case, "bwd-v01", trials=1, scale=s))
                for s in (-0.125, 0.0, 0.3)]
    table = summary(checked)
    print(f"{int(table.passed.sum())}/{len(table)} checks pass")
    display(table)
else:
    rows_chk = [r for r in ch.recorded(kind="check") if r.get("grad")]
    print(f"{sum(r['check']['passed'] for r in rows_chk)}/{len(rows_chk)} recorded gradient checks passed")
""")

md("""
### The self-test: a kernel that forgets the D term must fail (GPU)

The same kernel built with `-DLAB_BWD_BUG_NO_DELTA` (Δ = 0): dQ and dK must fail the check, dV (which has
no D term) must pass.
""")

code("""
if not ch.skip("D-term self-test"):
    bad = check.check_backward(backward_harness.bwd_runner("v01", defines={"LAB_BWD_BUG_NO_DELTA": None}),
                               case_sets.Case("bwd-selftest", 1, 4, 4, 130, 130, 64, dtype, False), "bwd-no-delta", trials=1)
    for name, r in bad.items():
        print(r)
    record.append({"kind": "selftest", "impl": "bwd-v01 LAB_BWD_BUG_NO_DELTA", "failed": [n for n, r in bad.items() if not r.passed]})
""")

md("""
## The race on the GPU

The same backward ten times on the same inputs, on two shapes. In the atomic mode nothing fixes the order of
the fp32 adds into a dQ row, so its bits *may* change from run to run (dK and dV cannot: each is owned by one
CTA); whether they do on a given GPU and shape is measured here, not assumed. In the deterministic mode
(`torch.use_deterministic_algorithms(True)` selects it) the order is fixed by construction. Then what each
mode costs in time.
""")

code("""
if not ch.skip("race"):
    dt = check.DTYPES[dtype]
    # (query shape, key shape, causal): a bench-like cell, and few query rows against many key blocks, where
    # every dQ row receives the adds of 128 K/V CTAs running at the same time.
    shapes = [((2, 8, 2048, 128), (2, 2, 2048, 128), True), ((1, 16, 256, 64), (1, 16, 16384, 64), False)]
    for shape_q, shape_kv, causal in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        qr, dor = (torch.randn(shape_q, generator=gen, device="cuda", dtype=dt) for _ in range(2))
        kr, vr = (torch.randn(shape_kv, generator=gen, device="cuda", dtype=dt) for _ in range(2))
        with torch.no_grad():
            outr, lser = ops.attention(qr, kr, vr, is_causal=causal, enable_gqa=True, return_lse=True)
        scale_r = 1.0 / shape_q[-1] ** 0.5
        for det in (False, True):
            call = lambda: backward._bwd_impl(dor, qr, kr, vr, outr, lser, None, causal, scale_r, det, "v01")
            outs = [call() for _ in range(10)]
            differ = {n: max(int((o[i] != outs[0][i]).sum()) for o in outs[1:]) for i, n in enumerate(("dq", "dk", "dv"))}
            maxdiff = max(float((o[0].float() - outs[0][0].float()).abs().max()) for o in outs[1:])
            ms = bench.time_fn(call).median_ms
            record.append({"kind": "race", "impl": "bwd-v01", "deterministic": det, "elements_differing": differ,
                           "dq_max_abs_diff": maxdiff, "ms": ms, "shape": [shape_q, shape_kv, causal]})
            print(f"q{shape_q} kv{shape_kv}{' causal' if causal else ''} {'deterministic' if det else 'atomic':13}: "
                  f"most elements differing from run 1 in 9 reruns {differ}, dQ max |diff| {maxdiff:.1e}; backward {ms:.3f} ms")
else:
    for r in ch.recorded(kind="race"):
        print(f"{r.get('shape')} {'deterministic' if r['deterministic'] else 'atomic':13}: elements differing "
              f"{r['elements_differing']}, dQ max |diff| {r['dq_max_abs_diff']:.1e}, {r.get('ms', float('nan')):.3f} ms")
""")

md("""
## The race against SDPA's backward (GPU)

The public op's backward (`torch.autograd.grad` on a graph recorded once) against SDPA forced to each
backend, same process, same inputs, L2 flushed before each run; FLOPs counted as FlashAttention does:
2.5× the forward's (5·B·H·S²·D, halved for causal). Then forward plus backward (3.5×).
""")

code("""
lengths = (512, 2048, 8192, 16384) if cases == "full" else (2048, 8192)
grid = case_sets.bench_fwd_cases(dtype, seqlens=lengths)
if not ch.skip("backward race"):
    rows_bwd = backward_harness.backward_sweep(grid, "bwd")
    rows_fb = backward_harness.backward_sweep(grid[::3], "fwd+bwd")
else:
    rows_bwd, rows_fb = ch.recorded(kind="bwd"), ch.recorded(kind="fwd+bwd")

def race_table(rows):
    import pandas as pd
    ours = [r for r in rows if r["impl"] == "lab.ops.attention" and "timing" in r]
    return pd.DataFrame([(r["case"]["name"], r["tflops"], r["timing"]["median_ms"],
                          *[r["ratios"].get(f"sdpa-{b}", float("nan")) for b in ("flash", "cudnn", "efficient")]) for r in ours],
                        columns=["case", "TFLOP/s", "ms", "x SDPA-flash", "x SDPA-cuDNN", "x SDPA-efficient"])
if rows_bwd:
    display(race_table(rows_bwd))
if rows_fb:
    display(race_table(rows_fb))
""")

md("""
## A training step

A one-block transformer language model (embedding, causal self-attention, projection, output head; bf16,
SGD) trained for a few steps on fixed random tokens, once with `lab.ops.attention` and once with SDPA, same
seed: the loss curves must agree to rounding. Then the time of one training step (forward plus backward of
the whole model) with each.
""")

code("""
import torch.nn.functional as F
if not ch.skip("training step"):
    ours_curve = backward_harness.train_losses(lambda q, k, v: ops.attention(q, k, v, is_causal=True), steps=10)
    sdpa_curve = backward_harness.train_losses(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), steps=10)
    record.append({"kind": "train", "impl": "lab.ops.attention", "losses": ours_curve})
    record.append({"kind": "train", "impl": "sdpa-default", "losses": sdpa_curve})
else:
    rows_train = {r["impl"]: r["losses"] for r in ch.recorded(kind="train")}
    ours_curve, sdpa_curve = rows_train.get("lab.ops.attention"), rows_train.get("sdpa-default")
if ours_curve and sdpa_curve:
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot(ours_curve, "o-", label="lab.ops.attention")
    ax.plot(sdpa_curve, "x--", label="SDPA")
    ax.set_xlabel("step"); ax.set_ylabel("loss"); ax.legend(); fig.tight_layout()
    fig.savefig(record.figure_path("n10_loss.png"))
    worst = max(abs(a - b) / abs(b) for a, b in zip(ours_curve, sdpa_curve))
    print(f"largest relative difference between the two loss curves: {worst:.2e}")
""")

code("""
def block_step(attention, B=8, H=16, S=2048, D=128):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, S, H * D, generator=gen, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(H * D, 3 * H * D, generator=gen, device="cuda", dtype=torch.bfloat16) / (H * D) ** 0.5
    def step():
        q, k, v = (x @ w).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        attention(q, k, v).float().sum().backward()
    return step

if not ch.skip("training-step timing"):
    t_ours = bench.time_fn(block_step(lambda q, k, v: ops.attention(q, k, v, is_causal=True)))
    t_sdpa = bench.time_fn(block_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
    record.append({"kind": "train-step", "impl": "lab.ops.attention", "timing": t_ours.as_dict(), "sdpa_default_ms": t_sdpa.median_ms,
                   "ratio": t_sdpa.median_ms / t_ours.median_ms, "shape": "B8 H16 S2048 D128 bf16 causal"})
    print(f"QKV projection + attention fwd+bwd step: ours {t_ours.median_ms:.3f} ms, SDPA default {t_sdpa.median_ms:.3f} ms "
          f"({t_sdpa.median_ms / t_ours.median_ms:.2f}x)")
else:
    for r in ch.recorded(kind="train-step"):
        print(f"recorded: ours {r['timing']['median_ms']:.3f} ms, SDPA default {r['sdpa_default_ms']:.3f} ms ({r['ratio']:.2f}x)")
""")

md("""
## Findings

Computed from this run's rows (or the recorded GPU session's in CPU mode), not typed in.
""")

code("""
from lab import findings


def summary(rows_bwd):
    ours = [r for r in rows_bwd if r["impl"] == "lab.ops.attention" and r.get("ratios")]
    if not ours:
        print("no backward timings")
        return
    print("\\n".join(findings.ratio_summary(rows_bwd, "lab.ops.attention", ("sdpa-flash", "sdpa-cudnn"), label="backward")))
    best = max(ours, key=lambda r: r["tflops"])
    print(f"highest backward rate: {best['tflops']:.0f} TFLOP/s ({best['case']['name']})")
summary(rows_bwd)
""")


def main():
    print(chapter.write())


if __name__ == "__main__":
    main()
