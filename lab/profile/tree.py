"""The decision tree: a profiled launch's counters -> what bounds it (memory, compute, latency or launch) and
the next action. Every threshold is data (TREE), recorded with each verdict, so a changed threshold shows in
the records; the tree reads nothing but the metrics row (lab.profile.counters.summarize).
"""
from __future__ import annotations

TREE = {
    # A launch whose kernel is this short, with every unit this idle, spends its time on the launch:
    # the driver's launch cost through the binding is a few us, so a < 10 us kernel is dominated by it.
    # Or, measured: back-to-back calls take this many times the kernel's own duration (host_us_per_call).
    "launch_us": 10.0,
    "launch_host_ratio": 1.5,
    "launch_idle_pct": 40.0,
    # A memory level at or above this % of its peak is the bound (Nsight's guidance calls 60% "high").
    # Levels are tried farthest first (DRAM, L2, shared/L1): every DRAM byte also crosses L2, so L2 is
    # busy whenever DRAM is (decode v02, H200: DRAM 83%, L2 89%); L2 is the bound only when DRAM is not.
    "memory_pct": 60.0,
    "memory_order": ["dram", "l2", "shared"],
    # 50, not 60: Hopper counts the tensor pipe's peak at wgmma's rate, and mma.sync kernels top out near
    # 56% of it (H200, fwd-d128-s2048: the FA2 reference SDPA-flash 56%, v04 56%, cuDNN's wgmma 74%).
    # At 60 every mma.sync kernel at its own ceiling would read as latency-bound.
    "compute_pct": 50.0,
    # The busiest pipe names the compute bound when at least this busy.
    "pipe_pct": 50.0,
    # The origin's rule (seeds/002): more than 30% of shared wavefronts from bank conflicts: fix those first.
    "bank_conflict_frac": 0.30,
    # Bytes moved beyond this multiple of the byte floor are traffic a kernel could cut.
    "bytes_over_floor": 1.25,
}
ACTIONS = {
    "launch": "the launch costs more than the work: batch or fuse launches (CUDA graphs), and give one launch "
              "more CTAs (split the KV loop) so it fills the GPU",
    "memory:dram:above_floor": "DRAM-bound with {over:.2f}x the byte floor: cut the re-reads (keep tiles resident, "
                               "share K/V across the query heads of a group) before anything else",
    "memory:dram": "DRAM-bound at {over:.2f}x the byte floor: only fewer bytes help (a smaller KV dtype, "
                   "compression) or overlapping this kernel with its neighbours",
    "memory:dram:no_floor": "DRAM-bound: count the bytes that must move and compare",
    "memory:shared:conflicts": "shared-memory-bound with {conflicts:.0%} bank-conflict wavefronts: fix the "
                               "conflicts first (swizzle or pad the tiles)",
    "memory:shared": "shared-memory-bound: feed the math from registers and tensor cores (ldmatrix + mma) "
                     "instead of one shared load per FMA",
    "memory:l2": "L2-bound: improve reuse in L2 (tile order, swizzled CTA order)",
    "compute:tensor": "tensor-pipe-bound: move to the faster tensor path (wgmma on Hopper) or shrink the "
                      "non-matmul work around it",
    "compute:tensor:wgmma": "tensor-pipe-bound on wgmma already: overlap the softmax with the matmuls "
                            "(ping-pong warpgroups) and shrink the non-matmul work",
    "compute:fma": "FMA-pipe-bound: the matmuls belong on the tensor cores",
    "compute:alu": "ALU-bound: cut integer, compare and conversion work (masks, index math)",
    "compute:xu": "XU-bound (exp, conversions): exp2 with a folded scale, fewer conversions",
    "compute": "compute-bound on {pipe}: cut the instructions on that pipe",
    "latency:long_scoreboard": "waiting on global memory: more bytes in flight (deeper cp.async pipeline, more warps)",
    "latency:short_scoreboard": "waiting on shared memory: fewer shared round trips (ldmatrix, keep operands in registers)",
    "latency:mio_throttle": "shared-memory instruction queue full: wider shared accesses, fewer of them",
    "latency:lg_throttle": "global-memory instruction queue full: 16-byte vector loads, fewer of them",
    "latency:barrier": "warps wait at __syncthreads: fewer barriers, warp-specialised producer/consumer",
    "latency:wait": "fixed-latency dependency chains: more independent work per warp (ILP)",
    "latency:math_pipe_throttle": "the math pipe is saturated for the warps that run: raise occupancy or "
                                  "move the math to a wider pipe",
    "latency:not_selected": "enough eligible warps: the scheduler is busy; look at the instruction count",
    "latency": "latency-bound on {stall}: hide it with more parallel work per SM",
}


def decide(m: dict, tree: dict | None = None) -> dict:
    """Measured counters (summarize's row) -> {label, bound, unit, pipe, stall, reason, action}.

    label: 'launch', 'memory:<dram|l2|shared>', 'compute:<pipe family>' or 'latency:<stall>'.
    """
    verdict = _decide(m, {**TREE, **(tree or {})})
    detail = verdict["unit"] if verdict["bound"] == "memory" else _pipe_family(verdict["pipe"] or "") \
        if verdict["bound"] == "compute" else verdict["stall"] if verdict["bound"] == "latency" else None
    return {"label": verdict["bound"] + (f":{detail}" if detail else ""), **verdict}


def _decide(m: dict, t: dict) -> dict:
    """The tree itself (see decide).

    Order: launch (nothing else matters if the launch dominates), then the busiest of memory and
    compute at or above its threshold, else latency named by the top stall reason.
    """
    pipe, pipe_pct = _top(m.get("pipes") or {})
    stall = (m.get("stalls") or [{}])[0].get("reason")
    verdict = {"pipe": pipe, "pipe_pct": pipe_pct, "stall": stall, "unit": None}
    busiest = max(m.get("sm_pct") or 0, m.get("memory_pct") or 0)
    duration, host = m.get("duration_us"), m.get("host_us_per_call")
    short = duration is not None and duration < t["launch_us"]
    host_bound = bool(duration and host and host >= t["launch_host_ratio"] * duration)
    if (short or host_bound) and busiest < t["launch_idle_pct"]:
        why = f"{duration:.1f} us < {t['launch_us']:g} us" if short else f"a call costs {host:.1f} us of host time"
        if host:
            why += f" (back-to-back calls: {host:.1f} us each)" if short else f" for a {duration:.1f} us kernel"
        return {**verdict, "bound": "launch", "action": ACTIONS["launch"],
                "reason": f"{why}, every unit below {t['launch_idle_pct']:g}% ({busiest:.0f}%)"}
    levels = {"dram": m.get("dram_pct"), "l2": m.get("l2_pct"), "shared": m.get("l1_pct")}
    unit = next((u for u in t["memory_order"] if (levels.get(u) or 0) >= t["memory_pct"]), None)
    unit_pct = levels.get(unit) if unit else max((v for v in levels.values() if v is not None), default=0)
    compute = m.get("sm_pct") or 0
    compute_ok = compute >= t["compute_pct"] and pipe is not None and pipe_pct >= t["pipe_pct"]
    if unit and (not compute_ok or unit_pct >= compute):
        return {**verdict, "bound": "memory", "unit": unit, **_memory_action(unit, unit_pct, m, t)}
    if compute_ok:
        key = f"compute:{_pipe_family(pipe)}"
        if key == "compute:tensor" and (m.get("pipes") or {}).get("tensor_op_gmma", 0) >= 1.0:
            key = "compute:tensor:wgmma"
        return {**verdict, "bound": "compute", "action": ACTIONS.get(key, ACTIONS["compute"]).format(pipe=pipe),
                "reason": f"SM throughput {compute:.0f}% >= {t['compute_pct']:g}%, busiest pipe {pipe} {pipe_pct:.0f}%"}
    key = f"latency:{stall}"
    return {**verdict, "bound": "latency", "action": ACTIONS.get(key, ACTIONS["latency"]).format(stall=stall),
            "reason": f"no unit at its threshold (SM {compute:.0f}%, busiest memory level {unit_pct:.0f}%); "
                      f"top stall {stall}"}


def _memory_action(unit: str, pct: float, m: dict, t: dict) -> dict:
    reason = f"{unit} throughput {pct:.0f}% >= {t['memory_pct']:g}%"
    if unit == "dram":
        over = m.get("bytes_over_floor")
        if over is None:
            return {"reason": reason, "action": ACTIONS["memory:dram:no_floor"]}
        key = "memory:dram:above_floor" if over > t["bytes_over_floor"] else "memory:dram"
        return {"reason": f"{reason}, {over:.2f}x the byte floor", "action": ACTIONS[key].format(over=over)}
    if unit == "shared":
        conflicts = m.get("bank_conflict_frac") or 0
        key = "memory:shared:conflicts" if conflicts > t["bank_conflict_frac"] else "memory:shared"
        return {"reason": f"{reason}, bank conflicts {conflicts:.0%} of shared wavefronts",
                "action": ACTIONS[key].format(conflicts=conflicts)}
    return {"reason": reason, "action": ACTIONS["memory:l2"]}


def _pipe_family(pipe: str) -> str:
    for family in ("tensor", "fma", "alu", "xu"):
        if family in pipe:
            return family
    return pipe


def _top(values: dict):
    values = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    if not values:
        return None, None
    key = max(values, key=values.get)
    return key, values[key]
