"""`torchrun --nproc-per-node 2 -m lab.ring.run`: the ring's checks, scaling, hidden communication and largest
sequence, forward and forward plus backward, one JSON record line per result (rank 0 writes them through
lab.record, into $LAB_SESSION_DIR). The stages that take gradients are lab.ring.stages_bwd.

Stages (--stages, default all):
- checks: the sharded result against single-device attention on the full sequence (lab.ops.attention on a
  GPU, float64 math on the CPU), judged by lab.check.compare against the float64 reference: causal and not,
  GQA, uneven shard boundaries; and a ring whose merge ignores the LSE weights, which must fail;
- grad-checks: dQ, dK, dV through ring_attention against float64 autograd, and the block-LSE backward that must fail;
- scale: rank 0 alone on the full sequence (t1), then the ring on all ranks (tW); efficiency = t1 / (W tW),
  for the forward and for forward plus backward;
- comm: the ring with the transfer overlapped, serial, and with no transfer (compute only), plus one call
  of each with a StepClock: the per-step timeline; comm_ratio = overlapped / compute-only; the forward ring,
  then the backward ring alone;
- torch-cp: torch's context parallel over SDPA against the lab's ring, forward plus backward (lab.ring.torch_cp);
- largest: S doubling from the scale length while the next call is predicted to fit in memory (peak bytes
  grow with S) and in --budget-s seconds (time grows with S^2), up to --max-seq; peak memory per rank. Then
  one layer's forward plus backward, on one device and on the ring. Outputs are checked to be finite only
  (no reference at these lengths); the values are checked at S <= 4097;
- train: lab.ring.train's one-block decoder trained with its sequence sharded over the ranks, and on rank 0
  alone with the whole sequence, from the same initial weights on the same batches: both loss curves.

Presets: `gpu` (bfloat16, S = 256k causal, D = 128, GQA 32/8 for scaling: long enough that one GPU's compute
outlasts a shard's transfer) and `cpu` (float64 math over gloo, tiny sizes: what CI and the chapter's CPU mode
run; its times are CPU wall-clock, not GPU numbers).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from dataclasses import dataclass

import torch

from .. import check, record
from . import attention as ring
from . import stages_bwd as bwd

CHAPTER = "n12_ring"
IMPL = "lab.dist.ring_attention"  # the records' name since the first sessions: old and new rows compare
STAGES = ("checks", "grad-checks", "scale", "comm", "torch-cp", "largest", "train")


@dataclass(frozen=True)
class Preset:
    dtype: torch.dtype
    checks: tuple  # (name, B, Hq, Hkv, S, D)
    scale: tuple  # (B, Hq, Hkv, S, D), causal
    largest_heads: int
    max_seq: int
    budget_s: float
    reps: int
    train: tuple = (6, 2, 37, 32, 32, 4, 2)  # steps, batch, S, vocab, model dim, heads, KV heads
    reps_bwd: int = 2  # forward plus backward timings (scale, comm, torch-cp)
    largest_bwd: tuple = (2, 1, 512, 2048)  # Hq, Hkv, first S, last S of one layer's forward plus backward
    budget_bwd_s: float = 5.0


PRESETS = {
    # 256k, GQA 32/8: the single device's forward plus backward holds q, k, v, dout, out and the gradients
    # (~10 GiB in bf16) plus the backward's float32 accumulators: it fits one 80 GB GPU, and the run records
    # its peak. 4M for the forward: a rank's (1, 8, 2M, 128) shard is 2^31 elements, where 32-bit element
    # offsets would wrap: the kernels' int arithmetic is not audited beyond it (largest_fwd_bwd stops below it).
    "gpu": Preset(torch.bfloat16, (("mha", 2, 8, 8, 4096, 128), ("gqa", 1, 8, 2, 3000, 128),
                                   ("uneven", 1, 4, 4, 4097, 64), ("short", 1, 4, 1, 67, 64)),
                  (1, 32, 8, 262144, 128), 8, 1 << 22, 30.0, 3, (200, 1, 16384, 256, 512, 8, 2),
                  reps_bwd=3, largest_bwd=(8, 2, 262144, 1 << 22), budget_bwd_s=40.0),
    "cpu": Preset(torch.float64, (("mha", 1, 2, 2, 64, 16), ("gqa", 1, 4, 2, 37, 16), ("uneven", 1, 2, 1, 61, 8)),
                  (1, 2, 2, 512, 32), 2, 2048, 5.0, 3),
}


class Run:
    """This rank's place in the run: device, world, rank, and the writer (rank 0 only)."""

    def __init__(self, device: torch.device, preset: Preset, tag: str):
        import torch.distributed as dist

        self.dist, self.device, self.preset, self.tag = dist, device, preset, tag
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.cuda = device.type == "cuda"
        self.label = "GPU, CUDA events, NCCL" if self.cuda else "CPU wall-clock, gloo"
        self.memo = {}  # what one stage measured that a later one reuses (the ring's forward plus backward)

    def write(self, row: dict) -> None:
        if self.rank == 0:  # a CPU run on a GPU machine is still a CPU row (gates never count it)
            env = record.fingerprint() if self.cuda else {**record.fingerprint(), "gpu": "cpu", "capability": None,
                                                          "sms": None, "driver": None}
            record.append({"impl": IMPL, "world_size": self.world, "tag": self.tag, "timer": self.label, **row},
                          chapter=CHAPTER, env=env)

    def say(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def attend(self, q, k, v, causal):
        """The single-device attention of the whole sequence (reference for checks, t1 for scaling)."""
        if self.cuda:
            from .. import ops
            return ops.attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
        return ring.reference_attend(q, k, v, causal)[0]

    def inputs(self, B, Hq, Hkv, S, D, seed, magnitude=1.0):
        gen = torch.Generator(device=self.device).manual_seed(seed)
        return [torch.randn(B, h, S, D, generator=gen, device=self.device, dtype=torch.float32).mul_(m).to(self.preset.dtype)
                for h, m in ((Hq, magnitude), (Hkv, magnitude), (Hkv, 1.0))]

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, fn, reps: int, everyone: bool = True) -> dict:
        """Median over reps of the slowest rank's wall time of fn() (synchronized), after one warm-up call."""
        fn()
        times = []
        for _ in range(reps):
            if everyone:
                self.dist.barrier()
            self.sync()
            start = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - start)
        if everyone:
            slowest = torch.tensor(times, dtype=torch.float64, device=self.device)
            self.dist.all_reduce(slowest, op=self.dist.ReduceOp.MAX)
            times = slowest.tolist()
        return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3, "reps": reps}

    def peak_gib(self) -> tuple[float, float]:
        """(peak bytes this rank held, its device's total), GiB: CUDA allocator, or the process's peak RSS."""
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) / 2**30, torch.cuda.mem_get_info(self.device)[1] / 2**30
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, total

    def gather(self, value):
        out = [None] * self.world
        self.dist.all_gather_object(out, value)
        return out


def prepare(run: Run, build_arch: str | None = None) -> None:
    """Build the kernels the run calls before any stage times them. Every rank asks at once: the kernel cache
    lets one process compile a key while the others wait for its library (lab/cache_files.py).

    build_arch (e.g. sm_80; nvcc, no GPU): each rank compiles, for that target, the forward kernels the ring
    calls on such a GPU; the cold-cache check of concurrent ranks on a machine without one."""
    if build_arch:
        from .. import build, registry
        capability = tuple(int(c) for c in build_arch.removeprefix("sm_").rstrip("a"))
        versions = sorted({registry.default_attention_version(D, sq, causal, capability)
                           for D in (64, 128) for causal in (False, True) for sq in (64, 8192)})
        for version in versions:
            lib = build.build_kernel(registry.FWD[version].source, arch=build.check_arch_flags(build_arch))
            print(f"rank {run.rank}: {version} for {build_arch} {'from the cache' if lib.cached else 'built'}: "
                  f"{lib.path.name}", flush=True)
    if not run.cuda:
        return
    from .. import ops
    for D in (64, 128):
        for causal in (False, True):
            for sq in (64, 8192):
                q, k, v = run.inputs(1, 2, 2, sq, D, seed=0)
                ops.attention(q, k, v, is_causal=causal, return_lse=True)
            q, k, v = run.inputs(1, 4, 2, 256, D, seed=0)  # the backward kernels (its GQA path too)
            bwd.fwd_bwd_call(lambda *t: bwd.single_attend(run, *t, causal=causal), q, k, v, q)()
    run.sync()
    run.dist.barrier()


def _ring_on(run, q, k, v, causal, **kw):
    return ring.ring_attention(*(ring.shard(t, run.world, run.rank, causal) for t in (q, k, v)), is_causal=causal,
                               seqlen=q.shape[2], **kw)


def checks(run: Run) -> None:
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
                           "impl": f"{IMPL} (merge without LSE weights)", "check": bad})
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


def scale(run: Run) -> None:
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


def _yardsticks(run: Run, q, k, v) -> dict:
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


def comm(run: Run) -> None:
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


def largest(run: Run, max_seq: int, budget_s: float) -> None:
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
        grow = max(r["peak_gib"] * 2 / r["total_gib"] for r in per_rank)
        if seconds * 4 > budget_s:
            stopped = f"the next length (2x) would take ~{seconds * 4:.0f} s > --budget-s {budget_s:g}"
            break
        if grow > 0.92:
            stopped = f"the next length (2x) would need ~{grow:.0%} of a rank's memory"
            break
        S *= 2
    if best:
        worst = max(best["ranks"], key=lambda r: r["peak_gib"])
        fits = int(best["S"] * 0.92 * worst["total_gib"] / worst["peak_gib"]) if worst["peak_gib"] else None
        run.write({"kind": "ring-largest", "S": best["S"], "seconds": best["seconds"], "memory": best["ranks"],
                   "peak_gib": worst["peak_gib"], "total_gib": worst["total_gib"], "stopped": stopped,
                   "projected_fit_tokens": fits, "case": {"Hq": H, "D": D, "causal": True}})
        run.say(f"largest run: S={best['S']} ({stopped}); by memory alone ~{fits} tokens would fit (projection)")


STEPS = {"checks": (checks,), "grad-checks": (bwd.grad_checks,), "scale": (scale, bwd.scale_fwd_bwd),
         "comm": (comm, bwd.comm_bwd), "torch-cp": (bwd.torch_cp_race,), "largest": (largest, bwd.largest_fwd_bwd),
         "train": (bwd.train,)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m lab.ring.run", description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="default: gpu on CUDA, cpu otherwise")
    parser.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    parser.add_argument("--tag", default="", help="copied into every row (the chapter finds its run's rows by it)")
    parser.add_argument("--max-seq", type=int, help="largest S the largest stage tries")
    parser.add_argument("--budget-s", type=float, help="seconds one call of the largest stage may be predicted to take")
    parser.add_argument("--build-arch", help="first compile the ring's forward kernels for this target (sm_80, "
                                             "sm_90a) on every rank at once; needs nvcc, not a GPU")
    args = parser.parse_args(argv)
    device = ring.init_process_group(args.device)
    preset = PRESETS[args.preset or ("gpu" if device.type == "cuda" else "cpu")]
    run = Run(device, preset, args.tag or record.new_run_id())
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = set(stages) - set(STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}")
    run.say(f"lab.ring.run: world {run.world}, {run.label}, preset {args.preset or device.type}, stages {stages}, "
            f"multicast off: {ring.MULTICAST_OFF}")
    try:
        prepare(run, args.build_arch)
        for stage in stages:
            for step in STEPS[stage]:
                if step is largest:
                    largest(run, args.max_seq or preset.max_seq, args.budget_s or preset.budget_s)
                else:
                    step(run)
            run.dist.barrier()
    finally:
        run.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
