"""Chapter n12_ring's side of the ring: launching lab.ring.run under torchrun from a cell, choosing which run
to show, the layout and timeline figures, the tables and the findings (the notebook defines no helpers).

Which run a chapter shows: on a machine with at least `world` GPUs, the run it launches there. Elsewhere
(a CPU, or one GPU) it says so, shows the latest recorded multi-GPU session if there is one under outputs/,
and launches the same program over gloo on the CPU with tiny sizes, whose times are CPU wall-clock and are
labelled so: they show the mechanism, never a GPU number.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

from .. import paths, record
from ..publish.tables import Table
from . import attention as ring

CHAPTER = "n12_ring"
TARGETS = {"efficiency": 0.85, "efficiency_fwd_bwd": 0.9, "comm_ratio": 1.1, "torch_cp": 1.0, "tokens": 1 << 20}
# The command that runs this chapter as a session on a two-GPU machine. It installs the wheels copied into .whl/ (the
# machine has no network), and the caller exports LAB_COMMIT=$(git rev-parse --short HEAD) first when the copy has no
# usable .git. It writes $OUT/topology.txt (nvidia-smi topo -m), $OUT/n12_session.log and $OUT/n12_session.tgz, and
# stops the session after N12_TIMEOUT seconds (default 480; on SIGTERM the session still writes session.json and the
# tarball). Back at the repository root: tar xzf n12_session.tgz, python -m lab log, commit outputs/sessions/<id>/.
# The `gpu` preset's stages, in order: kernel builds, output checks, gradient checks, scaling at S = 256k causal
# D = 128 GQA 32/8, communication (forward ring, then the backward ring alone), torch's context parallel against the
# lab's ring, the largest sequence (doubling from 256k while the next call is predicted under 30 s; one layer's
# forward plus backward while the next is predicted under 40 s), and 200 training steps at S = 16k; 3 timing
# repetitions after a warm-up. The records alone, without papermill:
#   LAB_SESSION_DIR=$OUT/ring python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
#     -m lab.ring.run --device cuda
# (--stages picks some). The CPU rehearsal of the same path (gloo, tiny sizes, about 40 s):
#   python -m lab session --chapters n12_ring --device cpu --outputs /tmp/n12
# NVLink multicast stays off (lab.ring.comm.init_process_group sets NCCL_NVLS_ENABLE=0 before NCCL starts). First
# run: session 20261126-021134-h200-cc4abeb on two H200s (NV18), 4 min 14 s, every n12 gate passing.
SESSION_COMMAND = ("python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && "
                   "export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx || exit; "
                   "nvidia-smi topo -m > $OUT/topology.txt 2>&1; "
                   "timeout ${N12_TIMEOUT:-480} python3 -m lab session --chapters n12_ring --device cuda --no-log "
                   "--tarball $OUT/n12_session.tgz > $OUT/n12_session.log 2>&1; tail -40 $OUT/n12_session.log")


def launch(world: int, device: str, extra=(), timeout: float = 900) -> list[dict]:
    """torchrun --standalone --nproc-per-node world -m lab.ring.run; its rows (appended to this run's records)."""
    tag = uuid.uuid4().hex[:12]
    env = {**os.environ, "LAB_SESSION_DIR": str(record.run_dir()), "LAB_CHAPTER": CHAPTER, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(paths.ROOT), os.environ.get("PYTHONPATH")]))}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run never touches (or claims to be) a GPU
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
               "-m", "lab.ring.run", "--device", device, "--tag", tag, *extra]
    logs = [record.run_dir() / f"torchrun-{tag}.{ext}" for ext in ("log", "err")]  # kept even if it is killed
    with open(logs[0], "w") as out, open(logs[1], "w") as err:
        done = subprocess.run(command, cwd=paths.ROOT, env=env, stdout=out, stderr=err, text=True, timeout=timeout)
    print(logs[0].read_text(), end="")
    if done.returncode:
        raise RuntimeError(f"torchrun exited with {done.returncode}:\n{logs[1].read_text()[-3000:]}")
    return [r for r in record.read(record.run_dir() / record.RECORDS) if r.get("tag") == tag]


def runs(chapter, world: int = 2, extra=()) -> dict:
    """{label: rows} of the runs to show (see the module's docstring); prints what it did and skipped."""
    import torch

    gpus = torch.cuda.device_count() if chapter.gpu else 0
    if gpus >= world:
        return {f"this run ({world} GPUs)": launch(world, "cuda", extra)}
    if chapter.gpu:
        print(f"[skipped: the ring on {world} GPUs needs {world} GPUs; this machine has {gpus}]")
    else:
        chapter.skip(f"the ring on {world} GPUs (NCCL)")
    shown = {}
    recorded = [r for r in chapter.recorded() if (r.get("world_size") or 0) >= 2]
    if recorded:
        shown[f"recorded GPU session {recorded[0]['session']}"] = recorded
    else:
        print(f"no multi-GPU run of {CHAPTER} is recorded under outputs/ yet: what follows is the CPU run only")
    shown[f"this run (CPU, gloo, {world} processes)"] = launch(world, "cpu", timeout=300)
    return shown


def of(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r.get("kind") == kind]


def is_cpu(rows: list[dict]) -> bool:
    return any((r.get("env") or {}).get("gpu", "cpu") == "cpu" for r in rows)


# ------------------------------------------------------------------ figures

def layout_figure(seqlen: int = 16, world: int = 4, path=None):
    """Who owns which chunk (contiguous against zig-zag), and the causal work per rank of each layout."""
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 2.8), gridspec_kw={"width_ratios": [3, 2]})
    colors = plt.get_cmap("tab10")
    for y, (name, zig) in enumerate((("contiguous", False), ("zig-zag", True))):
        for rank in range(world):
            chunks = ring.shard_chunks(seqlen, world, rank, True) if zig else [ring.chunk_bounds(seqlen, world)[rank]]
            for b, e in chunks:
                left.broken_barh([(b, e - b)], (y - 0.35, 0.7), color=colors(rank), edgecolor="white")
                left.text((b + e) / 2, y, f"r{rank}", ha="center", va="center", fontsize=8, color="white")
    left.set_yticks([0, 1], ["contiguous", "zig-zag"])
    left.set_xlabel(f"position in the sequence (S = {seqlen}, {2 * world} chunks for zig-zag)")
    left.set_title(f"which rank holds which positions, world {world}", fontsize=9)
    width = 0.4
    for shift, (name, zig) in ((-width / 2, ("contiguous", False)), (width / 2, ("zig-zag", True))):
        work = ring.causal_work(seqlen * 1024, world, zigzag=zig)
        mean = sum(work) / len(work)
        right.bar([r + shift for r in range(world)], [w / mean for w in work], width, label=name)
    right.axhline(1.0, color="gray", lw=0.8, ls=":")
    right.set_xticks(range(world), [f"rank {r}" for r in range(world)])
    right.set_ylabel("causal work / mean")
    right.set_title("query-key pairs each rank computes", fontsize=9)
    right.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def timeline_figure(rows: list[dict], path=None, which: str = "forward"):
    """Per-step compute and transfer intervals of every rank, one panel per mode, from the StepClock rows of
    the forward ring or of the backward's (which; in the backward, transfers s >= W carry the dK/dV sums)."""
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    lines = [r for r in of(rows, "ring-timeline") if r.get("pass", "forward") == which]
    modes = [m for m in ("overlap", "serial", "compute-only") if any(r["mode"] == m for r in lines)]
    if not modes:
        return None
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 1.2 + 1.1 * len(modes)), sharex=True, squeeze=False)
    for ax, mode in zip(axes[:, 0], modes):
        lanes = []
        for r in sorted((r for r in lines if r["mode"] == mode), key=lambda r: r["rank"]):
            for what, color in (("compute", "tab:blue"), ("comm", "tab:orange")):
                done = [s for s in r["steps"] if f"{what}_end_ms" in s]
                spans = [(s[f"{what}_start_ms"], s[f"{what}_end_ms"] - s[f"{what}_start_ms"]) for s in done]
                ax.broken_barh(spans, (len(lanes) - 0.35, 0.7), color=color, edgecolor="black", lw=0.4)
                for step, (begin, width) in zip((s["step"] for s in done), spans):
                    ax.text(begin + width / 2, len(lanes), f"s{step}", ha="center", va="center", fontsize=6, color="white")
                lanes.append(f"rank {r['rank']} {what}")
        ax.set_yticks(range(len(lanes)), lanes, fontsize=7)
        ax.set_title(mode, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms from the start of the call (each rank's own clock)")
    fig.suptitle(f"{which} ring steps: {lines[0].get('timer', '?')}" + (" (CPU run: not GPU timing)" if is_cpu(lines) else ""),
                 fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


# ------------------------------------------------------------------ tables and findings

def check_table(rows: list[dict]) -> Table:
    found = of(rows, "check")
    expected = sum(r["check"]["passed"] != bool(r.get("expected_fail")) for r in found)
    return Table(["case", "S", "Hq", "Hkv", "D", "causal", "passed", "max abs err", "single device's", "must fail"],
                 [[r["case"]["name"], r["case"]["S"], r["case"]["Hq"], r["case"]["Hkv"], r["case"]["D"], r["case"]["causal"],
                   r["check"]["passed"], r["check"]["max_abs"], r["check"]["sdpa_max_abs"], bool(r.get("expected_fail"))]
                  for r in found], f"{expected}/{len(found)} checks as expected")


def timing_table(rows: list[dict]) -> Table:
    """Scaling and communication, forward and forward plus backward (the backward ring alone for its transfers):
    one line per measured call, median ms of the slowest rank."""
    lines = []
    for kind, what in (("ring-scale", "forward"), ("ring-scale-fwd-bwd", "forward+backward")):
        for r in of(rows, kind):
            c = r["case"]
            shape = f"S={c['S']:,} Hq={c['Hq']} Hkv={c['Hkv']}"
            lines += [[what, f"full sequence, 1 device, {shape}", r["single"]["median_ms"], r["tflops_single"], None],
                      [what, f"ring, {r['world_size']} ranks", r["timing"]["median_ms"], r["tflops"], r["efficiency"]]]
    for kind, what in (("ring-comm", "forward"), ("ring-comm-bwd", "backward")):
        for r in of(rows, kind):
            lines += [[what, "ring, transfer overlapped", r["timing"]["median_ms"], None, r["comm_ratio"]],
                      [what, "ring, transfer then compute (serial)", r["serial"]["median_ms"], None, r["serial_ratio"]],
                      [what, "ring, no transfer (compute only)", r["compute_only"]["median_ms"], None, 1.0]]
    return Table(["pass", "call", "median ms", "TFLOP/s", "efficiency, or / compute-only"], lines)


def largest_table(rows: list[dict]) -> Table:
    return Table(["S", "seconds", "finite", "peak GiB per rank", "GiB per device"],
                 [[r["case"]["S"], r["seconds"], r["finite"], ", ".join(f"{m['peak_gib']:.2f}" for m in r["memory"]),
                   r["memory"][0]["total_gib"]] for r in of(rows, "ring-largest-step")])


def _met(value, op: str, target, cpu: bool) -> str:
    if cpu:
        return "target judged on GPUs only"
    ok = value >= target if op == ">=" else value <= target
    return f"target {op} {target:g}: {'met' if ok else 'missed'}"


def findings(rows: list[dict]) -> list[str]:
    """The chapter's closing sentences, from one run's rows."""
    cpu, lines = is_cpu(rows), []
    for kind, label, selftest in (
            ("check", "checks: {}/{} pass against single-device attention (causal and not, GQA, uneven shards)",
             "the merge without LSE weights"),
            ("grad-check", "gradient checks (dQ, dK, dV through autograd): {}/{} pass against single-device "
             "gradients", "a backward with each block's own LSE")):
        good = [r for r in of(rows, kind) if not r.get("expected_fail")]
        bad = [r for r in of(rows, kind) if r.get("expected_fail")]
        if good:
            lines.append(label.format(sum(r["check"]["passed"] for r in good), len(good)) + f"; {selftest} fails "
                         f"{sum(not r['check']['passed'] for r in bad)}/{len(bad)}")
    for r in of(rows, "ring-scale"):
        c = r["case"]
        lines.append(f"scaling at S={c['S']} causal D={c['D']} over {r['world_size']} ranks: efficiency "
                     f"{r['efficiency']:.3f} (1 device {r['single']['median_ms']:.1f} ms, {r['world_size']} ranks "
                     f"{r['timing']['median_ms']:.1f} ms); {_met(r['efficiency'], '>=', TARGETS['efficiency'], cpu)}")
    for r in of(rows, "ring-comm"):
        lines.append(f"communication: overlapped / compute-only = {r['comm_ratio']:.3f}, serial / compute-only = "
                     f"{r['serial_ratio']:.3f}; {_met(r['comm_ratio'], '<=', TARGETS['comm_ratio'], cpu)}")
    from .report_bwd import findings_bwd
    lines += findings_bwd(rows, lambda value, op, key: _met(value, op, TARGETS[key], cpu))
    for r in of(rows, "ring-largest"):
        lines.append(f"largest sequence run: {r['S']:,} tokens in {r['seconds']:.2f} s over {r['world_size']} ranks, "
                     f"peak memory per rank {r['peak_gib']:.1f} of {r['total_gib']:.0f} GiB; stopped: {r['stopped']}; "
                     f"{_met(r['S'], '>=', TARGETS['tokens'], cpu)}")
    if cpu and lines:
        lines.append("(a CPU run over gloo with tiny sizes, timed by wall-clock: it shows the mechanism, not GPU "
                     "numbers; the targets are judged on a multi-GPU session's rows only)")
    return lines or ["no rows"]
