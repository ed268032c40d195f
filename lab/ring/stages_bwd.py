"""lab.ring.run's stages that take gradients (every rank runs each; rank 0 writes the rows):

- grad-checks: the ring's dQ, dK, dV (torch.autograd.grad through ring_attention) against float64 autograd of
  full attention, single-device autograd as the yardstick; a backward fed each block's own LSE must fail;
- scale_fwd_bwd (in the scale stage): forward plus backward, one device on the whole sequence (t1: the lab's
  op, autograd) against the ring on every rank (tW); efficiency = t1 / (W tW), and the single device's peak
  memory, which says whether the whole sequence's backward fits one device at all;
- comm_bwd (in the comm stage): the ring's backward alone, transfers overlapped, serial and absent;
- largest_fwd_bwd (in the largest stage): one layer's forward plus backward at doubling S, on one device and on
  the ring, each until the next call is predicted to outgrow memory or the time budget;
- torch-cp: torch's context parallel over SDPA against the lab's ring (lab.ring.torch_cp);
- train: lab.ring.train's decoder sharded over the ranks against rank 0 alone on the whole sequence.
"""
from __future__ import annotations

import statistics
import time

import torch

from .. import check, record
from . import attention as ring
from . import growth
from . import torch_cp
from .backward import ring_attention_backward

OFFSET_LIMIT = 1 << 31  # elements of one tensor past which the kernels' 32-bit offsets are not audited
FWD_BWD_FLOPS = 3.5  # forward plus backward: 2 + 5 matmuls of the forward's 2 (the backward recomputes S)


def single_attend(run, q, k, v, causal=True):
    """Differentiable attention on one device: the lab's op on a GPU, SDPA's math (float64) on the CPU."""
    if run.cuda:
        from .. import ops
        return ops.attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            enable_gqa=q.shape[1] != k.shape[1])


def fwd_bwd_call(attend, q, k, v, dout):
    """Zero-argument callable: attend(q, k, v) and its gradients, (out, dq, dk, dv)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def call():
        out = attend(*leaves)
        return (out, *torch.autograd.grad(out, leaves, dout))
    return call


def _ring(seqlen, causal=True):
    return lambda q, k, v: ring.ring_attention(q, k, v, is_causal=causal, seqlen=seqlen)


def _case(run, name, B, Hq, Hkv, S, D, causal=True):
    return {"name": name, "B": B, "Hq": Hq, "Hkv": Hkv, "S": S, "D": D, "causal": causal,
            "dtype": str(run.preset.dtype).replace("torch.", "")}


def scale_inputs(run):
    """The scaling shape's full q, k, v, dout (the same on every rank: one seed)."""
    B, Hq, Hkv, S, D = run.preset.scale
    return (*run.inputs(B, Hq, Hkv, S, D, seed=1), run.inputs(B, Hq, Hq, S, D, seed=3)[0])


def scale_fwd_bwd(run) -> None:
    B, Hq, Hkv, S, D = run.preset.scale
    full = scale_inputs(run)
    one, peak, total = None, None, None
    if run.rank == 0:
        if run.cuda:
            torch.cuda.reset_peak_memory_stats(run.device)
        one = run.timed(fwd_bwd_call(lambda *t: single_attend(run, *t), *full), run.preset.reps_bwd, everyone=False)
        peak, total = run.peak_gib()
    run.dist.barrier()
    shards = [ring.shard(t, run.world, run.rank, True) for t in full]
    del full
    if run.cuda:
        torch.cuda.empty_cache()
    many = run.timed(fwd_bwd_call(_ring(S), *shards), run.preset.reps_bwd)
    run.memo["fwd_bwd"] = many
    if run.rank == 0:
        eff = record.scaling_efficiency(one["median_ms"], many["median_ms"], run.world)
        flops = FWD_BWD_FLOPS * 4 * B * Hq * S * S * D / 2
        run.write({"kind": "ring-scale-fwd-bwd", "case": _case(run, f"ring-fwd-bwd-S{S}", B, Hq, Hkv, S, D),
                   "single": one, "timing": many, "efficiency": eff, "single_peak_gib": peak, "total_gib": total,
                   "tflops_single": flops / one["median_ms"] / 1e9, "tflops": flops / many["median_ms"] / 1e9})
        run.say(f"forward+backward at S={S} causal Hq={Hq} Hkv={Hkv} D={D}: 1 device {one['median_ms']:.1f} ms "
                f"(peak {peak:.1f} of {total:.0f} GiB), {run.world} devices {many['median_ms']:.1f} ms, "
                f"efficiency {eff:.3f} ({run.label})")


def comm_bwd(run) -> None:
    """The backward ring alone (from the forward's output and LSE), overlapped, serial and compute-only."""
    B, Hq, Hkv, S, D = run.preset.scale
    q, k, v, dout = (ring.shard(t, run.world, run.rank, True) for t in scale_inputs(run))
    out, lse = ring.ring_forward(q, k, v, is_causal=True, seqlen=S)
    modes = {"overlap": {}, "serial": {"overlap": False}, "compute-only": {"communicate": False}}
    times, lines = {}, {}
    for mode, kw in modes.items():
        call = lambda kw=kw, **extra: ring_attention_backward(q, k, v, out, lse, dout, True, seqlen=S,  # noqa: E731
                                                               **kw, **extra)
        times[mode] = run.timed(call, run.preset.reps_bwd)
        run.dist.barrier()
        run.sync()
        clock = ring.StepClock(run.cuda)
        call(clock=clock)
        lines[mode] = run.gather(clock.steps())
    for mode, per_rank in lines.items():
        for rank, steps in enumerate(per_rank):
            run.write({"kind": "ring-timeline", "pass": "backward", "mode": mode, "rank": rank, "steps": steps, "S": S})
    transfer_ms = [s["comm_end_ms"] - s["comm_start_ms"] for steps in lines["serial"] for s in steps if "comm_end_ms" in s]
    ratio = times["overlap"]["median_ms"] / times["compute-only"]["median_ms"]
    run.write({"kind": "ring-comm-bwd", "case": _case(run, f"ring-comm-bwd-S{S}", B, Hq, Hkv, S, D),
               "timing": times["overlap"], "serial": times["serial"], "compute_only": times["compute-only"],
               "comm_ratio": ratio, "serial_ratio": times["serial"]["median_ms"] / times["compute-only"]["median_ms"],
               "bytes_per_step": 2 * k.numel() * (k.element_size() + max(k.element_size(), 4)),  # K, V; dK, dV
               "transfer_ms": statistics.median(transfer_ms) if transfer_ms else None})
    run.say(f"backward communication at S={S}: overlapped {times['overlap']['median_ms']:.1f} ms, serial "
            f"{times['serial']['median_ms']:.1f} ms, compute only {times['compute-only']['median_ms']:.1f} ms: "
            f"overlapped / compute-only = {ratio:.3f} ({run.label})")


def _grow(run, devices: int, budget_s: float) -> None:
    """One layer's forward plus backward at doubling S on `devices` (1: this rank alone, the whole sequence)."""
    Hq, Hkv, S, max_seq = run.preset.largest_bwd
    B, D = 1, run.preset.scale[4]
    everyone = devices > 1
    stopped, best = f"reached the largest length tried, {max_seq}", None
    while S <= max_seq:
        if run.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(run.device)
        n = sum(e - b for b, e in ring.shard_chunks(S, run.world, run.rank, True)) if everyone else S
        if max(-(-S // devices) * Hq * D, 0) >= OFFSET_LIMIT:
            stopped = f"at S={S} a device's q would hold >= 2^31 elements (32-bit offsets: not audited)"
            break
        gen = torch.Generator(device=run.device).manual_seed(run.rank)
        q, k, v, dout = (torch.randn(B, h, n, D, generator=gen, device=run.device, dtype=run.preset.dtype)
                         for h in (Hq, Hkv, Hkv, Hq))
        if everyone:
            run.dist.barrier()
        start = time.perf_counter()
        got = fwd_bwd_call(_ring(S) if everyone else (lambda *t: single_attend(run, *t)), q, k, v, dout)()
        run.sync()
        seconds = time.perf_counter() - start
        finite = all(bool(torch.isfinite(t).all()) for t in got)
        del q, k, v, dout, got
        peak, total = run.peak_gib()
        mine = {"peak_gib": peak, "total_gib": total, "seconds": seconds, "finite": finite}
        per_rank = run.gather(mine) if everyone else [mine]
        seconds = max(r["seconds"] for r in per_rank)
        best = {"S": S, "seconds": seconds, "ranks": per_rank}
        run.write({"kind": "ring-largest-fwd-bwd-step", "devices": devices, "seconds": seconds, "memory": per_rank,
                   "case": _case(run, f"fwd-bwd-{devices}dev-S{S}", B, Hq, Hkv, S, D),
                   "finite": all(r["finite"] for r in per_rank)})
        run.say(f"forward+backward on {devices} device(s), S={S}: {seconds:.2f} s, peak memory "
                + ", ".join(f"{r['peak_gib']:.1f}/{r['total_gib']:.0f} GiB" for r in per_rank))
        reason = growth.stop_reason(seconds, per_rank, budget_s)
        if reason:
            stopped = reason
            break
        S *= 2
    if best:
        worst, fits = growth.projection(best)
        run.write({"kind": "ring-largest-fwd-bwd", "devices": devices, "S": best["S"], "seconds": best["seconds"],
                   "memory": best["ranks"], "peak_gib": worst["peak_gib"], "total_gib": worst["total_gib"],
                   "stopped": stopped, "projected_fit_tokens": fits,
                   "case": {"Hq": Hq, "Hkv": Hkv, "D": D, "causal": True}})
        run.say(f"forward+backward on {devices} device(s): longest run S={best['S']} ({stopped}); by memory "
                f"alone ~{fits} tokens would fit (projection)")


def largest_fwd_bwd(run) -> None:
    if run.rank == 0:
        _grow(run, 1, run.preset.budget_bwd_s)
    run.dist.barrier()
    _grow(run, run.world, run.preset.budget_bwd_s)


def torch_cp_race(run) -> None:
    """torch's context parallel over SDPA against the lab's ring: forward plus backward, the scaling shape."""
    B, Hq, Hkv, S, D = run.preset.scale
    full = scale_inputs(run)
    lab_call = fwd_bwd_call(_ring(S), *(ring.shard(t, run.world, run.rank, True) for t in full))
    lab_shards = tuple(t.detach() for t in lab_call())
    lab = run.memo.get("fwd_bwd") or run.timed(lab_call, run.preset.reps_bwd)
    del lab_call
    rows = torch_cp.race(run, *full, lab_shards, run.preset.reps_bwd)
    case = _case(run, f"torch-cp-S{S}", B, Hq, Hkv, S, D)
    for row in rows:
        speedup = row["timing"]["median_ms"] / lab["median_ms"] if "timing" in row else None
        run.write({"kind": "ring-torch-cp", "impl": "torch context_parallel", "case": case, **row, "lab": lab,
                   "speedup": speedup})
        run.say(f"torch context parallel, {row['backend']} / {row['rotate']}: " +
                (f"{row['timing']['median_ms']:.1f} ms against the lab's ring {lab['median_ms']:.1f} ms: the lab "
                 f"{speedup:.2f}x" if speedup else f"did not run ({row['error']})"))
    ran = [r for r in rows if "timing" in r]
    best = min(ran, key=lambda r: r["timing"]["median_ms"]) if ran else None
    run.write({"kind": "ring-torch-cp-race", "case": case, "lab": lab, "configurations": len(rows),
               "best": best, "speedup": best["timing"]["median_ms"] / lab["median_ms"] if best else None,
               "errors": [f"{r['backend']}/{r['rotate']}: {r['error']}" for r in rows if "error" in r]})


def grad_checks(run) -> None:
    from .backward import lab_attend_backward, reference_attend_backward, with_block_lse

    for seed, (name, B, Hq, Hkv, S, D) in enumerate(run.preset.checks):
        for causal in (False, True):
            q, k, v = run.inputs(B, Hq, Hkv, S, D, seed=100 + seed)
            dout = run.inputs(B, Hq, Hq, S, D, seed=200 + seed)[0]
            mine = [ring.shard(t, run.world, run.rank, causal) for t in (q, k, v, dout)]
            grads = fwd_bwd_call(_ring(S, causal), *mine)()[1:]
            wrong = None
            if name == "mha":  # the self-test: the block's own lse in place of the merged one
                block = with_block_lse(ring.lab_attend if run.cuda else ring.reference_attend,
                                       lab_attend_backward if run.cuda else reference_attend_backward)
                out2, lse2 = ring.ring_forward(*mine[:3], is_causal=causal, seqlen=S)
                wrong = ring_attention_backward(*mine[:3], out2, lse2, mine[3], causal, seqlen=S, attend_backward=block)
            shards = run.gather(([g.cpu() for g in grads], None if wrong is None else [g.cpu() for g in wrong]))
            if run.rank:
                continue
            ref = check.reference_grads(q, k, v, dout, causal)[1:]
            yard = [g.cpu() for g in fwd_bwd_call(lambda *t: single_attend(run, *t, causal=causal), q, k, v, dout)()[1:]]
            case = _case(run, f"ring-grad-{name}", B, Hq, Hkv, S, D, causal)
            for i, grad in enumerate(("dq", "dk", "dv")):
                result = check.compare(ring.unshard([s[0][i] for s in shards], S, causal), ref[i].cpu(), yard[i])
                run.write({"kind": "grad-check", "case": case, "grad": grad, "check": result})
                run.say(f"grad check {case['name']:<16} {grad} S={S:<5} {'causal' if causal else 'full  '} "
                        f"{'PASS' if result['passed'] else 'FAIL'} max_abs {result['max_abs']:.2e} "
                        f"(single device {result['sdpa_max_abs']:.2e})")
                if wrong is not None:
                    bad = check.compare(ring.unshard([s[1][i] for s in shards], S, causal), ref[i].cpu(), yard[i])
                    run.write({"kind": "grad-check", "case": {**case, "name": "ring-grad-selftest-block-lse"},
                               "grad": grad, "expected_fail": True,
                               "impl": "lab.dist.ring_attention (backward with each block's own LSE)", "check": bad})
                    run.say(f"self-test {grad}: a backward with block LSEs "
                            f"{'fails, as it must' if not bad['passed'] else 'PASSES: the check is blind'}")


def train(run) -> None:
    from . import train as ring_train

    steps, batch, S, vocab, dim, heads, kv_heads = run.preset.train
    batches = ring_train.make_batches(steps, batch, S, vocab, device=run.device)

    def model():
        torch.manual_seed(0)
        return ring_train.TinyDecoder(vocab, dim, heads, kv_heads, max_len=S).to(run.device, run.preset.dtype)

    start = time.perf_counter()
    sharded = ring_train.train_losses(model(), batches)
    seconds = time.perf_counter() - start
    if run.rank:
        return
    attend = (lambda q, k, v: single_attend(run, q, k, v)) if run.cuda else None  # the same model, one device
    start = time.perf_counter()
    single = ring_train.train_losses(model(), batches, attend=attend, sharded=False)
    seconds_single = time.perf_counter() - start
    diff = max(abs(a - b) / abs(b) for a, b in zip(sharded, single))
    run.write({"kind": "ring-train", "case": {"S": S, "batch": batch, "dim": dim, "Hq": heads, "Hkv": kv_heads,
               "steps": steps}, "losses": sharded, "losses_single": single, "max_rel_diff": diff,
               "seconds": seconds, "seconds_single": seconds_single})
    run.say(f"train: {steps} steps at S={S} over {run.world} ranks ({seconds:.1f} s; one device {seconds_single:.1f} s), "
            f"loss {sharded[0]:.4f} -> {sharded[-1]:.4f}; largest relative difference from one device {diff:.2e}")
