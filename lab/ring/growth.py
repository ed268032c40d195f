"""The rule of both largest-sequence searches (forward, and one layer's forward plus backward): S doubles while
the next call is predicted to fit the time budget (time grows with S^2) and a device's memory (peak bytes grow
with S); the longest run's peak memory then projects how many tokens memory alone would allow."""
from __future__ import annotations

MEMORY_SHARE = 0.92  # of a device's memory the next call may be predicted to need


def stop_reason(seconds: float, per_rank: list[dict], budget_s: float) -> str | None:
    """Why the next length (2x) is not tried, or None to go on. per_rank: {"peak_gib", "total_gib"} per rank."""
    if seconds * 4 > budget_s:
        return f"the next length (2x) would take ~{seconds * 4:.0f} s > the budget {budget_s:g} s"
    grow = max(r["peak_gib"] * 2 / r["total_gib"] for r in per_rank)
    if grow > MEMORY_SHARE:
        return f"the next length (2x) would need ~{grow:.0%} of a device's memory"
    return None


def projection(best: dict) -> tuple[dict, int | None]:
    """(the rank with the highest peak, tokens that would fit by memory alone) of the longest run."""
    worst = max(best["ranks"], key=lambda r: r["peak_gib"])
    fits = int(best["S"] * MEMORY_SHARE * worst["total_gib"] / worst["peak_gib"]) if worst["peak_gib"] else None
    return worst, fits
