"""Where a kernel's warps stall, by stretch of SASS: reads ncu's source page exported as CSV
(`ncu -i R --page source --csv --print-source sass > src.csv`, the report taken with
`--section SourceCounters`) and prints, per block of N consecutive instructions holding at least 0.5 %
of the stall samples, its share, its top stall reasons and its commonest opcodes.
    python3 tests/cuda/ncu_source_regions.py src.csv[.gz] [N]
"""
from __future__ import annotations

import collections
import csv
import gzip
import sys


def load(path: str) -> tuple[list[str], list[list[str]]]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    return rows[header], rows[header + 1:]


def opcode(source: str) -> str:
    words = source.split()
    return (words[1] if words and words[0].startswith("@") else words[0]) if words else ""


def regions(header: list[str], data: list[list[str]], block: int = 40, floor: float = 0.005) -> list[dict]:
    ix = {h: i for i, h in enumerate(header)}
    samples = lambda r: int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(samples(r) for r in data) or 1
    out = []
    for a in range(0, len(data), block):
        seg = data[a:a + block]
        n = sum(samples(r) for r in seg)
        if n < floor * total:
            continue
        why = collections.Counter()
        for r in seg:
            for c in stalls:
                why[c[len("stall_"):]] += int(r[ix[c]] or 0)
        ops = collections.Counter(opcode(r[ix["Source"]]) for r in seg)
        out.append({"first": a, "share": n / total, "stalls": why.most_common(3), "ops": ops.most_common(4)})
    return out


if __name__ == "__main__":
    hdr, rows = load(sys.argv[1])
    for reg in regions(hdr, rows, int(sys.argv[2]) if len(sys.argv) > 2 else 40):
        print(f"{reg['first']:5d} {100 * reg['share']:5.1f}%  stalls " + ", ".join(f"{k} {v}" for k, v in reg["stalls"])
              + "  ops " + ", ".join(f"{k} {v}" for k, v in reg["ops"]))
