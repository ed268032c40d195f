"""Decode v06 (the warp-private ring, kernels/decode/v06_warpring.cu), or the version LAB_PAGED_NEW names (v07: v06
with the swizzled ring), on the GPU: its checks through the public op, the
wrong build, small calls for compute-sanitizer, and its race against v03 beside SDPA-cuDNN.

    python tools/gpu/paged_warpring.py check           # every paged-tests and paged head-dim case through lab.ops.decode
                                                       # (version="v06"), paged and contiguous, split plan and 3 splits,
                                                       # against float64 (lab.check's rule); the wrong build must fail
    python tools/gpu/paged_warpring.py sanitize        # small calls, inputs made on the CPU, each output checked
    python tools/gpu/paged_warpring.py ab OUT.jsonl    # the public op, version named: GPU time (eager, interleaved
                                                       # rounds) and CUDA-graph replays, beside SDPA-cuDNN, one JSON line a row;
                                                       # AB_VERSIONS="v07 v04": the versions beside v03 (default v06, LAB_PAGED_NEW);
                                                       # AB_DIMS="80 96": the head dims (default 128; a cell's label
                                                       # gains " dD" off 128); AB_CELLS="8x16384 128x2048" (default
                                                       # lab.cases.PAGED_CELLS); AB_PAGES (default "16 64 256")

A version without D 128 (v08: 80 / 96) is checked on the same case grids at its own head dims
(lab.cases.paged_tests_cases(head_dims)) and sanitized at them.

Exits 1 on a FAIL.
"""
from __future__ import annotations

import json
import os
import sys

import torch
from paged_rows import write_rows  # tools/gpu/paged_rows.py (this script's folder is on sys.path)

from lab import bench, cases, check, graphs, ops, registry
from lab.cases import PagedCase
from lab.decode import paged

NEW = os.environ.get("LAB_PAGED_NEW", "v06")  # a v06-family version; its rows are labelled by its name
WRONG = {"LAB_WARPRING_BUG_SLICE": None}  # a warp copies the next warp's slice into its rows: must fail
DIMS = registry.DECODE[NEW].head_dims
TESTS = cases.paged_tests_cases() if 128 in DIMS else cases.paged_tests_cases(DIMS)  # the grid at NEW's head dims


def contiguous_check(case: PagedCase, seed: int, splits) -> bool:
    """lab.ops.decode on the contiguous cache with version="v06" (causal as the case), two fresh trials."""
    ok = True
    for trial in range(2):
        a = paged.paged_inputs(case, paged.gen_on("cuda", seed + trial), "cuda")
        check._poison_allocator(a["q"])
        out = ops.decode(a["q"], a["k"], a["v"], a["seqlens"], num_splits=splits, version=NEW, is_causal=case.causal)
        ref = paged.reference(a["q"], a["k"], a["v"], case.lengths(), case.causal)
        yard = paged.yardstick(a["q"], a["k"], a["v"], case.lengths(), case.causal)
        ok &= check.compare(out.to(ref.device), ref, yard)["passed"]
    return ok


def run_checks() -> int:
    rows = [(c, s) for c in TESTS for s in (None,)] + \
           [(c, s) for c in cases.paged_head_dim_tests_cases() for s in (None, 3)]
    rows = [(c, s) for c, s in rows if c.D in DIMS]
    failed = total = 0
    for i, (case, splits) in enumerate(rows):
        ok_paged = paged.check_paged(case, num_splits=splits, trials=2, seed=1000 * i, save=False, version=NEW).passed
        ok_contiguous = contiguous_check(case, 1000 * i + 500, splits)
        for where, ok in (("paged", ok_paged), ("contiguous", ok_contiguous)):
            total += 1
            failed += not ok
            if not ok:
                print("FAIL", case.name, "splits", splits, where, flush=True)
    print(f"{NEW} checks: {total - failed}/{total} passed", flush=True)
    wrong = [paged.check_paged(case, num_splits=s, trials=1, save=False, defines=WRONG, version=NEW).passed
             for case in TESTS[:4] for s in (1, 3)]
    print(f"wrong build (LAB_WARPRING_BUG_SLICE): {sum(not w for w in wrong)}/{len(wrong)} calls fail, as they must",
          flush=True)
    return 1 if failed or any(wrong) else 0


def run_sanitize() -> int:
    """Small calls of v06 (D 64, 128, 256, or NEW's head dims where it has none of them; q_len 1 and 3 causal, and
    q_len 1 with one query row a KV head;
    bf16 / fp16; pages 16 / 48; one split and three; paged and contiguous; a table with an out-of-range id), each
    output judged on the host."""
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for D in tuple(d for d in (64, 128, 256) if d in DIMS) or DIMS:
        for q_len, causal, dtype, page, hq in ((1, False, "bfloat16", 16, 32), (3, True, "float16", 48, 32),
                                               (1, False, "bfloat16", 16, 8)):  # the last: one row a KV head (MHA)
            case = PagedCase(f"san-d{D}-q{q_len}-h{hq}", 3, hq, 8, q_len, 300, D, dtype, (0, 65, 300), page, causal)
            host = paged.paged_inputs(case, gen, "cpu")  # made on the CPU: initcheck then tracks our kernels only
            a = {name: t.to("cuda") for name, t in host.items()}
            ref = paged.reference(host["q"], host["k"], host["v"], case.lengths(), case.causal)
            yard = paged.yardstick(host["q"], host["k"], host["v"], case.lengths(), case.causal)
            for splits in (1, 3):
                flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
                outs = {"paged": ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], num_splits=splits,
                                            block_table=a["table"], page_errors=flags, is_causal=causal, version=NEW),
                        "contiguous": ops.decode(a["q"], a["k"], a["v"], a["seqlens"], num_splits=splits,
                                                 is_causal=causal, version=NEW)}
                for where, out in outs.items():
                    ok = check.compare(out.cpu(), ref, yard)["passed"] and not (where == "paged" and bool(flags.any()))
                    failed += not ok
                    print("PASS" if ok else "FAIL", case.name, "splits", splits, where, flush=True)
            bad = a["table"].clone()
            bad[1, 0] = a["k_pages"].shape[0] + 3  # an id past the pool: rows zeroed, flag set, nothing read
            flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
            out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=bad, page_errors=flags,
                             is_causal=causal, version=NEW)
            ok = flags.cpu().tolist()[1] != 0 and bool((out[1].cpu() == 0).all())
            failed += not ok
            print("PASS" if ok else "FAIL", case.name, "bad page id flagged and zeroed", flush=True)
    torch.cuda.synchronize()
    print("all passed" if not failed else f"FAILED {failed}")
    return 1 if failed else 0


# The versions raced beside v03, each named in its rows: AB_VERSIONS (default v06 and NEW).
NAMED = (("v03", "v03"),) + tuple((v, v) for v in dict.fromkeys(os.environ.get("AB_VERSIONS", f"v06 {NEW}").split()))


def run_ab(out_path: str) -> int:
    """The public op as called (version named; paged with page_errors), GPU time in interleaved rounds (a GPU sleep
    first: the call's GPU work alone) and one CUDA graph per call replayed (CudaTimer), beside SDPA-cuDNN on the
    contiguous cache. "v03 again": the spread between two identical calls in one round."""
    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    gpu_timer, replay_timer = bench.GpuTimeTimer(), bench.CudaTimer()
    pages = tuple(int(p) for p in os.environ.get("AB_PAGES", "16 64 256").split())
    dims = tuple(int(d) for d in os.environ.get("AB_DIMS", "128").split())
    cells = tuple(tuple(int(x) for x in c.split("x")) for c in os.environ.get("AB_CELLS", "").split()) or cases.PAGED_CELLS
    with open(out_path, "a") as out:
        for D, (B, L) in ((D, cell) for D in dims for cell in cells):
            label = f"{B}x{L}" + ("" if D == 128 else f" d{D}")
            case = PagedCase("ab", B, 32, 8, 1, L, D, "bfloat16", (), 16)
            a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
            q, k, v, seqlens = a["q"], a["k"], a["v"], a["seqlens"]
            runner = bench.sdpa_runner("default", q, k, v)
            calls = {"sdpa-cudnn": (runner, lambda: bench.sdpa_backend("cudnn")),
                     "contiguous default": (lambda: ops.decode(q, k, v), None)}
            for name, version in NAMED:
                calls[f"contiguous {name}"] = (lambda version=version: ops.decode(q, k, v, version=version), None)
            for page in pages:
                table, num_pages = paged.block_table(B, L, page, torch.Generator(device="cuda").manual_seed(page), "cuda")
                kp, vp = paged.to_pages(k, table, num_pages, page), paged.to_pages(v, table, num_pages, page)
                flags = torch.zeros(B, dtype=torch.int32, device="cuda")
                for name, version in (("v03", "v03"), ("v03 again", "v03")) + NAMED[1:]:
                    calls[f"p{page} {name}"] = (lambda version=version, kp=kp, vp=vp, table=table, flags=flags:
                                                ops.decode(q, kp, vp, seqlens, block_table=table, page_errors=flags,
                                                           version=version), None)
            times = bench.time_interleaved(calls, timer=gpu_timer, min_reps=15, max_reps=40, budget_s=1.0)
            write_rows(out, label, times, timer="gpu", D=D, **env)
            replays = {}
            for name, (fn, ctx) in calls.items():
                if ctx is not None:
                    with ctx():
                        g, _ = graphs.capture(fn)
                else:
                    g, _ = graphs.capture(fn)
                replays[name] = bench.time_fn(g.replay, timer=replay_timer, min_reps=15)
            write_rows(out, f"{label} graph", replays, timer="graph", D=D, **env)
            del a, q, k, v, calls, replays
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    sys.exit({"check": run_checks, "sanitize": run_sanitize}[mode]() if mode != "ab" else
             run_ab(sys.argv[2] if len(sys.argv) > 2 else "/tmp/paged_warpring_ab.jsonl"))
