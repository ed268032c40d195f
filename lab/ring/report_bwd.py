"""Chapter n12_ring's backward side: torch's context parallel against the lab's ring, the longest forward plus
backward on one device and on the ring, the loss curves of the sharded and the one-device model, and the
findings these rows give (lab.ring.report.findings appends them). Everything is computed from one run's rows.
"""
from __future__ import annotations

from ..publish.tables import Table


def of(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r.get("kind") == kind]


def grad_check_table(rows: list[dict]) -> Table:
    """dQ, dK, dV of the ring against float64 autograd, single-device autograd's error as the yardstick."""
    found = of(rows, "grad-check")
    expected = sum(r["check"]["passed"] != bool(r.get("expected_fail")) for r in found)
    return Table(["case", "grad", "S", "Hq", "Hkv", "D", "causal", "passed", "max abs err", "single device's",
                  "must fail"],
                 [[r["case"]["name"], r["grad"], r["case"]["S"], r["case"]["Hq"], r["case"]["Hkv"], r["case"]["D"],
                   r["case"]["causal"], r["check"]["passed"], r["check"]["max_abs"], r["check"]["sdpa_max_abs"],
                   bool(r.get("expected_fail"))] for r in found], f"{expected}/{len(found)} gradient checks as expected")


def torch_cp_table(rows: list[dict]) -> Table:
    """One line per torch configuration tried (backend, rotation), against the lab's ring in the same run."""
    lines = []
    for r in of(rows, "ring-torch-cp"):
        ms = r["timing"]["median_ms"] if "timing" in r else None
        lines.append([f"torch context_parallel, SDPA {r['backend']}", r["rotate"], bool(r.get("kv_expanded")), ms,
                      r["lab"]["median_ms"], r.get("speedup"), r.get("max_abs_vs_lab"),
                      r.get("error") or r.get("gqa_error") or ""])
    return Table(["implementation", "K/V rotation", "K/V expanded to Hq", "torch ms", "lab ring ms",
                  "torch / lab", "max |torch - lab| (out, dQ)", "error (or GQA's, before expanding)"], lines,
                 "forward plus backward, median ms of the slowest rank; torch / lab > 1: the lab's ring is faster")


def largest_table(rows: list[dict]) -> Table:
    """One layer's forward plus backward at each length tried, one device and the ring."""
    return Table(["devices", "S", "Hq", "Hkv", "seconds", "finite", "peak GiB per device", "GiB per device"],
                 [[r["devices"], r["case"]["S"], r["case"]["Hq"], r["case"]["Hkv"], r["seconds"], r["finite"],
                   ", ".join(f"{m['peak_gib']:.2f}" for m in r["memory"]), r["memory"][0]["total_gib"]]
                  for r in of(rows, "ring-largest-fwd-bwd-step")])


def loss_figure(rows: list[dict], path=None):
    """The sharded run's loss curve over the one-device run's, and their relative difference per step."""
    import matplotlib.pyplot as plt

    from ..plot import save_figure

    runs = of(rows, "ring-train")
    if not runs:
        return None
    r = runs[-1]
    steps = range(1, len(r["losses"]) + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
    left.plot(steps, r["losses_single"], label="one device, whole sequence", lw=2.5, alpha=0.6)
    left.plot(steps, r["losses"], label=f"sharded over {r['world_size']} ranks (ring)", lw=1, ls="--")
    left.set_xlabel("step")
    left.set_ylabel("mean next-token loss")
    left.legend(fontsize=8)
    c = r["case"]
    left.set_title(f"S = {c['S']:,}, {c['steps']} steps, {(r.get('env') or {}).get('gpu', '?')}", fontsize=9)
    right.plot(steps, [abs(a - b) / abs(b) for a, b in zip(r["losses"], r["losses_single"])], lw=1)
    right.set_yscale("log")
    right.set_xlabel("step")
    right.set_ylabel("|sharded - one device| / one device")
    right.set_title(f"largest {r['max_rel_diff']:.1e}", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def findings_bwd(rows: list[dict], met) -> list[str]:
    """Sentences from the backward's rows; met(value, op, target key) says how a number stands to its target."""
    lines = []
    for r in of(rows, "ring-scale-fwd-bwd"):
        c = r["case"]
        lines.append(f"forward+backward scaling at S={c['S']:,} causal, Hq={c['Hq']}/Hkv={c['Hkv']}, D={c['D']} over "
                     f"{r['world_size']} ranks: efficiency {r['efficiency']:.3f} (1 device {r['single']['median_ms']:.1f} "
                     f"ms with a peak of {r['single_peak_gib']:.1f} of {r['total_gib']:.0f} GiB, {r['world_size']} ranks "
                     f"{r['timing']['median_ms']:.1f} ms); {met(r['efficiency'], '>=', 'efficiency_fwd_bwd')}")
    for r in of(rows, "ring-comm-bwd"):
        lines.append(f"backward communication: overlapped / compute-only = {r['comm_ratio']:.3f}, serial / "
                     f"compute-only = {r['serial_ratio']:.3f}; {met(r['comm_ratio'], '<=', 'comm_ratio')}")
    for r in of(rows, "ring-torch-cp-race"):
        if r["best"]:
            b = r["best"]
            lines.append(f"against torch's context parallel (fastest that ran: SDPA {b['backend']}, {b['rotate']}"
                         f"{', K/V expanded' if b.get('kv_expanded') else ''}) forward+backward: torch "
                         f"{b['timing']['median_ms']:.1f} ms, the lab's ring {r['lab']['median_ms']:.1f} ms: the lab "
                         f"{r['speedup']:.2f}x; {met(r['speedup'], '>=', 'torch_cp')}")
        else:
            lines.append(f"torch's context parallel did not run in any of {r['configurations']} configurations: "
                         + "; ".join(r["errors"]))
    longest = {r["devices"]: r for r in of(rows, "ring-largest-fwd-bwd")}
    for devices, r in sorted(longest.items()):
        lines.append(f"longest forward+backward of one layer (Hq={r['case']['Hq']}/Hkv={r['case']['Hkv']}) on "
                     f"{devices} device{'s' if devices > 1 else ''}: S={r['S']:,} in {r['seconds']:.2f} s, peak "
                     f"{r['peak_gib']:.1f} of {r['total_gib']:.0f} GiB (stopped: {r['stopped']}); by memory alone "
                     f"~{r['projected_fit_tokens']:,} tokens would fit (projection)")
    for r in of(rows, "ring-train"):
        c = r["case"]
        lines.append(f"training: {c['steps']} steps of a one-block decoder at S={c['S']:,} sharded over "
                     f"{r['world_size']} ranks, loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}; largest relative "
                     f"difference from the one-device run {r['max_rel_diff']:.1e}")
    return lines
