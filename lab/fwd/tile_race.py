"""The D 128 non-causal forward at long S against SDPA-cuDNN: the last key tile and the last wave of the grid.

fwd v07's long config takes B_c = 176 keys a tile, so S_k = 4096 runs 24 tiles, 4224 keys of work for 4096 (3.1 %),
and B 4 x H 16 x 32 query tiles of 128 rows make 2048 CTAs, 15.5 waves of one CTA on each of 132 SMs. Builds of v07
at other key tiles or configs (BUILDS: -D defines of the experiment build, the default build untouched) are checked
through lab.check against float64 first (WRONG, a build that must fail, shows that the check can), then timed
kernel-only in alternating rounds (lab.bench.time_interleaved, L2 flushed) beside the public op and SDPA-cuDNN on
CELLS: the weak cell, cells whose grid is whole waves (the tail question: B 2 x H 33 and S 4224 fill 16 waves for
both kernels), and the sweep's other lengths, uneven ones included. Each cell is timed in `repeats` separate
interleaved sessions, so the spread across sessions is seen, not only within one. Needs CUDA.

python -m lab.fwd.tile_race [--quick] [--out DIR] [--builds a,b] [--repeats N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

VERSION = "v07"
# label -> defines of v07's build (None: the default build). Only which config a D = 128 call takes, or the long
# config itself, differs between them. Measured and dropped (H200, 2026-11-29; outputs/experiments/
# 20261129-fwd-d128-s4096-key-tile.json): the long config at B_c 128 ({"LAB_FWD_OVERLAP_D128_BC": 128}) and 192, and
# LAST_N (the last tile at wgmma N = 64; the switch is in the history at 9d3eea0).
BUILDS = {
    "default": None,
    "pad-rule-off": {"LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK": 0},  # the few-keys config up to S_k 2048 only
    "few-keys-all": {"LAB_FWD_OVERLAP_D128_SHORT_MAX_SK": 1 << 30},  # B_c 128, 3 stages, persistent + FUSE
}
# Builds that must fail the checks: no softmax (diagnostic; every config of v07).
WRONG = {"no-softmax": {"LAB_FWD_OVERLAP_ABLATE": 1}}
# (name, B, H, S_q = S_k): bf16, D 128, non-causal. Waves: B * H * ceil(S / 128) CTAs over 132 SMs. The padding rule
# (kernels/fwd/v07_overlap.cu, SHORT_PAD_MAX_SK) takes the few-keys config at 2560, 3000, 4096 and 4608, the long one
# at 3500, 4000, 4097 and 4224; 2048 is the few-keys config's in every build, 6144 up the long one's but in few-keys-all.
CELLS = [
    ("b4-h16-s4096", 4, 16, 4096),  # the weak cell: 2048 CTAs, 15.5 waves
    ("b4-h16-s2560", 4, 16, 2560),
    ("b4-h16-s3000", 4, 16, 3000),
    ("b4-h16-s3500", 4, 16, 3500),
    ("b4-h16-s4000", 4, 16, 4000),
    ("b4-h16-s4097", 4, 16, 4097),
    ("b8-h16-s2048", 8, 16, 2048),
    ("b4-h16-s4608", 4, 16, 4608),
    ("b2-h16-s6144", 2, 16, 6144),
    ("b2-h16-s8192", 2, 16, 8192),
    ("b2-h33-s4096", 2, 33, 4096),  # 2112 CTAs: 16.0 waves, 3.1 % more work than the weak cell
    ("b4-h16-s4224", 4, 16, 4224),  # 2112 CTAs: 16.0 waves, and 24 whole tiles of 176 keys
    ("b1-h16-s16384", 1, 16, 16384),
]
LONG_CASES = [  # (B, Hq, Hkv, S_q, S_k, causal): long keys, partial last tiles at every B_c above, GQA
    (1, 2, 2, 4096, 4096, False), (1, 2, 1, 4097, 4097, False), (2, 2, 2, 4000, 4000, False),
    (1, 2, 2, 4224, 4224, False), (1, 2, 2, 2500, 8191, False), (1, 2, 2, 4097, 4097, True),
    (1, 3, 3, 65, 3000, False),
]


def d128_config(seqlen_q: int, seqlen_k: int, causal: bool, defines: dict | None = None) -> str:
    """Which config fwd v07's Launch gives a full-width D = 128 call ("few-keys" or "long"): a mirror of the rule in
    kernels/fwd/v07_overlap.cu, read with the file's defaults of its -D knobs (kernel_defaults) unless `defines`
    overrides them; tests/fwd/test_d128_config_rule.py holds the two together."""
    knobs = {**kernel_defaults(), **(defines or {})}
    if causal:
        return "few-keys" if seqlen_q <= knobs["LAB_FWD_OVERLAP_D128_SHORT_MAX_SQ_CAUSAL"] else "long"
    if seqlen_k <= knobs["LAB_FWD_OVERLAP_D128_SHORT_MAX_SK"]:
        return "few-keys"
    short_bc, long_bc = knobs["LAB_FWD_OVERLAP_D128_SHORT_BC"], knobs["LAB_FWD_OVERLAP_D128_BC"]
    pad_short, pad_long = -(-seqlen_k // short_bc) * short_bc, -(-seqlen_k // long_bc) * long_bc
    padded_less = pad_short * 100 <= pad_long * 99
    return "few-keys" if seqlen_k <= knobs["LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK"] and padded_less else "long"


def kernel_defaults() -> dict:
    """The integer defaults of v07's D = 128 config knobs, as its source defines them (#ifndef NAME / #define NAME N)."""
    import re

    from .. import paths

    text = (paths.KERNELS / "fwd" / "v07_overlap.cu").read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^#define (LAB_FWD_OVERLAP_D128_(?:SHORT_MAX_SK|SHORT_PAD_MAX_SK|SHORT_MAX_SQ_CAUSAL|SHORT_BC|BC)) (\d+)",
        text, re.M)}


def _say(*args) -> None:
    print(*args, flush=True)


def check_builds(builds: dict, full: bool = True, wrong: dict | None = WRONG) -> int:
    """Every build's forward against float64 on LONG_CASES (bf16 and fp16) and, with full, lab.cases.tests_cases at
    D 128 with the (B, S, H, D) layout and scales 0 / -0.35 (as chapter n9's checks); then each of `wrong` on
    LONG_CASES' first four, which must fail. Returns the number of failures (a wrong build that passes counts as one)."""
    import torch

    from .. import bench, cases, check, ops
    from ..cases import Case

    long_cases = [Case(f"tile-{B}x{Hq}x{Hkv}-{Sq}x{Sk}-{dt[:2]}{'-c' if c else ''}", B, Hq, Hkv, Sq, Sk, 128, dt, c)
                  for (B, Hq, Hkv, Sq, Sk, c) in LONG_CASES for dt in ("bfloat16", "float16")]
    fails = 0
    with torch.no_grad():
        for label, defines in builds.items():
            run, results = ops.fwd_writer(VERSION, defines), []
            results += [check.check_forward(run, c, label, trials=2, save=False) for c in long_cases]
            if full:
                tests = cases.tests_cases(head_dims=(128,))
                results += [check.check_forward(run, c, label, trials=2, save=False) for c in tests]
                results += [check.check_forward(run, c, label, save=False, layout="bshd") for c in tests[2:6]]
                with bench.sdpa_backend("math"):  # SDPA's flash and cuDNN return NaN for scale <= 0
                    results += [check.check_forward(run, c, label, save=False, scale=s) for c in tests[4:6]
                                for s in (0.0, -0.35)]
            bad = [r for r in results if not r.passed]
            fails += len(bad)
            _say(f"checks {label}: {len(results) - len(bad)}/{len(results)} pass")
            for r in bad:
                _say("  ", repr(r))
        for label, defines in (wrong or {}).items():
            run = ops.fwd_writer(VERSION, defines)
            caught = [not check.check_forward(run, c, label, trials=1, save=False).passed for c in long_cases[:4]]
            _say(f"wrong build {label} {defines}: {sum(caught)}/{len(caught)} checks fail (all must)")
            fails += not all(caught)
    return fails


def sanitize_call(label: str) -> int:
    """Small calls of a build for compute-sanitizer (memcheck, racecheck), non-causal D 128 above 2048 keys: S_k 2160
    (GQA) and 2300, which the padding rule sends to the few-keys config, and 2200, which stays on the long one;
    partial query tiles; checked against float64, with SDPA's math backend as the yardstick (no cuDNN kernel under
    the sanitizer). Returns 0 when they pass."""
    import torch

    from .. import bench, check, ops
    from ..cases import Case

    run = ops.fwd_writer(VERSION, BUILDS[label])
    with torch.no_grad(), bench.sdpa_backend("math"):
        res = [check.check_forward(run, Case(f"san-{Sk}", 1, 2, kv, Sq, Sk, 128, "bfloat16", False), label, trials=1,
                                   save=False) for (kv, Sq, Sk) in ((1, 130, 2160), (2, 65, 2300), (2, 65, 2200))]
    torch.cuda.synchronize()
    _say(f"sanitize call {label}: " + ", ".join(repr(r) for r in res))
    return 0 if all(r.passed for r in res) else 1


def race(cells, builds: dict, repeats: int = 3, out: Path | None = None, public: bool = True, **stop) -> list[dict]:
    """Per cell, `repeats` interleaved sessions of: SDPA-cuDNN, the public op, and each build's kernel-level call.
    Prints each build's cuDNN time / its time (above 1: faster than cuDNN) per session, and returns the rows."""
    import torch

    from .. import bench, ops

    stop = {"min_reps": 15, "max_reps": 30, "rel_iqr": 0.0, "budget_s": 0.6, **stop}
    rows = []
    for name, B, H, S in cells:
        gen = torch.Generator(device="cuda").manual_seed(B * 100003 + H * 131 + S)
        q, k, v = (torch.randn(B, H, S, 128, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        calls = {"sdpa-cudnn": (bench.sdpa_runner("default", q, k, v, False), partial(bench.sdpa_backend, "cudnn"))}
        if public:
            calls["lab.ops.attention"] = (partial(ops.attention, q, k, v), None)
        for label, defines in builds.items():
            calls[f"kernel {label}"] = (ops.fwd_call_factory(VERSION, defines)(q, k, v, False), None)
        sessions = []
        for r in range(repeats):
            timed = bench.time_interleaved(calls, **stop)
            sessions.append({n: t.as_dict() if isinstance(t, bench.Timing) else str(t) for n, t in timed.items()})
        ref = [s["sdpa-cudnn"]["median_ms"] for s in sessions]
        flops = bench.attention_flops(B, H, S, S, 128, False)
        for n in calls:
            med = [s[n]["median_ms"] for s in sessions if isinstance(s[n], dict)]
            if len(med) != len(ref):
                _say(f"{name:14s} {n:26s} not timed: {sessions[0][n]}")
                continue
            speed = [a / b for a, b in zip(ref, med)]
            row = {"cell": name, "B": B, "H": H, "S": S, "impl": n, "median_ms": med, "cudnn_over_impl": speed,
                   "iqr_ms": [s[n]["iqr_ms"] for s in sessions], "n": [s[n]["n"] for s in sessions],
                   "tflops": flops / statistics.median(med) / 1e9}
            rows.append(row)
            _say(f"{name:14s} {n:26s} {statistics.median(med):.4f} ms  {row['tflops']:6.1f} TFLOP/s  x cuDNN "
                 f"{statistics.median(speed):.3f} (sessions {' '.join(f'{x:.3f}' for x in speed)})")
            if out is not None:
                with open(out / "race.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
        del q, k, v
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the long checks only, and the first six cells")
    parser.add_argument("--out", type=Path, default=None, help="folder for race.jsonl")
    parser.add_argument("--builds", default=",".join(BUILDS), help="labels of BUILDS, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cells", default="", help="names of CELLS, comma-separated (default: all)")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--sanitize", default="", help="only one small call of this build (for compute-sanitizer)")
    args = parser.parse_args(argv)
    if args.sanitize:
        return sanitize_call(args.sanitize)
    builds = {b: BUILDS[b] for b in args.builds.split(",") if b}
    cells = [c for c in CELLS if not args.cells or c[0] in args.cells.split(",")]
    if args.quick:
        cells = cells[:6]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    fails = 0 if args.no_checks else check_builds(builds, full=not args.quick)
    _say(f"[{time.perf_counter() - t0:.0f}s] checks: {fails} failure(s)")
    race(cells, builds, args.repeats, args.out)
    _say(f"[{time.perf_counter() - t0:.0f}s] done")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
