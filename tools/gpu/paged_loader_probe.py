"""What bounds the paged decode under SDPA-cuDNN on the serving cells? Loader variants of decode v03 (paged) and v02
(contiguous), each built with one probe switch, timed beside SDPA-cuDNN on the same data in one process (GPU only).

A row is the GPU time of one call: lab.bench.GpuTimeTimer (L2 flushed, then a GPU sleep that the host's launch hides
behind, so the window holds the kernels alone), in interleaved rounds (lab.bench.time_interleaved: a clock drift reaches
every row alike); the ratio is cuDNN's time over the row's. Every variant is built with LAB_DECODE_ONLY_D128 (the one
head dim the cells use; the D 128 kernels are the same) and runs the public op's split plan unless its name says
otherwise. The switches are described in kernels/common/paged.cuh and common/decode_head_dim.cuh.

    python tools/gpu/paged_loader_probe.py OUT.jsonl      # one JSON line per row, a table on stdout

`host` mode: the contiguous public op's host path at n7's small cells (batch 1 and 8, 4096 and 16384 keys): the cold
call as n7 times it (lab.bench.CudaTimer: L2 flush, then one call between two events) for SDPA-cuDNN, the op (its
one-crossing path after the first call), the op's full path (its plans forgotten before each call), the kernel alone
(lab.ops.decode_call_factory) and a CUDA-graph replay of the op; and lab.hostcost.host_us (GPU idle and busy).

    python tools/gpu/paged_loader_probe.py host OUT.jsonl
"""
from __future__ import annotations

import json
import os
import sys

ONE_DIM = {"LAB_DECODE_ONLY_D128": None}
VARIANTS = {  # name: (version, defines); v03 runs on the pages, v02 on the contiguous cache
    "v03": ("v03", {}),
    "v03 again": ("v03", {}),  # the same kernel timed twice in a round: the spread one run cannot resolve
    "v03 pf0": ("v03", {"LAB_PAGED_PREFETCH": 0}),
    "v03 pf256": ("v03", {"LAB_PAGED_PREFETCH": 256}),
    "v03 evict-first": ("v03", {"LAB_PAGED_EVICT_FIRST": None}),
    "v03 k-then-v": ("v03", {"LAB_PAGED_KV_ORDER": None}),
    "v03 check x32": ("v03", {"LAB_PAGED_CHECK_UNROLL": 32}),
    "v03 no check": ("v03", {"LAB_PAGED_SKIP_CHECK": None}),
    "v03 stages 4": ("v03", {"LAB_DECODE_STAGES_D128": 4}),
    "v03 stages 2": ("v03", {"LAB_DECODE_STAGES_D128": 2}),
    "v02": ("v02", {}),
    "v02 again": ("v02", {}),
    "v02 pf0": ("v02", {"V02_L2_PREFETCH": 0}),
    "v02 stages 4": ("v02", {"LAB_DECODE_STAGES_D128": 4}),
    "v02 stages 2": ("v02", {"LAB_DECODE_STAGES_D128": 2}),
}
CELLS = ((64, 1024), (32, 4096), (8, 16384), (1, 131072))  # the serving cells that missed 0.95x cuDNN (lab.cases.PAGED_CELLS)
PAGES = (16, 64)
EXTRA_SPLITS = {131072: (16, 33)}  # v03 at other split counts: one block per SM, and 264 blocks (two on every SM)


def defines_of(name: str) -> dict:
    return {**VARIANTS[name][1], **ONE_DIM}


def main(out_path: str) -> None:
    import torch

    from lab import bench, build, op_common, ops
    from lab.cases import PagedCase
    from lab.decode import paged
    from lab.decode.op import _decode_plan, _v03_plan
    from paged_rows import write_rows  # tools/gpu/paged_rows.py (this script's folder is on sys.path)

    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    bind, timer = build.binding(), bench.GpuTimeTimer()  # bind's calls raise on a refusal and return (out, ...)
    cudnn = lambda: bench.sdpa_backend("cudnn")  # noqa: E731
    with open(out_path, "a") as out:
        for B, L in CELLS:
            case = PagedCase("probe", B, 32, 8, 1, L, 128, "bfloat16", (), 16)
            a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
            q, k, v, seqlens = a["q"], a["k"], a["v"], a["seqlens"]
            scale = op_common._scale(None, 128)
            calls = {"sdpa-cudnn": (bench.sdpa_runner("default", q, k, v), cudnn)}
            contiguous_splits = _decode_plan(q, k, None, None)[1]
            for name, (version, _) in VARIANTS.items():
                if version == "v02":
                    address = ops.launcher(ops.DECODE, "v02", defines_of(name))
                    calls[name] = (lambda address=address: bind.decode_call(address, q, k, v, None, scale,
                                                                            contiguous_splits)[0], None)
            pages = {}
            for page in PAGES:
                table, num_pages = paged.block_table(B, L, page, torch.Generator(device="cuda").manual_seed(page), "cuda")
                kp, vp = paged.to_pages(k, table, num_pages, page), paged.to_pages(v, table, num_pages, page)
                flags = torch.zeros(B, dtype=torch.int32, device="cuda")
                pages[page] = (kp, vp, table, flags)
                splits = _v03_plan(q, 8, table.shape[1] * page, "v03", None, True)[1]
                calls[f"p{page} lab.ops.decode"] = (lambda kp=kp, vp=vp, table=table, flags=flags: ops.decode(
                    q, kp, vp, seqlens, block_table=table, page_errors=flags), None)
                for name, (version, _) in VARIANTS.items():
                    if version != "v03":
                        continue
                    address = ops.launcher(ops.DECODE, "v03", defines_of(name))
                    counts = [(splits, "")] + [(s, f" splits {s}") for s in EXTRA_SPLITS.get(L, ()) if name == "v03"]
                    for count, label in counts:
                        calls[f"p{page} {name}{label}"] = (
                            lambda address=address, kp=kp, vp=vp, table=table, flags=flags, count=count:
                            bind.decode_paged_call(address, q, kp, vp, seqlens, table, flags, scale, count, False)[0],
                            None)
            times = bench.time_interleaved(calls, timer=timer, min_reps=15, max_reps=40, budget_s=1.5)
            write_rows(out, f"{B}x{L}", times, contiguous_splits=contiguous_splits, **env)
            del a, q, k, v, pages, calls
            torch.cuda.empty_cache()


def host(out_path: str) -> None:
    import torch

    from lab import bench, graphs, hostcost, kernels, ops

    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    cudnn = lambda: bench.sdpa_backend("cudnn")  # noqa: E731
    with open(out_path, "a") as out:
        for B, L in ((1, 4096), (1, 16384), (8, 4096)):
            q = torch.randn(B, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(B, 8, L, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            op = lambda: ops.decode(q, k, v)  # noqa: E731

            def full():
                kernels.plans.clear()  # the one-crossing path finds no plan: the full path runs
                return ops.decode(q, k, v)
            graph, _ = graphs.capture(op)
            calls = {"sdpa-cudnn": (bench.sdpa_runner("default", q, k, v), cudnn), "lab.ops.decode": (op, None),
                     "lab.ops.decode full path": (full, None),
                     "kernel only": (ops.decode_call_factory()(q, k, v, None), None), "graph replay": (graph.replay, None)}
            times = bench.time_interleaved(calls, min_reps=30, max_reps=100, budget_s=2.0)
            sdpa = hostcost._sdpa_call(q, k, v, False)
            host_us = {name: {mode: round(hostcost.host_us(fn, 100, busy=mode == "busy"), 2) for mode in ("idle", "busy")}
                       for name, fn in (("sdpa", sdpa), ("lab.ops.decode", op), ("lab.ops.decode full path", full))}
            for name, t in times.items():
                row = {"cell": f"{B}x{L}", "impl": name, "cold_us": round(t.median_ms * 1e3, 2),
                       "iqr_us": round(t.iqr_ms * 1e3, 2), "x_cudnn": round(times["sdpa-cudnn"].median_ms / t.median_ms, 4),
                       "host_us": host_us.get(name), **env}
                out.write(json.dumps(row) + "\n")
                print(f"{row['cell']:>8} {name:<26} cold {row['cold_us']:8.2f} us  x cuDNN {row['x_cudnn']}  "
                      f"host {row['host_us']}", flush=True)
            print(f"{B}x{L} host us (idle/busy): {host_us}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "host":
        host(sys.argv[2] if len(sys.argv) > 2 else "/tmp/paged_host.jsonl")
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/paged_loader_probe.jsonl")
