"""Decode v03's lean loader (the LAB_PAGED_LEAN_LOADER switch of kernels/decode/v03_paged.cu) on the GPU: its checks,
small calls for compute-sanitizer, and its A/B against v03's default loader, paged and on the contiguous cache.

    python tools/gpu/paged_lean.py check             # every paged-tests and paged head-dim case, paged and contiguous,
                                                     # against float64 (lab.check's rule); the switch's wrong build must fail
    python tools/gpu/paged_lean.py sanitize          # small calls, inputs made on the CPU, each output checked (PASS/FAIL)
    python tools/gpu/paged_lean.py ab OUT.jsonl      # GPU time in interleaved rounds beside SDPA-cuDNN, one JSON line a row

Every call goes through the binding with the variant's launcher and the public op's split plan. Exits 1 on a FAIL.
"""
from __future__ import annotations

import os
import sys

import torch
from paged_rows import write_rows  # tools/gpu/paged_rows.py (this script's folder is on sys.path)

from lab import bench, build, cases, check, op_common, ops
from lab.cases import PagedCase
from lab.decode import paged
from lab.decode.op import _decode_plan, _v03_plan

LEAN = {"LAB_PAGED_LEAN_LOADER": None}
WRONG = {**LEAN, "LAB_PAGED_LEAN_BUG": None}  # V's later rows of a group read its first row again: must fail


def call(defines, a, case, splits, paged_cache=True):
    """v03 built with `defines` on one case's inputs: (out, flags or None); the binding raises on a refusal."""
    scale = op_common._scale(None, case.D)
    address = ops.launcher(ops.DECODE, "v03", defines)
    check._poison_allocator(a["q"])
    if paged_cache:
        flags = torch.full((case.B,), -1, dtype=torch.int32, device=a["q"].device)
        out, _ = build.binding().decode_paged_call(address, a["q"], a["k_pages"], a["v_pages"], a["seqlens"], a["table"],
                                                   flags, scale, splits, case.causal)
    else:
        flags = None
        out, _ = build.binding().decode_paged_call(address, a["q"], a["k"], a["v"], a["seqlens"], None, None, scale,
                                                   splits, case.causal)
    return out, flags


def judge(out, flags, a, case) -> bool:
    if flags is not None and bool(flags.any()):
        return False
    ref = paged.reference(a["q"], a["k"], a["v"], case.lengths(), case.causal)
    yard = paged.yardstick(a["q"], a["k"], a["v"], case.lengths(), case.causal)
    return check.compare(out.to(ref.device), ref, yard)["passed"]


def run_checks() -> int:
    rows = [(c, s) for c in cases.paged_tests_cases() for s in (1,)] + \
           [(c, s) for c in cases.paged_head_dim_tests_cases() for s in (1, 3)]
    failed = total = 0
    for i, (case, splits) in enumerate(rows):
        for paged_cache in (True, False):
            ok = True
            for trial in range(2):  # fresh inputs per trial
                a = paged.paged_inputs(case, paged.gen_on("cuda", 1000 * i + trial), "cuda")
                ok &= judge(*call(LEAN, a, case, splits, paged_cache), a, case)
            total += 1
            failed += not ok
            if not ok:
                print("FAIL", case.name, "splits", splits, "paged" if paged_cache else "contiguous", flush=True)
    print(f"lean checks: {total - failed}/{total} passed", flush=True)
    wrong = []
    # D 128: a thread copies two rows of each 16-key group, so the wrong build reads a wrong V row. Not D 64: there a
    # thread has one row a group, and the wrong build computes the right answer.
    for case in (cases.paged_tests_cases()[2],):
        a = paged.paged_inputs(case, paged.gen_on("cuda", 7), "cuda")
        wrong += [judge(*call(WRONG, a, case, 1, pc), a, case) for pc in (True, False)]
    print(f"wrong build (LAB_PAGED_LEAN_BUG): {sum(not w for w in wrong)}/{len(wrong)} calls fail, as they must", flush=True)
    return 1 if failed or any(wrong) else 0


def run_sanitize() -> int:
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for D in (64, 128, 256):
        for q_len, causal, dtype, page in ((1, False, "bfloat16", 16), (3, True, "float16", 48)):
            case = PagedCase(f"san-d{D}-q{q_len}", 3, 32, 8, q_len, 300, D, dtype, (0, 65, 300), page, causal)
            host = paged.paged_inputs(case, gen, "cpu")  # made on the CPU: initcheck then tracks our kernels only
            a = {name: t.to("cuda") for name, t in host.items()}
            for splits in (1, 3):
                for paged_cache in (True, False):
                    out, flags = call(LEAN, a, case, splits, paged_cache)
                    ok = judge(out.cpu(), None if flags is None else flags.cpu(), host, case)
                    failed += not ok
                    print("PASS" if ok else "FAIL", case.name, "splits", splits, "paged" if paged_cache else "contiguous",
                          flush=True)
    torch.cuda.synchronize()
    print("all passed" if not failed else f"FAILED {failed}")
    return 1 if failed else 0


def run_ab(out_path: str) -> int:
    env = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("LAB_COMMIT"), "torch": torch.__version__}
    bind, timer = build.binding(), bench.GpuTimeTimer()
    variants = {"v03": {}, "v03 again": {}, "v03 lean": LEAN}  # "again": the spread between two identical calls
    with open(out_path, "a") as out:
        for B, L in cases.PAGED_CELLS:
            case = PagedCase("ab", B, 32, 8, 1, L, 128, "bfloat16", (), 16)
            a = paged.paged_inputs(case, torch.Generator(device="cuda").manual_seed(0), "cuda")
            q, k, v, seqlens = a["q"], a["k"], a["v"], a["seqlens"]
            scale = op_common._scale(None, 128)
            calls = {"sdpa-cudnn": (bench.sdpa_runner("default", q, k, v), lambda: bench.sdpa_backend("cudnn")),
                     "contiguous lab.ops.decode": (lambda: ops.decode(q, k, v), None)}
            c_splits = _decode_plan(q, k, None, None)[1]
            for name, defines in variants.items():
                address = ops.launcher(ops.DECODE, "v03", defines)
                calls[f"contiguous {name}"] = (lambda address=address: bind.decode_paged_call(
                    address, q, k, v, None, None, None, scale, c_splits, False)[0], None)
            for page in (16, 64, 256):
                table, num_pages = paged.block_table(B, L, page, torch.Generator(device="cuda").manual_seed(page), "cuda")
                kp, vp = paged.to_pages(k, table, num_pages, page), paged.to_pages(v, table, num_pages, page)
                flags = torch.zeros(B, dtype=torch.int32, device="cuda")
                splits = _v03_plan(q, 8, table.shape[1] * page, "v03", None, True)[1]
                for name, defines in variants.items():
                    address = ops.launcher(ops.DECODE, "v03", defines)
                    calls[f"p{page} {name}"] = (lambda address=address, kp=kp, vp=vp, table=table, flags=flags, s=splits:
                                                bind.decode_paged_call(address, q, kp, vp, seqlens, table, flags, scale,
                                                                       s, False)[0], None)
            times = bench.time_interleaved(calls, timer=timer, min_reps=15, max_reps=40, budget_s=1.0)
            write_rows(out, f"{B}x{L}", times, **env)
            del a, q, k, v, calls
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    sys.exit({"check": run_checks, "sanitize": run_sanitize}[mode]() if mode != "ab" else
             run_ab(sys.argv[2] if len(sys.argv) > 2 else "/tmp/paged_lean_ab.jsonl"))
