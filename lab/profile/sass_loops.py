"""The loops of a kernel's SASS and what each one issues: the floor count before an optimisation.

    python -m lab.profile.sass_loops KERNEL.cubin|.sass NAME_SUBSTRING [--min-mma 1]

Reads `cuobjdump -sass` output (or runs cuobjdump on a .cubin; CUOBJDUMP names it), picks the function whose
name contains NAME_SUBSTRING, finds every loop (a backward branch and its target) that holds at least
--min-mma tensor-core instructions (HMMA/HGMMA), and prints per loop the instruction count by class: the
tensor instructions, the MUFU (exp2, rcp), the FP32 pipe (FFMA/FMUL/FADD/FMNMX), conversions and packing,
shuffles, shared-memory and barrier traffic, the rest. Dividing by the pipes' rates
(outputs/experiments/20261123-fwd-hopper-pipe-floors.json) gives the issue and pipe floors of one iteration.
Tested by tests/harness/test_sass_loops.py.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[0-9T]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
CLASSES = [
    ("tensor", re.compile(r"^(HGMMA|HMMA|WARPGROUP)")),
    ("mufu", re.compile(r"^MUFU")),
    ("fp32", re.compile(r"^(FFMA|FMUL|FADD|FMNMX|FSEL|FSETP|FCHK)")),
    ("convert", re.compile(r"^(F2FP|F2F|I2F|F2I|PRMT)")),
    ("shuffle/vote", re.compile(r"^(SHFL|VOTE|REDUX)")),
    ("shared/ldsm", re.compile(r"^(LDS|STS|LDSM|STSM)")),
    ("sync/barrier", re.compile(r"^(BAR|SYNCS|WARPSYNC|MEMBAR|DEPBAR|ARRIVES|ELECT|NANOSLEEP)")),
    ("branch", re.compile(r"^(BRA|BSSY|BSYNC|EXIT|RET|CALL)")),
    ("int/other", re.compile(r".")),
]


# Hopper SM rates (H100 whitepaper: 128 FP32 lanes, 64 INT32 lanes, 16 SFU lanes per SM, 4 schedulers each
# issuing one warp instruction per clock; 989 TFLOP/s dense bf16 at 1830 MHz on 132 SMs = 4096 FLOP, i.e.
# 2048 multiply-adds, per clock per SM). Per scheduler (SMSP), clocks per warp instruction:
CLOCKS_PER_WARP_INSTR = {"issue": 1, "fp32": 1, "int/other": 2, "mufu": 8}
MMA_PER_CLOCK_PER_SM = 2048
WGMMA_SHAPE = re.compile(r"HGMMA\.64x(\d+)x(\d+)")


def sass_text(path: str) -> str:
    if path.endswith(".cubin"):
        return subprocess.run([os.environ.get("CUOBJDUMP", "cuobjdump"), "-sass", path], check=True,
                              capture_output=True, text=True).stdout
    return open(path).read()


def functions(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """{function name: [(address, opcode, operands)]}."""
    out, name = {}, None
    for line in text.splitlines():
        if "Function :" in line:
            name = line.split("Function :")[1].strip()
            out[name] = []
            continue
        m = LINE.search(line)
        if m and name:
            out[name].append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loops(instrs, min_mma: int = 1):
    """[(start, end, Counter of classes, Counter of opcodes)] for each backward branch holding >= min_mma mma."""
    found = []
    for i, (addr, op, args) in enumerate(instrs):
        target = re.search(r"0x([0-9a-f]+)", args) if op == "BRA" else None
        if not target or int(target.group(1), 16) >= addr:
            continue
        start = int(target.group(1), 16)
        body = [(a, o) for a, o, _ in instrs if start <= a <= addr]
        ops = collections.Counter(o for _, o in body)
        mma = sum(n for o, n in ops.items() if o.startswith(("HGMMA", "HMMA")))
        if mma < min_mma:
            continue
        classes = collections.Counter()
        for o, n in ops.items():
            classes[next(c for c, rx in CLASSES if rx.search(o))] += n
        shapes = [WGMMA_SHAPE.search(o + a) for a_, o, a in instrs if start <= a_ <= addr and o.startswith("HGMMA")]
        mma_clocks = sum(64 * int(m.group(1)) * int(m.group(2)) for m in shapes if m) / MMA_PER_CLOCK_PER_SM
        found.append((start, addr, classes, ops, mma_clocks))
    return found


def floors(classes: collections.Counter, mma_clocks: float) -> dict[str, float]:
    """Clocks one warp's pass over the loop body needs on its scheduler, per pipe (the static body: both sides
    of every branch count), and the tensor clocks of the warpgroup's wgmmas (the whole SM's tensor cores)."""
    out = {"issue": sum(classes.values()) * CLOCKS_PER_WARP_INSTR["issue"]}
    for pipe in ("fp32", "int/other", "mufu"):
        out[pipe] = classes.get(pipe, 0) * CLOCKS_PER_WARP_INSTR[pipe]
    out["tensor (SM)"] = mma_clocks
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    min_mma = int(argv[argv.index("--min-mma") + 1]) if "--min-mma" in argv else 1
    funcs = {n: f for n, f in functions(sass_text(argv[0])).items() if argv[1] in n}
    if not funcs:
        print(f"no function matches {argv[1]!r}", file=sys.stderr)
        return 2
    for name, instrs in funcs.items():
        print(f"{name}: {len(instrs)} instructions")
        for start, end, classes, ops, mma_clocks in loops(instrs, min_mma):
            total = sum(classes.values())
            print(f"  loop {start:#06x}-{end:#06x}: {total} instructions: "
                  + ", ".join(f"{c} {n}" for c, n in sorted(classes.items(), key=lambda x: -x[1])))
            print("    " + ", ".join(f"{o} {n}" for o, n in ops.most_common(14)))
            print("    floors, clocks per pass: " + ", ".join(f"{k} {v:.0f}" for k, v in floors(classes, mma_clocks).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
