"""Cell-by-cell comparison of the two guard sessions of guard_ab.sh: head / base time for every timed row.

SDPA's rows run the same code in both sessions, so their spread is the noise floor the +-2 % guard is read
against. Usage (repo root): PYTHONPATH=. python3 tools/gpu/guard_ab.py base.tgz head.tgz [out.json]
"""
import json
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

from lab import record


def rows(tgz):
    """The records of a session tarball, read by lab.record (the one reader of records.jsonl)."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tgz) as tar:
            tar.extractall(tmp, filter="data")
        found = record.load(Path(tmp))
    if not found:
        raise SystemExit(f"{tgz}: no records")
    return found


def times(records):
    return {(r.get("chapter"), r["impl"], r["case"]["name"]): r["timing"]["median_ms"]
            for r in records if isinstance(r.get("timing"), dict)}


def main():
    base, head = times(rows(sys.argv[1])), times(rows(sys.argv[2]))
    table = [(key, head[key] / base[key]) for key in sorted(base) if key in head]
    ours = [(k, x) for k, x in table if not k[1].startswith("sdpa")]
    sdpa = [(k, x) for k, x in table if k[1].startswith("sdpa")]
    for (chapter, impl, case), x in ours:
        print(f"{chapter:<11} {impl:<30} {case:<22} head/base {x:.3f}{'  OUTSIDE +-2 %' if abs(x - 1) > 0.02 else ''}")
    by_impl = {}
    for (chapter, impl, _), x in table:
        by_impl.setdefault((chapter, impl), []).append(x)
    for (chapter, impl), xs in sorted(by_impl.items()):  # a kernel whose SASS did not change shows the drift
        print(f"{chapter:<11} {impl:<30} n={len(xs):2} median {statistics.median(xs):.3f} min {min(xs):.3f} "
              f"max {max(xs):.3f} outside +-2 %: {sum(abs(x - 1) > 0.02 for x in xs)}")
    worst = lambda pairs: max((abs(x - 1) for _, x in pairs), default=0.0)  # noqa: E731
    print(f"ours: {len(ours)} rows, worst |head/base - 1| {worst(ours):.3f}, outside +-2 %: "
          f"{sum(abs(x - 1) > 0.02 for _, x in ours)}; SDPA (unchanged code, the noise floor): {len(sdpa)} rows, "
          f"worst {worst(sdpa):.3f}, outside +-2 %: {sum(abs(x - 1) > 0.02 for _, x in sdpa)}")
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump([{"chapter": k[0], "impl": k[1], "case": k[2], "head_over_base": x} for k, x in table], f,
                      indent=1)


if __name__ == "__main__":
    main()
