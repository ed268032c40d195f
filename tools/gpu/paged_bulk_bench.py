"""decode v05 (whole-row bulk copies) against v03 (16-byte cp.async) and SDPA-cuDNN on the paged serving cells, GPU time.

Every row is the public op as a user calls it (lab.ops.decode with block_table and page_errors; `version=` picks v03 or
v05, no version is the default), timed by lab.bench.GpuTimeTimer (L2 flushed, then a GPU sleep that the host's launch
hides behind: the window holds the kernels alone) in interleaved rounds (lab.bench.time_interleaved). Both versions
take v02's split plan with the ragged cap (lab.decode.op._v03_plan), so a row differs from its neighbour only in the
loader. `again` rows time the same call twice a round: the spread one run cannot resolve. x_cudnn is cuDNN's time
(SDPA on the contiguous cache) over the row's; x_v03 the v03 row's over the row's.

    python tools/gpu/paged_bulk_bench.py OUT.jsonl          # one JSON line per row, a table on stdout
    python tools/gpu/paged_bulk_bench.py ncu                # one call of each version per cell, for ncu's profile
"""
from __future__ import annotations

import json
import os
import sys

from lab.cases import PAGED_CELLS

PAGES = (16, 64, 256)
ROWS = ("default", "v03", "v03 again", "v05", "v05 again")
NCU_CELLS = ((32, 4096), (1, 131072))


def _cell(B: int, L: int):
    import torch

    from lab.cases import PagedCase
    from lab.decode import paged

    case = PagedCase("bulk", B, 32, 8, 1, L, 128, "bfloat16", (), 16)
    a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
    pages = {}
    for page in PAGES:
        table, num_pages = paged.block_table(B, L, page, torch.Generator(device="cuda").manual_seed(page), "cuda")
        pages[page] = (paged.to_pages(a["k"], table, num_pages, page), paged.to_pages(a["v"], table, num_pages, page),
                       table, torch.zeros(B, dtype=torch.int32, device="cuda"))
    return a, pages


def _paged_call(a, kp, vp, table, flags, version):
    from lab import ops

    return lambda: ops.decode(a["q"], kp, vp, a["seqlens"], block_table=table, page_errors=flags, version=version)


def main(out_path: str) -> None:
    import torch

    from lab import bench, ops

    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    timer = bench.GpuTimeTimer()
    with open(out_path, "a") as out:
        for B, L in PAGED_CELLS:
            a, pages = _cell(B, L)
            q, k, v = a["q"], a["k"], a["v"]
            calls = {"sdpa-cudnn": (bench.sdpa_runner("default", q, k, v), lambda: bench.sdpa_backend("cudnn")),
                     "contiguous lab.ops.decode": (lambda: ops.decode(q, k, v, a["seqlens"]), None)}
            for page, (kp, vp, table, flags) in pages.items():
                for row in ROWS:
                    version = None if row == "default" else row.split()[0]
                    calls[f"p{page} {row}"] = (_paged_call(a, kp, vp, table, flags, version), None)
            times = bench.time_interleaved(calls, timer=timer, min_reps=15, max_reps=40, budget_s=1.5)
            base = times["sdpa-cudnn"]
            for name, t in times.items():
                if not isinstance(t, bench.Timing):
                    print(f"{B}x{L} {name}: {t}", flush=True)
                    continue
                ref = times.get(f"{name.split()[0]} v03") if name.startswith("p") else None
                row = {"cell": f"{B}x{L}", "impl": name, "gpu_us": round(t.median_ms * 1e3, 2),
                       "iqr_us": round(t.iqr_ms * 1e3, 2), "n": t.n,
                       "x_cudnn": round(base.median_ms / t.median_ms, 4) if isinstance(base, bench.Timing) else None,
                       "x_v03": round(ref.median_ms / t.median_ms, 4) if isinstance(ref, bench.Timing) else None,
                       "kv_bytes": 2 * k.numel() * k.element_size(), **env}
                out.write(json.dumps(row) + "\n")
                print(f"{row['cell']:>9} {name:<28} {row['gpu_us']:8.2f} us  iqr {row['iqr_us']:5.2f}  "
                      f"x cuDNN {row['x_cudnn']}  x v03 {row['x_v03']}", flush=True)
            del a, q, k, v, pages, calls
            torch.cuda.empty_cache()


def ncu() -> None:
    """One call of v03 and v05 per (cell, page size) of NCU_CELLS, after one untimed call each (builds, plans)."""
    import torch

    for B, L in NCU_CELLS:
        a, pages = _cell(B, L)
        for page in (16, 256):
            for version in ("v03", "v05"):
                call = _paged_call(a, *pages[page], version)
                torch.cuda.synchronize()
                call()
                torch.cuda.synchronize()
                torch.cuda.nvtx.range_push(f"{B}x{L} p{page} {version}")
                call()
                torch.cuda.nvtx.range_pop()
                torch.cuda.synchronize()
        del a, pages
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "ncu":
        ncu()
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/paged_bulk_bench.jsonl")
