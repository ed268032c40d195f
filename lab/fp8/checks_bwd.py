"""GPU checks of training through the FP8 forward (lab.fp8.backward.attention_fp8_train), one record per check
(kind "fp8-bwd-check", its "backward" field naming the backward that ran: "fp8", the kernel bwd v22, or "bf16",
dequantise-then-bf16).

Each check draws fresh seeded randn Q, K, V (bf16, the user's tensors) and dO, runs the call and its backward
through torch.autograd.grad (the gradients' memory NaN-poisoned first: an unwritten element fails), and compares
dQ, dK, dV with float64 autograd on the DEQUANTISED inputs (x_fp8 * descale, what the forward was given). Beside
it, on the same dequantised inputs, the errors of

* ``bf16_eager``: the same math eagerly in bf16 (SDPA's math backend as autograd runs it), the yardstick of a
  16-bit backward;
* ``lab_bf16``: lab.ops.attention's own bf16 forward and backward;
* ``model``: the emulation of the path that ran, on the FP8 forward's actual O and LSE, the rule's yardstick: for
  the kernel lab.fp8.emulate_bwd.kernel_model (its e4m3 dO, P and dS with their scales), for dequantise-then-bf16
  lab.fp8.emulate_bwd.backward with P, dS, dO as bf16;
* ``dequantise_bf16`` (kernel cells): the same call with backward="bf16".

Pass: no NaN or inf in any gradient, and each gradient's relative L2 and max abs at most
emulate.MULTIPLIER x the model's (plus a floor far below bf16's rounding, `passes`). `wrong_build()` runs the call
with K's descale dropped in the backward, `wrong_build(backward="fp8")` the kernel built without dK's row
multiplier (LAB_BWD_FP8_WRONG): both must fail. Cells, dequantise-then-bf16: S 1, 65, 300, 1000, 4097, S_q != S_k,
causal and not, GQA, D 64 and 128, per-tensor and per-head descales, fp16 inputs, deterministic mode. The kernel
(KERNEL_CELLS, D 128 and 64): S 1, 65, 300, 1000, 4097, S_q != S_k both ways, causal and not, GQA 4, per-head
descales, fp16 inputs (D 128), and V and dO of mean 1 at S 4097 (a long positive sum in dV's accumulator).
Run: python -m lab.fp8.checks_bwd  (exit status 1 on any failure).
"""
from __future__ import annotations

import contextlib
import sys

import torch

from .. import record
from ..check import _poison_allocator, reference_grads
from . import backward as fp8_backward
from . import emulate, emulate_bwd, quant
from .backward import attention_fp8_train
from .casts import dequantize_bf16, dequantize_bf16_torch, quantize_e4m3

FLOOR = 1e-4  # below bf16's own rounding (2^-9 = 2e-3): a floor, not a tolerance
# (name, B, H_q, H_kv, S_q, S_k, D, causal, granularity)
CELLS = (
    ("d128-s1", 1, 2, 2, 1, 1, 128, False, "tensor"),
    ("d128-s65-c", 2, 4, 4, 65, 65, 128, True, "tensor"),
    ("d128-s300-gqa4", 1, 8, 2, 300, 300, 128, False, "tensor"),
    ("d128-s1000-c-head", 1, 4, 4, 1000, 1000, 128, True, "head"),
    ("d128-sq65-sk1000", 1, 4, 4, 65, 1000, 128, False, "tensor"),
    ("d128-s4097-c", 1, 4, 4, 4097, 4097, 128, True, "tensor"),
    ("d64-s1-c", 1, 2, 2, 1, 1, 64, True, "tensor"),
    ("d64-s65", 2, 4, 4, 65, 65, 64, False, "tensor"),
    ("d64-s1000-gqa2-c", 1, 4, 2, 1000, 1000, 64, True, "tensor"),
    ("d64-s4097", 1, 2, 2, 4097, 4097, 64, False, "tensor"),
)
# The FP8 backward kernel's cells (backward="fp8"): as CELLS, then the check's options
KERNEL_CELLS = (
    ("fp8-s1", 1, 2, 2, 1, 1, 128, False, "tensor", {}),
    ("fp8-s65-c", 2, 4, 4, 65, 65, 128, True, "tensor", {}),
    ("fp8-s300-gqa4", 1, 8, 2, 300, 300, 128, False, "tensor", {}),
    ("fp8-s300-gqa4-c-head", 1, 8, 2, 300, 300, 128, True, "head", {}),
    ("fp8-s1000-c-head", 1, 4, 4, 1000, 1000, 128, True, "head", {}),
    ("fp8-sq65-sk1000", 1, 4, 4, 65, 1000, 128, False, "tensor", {}),
    ("fp8-sq1000-sk65-c", 1, 4, 4, 1000, 65, 128, True, "tensor", {}),
    ("fp8-s1000-fp16-inputs", 1, 4, 2, 1000, 1000, 128, True, "tensor", {"dtype": torch.float16}),
    ("fp8-s4097-c", 1, 4, 4, 4097, 4097, 128, True, "tensor", {}),
    ("fp8-s4097-mean1", 1, 4, 4, 4097, 4097, 128, False, "tensor", {"mean": 1.0}),
    ("fp8-d64-s1-c", 1, 2, 2, 1, 1, 64, True, "tensor", {}),
    ("fp8-d64-s65", 2, 4, 4, 65, 65, 64, False, "tensor", {}),
    ("fp8-d64-s300-gqa4-c-head", 1, 8, 2, 300, 300, 64, True, "head", {}),
    ("fp8-d64-sq1000-sk65-c", 1, 4, 4, 1000, 65, 64, True, "tensor", {}),
    ("fp8-d64-sq65-sk1000", 1, 4, 4, 65, 1000, 64, False, "tensor", {}),
    ("fp8-d64-s4097-c", 1, 4, 4, 4097, 4097, 64, True, "tensor", {}),
    ("fp8-d64-s4097-mean1", 1, 4, 4, 4097, 4097, 64, False, "tensor", {"mean": 1.0}),
)
WRONG_FP8 = "wrong-fp8-bwd-no-dk-multiplier"  # wrong_build(backward="fp8")'s check name


def check(name, B, Hq, Hkv, Sq, Sk, D, causal, granularity="tensor", seed: int = 0, bug=None,
          device="cuda", dtype=torch.bfloat16, deterministic_mode: bool = False, lab_bf16: bool = True,
          backward: str = "bf16", mean: float = 0.0) -> dict:
    """One check (module notes) of attention_fp8_train(..., backward=backward); appends and returns its record. V
    and dO are drawn as randn + mean. (device: the CPU runs it only with the kernels replaced, as
    tests/fp8/test_fp8_checks_bwd.py does.)"""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn((B, H, S, D), generator=gen, device=device) for H, S in ((Hq, Sq), (Hkv, Sk), (Hkv, Sk)))
    q, k, v = q.to(dtype), k.to(dtype), (v + mean).to(dtype)
    grad_out = (torch.randn((B, Hq, Sq, D), generator=gen, device=device) + mean).to(torch.bfloat16)
    quantized = [quant.quantize(x, "e4m3", granularity) for x in (q, k, v)]
    deq = [x.dequantize(torch.float64) for x in quantized]
    _, *ref = reference_grads(*deq, grad_out, causal)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    ran = fp8_backward.backward_path(D, "fp8" if bug == "fp8_bwd_wrong" else backward,
                                     fp8_backward._capability_check(q.device),
                                     deterministic_mode or torch.are_deterministic_algorithms_enabled())
    _poison_allocator(q, k, v)
    kw = dict(is_causal=causal, enable_gqa=Hq != Hkv, granularity=granularity)
    with _deterministic(deterministic_mode):  # our call alone: the references' cuBLAS calls stay outside
        out, lse = attention_fp8_train(*leaves, **kw, return_lse=True, backward=backward, _bug=bug)
        grads = torch.autograd.grad(out, leaves, grad_out)
    if q.is_cuda:
        torch.cuda.synchronize()
    error = emulate_bwd.errors([g.float() for g in grads], ref)
    if ran == "fp8":
        modelled = emulate_bwd.kernel_model(*(x.data for x in quantized), *(x.descale for x in quantized),
                                            out.detach(), lse, grad_out, causal)
    else:
        as_run = [dequantize_bf16(x.data, x.descale).float() for x in quantized]  # what the bf16 backward reads
        modelled = emulate_bwd.backward(*as_run, out.detach(), lse, grad_out.float(), causal, do_format="bf16",
                                        p_format="bf16", ds_format="bf16")
    model = emulate_bwd.errors([g.to(torch.bfloat16).float() for g in modelled], ref)  # stored as bf16, as dq, dk, dv
    eager = emulate_bwd.errors([g.float() for g in emulate_bwd.eager(*deq, grad_out, causal)], ref)
    path = "FP8 backward kernel (bwd v22)" if ran == "fp8" else "dequantise-then-bf16 backward"
    row = {"kind": "fp8-bwd-check", "impl": "lab.fp8.backward.attention_fp8_train", "backward": ran,
           "backward_arg": backward, "path": f"fp8 forward (fwd v13) + {path}", "check": name,
           "shape": [B, Hq, Hkv, Sq, Sk, D], "causal": causal, "granularity": granularity, "seed": seed,
           "dtype": str(dtype), "mean": mean, "bug": bug, "error": error, "model": model,
           "model_kind": "emulate_bwd.kernel_model" if ran == "fp8" else "emulate_bwd.backward (bf16 operands)",
           "bf16_eager": eager, "reference": "float64 autograd on the dequantised inputs"}
    if ran == "fp8":  # the other path on the same inputs, beside it
        other = torch.autograd.grad(attention_fp8_train(*leaves, **kw, backward="bf16"), leaves, grad_out)
        row["dequantise_bf16"] = emulate_bwd.errors([g.float() for g in other], ref)
    try:
        if not lab_bf16:
            raise RuntimeError("not asked")
        import lab.ops as ops
        lab_leaves = [x.to(torch.bfloat16).requires_grad_() for x in deq]
        lab_out = ops.attention(*lab_leaves, is_causal=causal, enable_gqa=Hq != Hkv)
        row["lab_bf16"] = emulate_bwd.errors([g.float() for g in torch.autograd.grad(lab_out, lab_leaves,
                                                                                       grad_out)], ref)
    except Exception as err:  # noqa: BLE001 (a shape lab.ops refuses is recorded beside, not fatal)
        row["lab_bf16_unavailable"] = f"{type(err).__name__}: {err}"
    row["grad_dtypes"] = [str(g.dtype) for g in grads]
    ok = all(e["nan"] == 0 and e["inf"] == 0 for e in error.values()) and all(g.dtype == dtype for g in grads)
    ref_max = max(float(r.abs().max()) for r in ref)  # dQ, dK are 0 at S_k = 1: the floor takes dV's scale
    ok = ok and all(passes(error[g], model[g], ref_max) for g in error)
    row["pass"] = bool(ok)
    return record.append(row)


def kernel_check(cell, seed: int = 0, **options) -> dict:
    """One of KERNEL_CELLS through the FP8 backward kernel (backward="fp8")."""
    return check(*cell[:9], seed=seed, backward="fp8", **{**cell[9], **options})


def kernel_rows(seed: int = 0, **options) -> list[dict]:
    """Every KERNEL_CELLS check, then wrong_build(backward="fp8"): the FP8 backward kernel's rows as chapter n15
    records them. A check that raises is a recorded row too, naming the error: "pass" False for a kernel cell; for
    the wrong build None, no verdict (it did not fail the check, so it cannot count as failing it)."""
    runs = [(cell[0], None, lambda cell=cell: kernel_check(cell, seed=seed, **options)) for cell in KERNEL_CELLS]
    runs.append((WRONG_FP8, "fp8_bwd_wrong", lambda: wrong_build(backward="fp8", **options)))
    rows = []
    for name, bug, run in runs:
        try:
            rows.append(run())
        except Exception as err:  # noqa: BLE001 (the other checks still run; the row says what raised)
            rows.append(record.append({"kind": "fp8-bwd-check", "impl": "lab.fp8.backward.attention_fp8_train",
                                       "backward": "fp8", "check": name, "bug": bug, "pass": None if bug else False,
                                       "error_raised": f"{type(err).__name__}: {err}"}))
    return rows


def passes(error: dict, model: dict, ref_max: float) -> bool:
    """emulate.MULTIPLIER x the model's relative L2 and max abs, plus a floor of FLOOR (relative L2) and FLOOR x
    the largest element of the three reference gradients (max abs): where the model's error is ~0 (S_k = 1:
    dS = 0 exactly, so dQ = dK = 0), float32 sums in another order must not fail."""
    return (error["nan"] == 0 and error["inf"] == 0
            and error["rel_l2"] <= emulate.MULTIPLIER * model["rel_l2"] + FLOOR
            and error["max_abs"] <= emulate.MULTIPLIER * model["max_abs"] + FLOOR * max(ref_max, 1e-30))


def wrong_build(seed: int = 7, backward: str = "bf16", **options) -> dict:
    """A deliberately wrong backward, which must fail: "bf16", K's descale dropped (dequantised K = its e4m3
    values); "fp8", the kernel built with LAB_BWD_FP8_WRONG (dK without its row multiplier). options: check's."""
    if backward == "fp8":
        return check(WRONG_FP8, 1, 4, 2, 300, 300, 128, True, seed=seed, bug="fp8_bwd_wrong",
                     backward="fp8", **options)
    return check("wrong-no-k-descale", 1, 4, 4, 300, 300, 128, True, seed=seed, bug="no_k_descale", **options)


def casts_bitwise(seed: int = 11) -> dict:
    """kernels/bwd/fp8_cast.cu against lab.fp8.quant.quantize and torch's dequantise, bit for bit: per-tensor and
    per-head descales, S 1, 65, 300, 4097, D 64 / 128, values across e4m3's range (subnormals, saturation at
    +-448 where a head's amax is another head's), an all-zero head (descale 1)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mismatched = []  # [B, H, S, D, granularity, which parts differ]
    for B, H, S, D, granularity in ((1, 2, 1, 64, "tensor"), (2, 3, 65, 128, "head"), (1, 4, 4097, 128, "head"),
                                    (3, 2, 300, 64, "tensor"), (2, 4, 1000, 128, "tensor")):
        x = torch.randn((B, H, S, D), generator=gen, device="cuda") * torch.logspace(-6, 3, D, device="cuda")
        x[0, 0] = 0 if granularity == "head" else x[0, 0]
        x = x.to(torch.bfloat16)
        reference = quant.quantize(x, "e4m3", granularity)
        data, descale = quantize_e4m3(x, granularity)
        parts = {"data": torch.equal(data.view(torch.uint8), reference.data.view(torch.uint8)),
                 "descale": torch.equal(descale, reference.descale),
                 "dequantise": torch.equal(dequantize_bf16(data, descale), dequantize_bf16_torch(data, descale))}
        if not all(parts.values()):
            mismatched.append([B, H, S, D, granularity, sorted(k for k, ok in parts.items() if not ok)])
    return record.append({"kind": "fp8-bwd-check", "check": "casts-bitwise", "mismatched": mismatched,
                          "pass": not mismatched})


@contextlib.contextmanager
def _deterministic(on: bool):
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on or previous)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def deterministic(seed: int = 5) -> dict:
    """Under torch.use_deterministic_algorithms(True) (bwd v18): the check passes, and a second call's gradients
    are bit-identical to the first's."""
    cell = ("deterministic-d128-s1000-c", 1, 4, 4, 1000, 1000, 128, True)
    first = check(*cell, seed=seed, deterministic_mode=True)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    leaves = [torch.randn((1, 4, 1000, 128), generator=gen, device="cuda").to(torch.bfloat16).requires_grad_()
              for _ in range(3)]
    grad_out = torch.randn((1, 4, 1000, 128), generator=gen, device="cuda").to(torch.bfloat16)
    with _deterministic(True):
        runs = [torch.autograd.grad(attention_fp8_train(*leaves, is_causal=True), leaves, grad_out) for _ in range(2)]
    same = all(torch.equal(a, b) for a, b in zip(*runs))
    record.append({"kind": "fp8-bwd-check", "check": "deterministic-bit-identical", "bit_identical": same,
                   "pass": same})
    return dict(first, bit_identical=same, **{"pass": first["pass"] and same})


def run_all(seed: int = 0) -> list[dict]:
    return [check(*cell, seed=seed) for cell in CELLS] + [kernel_check(cell, seed=seed) for cell in KERNEL_CELLS]


def line(row: dict) -> str:
    err = " ".join(f"{g}:{row['error'][g]['rel_l2']:.2e}/{row['model'][g]['rel_l2']:.2e}/"
                   f"{row['bf16_eager'][g]['rel_l2']:.2e}" for g in ("dq", "dk", "dv"))
    beside = ""
    for key in ("dequantise_bf16", "lab_bf16"):
        if row.get(key):
            beside += f" {key} " + "/".join(f"{row[key][g]['rel_l2']:.2e}" for g in ("dq", "dk", "dv"))
    return (f"{'PASS' if row['pass'] else 'FAIL'} {row['check']:<24} [{row.get('backward', 'bf16')}] "
            f"ours/model/bf16eager {err}{beside}")


def _guarded(name: str, run) -> dict:
    """run() printed as a line; an exception is a failed row (the other checks still run)."""
    try:
        row = run()
        print(line(row), flush=True)
    except Exception as err:  # noqa: BLE001
        row = {"check": name, "pass": False, "error_raised": f"{type(err).__name__}: {err}"}
        print("FAIL", name, row["error_raised"], flush=True)
    return row


def main(argv=None) -> int:
    rows = [casts_bitwise()]
    print("PASS" if rows[0]["pass"] else "FAIL", "casts-bitwise", rows[0]["mismatched"], flush=True)
    print("the deliberately wrong builds (must FAIL):", flush=True)  # early: a run cut short still shows them
    wrong = [_guarded(f"wrong build ({b})", lambda b=b: wrong_build(backward=b)) for b in ("bf16", "fp8")]
    rows += [_guarded(cell[0], lambda cell=cell: check(*cell)) for cell in CELLS]
    rows += [_guarded(cell[0], lambda cell=cell: kernel_check(cell)) for cell in KERNEL_CELLS]
    rows.append(_guarded("d128-s300-fp16-inputs", lambda: check("d128-s300-fp16-inputs", 1, 4, 2, 300, 300, 128, True,
                                                                 dtype=torch.float16)))
    rows.append(_guarded("deterministic", deterministic))
    failed = [r["check"] for r in rows if not r["pass"]]
    failed += [f"{r['check']} passed" if r["pass"] else f"{r['check']} raised" for r in wrong
               if r["pass"] or "error_raised" in r]
    print("failures:", failed or "none", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
