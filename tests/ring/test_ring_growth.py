"""lab.ring.growth: the largest-sequence searches stop before a call predicted to outgrow the time budget
(time ~ S^2) or a device's memory (peak ~ S), and project the tokens memory alone would allow."""
from lab.ring import growth


def test_the_next_doubling_is_judged_on_time_then_memory():
    ranks = [{"peak_gib": 10.0, "total_gib": 80.0}, {"peak_gib": 30.0, "total_gib": 80.0}]
    assert growth.stop_reason(10.0, ranks, 90.0) is None  # 40 s and 75 % of memory next: go on
    assert "would take ~44 s" in growth.stop_reason(11.0, ranks, 40.0)
    assert "~100% of a device's memory" in growth.stop_reason(1.0, [{"peak_gib": 40.0, "total_gib": 80.0}], 90.0)


def test_the_projection_uses_the_fullest_rank():
    best = {"S": 1 << 20, "ranks": [{"peak_gib": 10.0, "total_gib": 80.0}, {"peak_gib": 20.0, "total_gib": 80.0}]}
    worst, fits = growth.projection(best)
    assert worst["peak_gib"] == 20.0 and fits == int((1 << 20) * 0.92 * 4)
    assert growth.projection({"S": 8, "ranks": [{"peak_gib": 0.0, "total_gib": 1.0}]})[1] is None
