"""GPU checks of the lab's FP8 forward (lab.ops.attention_fp8, fwd v13), one record per check (kind "fp8-check").

Each check draws float32 randn Q, K, V (seeded), quantises them to e4m3 (amax descales, per tensor or per
head), and compares the kernel's output, on ROWS query rows spread over the sequence, with float64 attention
on the DEQUANTISED inputs (x_fp8 * descale: what the kernel was given, so the error is its arithmetic alone).
It passes when

* no NaN or inf anywhere in O or LSE (both poisoned with NaN before the call: an unwritten element fails);
* O's max abs and relative L2 are at most emulate.MULTIPLIER x those of lab.fp8.emulate.forward on the same
  e4m3 tensors (P as e4m3(P * 448), O bf16, the kernel's key-tile width): the emulation predicts the error;
* O's relative L2 is at most cuDNN FP8's on the same inputs (lab.fp8.peer; per-tensor scales only, which is
  all sdpa_fp8 takes); where cuDNN cannot run, the emulation rule above stands alone (2x its error);
* LSE (natural log) within MULTIPLIER x the modelled emulation's LSE error + LSE_TOLERANCE of float64's.

The emulation sums S as Hopper's FP8 tensor cores do (S_ACCUMULATOR, emulate's notes): each k32 step's 32
products and the running sum cut to 13 bits below the largest of them. With randn inputs this changes nothing;
with outlier channels it is the kernel's error to four digits (accumulator_models: LSE 2.4292 against the
model's 2.4293 and 1.6927 against 1.6927 at outliers x 50, H200, outputs/driver_logs/20261129-h200-batch2-
f58d500e62/T4), where float32-exact S is off by 1000x.

The cells: uneven S (1, 65, 1000, 1500, 3000, 4097), S_q != S_k both ways, causal, GQA, D 64 / 128 / 256, two with
more work tiles than SMs (a persistent grid's CTAs loop); outlier channels in Q and K under one per-tensor
scale; per-head descales; FA3's (B, H_kv) and one-element descale forms; (B, S, H, D) inputs seen through a
transpose; V with a mean (v_mean: randn + 1, so that every column of O's running sum grows with the keys, which
the FP8 wgmma accumulator truncates unless P V is promoted to float32 per key tile, fwd v13's
LAB_FWD_FP8_PV_PROMOTE). `wrong_build()` runs a build that drops v_descale, which must fail.
Run: python -m lab.fp8.checks  (exit status 1 on any failure).
"""
from __future__ import annotations

import math
import sys

import torch

from .. import bench, record
from . import emulate, op, peer, quant, race

ROWS = 512
LSE_TOLERANCE = 1e-3  # natural-log units; exp2.approx and float32 sums give ~1e-5
# The emulation the kernel is held to: S summed as Hopper's FP8 tensor cores sum it (emulate's notes). With
# plain randn inputs every model gives the same error; with outlier channels only this one predicts the kernel
# (accumulator_models measures each against it).
S_ACCUMULATOR = "fp22-align"

# (name, B, H_q, H_kv, S_q, S_k, D, causal)
CELLS = (
    ("d128-s1", 1, 2, 2, 1, 1, 128, False),
    ("d128-s65-c", 2, 4, 4, 65, 65, 128, True),
    ("d128-s1000-gqa4", 1, 8, 2, 1000, 1000, 128, False),
    ("d128-s4097-c", 1, 4, 4, 4097, 4097, 128, True),
    ("d128-sq65-sk1000", 1, 4, 4, 65, 1000, 128, False),
    ("d128-sq1000-sk65-c", 1, 4, 4, 1000, 65, 128, True),
    ("d64-s1", 1, 2, 2, 1, 1, 64, True),
    ("d64-s1000-c", 2, 4, 4, 1000, 1000, 64, True),
    ("d64-s4097-gqa2", 1, 4, 2, 4097, 4097, 64, False),
    ("d256-s65-gqa2", 1, 4, 2, 65, 65, 256, False),
    ("d256-s1000-c", 1, 4, 4, 1000, 1000, 256, True),
    ("d256-s4097", 1, 2, 2, 4097, 4097, 256, False),
    # More work tiles (128 query rows each) than an H200's 132 SMs, so that a persistent build's CTAs take several
    # tiles each, of different key counts (causal): 768 and 192 tiles. Every cell above has 132 or fewer.
    ("d128-s3000-gqa2-c", 2, 16, 8, 3000, 3000, 128, True),
    ("d256-s1500", 2, 8, 8, 1500, 1500, 256, False),
)
# (name, cell, options): the quantisation-aware and layout checks
VARIANTS = (
    ("outliers-x50-tensor", "d128-s1000-gqa4", {"outliers": 50.0}),
    ("outliers-x50-tensor-c", "d256-s1000-c", {"outliers": 50.0}),
    ("per-head-descales", "d128-s1000-gqa4", {"granularity": "head", "form": "per_head"}),
    ("one-element-descales", "d64-s1000-c", {"form": "scalar"}),
    ("bshd-layout", "d128-s65-c", {"layout": "bshd"}),
    ("v-mean-1", "d128-s4097-c", {"v_mean": 1.0}),
    ("v-mean-1-d64", "d64-s4097-gqa2", {"v_mean": 1.0}),
    ("v-mean-1-d256", "d256-s4097", {"v_mean": 1.0}),
)


def _cell(name: str):
    return next(c for c in CELLS if c[0] == name)


def _lse_reference(q, k, is_causal: bool, rows) -> torch.Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1])
    k = emulate._expand(k, q.shape[1])
    s = (q[:, :, rows] @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(torch.arange(k.shape[2], device=q.device)[None, :] > rows[:, None], float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _descales(quantized, Hq: int, Hkv: int, form: str):
    qq, kq, vq = quantized
    if form == "scalar":
        return [x.descale.flatten()[:1].contiguous() for x in quantized]
    if form == "fa3":  # FA3: q_descale (B, H_kv); per tensor, every query head of a group shares it
        return [qq.descale[:, ::Hq // Hkv].contiguous(), kq.descale, vq.descale]
    return [qq.descale, kq.descale, vq.descale]  # per head: q (B, H_q)


def _draw(B, Hq, Hkv, Sq, Sk, D, seed: int, granularity: str = "tensor", outliers=None, v_mean: float = 0.0) -> list:
    """Q, K, V: float32 randn on the GPU (V + v_mean; outlier channels in Q and K), quantised to e4m3 with amax
    descales."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((B, H, S, D), generator=gen, device="cuda")
               for H, S in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    if outliers:
        q, k = emulate.with_outliers(q, outliers), emulate.with_outliers(k, outliers)
    return [quant.quantize(x, "e4m3", granularity) for x in (q, k, v + v_mean)]


def check(name, B, Hq, Hkv, Sq, Sk, D, causal, seed: int = 0, granularity: str = "tensor", outliers=None,
          form: str = "fa3", layout: str = "bhsd", defines=None, use_peer: bool = True, v_mean: float = 0.0) -> dict:
    """One check (module notes); appends and returns its record."""
    quantized = _draw(B, Hq, Hkv, Sq, Sk, D, seed, granularity, outliers, v_mean)
    data = [x.data for x in quantized]
    if layout == "bshd":  # (B, S, H, D) storage, seen as (B, H, S, D)
        data = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in data]
    rows = race.checked_rows(Sq, ROWS).to("cuda")
    deq = [x.dequantize(torch.float64) for x in quantized]
    ref = emulate.reference(*deq, causal, rows=rows)
    emulated = emulate.forward(*quantized, causal, rows=rows, block_n=op.key_tile(D, defines, causal),
                               s_accumulator=S_ACCUMULATOR)
    yardstick = emulate.errors(emulated, ref)
    out = torch.full((B, Hq, Sq, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, Hq, Sq), float("nan"), dtype=torch.float32, device="cuda")
    op.run(*data, *_descales(quantized, Hq, Hkv, form), is_causal=causal, enable_gqa=Hq != Hkv, return_lse=True,
           defines=defines, out=out, lse=lse)
    torch.cuda.synchronize()
    error = emulate.errors(out[:, :, rows].float(), ref)
    lse_ref = _lse_reference(deq[0], deq[1], causal, rows)
    lse_error = float((lse[:, :, rows].double() - lse_ref).abs().max())
    lse_model = float((_lse_model(quantized, causal, rows, S_ACCUMULATOR) - lse_ref).abs().max())
    row = {"kind": "fp8-check", "impl": "lab.ops.attention_fp8", "check": name, "shape": [B, Hq, Hkv, Sq, Sk, D],
           "causal": causal, "seed": seed, "granularity": granularity, "outliers": outliers, "descale_form": form,
           "layout": layout, "v_mean": v_mean, "defines": defines or {}, "error": error, "emulation": yardstick,
           "s_accumulator": S_ACCUMULATOR,
           "nan_out": int(out.isnan().sum()), "nan_lse": int(lse.isnan().sum()), "lse_max_abs": lse_error,
           "lse_emulation_max_abs": lse_model,
           "reference": "float64 on the dequantised inputs", "rows_checked": len(rows)}
    why = peer.unavailable() if use_peer else "not asked"
    if why is None and granularity == "tensor":
        try:
            row["cudnn_fp8"] = emulate.errors(peer.sdpa_fp8(*quantized, causal)[:, :, rows], ref)
        except Exception as err:  # noqa: BLE001 (a shape the frontend declines is recorded, not fatal)
            row["cudnn_fp8_unavailable"] = bench.why(err)
    else:
        row["cudnn_fp8_unavailable"] = why or "per-head descales (sdpa_fp8 takes one per tensor)"
    rule = emulate.passes(error, yardstick) and row["nan_out"] == row["nan_lse"] == 0 and \
        lse_error <= emulate.MULTIPLIER * lse_model + LSE_TOLERANCE
    if "cudnn_fp8" in row:
        rule = rule and error["rel_l2"] <= row["cudnn_fp8"]["rel_l2"]
    row["pass"] = bool(rule)
    return record.append(row)


# (D, H, S, mu, causal): V = randn + mu, B 1; the keys at which an unpromoted P V's running sums lose their increments.
V_MEAN_CELLS = ((128, 4, 4096, 0.0, False), (128, 4, 4096, 1.0, False), (128, 4, 16384, 1.0, False),
                (128, 4, 16384, 1.0, True), (64, 8, 16384, 1.0, False), (256, 2, 16384, 1.0, False))
UNPROMOTED = {"LAB_FWD_FP8_PV_PROMOTE": 0, "LAB_FWD_FP8_PV_PROMOTE_D256": 0}  # P V accumulated across the key tiles


def v_mean_sweep(cells=V_MEAN_CELLS, rows_checked: int = 256) -> list[dict]:
    """O's relative L2 against float64 (dequantised inputs) with V of mean mu: the lab's FP8 forward (P V promoted to
    float32 per key tile), the same kernel unpromoted, cuDNN FP8 (when the peer is installed) and the float32
    emulation; one record (kind "fp8-vmean") per cell."""
    out = []
    for D, H, S, mu, causal in cells:
        qq = _draw(1, H, H, S, S, D, S + D + int(10 * mu), v_mean=mu)
        rows = race.checked_rows(S, rows_checked).to("cuda")
        ref = emulate.reference(*(t.dequantize(torch.float64) for t in qq), causal, rows=rows)
        args = [t.data for t in qq] + _descales(qq, H, H, "scalar")
        err = {name: emulate.errors(op.run(*args, is_causal=causal, defines=d)[:, :, rows].float(), ref)["rel_l2"]
               for name, d in (("lab-fp8", None), ("lab-fp8 unpromoted", UNPROMOTED))}
        if peer.unavailable() is None:
            err["cudnn-fp8"] = emulate.errors(peer.sdpa_fp8(*qq, is_causal=causal)[:, :, rows], ref)["rel_l2"]
        err["emulation"] = emulate.errors(emulate.forward(*qq, causal, rows=rows, block_n=op.key_tile(D, None, causal)),
                                          ref)["rel_l2"]
        out.append(record.append({"kind": "fp8-vmean", "impl": "lab.ops.attention_fp8", "shape": [1, H, S, D],
                                  "v_mean": mu, "causal": causal, "rel_l2": err, "rows_checked": len(rows),
                                  "reference": "float64 on the dequantised inputs"}))
    return out


def _lse_model(quantized, causal: bool, rows, model: str) -> torch.Tensor:
    """LSE (float64, natural log) of the scores as emulate's `model` accumulator sums them."""
    qq, kq, _ = quantized
    Hq, D, Sk = qq.data.shape[1], qq.data.shape[3], kq.data.shape[2]
    q8, k8 = qq.data[:, :, rows].float(), emulate._expand(kq.data.float(), Hq)
    c = qq.descale.double()[..., None, None] * emulate._expand(kq.descale.double()[..., None, None], Hq) / math.sqrt(D)
    parts = []
    for j0 in range(0, Sk, 128):
        s = emulate._scores(q8, k8[:, :, j0:j0 + 128], model).double() * c
        if causal:
            s = s.masked_fill(torch.arange(j0, min(j0 + 128, Sk), device=s.device)[None, :] > rows[:, None],
                              float("-inf"))
        parts.append(s)
    return torch.logsumexp(torch.cat(parts, dim=-1), dim=-1)


def accumulator_models(name: str, seed: int = 0) -> dict:
    """Which S accumulator model predicts the kernel on a VARIANTS entry: O's and LSE's error of the kernel and
    of emulate.forward under every model of emulate.S_ACCUMULATORS, against float64 on the dequantised inputs."""
    _, cell, options = next(v for v in VARIANTS if v[0] == name)
    _, B, Hq, Hkv, Sq, Sk, D, causal = _cell(cell)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((B, H, S, D), generator=gen, device="cuda") for H, S in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    if options.get("outliers"):
        q, k = emulate.with_outliers(q, options["outliers"]), emulate.with_outliers(k, options["outliers"])
    quantized = [quant.quantize(x, "e4m3", options.get("granularity", "tensor")) for x in (q, k, v)]
    rows = race.checked_rows(Sq, ROWS).to("cuda")
    deq = [x.dequantize(torch.float64) for x in quantized]
    ref, lse_ref = emulate.reference(*deq, causal, rows=rows), _lse_reference(deq[0], deq[1], causal, rows)
    out, lse = op.run(*[x.data for x in quantized], *_descales(quantized, Hq, Hkv, "fa3"), is_causal=causal,
                      enable_gqa=Hq != Hkv, return_lse=True)
    row = {"kind": "fp8-check", "impl": "lab.ops.attention_fp8", "check": f"accumulator-models {name}",
           "kernel": {**emulate.errors(out[:, :, rows].float(), ref),
                      "lse_max_abs": float((lse[:, :, rows].double() - lse_ref).abs().max())}}
    for model in emulate.S_ACCUMULATORS:
        emulated = emulate.forward(*quantized, causal, rows=rows, block_n=op.KEY_TILE[D], s_accumulator=model)
        row[model] = {**emulate.errors(emulated, ref),
                      "lse_max_abs": float((_lse_model(quantized, causal, rows, model) - lse_ref).abs().max())}
    return record.append(row)


def run_all(seed: int = 0, defines=None, use_peer: bool = True) -> list[dict]:
    """Every cell and variant, on the default build or the one `defines` makes (a candidate)."""
    rows = [check(*cell, seed=seed + i, defines=defines, use_peer=use_peer) for i, cell in enumerate(CELLS)]
    for i, (name, cell, options) in enumerate(VARIANTS):
        rows.append(check(name, *_cell(cell)[1:], seed=seed + 100 + i, defines=defines, use_peer=use_peer, **options))
    return rows


def wrong_build(seed: int = 7) -> dict:
    """The build without v_descale (LAB_FP8_BUG_NO_V_DESCALE) on one cell: its check must fail."""
    return check("wrong-build-no-v-descale", *_cell("d128-s1000-gqa4")[1:], seed=seed,
                 defines={"LAB_FP8_BUG_NO_V_DESCALE": 1}, use_peer=False)


def vt_pass_share(cell="d128-s4097-c", seed: int = 0) -> dict:
    """The V^T pass's time against the whole call's (both through lab.fp8.op, timed in rounds); `cell`: a name of
    CELLS or its tuple (name, B, H_q, H_kv, S_q, S_k, D, causal)."""
    _, B, Hq, Hkv, Sq, Sk, D, causal = _cell(cell) if isinstance(cell, str) else cell
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (quant.quantize(torch.randn((B, H, S, D), generator=gen, device="cuda")).data
               for H, S in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    calls = {"vt_pass": (lambda: op.run(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv, symbol="attn_fp8_vt_v13"), None),
             "attention_fp8": (lambda: op.attention_fp8(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv), None)}
    timed = bench.time_interleaved(calls, timer=bench.GpuTimeTimer())
    row = {"kind": "fp8-check", "impl": "lab.ops.attention_fp8", "check": "vt_pass", "cell": cell,
           **{name: t.as_dict() for name, t in timed.items() if isinstance(t, bench.Timing)}}
    if all(isinstance(t, bench.Timing) for t in timed.values()):
        row["share"] = timed["vt_pass"].median_ms / timed["attention_fp8"].median_ms
    return record.append(row)


def _line(row: dict) -> str:
    e, y = row["error"], row["emulation"]
    peer_l2 = row.get("cudnn_fp8", {}).get("rel_l2", float("nan"))
    return (f"{'PASS' if row['pass'] else 'FAIL'} {row['check']:28s} rel_l2 {e['rel_l2']:.3e} (emul {y['rel_l2']:.3e}, "
            f"cudnn {peer_l2:.3e}) max_abs {e['max_abs']:.3e} (emul {y['max_abs']:.3e}) lse {row['lse_max_abs']:.1e} "
            f"(emul {row['lse_emulation_max_abs']:.1e}) "
            f"nan {row['nan_out']}/{row['nan_lse']}")


def main(argv=None) -> int:
    """python -m lab.fp8.checks [NAME=VALUE ...]: every check on the default build, or on the build those
    defines make (a candidate), then the wrong build and the V^T pass's share."""
    defines = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv)) or None
    rows = run_all(defines=defines)
    for row in rows:
        print(_line(row), flush=True)
    wrong = wrong_build()
    print("wrong build (no v_descale):", "fails as it must" if not wrong["pass"] else "PASSES: the checks are blind",
          "|", _line(wrong))
    share = vt_pass_share()
    print("V^T pass share of the call:", {k: share.get(k) for k in ("share",)},
          {n: round(share[n]["median_ms"], 4) for n in ("vt_pass", "attention_fp8") if n in share})
    failed = [r["check"] for r in rows if not r["pass"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} checks pass" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed or wrong["pass"] else 0


if __name__ == "__main__":
    sys.exit(main())
