"""Writes chapters/n12_ring.ipynb (sources only, no outputs): python tests/cuda/ring_make_chapter.py"""
from __future__ import annotations

from pathlib import Path

import nbformat

nb = nbformat.v4.new_notebook()
nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                   language_info={"name": "python"},
                   lab={"min_gpus": 2})  # the book never lets a 1-GPU session's run replace a 2-GPU one


def add(kind: str, text: str, tags=None) -> None:
    make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
    cell = make(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = tags
    cell["id"] = f"n12-{len(nb.cells):02d}"  # stable ids: regenerating gives no diff
    nb.cells.append(cell)


add("md", r"""
# n12 · Beyond one GPU: ring attention

**What you will learn:** how attention over a sequence too long for one GPU is split along the sequence
across GPUs (context parallelism), how the pieces are merged with the same log-sum-exp algebra as split-K
decoding, why a causal mask needs a load-balanced layout (zig-zag), how the K/V transfer hides under the
compute, and what the ring measures on two GPUs: correctness against one GPU, scaling efficiency,
hidden communication and the longest sequence that fits.

## The algorithm

Each of the W ranks holds one shard of Q, K and V, (B, H, S/W, D). Its queries must see every key, so the
K/V shards travel around a ring: at each step a rank sends the shard it holds to rank + 1 and receives
the one of rank − 1 (`torch.distributed.batch_isend_irecv`), and meanwhile runs our forward kernel
(`lab.ops.attention(..., return_lse=True)`) of its queries against the shard already there. Every step
gives a partial (O_j, L_j) over a disjoint set of keys; they merge exactly as the split-K combine does:

    L = log(e^La + e^Lb),   O = e^(La − L)·Oa + e^(Lb − L)·Ob      (a part that saw no key: L = −inf, weight 0)

```
kv = stack(K_r, V_r)
for step in 0 .. W-1:
    owner = (r - step) mod W                      # whose shard is here
    if step < W-1: start send(kv -> r+1), recv(kv' <- r-1)      # on the comm stream (GPU)
    for each query chunk i of r, key chunk j of owner:
        if visible(i, j): (O_i, L_i) = merge((O_i, L_i), attention(Q_i, K_j, V_j, causal = (i == j)))
    wait for the transfer; kv = kv'               # the compute stream waits only here
```

Memory per rank grows with S/W, not S: no rank ever holds more than two K/V shards. The code is
`lab.dist.ring_attention`; the transport (process group, comm stream, per-step clock) is `lab.dist_comm`.

## The layout

Non-causal, contiguous shards (boundaries at ⌊r·S/W⌋, so any S works) balance the work. Under a causal mask
they do not: the last rank's queries see every key, the first rank's only its own, so rank W − 1 does
about 2W − 1 times the work of rank 0 and the ring runs at the speed of the slowest rank. **Zig-zag**
cuts the sequence into 2W chunks and gives rank r chunks r and 2W − 1 − r: an early chunk with a late one,
so every rank does the same work (up to one chunk of rounding). Every (query chunk, key chunk) pair is then
either fully visible, the causal diagonal (the same chunk), or fully masked, so the kernel only ever runs
full or top-left-causal blocks of equal length. Striped layouts (position p on rank p mod W) balance too,
but every block is then a partial mask the kernel would have to take as an offset: zig-zag keeps our
forward kernel as it is.
""")

add("code", """
device = "auto"  # "auto" | "cuda" | "cpu"
world = 2  # ranks (GPUs on a multi-GPU machine; processes over gloo on the CPU)
cases = "quick"  # "full": the largest-sequence search may run calls of up to 300 s (quick: 90 s)
""", tags=["parameters"])

add("code", """
import torch
from lab import chapter, dist, dist_report, record
ch = chapter.start("n12_ring", device)
print(f"NVLink multicast off for NCCL: {dist.multicast_off()}")
""")

add("md", """
## Who holds what, and the causal work per rank

S = 16 positions over 4 ranks (the chapter's figure; the run below uses W = `world`), then the query-key
pairs each rank computes at S = 16k under a causal mask, contiguous against zig-zag.
""")

add("code", """
dist_report.layout_figure(16, 4, path=record.figure_path("n12_layout.png"))
for name, zig in (("contiguous", False), ("zig-zag", True)):
    work = dist.causal_work(16384, 4, zigzag=zig)
    print(f"{name:10}: causal work per rank {work}, slowest / fastest {max(work) / min(work):.2f}")
""")

add("md", """
## The algorithm, emulated (CPU and GPU)

`lab.dist.emulate_ring` runs every rank's steps in one process, float64, against full attention on the whole
sequence: world sizes 2-4, causal (zig-zag) and not, GQA (4 query heads on 2 KV heads), S = 61 so no shard
boundary is even.
""")

add("code", """
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, h, 61, 16, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
for world_e in (2, 3, 4):
    for causal in (False, True):
        err = float((dist.emulate_ring(q, k, v, world_e, causal) - dist.reference_attend(q, k, v, causal)[0]).abs().max())
        record.append({"kind": "emulation", "impl": "lab.dist.emulate_ring", "world_size": world_e, "causal": causal, "max_abs": err})
        print(f"world {world_e}, {'causal' if causal else 'full  '}: max abs error against full attention {err:.1e}")
""")

add("md", """
## The run

`lab.dist_run` under `torchrun` (one process per rank): checks, scaling, communication, largest sequence.
On a machine with at least `world` GPUs it runs there over NCCL, the forward kernel on each rank's GPU.
Elsewhere the chapter shows the latest recorded multi-GPU session, if there is one, and runs the same
program over gloo on the CPU with tiny sizes and float64 math, timed by wall-clock: that run shows the
mechanism (the checks are real; the times are not GPU numbers).
""")

add("code", """
shown = dist_report.runs(ch, world, ["--budget-s", "300"] if cases == "full" else [])
print("runs shown: " + "; ".join(f"{label} ({len(rows)} rows)" for label, rows in shown.items()))
""")

add("md", """
## Checks

The ring's output on the whole sequence (gathered from every rank) against the float64 reference, judged
by the error of single-device attention on the full sequence (`lab.check.compare`: max abs error ≤ 3× the
single device's + 2⁻¹⁴, no NaN): MHA, GQA, uneven shard boundaries and a short sequence, causal and not.
A ring whose merge ignores the LSE weights must fail.
""")

add("code", """
for label, rows in shown.items():
    print(label)
    display(dist_report.check_table(rows))
""")

add("md", """
## The overlap timeline

One call of the ring per mode, every step's compute and transfer as recorded by `lab.dist.StepClock`: CUDA
events on the stream that did the work on GPUs; wall-clock on the CPU (a helper thread waits for gloo's
transfer, so its end is timed as it happens). *overlap*: the transfer of the next shard runs under the
compute of this one; *serial*: each transfer finishes before the compute starts; *compute-only*: no transfer.
""")

add("code", """
for label, rows in shown.items():  # each figure's title names its clock (CUDA events, or CPU wall-clock)
    dist_report.timeline_figure(rows, path=record.figure_path(f"n12_timeline_{'cpu' if dist_report.is_cpu(rows) else 'gpu'}.png"))
""")

add("md", """
## Scaling and hidden communication

Scaling: `lab.ops.attention` on the whole sequence on one device (rank 0 alone; t1), then the ring on all
ranks (tW); efficiency = t1 / (W · tW), target ≥ 0.85 at S = 256k, causal, D = 128 on two GPUs.
Communication hidden: the overlapped ring over the same steps with no transfer, target ≤ 1.1×. Medians of
the slowest rank's time per call.
""")

add("code", """
for label, rows in shown.items():
    print(label)
    display(dist_report.timing_table(rows))
""")

add("md", """
## The largest sequence

S doubles from the scaling length while the next call is predicted to fit in memory and in the time
budget (peak memory grows with S, time with S²); the peak memory each rank held is measured (the CUDA
allocator's peak on GPUs, the process's peak RSS on the CPU).
""")

add("code", """
for label, rows in shown.items():
    print(label)
    display(dist_report.largest_table(rows))
""")

add("md", """
## Findings

Computed from the rows of each run shown (`lab.dist_report.findings`), not typed in.
""")

add("code", """
for label, rows in shown.items():
    print(f"{label}:")
    print("\\n".join("  " + line for line in dist_report.findings(rows)))
""")

add("md", """
## Running it on two GPUs

One device call on `nvidia-h200-x2` runs this chapter as a session (carry `.whl`, see the README's
"Ring attention on two GPUs"); unpack the tarball it leaves in `$OUT` at the repository root, run
`python -m lab log` and commit the session folder:
""")

add("code", """
print(dist_report.SESSION_COMMAND)
""")

Path(__file__).resolve().parents[2].joinpath("chapters", "n12_ring.ipynb").write_text(nbformat.writes(nb) + "\n")
