"""Summarise tools/gpu/paged_source_profile.sh's source page (ncu --page source --csv --print-source sass): per kernel, the
executed count of each load, store, barrier and tensor-core opcode, its share of the kernel's warp instructions and of
its stall samples, and, for the global loads, ncu's L2 theoretical sectors against the ideal count for their addresses.

    python tools/gpu/paged_source_summary.py source.csv.gz [kept.csv.gz]   # kept: only those opcodes' rows, for the record
"""
from __future__ import annotations

import collections
import csv
import gzip
import re
import sys

KEEP = ("LDG", "LDS", "STS", "BAR", "DEPBAR", "HMMA", "LDSM", "MUFU")


def kernels(path: str) -> list[dict]:
    out, cur = [], None
    for row in csv.reader(gzip.open(path, "rt")):
        if not row:
            continue
        if row[0] == "Kernel Name":
            cur = {"name": row[1], "rows": []}
            out.append(cur)
        elif row[0] == "Address":
            cur["header"] = row
        else:
            cur["rows"].append(row)
    return out


def opcode(source: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]


def number(value: str) -> float:
    return float(value.replace(",", "")) if value not in ("", "-") else 0.0


def summary(k: dict) -> str:
    col = {name: i for i, name in enumerate(k["header"])}
    executed, samples, sectors = collections.Counter(), collections.Counter(), collections.defaultdict(lambda: [0.0, 0.0])
    for row in k["rows"]:
        op = opcode(row[col["Source"]])
        executed[op] += number(row[col["Instructions Executed"]])
        samples[op] += number(row[col["Warp Stall Sampling (All Samples)"]])
        if op.startswith("LDG"):
            sectors[op][0] += number(row[col["L2 Theoretical Sectors Global"]])
            sectors[op][1] += number(row[col["L2 Theoretical Sectors Global Ideal"]])
    total, total_samples = sum(executed.values()) or 1, sum(samples.values()) or 1
    lines = [f"{k['name'][:100]}: {total:.0f} warp instructions, {total_samples:.0f} stall samples"]
    for op, n in executed.most_common():
        if op.startswith(KEEP) and n:
            extra = (f"  L2 sectors {sectors[op][0]:.0f} (ideal {sectors[op][1]:.0f})" if op in sectors else "")
            lines.append(f"  {op:30s} {n:>10.0f} {n / total:6.1%} of instructions, {samples[op] / total_samples:6.1%} "
                         f"of stall samples{extra}")
    return "\n".join(lines)


if __name__ == "__main__":
    ks = kernels(sys.argv[1])
    print("\n".join(summary(k) for k in ks))
    if len(sys.argv) > 2:
        with gzip.open(sys.argv[2], "wt", newline="") as f:
            w = csv.writer(f)
            for k in ks:
                w.writerow(["Kernel Name", k["name"]])
                w.writerow(k["header"])
                w.writerows(r for r in k["rows"] if opcode(r[k["header"].index("Source")]).startswith(KEEP))
