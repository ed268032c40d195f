"""lab.ring.run's forward stages (every rank runs each; rank 0 writes the rows):

- checks: the sharded output against the float64 reference, single-device attention as the yardstick; a ring
  whose merge ignores the LSE weights must fail;
- scale: rank 0 alone on the full sequence (t1; and SDPA's fused backends), then the ring on all ranks (tW);
- comm: the ring with the transfer overlapped, serial and absent, and one StepClock call of each;
- largest: S doubling while the next call is predicted to fit in memory and in the time budget.
"""
from __future__ import annotations

import statistics
import time

import torch

from .. import check, record
from . import attention as ring
from . import growth


def _ring_on(run, q, k, v, causal, **kw):
    return ring.ring_attention(*(ring.shard(t, run.world, run.rank, causal) for t in (q, k, v)), is_causal=causal,
                               seqlen=q.shape[2], **kw)


def checks(run) -> None:
    for seed, (name, B, Hq, Hkv, S, D) in enumerate(run.preset.checks):
        for causal in (False, True):
            q, k, v = run.inputs(B, Hq, Hkv, S, D, seed=seed)
            mine = _ring_on(run, q, k, v, causal)
            wrong = _ring_on(run, q, k, v, causal, attend=_no_lse(run)) if name == "mha" else None
            shards = run.gather((mine.cpu(), None if wrong is None else wrong.cpu()))
            if run.rank:
                continue
            ref = check.reference(q, k, v, causal).cpu()
            yardstick = run.attend(q, k, v, causal).cpu()
            case = {"name": f"ring-{name}", "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal,
                    "dtype": str(run.preset.dtype).replace("torch.", "")}
            result = check.compare(ring.unshard([s[0] for s in shards], S, causal), ref, yardstick)
            run.write({"kind": "check", "case": case, "check": result})
            run.say(f"check {case['name']:<12} S={S:<5} {'causal' if causal else 'full  '} "
                    f"{'PASS' if result['passed'] else 'FAIL'} max_abs {result['max_abs']:.2e} "
                    f"(single device {result['sdpa_max_abs']:.2e})")
            if wrong is not None:
                bad = check.compare(ring.unshard([s[1] for s in shards], S, causal), ref, yardstick)
                run.write({"kind": "check", "case": {**case, "name": "ring-selftest-no-lse"}, "expected_fail": True,
                           "impl": f"{run.impl} (merge without LSE weights)", "check": bad})
                run.say(f"self-test: a merge without LSE weights {'fails, as it must' if not bad['passed'] else 'PASSES: the check is blind'}"
                        f" (max_abs {bad['max_abs']:.2e})")


def _no_lse(run):
    """The deliberately wrong ring: every partial gets the same weight (its LSE replaced by 0)."""
    def attend(q, k, v, causal):
        out, lse = (ring.lab_attend if run.cuda else ring.reference_attend)(q, k, v, causal)
        return out, torch.zeros_like(lse)
    return attend


def _flops(B, Hq, S, D, causal) -> float:
    return 4 * B * Hq * S * S * D / (2 if causal else 1)


def scale(run) -> None:
    B, Hq, Hkv, S, D = run.preset.scale
    q, k, v = run.inputs(B, Hq, Hkv, S, D, seed=1)
    case = {"name": f"ring-scale-S{S}", "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": True,
            "dtype": str(run.preset.dtype).replace("torch.", "")}
    one = run.timed(lambda: run.attend(q, k, v, True), run.preset.reps, everyone=False) if run.rank == 0 else None
    sdpa = _yardsticks(run, q, k, v) if run.rank == 0 else {}
    run.dist.barrier()
    shards = [ring.shard(t, run.world, run.rank, True) for t in (q, k, v)]
    del q, k, v
    many = run.timed(lambda: ring.ring_attention(*shards, is_causal=True, seqlen=S), run.preset.reps)
    if run.rank == 0:
        eff = record.scaling_efficiency(one["median_ms"], many["median_ms"], run.world)
        flops = _flops(B, Hq, S, D, True)
        ratios = {b: t["median_ms"] / many["median_ms"] for b, t in sdpa.items() if "median_ms" in t}
        run.write({"kind": "ring-scale", "case": case, "single": one, "timing": many, "efficiency": eff,
                   "tflops_single": flops / one["median_ms"] / 1e9, "tflops": flops / many["median_ms"] / 1e9,
                   "sdpa": sdpa, "ratios": ratios})
        run.say(f"scaling at S={S} causal D={D}: 1 device {one['median_ms']:.1f} ms, {run.world} devices "
                f"{many['median_ms']:.1f} ms, efficiency {eff:.3f} ({run.label})")


# What the ring is for beating: SDPA on one device over the whole sequence. On a GPU its fused backends;
# math would materialise the S x S scores (128 GiB at S = 256k). On the CPU math is the only backend.
YARDSTICKS = {"cuda": ("flash", "cudnn", "efficient"), "cpu": ("math",)}


def _yardsticks(run, q, k, v) -> dict:
    """{sdpa-<backend>: timing, or why it could not run} on this rank alone, the whole sequence, causal."""
    from .. import bench

    found = {}
    for backend in YARDSTICKS[run.device.type]:
        try:
            found[f"sdpa-{backend}"] = run.timed(bench.sdpa_runner(backend, q, k, v, is_causal=True),
                                                 run.preset.reps, everyone=False)
        except (RuntimeError, ValueError) as err:  # a backend that rejects the shape, or out of memory
            found[f"sdpa-{backend}"] = {"unsupported": str(err).splitlines()[0][:120]}
            if run.cuda:
                torch.cuda.empty_cache()
    return found


def comm(run) -> None:
    B, Hq, Hkv, S, D = run.preset.scale
    shards = [ring.shard(t, run.world, run.rank, True) for t in run.inputs(B, Hq, Hkv, S, D, seed=2)]
    modes = {"overlap": {}, "serial": {"overlap": False}, "compute-only": {"communicate": False}}
    times, lines = {}, {}
    for mode, kw in modes.items():
        call = lambda kw=kw, **extra: ring.ring_attention(*shards, is_causal=True, seqlen=S, **kw, **extra)  # noqa: E731
        times[mode] = run.timed(call, run.preset.reps)
        run.dist.barrier()
        run.sync()
        clock = ring.StepClock(run.cuda)
        call(clock=clock)
        lines[mode] = run.gather(clock.steps())
    kv_bytes = 2 * shards[1].numel() * shards[1].element_size()
    ratio = times["overlap"]["median_ms"] / times["compute-only"]["median_ms"]
    for mode, per_rank in lines.items():
        for rank, steps in enumerate(per_rank):
            run.write({"kind": "ring-timeline", "mode": mode, "rank": rank, "steps": steps, "S": S})
    transfer_ms = [s["comm_end_ms"] - s["comm_start_ms"] for steps in lines["serial"] for s in steps if "comm_end_ms" in s]
    run.write({"kind": "ring-comm", "case": {"name": f"ring-comm-S{S}", "S": S, "D": D, "Hq": Hq, "causal": True},
               "timing": times["overlap"], "serial": times["serial"], "compute_only": times["compute-only"],
               "comm_ratio": ratio, "serial_ratio": times["serial"]["median_ms"] / times["compute-only"]["median_ms"],
               "kv_bytes_per_step": kv_bytes,
               "transfer_ms": statistics.median(transfer_ms) if transfer_ms else None})
    run.say(f"communication at S={S}: overlapped {times['overlap']['median_ms']:.1f} ms, serial "
            f"{times['serial']['median_ms']:.1f} ms, compute only {times['compute-only']['median_ms']:.1f} ms: "
            f"overlapped / compute-only = {ratio:.3f} ({run.label})")


def largest(run, max_seq: int, budget_s: float) -> None:
    B, _, _, S, D = run.preset.scale
    H = run.preset.largest_heads
    stopped, best = f"reached --max-seq {max_seq}", None
    while S <= max_seq:
        if run.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(run.device)
        gen = torch.Generator(device=run.device).manual_seed(run.rank)
        n = sum(e - b for b, e in ring.shard_chunks(S, run.world, run.rank, True))
        q, k, v = (torch.randn(B, H, n, D, generator=gen, device=run.device, dtype=run.preset.dtype) for _ in range(3))
        run.dist.barrier()
        start = time.perf_counter()
        out = ring.ring_attention(q, k, v, is_causal=True, seqlen=S)
        run.sync()
        seconds = time.perf_counter() - start
        finite = bool(torch.isfinite(out).all())
        del q, k, v, out
        peak, total = run.peak_gib()
        per_rank = run.gather({"peak_gib": peak, "total_gib": total, "seconds": seconds, "finite": finite})
        seconds = max(r["seconds"] for r in per_rank)
        best = {"S": S, "seconds": seconds, "ranks": per_rank}
        run.write({"kind": "ring-largest-step", "case": {"name": f"ring-S{S}", "S": S, "Hq": H, "D": D, "causal": True},
                   "seconds": seconds, "memory": per_rank, "finite": all(r["finite"] for r in per_rank)})
        run.say(f"S={S}: {seconds:.2f} s, peak memory per rank "
                + ", ".join(f"{r['peak_gib']:.1f}/{r['total_gib']:.0f} GiB" for r in per_rank))
        reason = growth.stop_reason(seconds, per_rank, budget_s)
        if reason:
            stopped = reason
            break
        S *= 2
    if best:
        worst, fits = growth.projection(best)
        run.write({"kind": "ring-largest", "S": best["S"], "seconds": best["seconds"], "memory": best["ranks"],
                   "peak_gib": worst["peak_gib"], "total_gib": worst["total_gib"], "stopped": stopped,
                   "projected_fit_tokens": fits, "case": {"Hq": H, "D": D, "causal": True}})
        run.say(f"largest run: S={best['S']} ({stopped}); by memory alone ~{fits} tokens would fit (projection)")
