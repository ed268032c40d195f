"""The backward race: training through the FP8 forward against the lab's bf16 attention and cuDNN's FP8 backward.

One process, interleaved rounds (lab.bench.time_interleaved: each round times every call once, L2 flushed
before each, cold), the public calls as a user makes them:

* ``lab-fp8-kernel``: torch.autograd.grad through lab.fp8.backward.attention_fp8_train(..., backward="fp8"): the
  FP8 backward kernel, bwd v22 (dO's quantise, the pre-passes and the kernel; D 64 and 128);
* ``lab-fp8-train``: the same call with backward="bf16" (dequantise-then-bf16: three dequantising passes and the
  bf16 backward kernel; NOT an FP8 backward);
* ``lab-bf16``: torch.autograd.grad through lab.ops.attention on bf16 inputs (bwd v14 on the H200), the ratio every
  lab row carries (speed_vs_lab-bf16);
* ``cudnn-fp8``: cuDNN's sdpa_fp8_backward graph execute (lab.fp8.peer_bwd), where the frontend builds it;
* ``sdpa-cudnn-bf16``: torch SDPA's cuDNN backend, bf16 (what FP8 buys cuDNN itself);
* ``lab-fp8-kernel fwd+bwd``, ``lab-fp8-train fwd+bwd`` and ``lab-bf16 fwd+bwd``: the forward and backward of one
  training step;
* ``dequantise q, k, v``: the dequantising passes of lab-fp8-train's backward alone (kernels/bwd/fp8_cast.cu;
  "(torch)": torch's three passes a tensor it replaced), ``quantise q, k, v`` (the forward's, likewise) and
  ``quantise dO`` (lab-fp8-kernel's, per tensor), diagnostics.

TFLOP/s of a backward count 2.5 x the forward's 4 B H S_q S_k D (halved for causal), the five GEMMs.
Records: kind "fp8-bwd-race", one per (impl, case). `accuracy()` adds cuDNN FP8's gradient error against
float64 beside both of our paths on one small cell.
"""
from __future__ import annotations

import sys

import torch

from .. import bench, record
from ..check import reference_grads
from . import emulate_bwd, kernel_bwd, peer, peer_bwd, quant
from .backward import attention_fp8_train
from .casts import dequantize_bf16, dequantize_bf16_torch, quantize_e4m3

PATHS = {"lab-fp8-kernel": "FP8 backward kernel (bwd v22)",
         "lab-fp8-train": "dequantise-then-bf16 backward (bwd v14 on bf16 copies)"}
# a row -> the row its speed_vs_ ratio is taken against (partner's median / its own: above 1 is faster)
PARTNERS = {"lab-fp8-kernel": ("lab-bf16", "lab-fp8-train", "cudnn-fp8"), "lab-fp8-train": ("lab-bf16", "cudnn-fp8"),
            "lab-fp8-kernel fwd+bwd": ("lab-bf16 fwd+bwd", "lab-fp8-train fwd+bwd"),
            "lab-fp8-train fwd+bwd": ("lab-bf16 fwd+bwd",), "cudnn-fp8": ("sdpa-cudnn-bf16",),
            "lab-bf16": ("sdpa-cudnn-bf16",)}

# (name, B, H, S, D, causal)
CASES = (
    ("d128-s4096", 2, 16, 4096, 128, False),
    ("d128-s4096-c", 2, 16, 4096, 128, True),
    ("d128-s8192", 1, 16, 8192, 128, False),
    ("d128-s8192-c", 1, 16, 8192, 128, True),
    ("d64-s4096", 2, 16, 4096, 64, False),
    ("d64-s4096-c", 2, 16, 4096, 64, True),
)
# chapter n15's cells: the kernel's head dims, H 16 and 16k tokens (B S = 16384, where CASES hold 8k)
CHAPTER_CASES = (
    ("d128-b4-s4096", 4, 16, 4096, 128, False),
    ("d128-b2-s8192", 2, 16, 8192, 128, False),
    ("d128-b2-s8192-c", 2, 16, 8192, 128, True),
    ("d128-b1-s16384", 1, 16, 16384, 128, False),
    ("d64-b4-s4096", 4, 16, 4096, 64, False),
    ("d64-b2-s8192-c", 2, 16, 8192, 64, True),
)


def _inputs(B, H, S, D, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, d_o = (torch.randn((B, H, S, D), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(4))
    return [x.requires_grad_() for x in (q, k, v)], d_o


def _grad_call(forward, leaves, grad_out):
    out = forward(*leaves)
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)


def _step_call(forward, leaves, grad_out):
    return lambda: torch.autograd.grad(forward(*leaves), leaves, grad_out)


def race_case(name, B, H, S, D, causal, seed: int = 0, budget_s: float = 0.3) -> list[dict]:
    import lab.ops as ops
    leaves, grad_out = _inputs(B, H, S, D, seed)
    kernel = lambda q, k, v: attention_fp8_train(q, k, v, is_causal=causal, backward="fp8")  # noqa: E731
    fp8 = lambda q, k, v: attention_fp8_train(q, k, v, is_causal=causal, backward="bf16")  # noqa: E731
    bf16 = lambda q, k, v: ops.attention(q, k, v, is_causal=causal)  # noqa: E731
    no_kernel = kernel_bwd.unavailable(D, torch.cuda.get_device_capability(),
                                       torch.are_deterministic_algorithms_enabled())
    calls = {} if no_kernel else {"lab-fp8-kernel": (_grad_call(kernel, leaves, grad_out), None)}
    calls.update({"lab-fp8-train": (_grad_call(fp8, leaves, grad_out), None),
                  "lab-bf16": (_grad_call(bf16, leaves, grad_out), None)})
    try:  # cuDNN's own bf16 backward: what FP8 buys cuDNN (its FP8 row / this one)
        sdpa = bench.sdpa_runner("cudnn", *leaves, is_causal=causal)
        calls["sdpa-cudnn-bf16"] = (_grad_call(lambda q, k, v: sdpa(), leaves, grad_out), None)
    except Exception as err:  # noqa: BLE001 (a backend that refuses the shape is a row)
        print("sdpa-cudnn-bf16 unsupported:", bench.why(err), flush=True)
    why = peer.unavailable()
    cudnn = None
    if why is None:
        try:
            quantized = [quant.quantize(x.detach(), "e4m3", "tensor") for x in leaves]
            cudnn = peer_bwd.FP8Backward(*quantized, grad_out, causal)
            calls["cudnn-fp8"] = (cudnn.call, None)
        except Exception as err:  # noqa: BLE001 (a graph the frontend declines is a row, not a crash)
            why = f"unsupported: {bench.why(err)}"
    saved = [quant.quantize(x.detach(), "e4m3", "tensor") for x in leaves]
    calls["dequantise q, k, v"] = (lambda: [dequantize_bf16(x.data, x.descale) for x in saved], None)
    calls["dequantise q, k, v (torch)"] = (lambda: [dequantize_bf16_torch(x.data, x.descale) for x in saved], None)
    calls["quantise q, k, v"] = (lambda: [quantize_e4m3(x.detach(), "tensor") for x in leaves], None)
    calls["quantise q, k, v (torch)"] = (lambda: [quant.quantize(x.detach(), "e4m3") for x in leaves], None)
    if not no_kernel:
        calls["quantise dO"] = (lambda: quantize_e4m3(grad_out, "tensor"), None)
        calls["lab-fp8-kernel fwd+bwd"] = (_step_call(kernel, leaves, grad_out), None)
    calls["lab-fp8-train fwd+bwd"] = (_step_call(fp8, leaves, grad_out), None)
    calls["lab-bf16 fwd+bwd"] = (_step_call(bf16, leaves, grad_out), None)
    timed = bench.time_interleaved(calls, bench.CudaTimer(), budget_s=budget_s, max_reps=40)
    if cudnn is not None:
        cudnn.close()
    rows = [record.append(row) for row in rows_of(timed, name, B, H, S, D, causal)]
    if "cudnn-fp8" not in timed:
        rows.append(record.append({"kind": "fp8-bwd-race", "impl": "cudnn-fp8", "case": name, "unsupported": why}))
    if no_kernel:
        rows.append(record.append({"kind": "fp8-bwd-race", "impl": "lab-fp8-kernel", "case": name,
                                   "path": PATHS["lab-fp8-kernel"], "unsupported": no_kernel}))
    return rows


def rows_of(timed: dict, name, B, H, S, D, causal) -> list[dict]:
    """The race's rows from time_interleaved's {impl: Timing or why}: TFLOP/s, the speed_vs_ ratios of PARTNERS, and
    each cast's share of the call that makes it (quantise dO: the kernel path's; the others: lab-fp8-train's)."""
    flops = 2.5 * bench.attention_flops(B, H, S, S, D, causal)
    rows = []
    for impl, t in timed.items():
        row = {"kind": "fp8-bwd-race", "impl": impl, "case": name, "shape": [B, H, S, D], "causal": causal,
               "path": PATHS.get(impl.split(" ")[0], impl), "timer": "cold (L2 flushed)"}
        if isinstance(t, bench.Timing):
            row["timing"] = t.as_dict()
            if impl.startswith(("dequantise", "quantise")):
                whole = "lab-fp8-kernel" if impl == "quantise dO" else "lab-fp8-train"
                if isinstance(timed.get(whole), bench.Timing):
                    row["share_of_" + whole] = t.median_ms / timed[whole].median_ms
            else:  # a training step: 3.5 x the forward's FLOPs, the backward's 2.5 and the forward's 1
                row["tflops"] = flops * (1.4 if "fwd+bwd" in impl else 1.0) / t.median_ms / 1e9
            for partner in PARTNERS.get(impl, ()):
                if isinstance(timed.get(partner), bench.Timing):
                    row["speed_vs_" + partner] = timed[partner].median_ms / t.median_ms
        else:
            row["unsupported"] = t
        rows.append(row)
    return rows


def accuracy(B=1, H=4, S=1024, D=128, causal=True, seed: int = 3) -> dict:
    """cuDNN FP8's and our two paths' gradient error against float64 on the dequantised inputs (per-tensor
    scales): lab-fp8-kernel (backward="fp8", where it runs) and lab-fp8-train (backward="bf16")."""
    leaves, grad_out = _inputs(B, H, S, D, seed)
    quantized = [quant.quantize(x.detach(), "e4m3", "tensor") for x in leaves]
    deq = [x.dequantize(torch.float64) for x in quantized]
    _, *ref = reference_grads(*deq, grad_out, causal)
    row = {"kind": "fp8-bwd-accuracy", "shape": [B, H, S, D], "causal": causal,
           "bf16_eager": emulate_bwd.errors([g.float() for g in emulate_bwd.eager(*deq, grad_out, causal)], ref)}
    for impl, choice in (("lab-fp8-kernel", "fp8"), ("lab-fp8-train", "bf16")):
        try:
            ours = torch.autograd.grad(attention_fp8_train(*leaves, is_causal=causal, backward=choice), leaves,
                                       grad_out)
            row[impl] = emulate_bwd.errors([g.float() for g in ours], ref)
        except NotImplementedError as err:  # the kernel's head dims and mode: a row saying so
            row[impl + "_unavailable"] = str(err)
    why = peer.unavailable()
    if why is None:
        try:
            cudnn = peer_bwd.FP8Backward(*quantized, grad_out, causal)
            row["cudnn-fp8"] = emulate_bwd.errors(cudnn.grads(), ref)
            cudnn.close()
        except Exception as err:  # noqa: BLE001
            why = f"unsupported: {bench.why(err)}"
    if why:
        row["cudnn-fp8_unavailable"] = why
    return record.append(row)


def line(row: dict) -> str:
    if "timing" not in row:
        return f"{row['case']:<14} {row['impl']:<24} {row.get('unsupported')}"
    ratio = " ".join(f"{k}={v:.3f}" for k, v in row.items() if k.startswith(("speed_vs_", "share_of_")))
    t = row["timing"]
    rate = f"{row['tflops']:.0f} TFLOP/s " if "tflops" in row else ""
    return (f"{row['case']:<14} {row['impl']:<24} {t['median_ms']:.3f} ms (IQR {t['iqr_ms']:.3f}, n {t['n']}) "
            f"{rate}{ratio}")


def main(argv=None) -> int:
    for case in CASES:
        for row in race_case(*case):
            print(line(row), flush=True)
    acc = accuracy()
    print({k: ({g: round(e["rel_l2"], 5) for g, e in v.items()} if isinstance(v, dict) and "dq" in v else v)
           for k, v in acc.items() if k not in ("env",)}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
