"""lab.findings on fixed rows: the summaries chapters print."""
import pytest

from lab import findings


def _row(impl, name, ms, B=1, **ratios):
    return {"impl": impl, "case": {"name": name, "B": B}, "timing": {"median_ms": ms}, "ratios": ratios,
            "frac_ceiling": 0.5 if ratios else None}


ROWS = [_row("ours", "a", 1.0, **{"sdpa-flash": 2.0, "sdpa-cudnn": 0.5}),
        _row("ours", "b", 2.0, **{"sdpa-flash": 0.5, "sdpa-cudnn": 0.5}),
        _row("one", "a", 4.0), _row("one", "b", 3.0), _row("one", "c", 9.0)]


def test_geomean():
    assert findings.geomean([2.0, 0.5]) == pytest.approx(1.0)
    assert findings.geomean([]) != findings.geomean([])  # nan for no values


def test_ratio_summary_counts_cells_and_skips_missing_backends():
    lines = findings.ratio_summary(ROWS, "ours", ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient"))
    assert len(lines) == 2
    assert "geometric mean 1.00x" in lines[0] and "cells >= 1.0x: 1" in lines[0]
    assert "min 0.50x" in lines[1] and "cells >= 1.0x: 0" in lines[1]


def test_split_gain_pairs_cases_by_name():
    (line,) = findings.split_gain(ROWS, "ours", "one")
    assert "1.5x-4.0x over 2 cells" in line  # c has no planned row: left out


def test_host_summary():
    rows = [{"case": {"name": "x"}, "max_excess_us": 7.0, "target_excess_us": 5.0},
            {"case": {"name": "y"}, "max_excess_us": 1.0, "target_excess_us": 5.0}]
    (line,) = findings.host_summary(rows)
    assert "worst excess over SDPA 7.0 us (x)" in line and "1/2" in line
    assert findings.host_summary([]) == []


def test_below_names_the_cells_under_the_bar():
    (line,) = findings.below(ROWS, "ours", "sdpa-flash")
    assert line.endswith("b 0.50x")
    assert findings.below(ROWS, "ours", "sdpa-flash", bar=0.4)[0].endswith("none")
