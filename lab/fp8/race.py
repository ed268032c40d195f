"""The FP8 race: cuDNN's FP8 forward beside bf16 SDPA-cuDNN on the same cells, timed and checked.

Per cell (B*S = 16k tokens, H*D = 2048, bf16 randn inputs, seeded): the inputs are quantised to e4m3 with one
amax descale per tensor; cuDNN's FP8 forward (lab.fp8.peer) and SDPA forced to cuDNN on the bf16 inputs are
timed in alternating rounds (lab.bench.time_interleaved, L2 flushed, CUDA events, median and IQR). Then the
accuracy, on ROWS_CHECKED query rows spread over the sequence (first and last included), against float64:

* cuDNN FP8 against float64 on the DEQUANTISED inputs (its arithmetic: P's and O's e4m3 rounding), and against
  float64 on the bf16 inputs (the whole FP8 budget, the inputs' quantisation included);
* lab.fp8.emulate's forward of the same e4m3 tensors, O stored as e4m3 with cuDNN's scale_o, against the same
  float64: `emulation_fold` = max(ratio, 1 / ratio) of the two relative L2 errors (the gate: <= 2);
* bf16 SDPA-cuDNN against float64 on its bf16 inputs: a 16-bit kernel's own error, for scale.

One record per row (kind "fp8"): impl "cudnn-fp8" (with `ratios.sdpa-cudnn` = t_bf16 / t_fp8, and
`accuracy_recorded`: false where the cell could not run or gave NaN / inf) and "sdpa-cudnn"; with lab=True
(a GPU of compute capability 9.0) also "lab-fp8": the public lab.ops.attention_fp8 on the same e4m3 tensors and
per-tensor descales, timed in the same rounds, its accuracy on the same rows against the same float64 (its
emulation: emulate.forward with O in bf16, as the kernel writes it), `ratios` = t_other / t_lab for cuDNN FP8
and bf16 SDPA-cuDNN.
"""
from __future__ import annotations

import math
from functools import partial

import torch

from .. import bench, record, sweep
from ..cases import Case
from . import emulate, peer, quant
from .op import key_tile

ROWS_CHECKED = 512


def cases() -> list[Case]:
    """The race cells: D 128 at S 4k / 16k, causal at 8k, D 64 and 256 at 8k, and GQA 16 / 4 at 8k."""
    cell = lambda name, B, H, S, D, causal=False, Hkv=None: Case(  # noqa: E731
        name, B, H, Hkv or H, S, S, D, "bfloat16", causal)
    return [cell("fp8-d128-s4096", 4, 16, 4096, 128), cell("fp8-d128-s16384", 1, 16, 16384, 128),
            cell("fp8-d128-s8192-c", 2, 16, 8192, 128, True), cell("fp8-d64-s8192", 2, 32, 8192, 64),
            cell("fp8-d256-s8192", 2, 8, 8192, 256), cell("fp8-d128-s8192-gqa4", 2, 16, 8192, 128, Hkv=4)]


def checked_rows(seqlen: int, count: int = ROWS_CHECKED) -> torch.Tensor:
    """count query rows spread evenly over [0, seqlen), the first and last among them."""
    return torch.linspace(0, seqlen - 1, min(count, seqlen)).round().long().unique()


def accuracy(q, k, v, quantized, fp8_out, bf16_out, is_causal: bool, rows, descale_o: float) -> dict:
    """The accuracy block of a cudnn-fp8 row (see the module notes); every error on `rows` only."""
    deq = [x.dequantize(torch.float64) for x in quantized]
    on_deq = emulate.reference(*deq, is_causal, rows=rows)
    on_bf16 = emulate.reference(q, k, v, is_causal, rows=rows)
    emulated = emulate.forward(*quantized, is_causal, rows=rows, out_format="e4m3", out_descale=descale_o)
    fp8 = fp8_out[:, :, rows]
    result = {**emulate.errors(fp8, on_deq), "reference": "float64 on the dequantised inputs",
              "rows_checked": len(rows), "vs_bf16_inputs": emulate.errors(fp8, on_bf16),
              "emulation": emulate.errors(emulated, on_deq)}
    ratio = result["rel_l2"] / result["emulation"]["rel_l2"] if result["emulation"]["rel_l2"] else float("inf")
    result["emulation_fold"] = max(ratio, 1.0 / ratio) if ratio else float("inf")
    result["bf16_sdpa_cudnn"] = emulate.errors(bf16_out[:, :, rows], on_bf16) if bf16_out is not None else None
    return result


def _row(impl: str, case: Case, timing, flops: float, extra: dict) -> dict:
    row = {"kind": "fp8", "impl": impl, "case": case.as_dict(), **extra}
    if isinstance(timing, bench.Timing):
        row.update({"timing": timing.as_dict(), "tflops": flops / timing.median_ms / 1e9})
    else:
        row["unsupported"] = timing
    return row


def _timer(name: str):
    """'gpu': GPU time alone (a sleep queued before the window hides the host's launch cost: the frontend's
    Python is not the kernel); 'cold': lab.bench's default cold call, host time included."""
    return {"gpu": bench.GpuTimeTimer, "cold": bench.CudaTimer}[name]()


def _attempt(quantized, causal: bool):
    """The peer built and run once, or why not ("unsupported: ..."): a shape the frontend declines is a row."""
    try:
        fp8 = peer.FP8Attention(*quantized, is_causal=causal)
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 (the frontend's own error types vary)
        return f"unsupported: {bench.why(err)}"
    try:
        fp8.call()
        torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001
        fp8.close()
        return f"unsupported: {bench.why(err)}"
    return fp8


def _lab_call(quantized, causal: bool, defines=None):
    """lab.ops.attention_fp8 on the e4m3 tensors with their one-element descales (with `defines`: the same call
    through lab.fp8.op.run on that build, a candidate), or why it cannot run."""
    from . import op

    args = [x.data for x in quantized] + [x.descale.flatten()[:1].contiguous() for x in quantized]
    call = partial(op.run, *args, is_causal=causal, enable_gqa=True, defines=defines) if defines else \
        partial(op.attention_fp8, *args, is_causal=causal, enable_gqa=True)
    return bench.try_run(call) or call


def _lab_row(impl, case, quantized, call, timed, flops, causal, rows, extra, defines=None,
             cudnn_rel_l2: float | None = None) -> dict:
    """cudnn_rel_l2: cuDNN FP8's relative L2 on the same rows and reference; the row's accuracy then carries
    vs_cudnn_fp8 = ours / cuDNN's (<= 1: ours is at most cuDNN FP8's error, chapter n15's gate)."""
    deq = [x.dequantize(torch.float64) for x in quantized]
    on_deq = emulate.reference(*deq, causal, rows=rows)
    emulated = emulate.forward(*quantized, causal, rows=rows, block_n=key_tile(case.D, defines, causal))
    out = call()
    torch.cuda.synchronize()
    accuracy_block = {**emulate.errors(out[:, :, rows].float(), on_deq), "reference": "float64 on the dequantised "
                      "inputs", "rows_checked": len(rows), "emulation": emulate.errors(emulated, on_deq)}
    if cudnn_rel_l2 is not None and cudnn_rel_l2 > 0 and math.isfinite(cudnn_rel_l2):
        accuracy_block["vs_cudnn_fp8"] = accuracy_block["rel_l2"] / cudnn_rel_l2
    row = dict(extra, accuracy=accuracy_block)
    if isinstance(timed[impl], bench.Timing):
        row["ratios"] = {name: t.median_ms / timed[impl].median_ms for name, t in timed.items()
                         if name != impl and isinstance(t, bench.Timing)}
    return _row(impl, case, timed[impl], flops, row)


def run_case(case: Case, seed: int, timer: str = "gpu", rows_checked: int = ROWS_CHECKED, lab: bool = False,
             lab_candidates: dict | None = None, **stop) -> list[dict]:
    """Time and check one cell; append and return its records (two; with lab one more for lab-fp8 and one per
    candidate build, {impl: defines})."""
    q, k, v, causal = sweep.case_inputs(case, seed)
    quantized = [quant.quantize(x, "e4m3", "tensor") for x in (q, k, v)]
    flops = bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, causal)
    fp8 = _attempt(quantized, causal)
    bf16 = bench.sdpa_runner("default", q, k, v, causal)
    calls = {"sdpa-cudnn": (bf16, partial(bench.sdpa_backend, "cudnn"))}
    if not isinstance(fp8, str):
        calls["cudnn-fp8"] = (fp8.call, None)
    labs = {impl: _lab_call(quantized, causal, defines)
            for impl, defines in ({"lab-fp8": None, **(lab_candidates or {})} if lab else {}).items()}
    calls.update({impl: (call, None) for impl, call in labs.items() if callable(call)})
    timed = bench.time_interleaved(calls, timer=_timer(timer), **stop)
    for impl, call in labs.items():
        timed.setdefault(impl, call)
    timed.setdefault("cudnn-fp8", fp8)
    bf16_out = None
    if isinstance(timed["sdpa-cudnn"], bench.Timing):
        with bench.sdpa_backend("cudnn"):
            bf16_out = bf16()
    extra = {"timer": timer, "inputs": "bf16 randn; FP8: e4m3, one amax descale per tensor"}
    rows = [record.append(_row("sdpa-cudnn", case, timed["sdpa-cudnn"], flops, extra))]
    fp8_extra = dict(extra)
    if not isinstance(fp8, str):
        fp8.o.view(torch.uint8).fill_(0x7F)  # e4m3's NaN: an element the kernel leaves unwritten fails
        fp8.call()
        torch.cuda.synchronize()
        checked = checked_rows(case.Sq, rows_checked).to(q.device)
        fp8_extra["accuracy"] = accuracy(q, k, v, quantized, fp8.output(), bf16_out, causal, checked, fp8.descale_o)
        fp8_extra.update({"scale_s": peer.SCALE_S, "descale_o": fp8.descale_o})
        if isinstance(timed["cudnn-fp8"], bench.Timing):
            fp8_extra["ratios"] = bench.ratios(timed["cudnn-fp8"], {"cudnn": timed["sdpa-cudnn"]})
        fp8.close()
    block = fp8_extra.get("accuracy") or {}
    fp8_extra["accuracy_recorded"] = bool(block) and block["nan"] == block["inf"] == 0 \
        and math.isfinite(block["rel_l2"])  # the gate: every cell ran and was checked
    rows.append(record.append(_row("cudnn-fp8", case, timed["cudnn-fp8"], flops, fp8_extra)))
    for impl, call in labs.items():
        if callable(call):
            checked = checked_rows(case.Sq, rows_checked).to(q.device)
            row = _lab_row(impl, case, quantized, call, timed, flops, causal, checked, extra,
                           (lab_candidates or {}).get(impl), block.get("rel_l2") if block else None)
            rows.append(record.append(dict(row, defines=(lab_candidates or {}).get(impl) or {})))
        else:
            rows.append(record.append(_row(impl, case, call, flops, dict(extra))))
    del q, k, v, quantized, fp8, bf16_out
    torch.cuda.empty_cache()
    return rows


def race(cells: list[Case] | None = None, timer: str = "gpu", rows_checked: int = ROWS_CHECKED, lab: bool = False,
         lab_candidates: dict | None = None, **stop) -> list[dict]:
    """Every cell (default: cases()); raises the peer's ImportError first if cudnn is missing. lab: race
    lab.ops.attention_fp8 too (compute capability 9.0), and lab_candidates' builds ({impl: defines})."""
    peer.require()
    rows = []
    for seed, case in enumerate(cells or cases()):
        rows += run_case(case, seed, timer, rows_checked, lab, lab_candidates, **stop)
    return rows
