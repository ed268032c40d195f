"""GPU driver for the Hopper forward kernels (v05+): correctness, sanitizer shapes, bench-fwd race.

Runs through the lab (lab.ops runners, lab.check, lab.sweep), so what it checks is what users call.
    python3 tools/gpu/hopper_run.py check v05,v06          # every `tests` case + strided, scales, LSE
    python3 tools/gpu/hopper_run.py sanitize v05,v06       # a few uneven shapes, once each (for compute-sanitizer)
    python3 tools/gpu/hopper_run.py bench v04,v05,v06 [out.json]   # bench-fwd vs SDPA flash/cuDNN
Prints one line per case; exit status 1 if any check fails.
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch

from lab import bench, cases, check, ops, sweep


def parse(spec: str):
    """'v07' -> ('v07', None); 'v07:NAME=VALUE+NAME2=VALUE2' -> ('v07', {NAME: VALUE, ...}): a build variant."""
    name, _, defs = spec.partition(":")
    return name, (dict(d.split("=") for d in defs.split("+")) if defs else None)


def prebuild(specs) -> None:
    """Compile every variant at once (nvcc runs out of process, one per core): a variant's build takes
    about a minute, and one after another they ate most of a 600 s GPU run."""
    from concurrent.futures import ThreadPoolExecutor

    from lab import build, registry
    jobs = {(registry.FWD[n].source, tuple(sorted((d or {}).items()))) for n, d in map(parse, specs)}
    jobs |= {(k.source, ()) for k in registry.FWD.values() if (9, 0) in k.capabilities}  # the default rows
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        list(pool.map(lambda job: build.build_kernel(job[0], dict(job[1]) or None), jobs))


def lse_error(version: str, case, scale) -> float:
    """Max |LSE - float64 LSE| of lab.ops.attention(return_lse=True)."""
    gen = torch.Generator().manual_seed(7)
    dtype = check.DTYPES[case.dtype]
    q, k, v = (torch.randn(s, generator=gen).to("cuda", dtype) for s in
               ((case.B, case.Hq, case.Sq, case.D), (case.B, case.Hkv, case.Sk, case.D), (case.B, case.Hkv, case.Sk, case.D)))
    _, lse = ops.attention(q, k, v, is_causal=case.causal, scale=scale, enable_gqa=case.Hq != case.Hkv,
                           version=version, return_lse=True)
    kk = k.double().repeat_interleave(case.Hq // case.Hkv, dim=1)
    s = (q.double() @ kk.transpose(-1, -2)) * (1 / math.sqrt(case.D) if scale is None else scale)
    if case.causal:
        s = s.masked_fill(torch.ones(case.Sq, case.Sk, dtype=torch.bool, device="cuda").triu(1), -math.inf)
    return (lse.double() - torch.logsumexp(s, dim=-1)).abs().max().item()


def sdpa_scale_probe():
    """Which SDPA backends return NaN for scale 0 or a negative scale (why the yardstick above is math)."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 65, 128, generator=gen).to("cuda", torch.bfloat16) for _ in range(3))
    for backend in ("flash", "cudnn", "efficient", "math"):
        for scale in (0.0, -0.35):
            for causal in (False, True):
                try:
                    with bench.sdpa_backend(backend):
                        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
                    ref = check.reference(q, k, v, causal, scale)
                    print(f"SDPA-{backend} scale {scale} causal {causal}: NaN {int(out.isnan().sum())}, "
                          f"max abs err {(out.double() - ref).abs().nan_to_num(float('inf')).max().item():.3g}")
                except RuntimeError as err:
                    print(f"SDPA-{backend} scale {scale}: unsupported ({str(err).splitlines()[0][:80]})")


def planted_key_check(version: str, defines=None) -> tuple[bool, str]:
    """Keys whose scores jump far above every earlier key's (up to ~900 in log2 units), so a kept running max
    (v07's LAZY) would overflow P: the kernel must take the full step and still give softmax's answer."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 1024, d, generator=gen) for d in (128, 128, 128))
    for key in (300, 700, 1000):  # later tiles, after the max has settled
        k[:, :, key] = q.mean(dim=2) * 40 * (key / 300)
    q, k, v = (x.to("cuda", torch.bfloat16) for x in (q, k, v))
    ref = check.reference(q, k, v, False, None)
    out = torch.full_like(q, float("nan"))  # poisoned: a row the kernel skips stays NaN and fails
    ops.fwd_writer(version, defines)(q, k, v, False, None, out)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    err, err_sdpa = ((x.double() - ref).abs().nan_to_num(float("inf")).max().item() for x in (out, sdpa))
    ok = err <= 4 * err_sdpa + 1e-3
    return ok, f"planted keys: max abs {err:.3g} (sdpa {err_sdpa:.3g}) nan {int(out.isnan().sum())}"


def run_check(versions) -> bool:
    ok = True
    sdpa_scale_probe()
    tests = cases.tests_cases()
    for version in versions:
        name, defines = parse(version)
        run = ops.fwd_writer(name, defines)
        results = check.run_set(run, tests, version, progress=False, show_failures=0, save=False)
        results += [check.check_forward(run, c, version, layout="bshd", save=False) for c in tests[2:10]]
        # Grids of more work tiles than SMs (528 at D 128, 352 at D 64): a persistent kernel loops here
        results += [check.check_forward(run, cases.Case("many-tiles", 2, 8, 2, 4097, 4097, d, "bfloat16", causal),
                                        version, trials=1, save=False) for d in (64, 128) for causal in (False, True)]
        # D 128's few-keys config (persistent, FUSE): non-causal with S_k <= 2048 (many work tiles per CTA, ragged
        # tails, GQA, one key tile per work tile, where FUSE's stream crosses a work tile at every step) and causal
        # up to 2048 queries in PAIR order (odd and even numbers of query tiles, more units than SMs)
        results += [check.check_forward(run, cases.Case("many-tiles-short", B, Hq, Hkv, Sq, Sk, 128, dtype, causal),
                                        version, trials=1, save=False)
                    for (B, Hq, Hkv, Sq, Sk, dtype, causal) in (
                        (4, 16, 4, 1000, 777, "bfloat16", False), (2, 40, 8, 513, 1000, "float16", False),
                        (2, 40, 8, 700, 100, "bfloat16", False), (2, 20, 4, 1500, 2048, "float16", False),
                        (4, 16, 4, 1000, 1000, "bfloat16", True),
                        (2, 40, 8, 1100, 1000, "float16", True), (3, 20, 20, 2048, 2048, "bfloat16", True))]
        for scale in (0.0, -0.35, 2.0):  # any finite scale: zero, negative, large
            with bench.sdpa_backend("math"):  # the yardstick: SDPA's fused backends give NaN for scale <= 0
                results += [check.check_forward(run, c, version, scale=scale, save=False) for c in (tests[5], tests[14])]
        for r in results:
            w = r.worst
            print(f"{version} {'PASS' if r.passed else 'FAIL'} {r.case.label:<48} max_abs {w['max_abs']:.3g} "
                  f"(sdpa {w['sdpa_max_abs']:.3g}, tol {w['tol_max_abs']:.3g}) nan {w['nan']}")
        lse = max(lse_error(name, c, s) for c in (tests[6], tests[13], tests[30]) for s in (None, -0.5))
        planted, line = planted_key_check(name, defines)
        print(f"{version} {'PASS' if planted else 'FAIL'} {line}")
        passed = sum(r.passed for r in results) + planted
        print(f"SUMMARY {version}: {passed}/{len(results) + 1} checks pass; LSE max error {lse:.3g}")
        ok &= passed == len(results) + 1 and lse < 1e-2
    return ok


def run_sanitize(versions) -> bool:
    shapes = [(1, 3, 1, 65, 63, 64, True), (2, 4, 2, 63, 130, 128, False), (1, 2, 2, 130, 65, 128, True),
              (1, 1, 1, 1, 1, 64, False), (1, 2, 1, 257, 257, 64, True),
              # more work tiles than SMs, so a persistent kernel's CTAs take several each (272 and 240)
              (2, 17, 1, 1000, 777, 128, True), (2, 20, 4, 1025, 1025, 64, False),
              # v07 at D 128 picks its config per call: S_k > 2048 non-causal and S_q > 2048 causal take the long one
              (1, 3, 1, 130, 2100, 128, False), (1, 2, 1, 2100, 2100, 128, True),
              # the few-keys config (D 128, S_k <= 2048) with more work tiles than SMs (240 and 160)
              (2, 40, 8, 300, 500, 128, False), (1, 40, 8, 500, 100, 128, False),
              # causal few-keys in PAIR order: an odd number of query tiles (9), more units (200) than SMs
              (1, 40, 8, 1100, 1100, 128, True)]
    ok = True
    for version in versions:
        for (B, Hq, Hkv, Sq, Sk, D, causal) in shapes:
            for dtype in ("float16", "bfloat16"):
                case = cases.Case("san", B, Hq, Hkv, Sq, Sk, D, dtype, causal)
                with bench.sdpa_backend("math"):  # keep cuDNN's kernels out of the sanitizer's report
                    r = check.check_forward(ops.fwd_writer(*parse(version)), case, version, trials=1, peaked=False,
                                            save=False)
                print(f"{version} {'PASS' if r.passed else 'FAIL'} {case.label}")
                ok &= r.passed
    return ok


def run_bench(versions, out_path=None) -> bool:
    grid = cases.bench_fwd_cases("bfloat16")
    only = os.environ.get("LAB_BENCH_CASES")  # e.g. "fwd-d128-s8192,fwd-d128-s512-c": a subset, for quick A/B runs
    if only:
        grid = [c for c in grid if c.name in only.split(",")]
    # each version through the public op (what users call), then the default choice as the public row
    makers = {}
    if os.environ.get("LAB_BENCH_PUBLIC_FIRST"):  # the public op also first in each round (an order-effect probe)
        makers[sweep.PUBLIC_FWD + " (first)"] = sweep.public_attention()
    for v in versions:  # "v07" times the public op with version=v07; "v07:NAME=VALUE+..." a kernel-only variant
        name, defines = parse(v)
        makers[f"{v} (public op)" if not defines else v] = (sweep.public_attention(name) if not defines
                                                            else ops.fwd_call_factory(name, defines))
    makers[sweep.PUBLIC_FWD] = sweep.public_attention()
    rows = sweep.fwd_sweep(grid, makers, backends=("flash", "cudnn"), progress=False, budget_s=1.0)
    for row in rows:
        if "tflops" in row:
            ratio = row.get("ratios", {})
            print(f"{row['case']['name']:<16} {row['impl']:<18} {row['tflops']:7.1f} TFLOP/s "
                  + " ".join(f"{k} {x:.2f}" for k, x in ratio.items()))
    if out_path:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    return True


if __name__ == "__main__":
    mode, versions = sys.argv[1], sys.argv[2].split(",")
    print(f"GPU {torch.cuda.get_device_name()} torch {torch.__version__}")
    fn = {"check": run_check, "sanitize": run_sanitize, "bench": run_bench}[mode]
    if mode != "sanitize":  # under compute-sanitizer the builds would run inside the tool
        prebuild(versions)
    sys.exit(0 if fn(versions, *sys.argv[3:]) else 1)
