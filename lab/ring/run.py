"""`torchrun --nproc-per-node 2 -m lab.ring.run`: the ring's checks, scaling, hidden communication and largest
sequence, forward and forward plus backward, one JSON record line per result (rank 0 writes them through
lab.record, into $LAB_SESSION_DIR). The stages live in lab.ring.stages_fwd (the forward's) and lab.ring.stages_bwd
(those that take gradients); this module holds the presets, the rank's Run, the kernel builds and the entry.

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
import sys
import time
from dataclasses import dataclass

import torch

from .. import record
from . import attention as ring
from . import stages_bwd as bwd
from . import stages_fwd as fwd

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

        self.dist, self.device, self.preset, self.tag, self.impl = dist, device, preset, tag, IMPL
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
            line = (f"rank {run.rank}: {version} for {build_arch} {'from the cache' if lib.cached else 'built'}: "
                    f"{lib.path.name}\n")
            sys.stdout.flush()
            os.write(sys.stdout.fileno(), line.encode())  # one write: the ranks share the stream, lines stay whole
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


STEPS = {"checks": (fwd.checks,), "grad-checks": (bwd.grad_checks,), "scale": (fwd.scale, bwd.scale_fwd_bwd),
         "comm": (fwd.comm, bwd.comm_bwd), "torch-cp": (bwd.torch_cp_race,),
         "largest": (fwd.largest, bwd.largest_fwd_bwd),
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
                if step is fwd.largest:
                    fwd.largest(run, args.max_seq or preset.max_seq, args.budget_s or preset.budget_s)
                else:
                    step(run)
            run.dist.barrier()
    finally:
        run.dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
