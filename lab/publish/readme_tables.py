"""The version tables of the kernel READMEs, generated from lab.registry: `python -m lab readme` writes them between
the markers below, and tests/book/test_readme_tables.py checks that each README holds the table this module gives.

A row's file and head dims come from the registry's tables, its status from lab.registry.HISTORY and VARIANTS (history:
no default call reaches it; otherwise the product variant it implements); the idea and the chapter that teaches it are
the one line each that the registry does not hold.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from .. import registry

ROOT = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- version-table:begin -->", "<!-- version-table:end -->"
README = {"fwd": "kernels/README.md", "bwd": "kernels/bwd/README.md", "decode": "kernels/decode/README.md"}

IDEAS = {
    ("fwd", "v01"): "FA1, scalar fp32 FFMAs, 64 x 64 tiles: the correctness anchor",
    ("fwd", "v02"): "FA2 on mma.sync, ldmatrix, cp.async, swizzled shared memory",
    ("fwd", "v03"): "v02 + Q re-read from shared memory (4 warps x 32 rows at both D)",
    ("fwd", "v04"): "v03 + lazy O rescale, XOR ldmatrix addresses, one row pointer: 0 spills; 64-row CTAs on small grids",
    ("fwd", "v05"): "wgmma + TMA + mbarrier ring, one warpgroup a CTA",
    ("fwd", "v06"): "v05 + producer warpgroup, 2-3 consumer warpgroups, setmaxnreg",
    ("fwd", "v07"): "v06 + intra-warpgroup overlap, ping-pong, folded scale, conditional rescale, per-call persistent configs",
    ("fwd", "v10"): "D 192 / 256: v06's producer + 2 consumers with v07's overlap, persistent loop",
    ("fwd", "masked v08"): "v04's tiles + window, softcap, sinks, packed sequences",
    ("fwd", "masked v09"): "v08's masks on v05's wgmma + TMA loop",
    ("fwd", "masked v11"): "v09's mask steps in v07's overlapped loop",
    ("fwd", "masked v12"): "D 192 / 256: v11's mask steps on v10's wide tiles and overlapped loop",
    ("decode", "v01"): "split-K, scalar fp32, all GQA rows of a KV head a block, LSE combine",
    ("decode", "v02"): "v01 with mma.sync for Q K^T and P V, one block an SM split plan",
    ("decode", "v03"): "v02's pass 1 through a block table (paged), bottom-right causal, page-table check",
    ("decode", "v04"): "v03 with one block per 8 KV heads (whole 2 KiB rows a key)",
    ("decode", "v05"): "v03 with one cp.async.bulk per K or V row (sm_90)",
    ("decode", "v06"): "v03 with warp-private rings: no block barrier in the main loop",
    ("decode", "v07"): "v06 with an unpadded, swizzled ring (chunk c of row r at c ^ (r & 7))",
    ("decode", "v08"): "v07's ring at D 80 / 96 (c ^ ((r & 7) >> s))",
    ("bwd", "v01"): "FA2's backward on mma.sync, dQ by atomics or a deterministic pass",
    ("bwd", "v02"): "wgmma for all five GEMMs, TMA ring, dQ by bulk reductions",
    ("bwd", "v03"): "v02 + the next Sᵀ before the dQ hand-off (serialized by ptxas)",
    ("bwd", "v04"): "v02 as a persistent kernel, two dSᵀ buffers",
    ("bwd", "v05"): "v02 + dQ GEMM deferred a step, staggered warpgroups, dQ by red.global.add.v4",
    ("bwd", "v06"): "v05 + dQ converted in the kernel by each slab's last warp",
    ("bwd", "v07"): "v05 + D 64's dQ split by columns",
    ("bwd", "v09"): "D 192 / 256 on mma.sync, FA2's wide-head tiling",
    ("bwd", "v10"): "v07 + D 64's K_w, V_w in registers (RS GEMMs)",
    ("bwd", "v11"): "v10 + persistent zigzag CTAs at D 64, S_k <= 1024",
    ("bwd", "v12"): "v10 + dK, dV stored as 16-byte chunks of whole rows",
    ("bwd", "v13"): "v12 + D 64 over 128 queries a step, dQ split by rows",
    ("bwd", "v14"): "v13 + causal grids ending on short key blocks, pre-pass zeroes dq_accum",
    ("bwd", "v15"): "v14 + convert by each KV head's last CTA",
    ("bwd", "v16"): "v15's convert fed by cp.async.bulk into a ring",
    ("bwd", "v17"): "v14 with dQ added in a fixed order, signalled by the consumers",
    ("bwd", "v18"): "v17's order signalled by two producer warps",
    ("bwd", "v19"): "D 192 / 256 on wgmma, two consumer warpgroups by role",
    ("bwd", "v20"): "v14 over tensor maps of the true D (narrow head dims below 128)",
    ("bwd", "masked v08"): "v07's staggered loop with window, softcap, sinks as a Steps policy",
    ("bwd", "masked v21"): "D 192 / 256: masked v08's steps on v19's wide loop (softcap's derivative in the P^T hand-off)",
}
# (family, first version, last version) -> the chapter that teaches them
CHAPTERS = (("fwd", "v01", "v01", "n4"), ("fwd", "v02", "v04", "n6"), ("fwd", "v05", "v07", "n9"), ("fwd", "v10", "v10", "n14"),
            ("fwd", "masked v08", "masked v11", "n13"), ("decode", "v01", "v02", "n7"), ("decode", "v03", "v08", "n11"),
            ("bwd", "v01", "v08", "n10"), ("bwd", "v09", "v09", "n14"), ("bwd", "v10", "v18", "n10"),
            ("bwd", "v19", "v20", "n14"), ("bwd", "masked v08", "masked v08", "n13"))


def _tables(family: str) -> list[tuple[str, str]]:
    """(row prefix, lab.registry.TABLES key) of a README's family: the plain table, then the masked one."""
    return [("", family)] + ([("masked ", family + "_masked")] if family + "_masked" in registry.TABLES else [])


def _status(table: str, version: str) -> str:
    """'history' for a version no default call reaches (lab.registry.HISTORY), else the product variant it implements."""
    if version in registry.HISTORY.get(table, ()):
        return "history"
    names = [v.name for v in registry.VARIANTS.values() if v.family == table and v.version == version]
    return "**default**: " + ", ".join(f"`{n}`" for n in names) if names else "-"


def _chapter(family: str, name: str) -> str:
    def key(v: str) -> tuple:
        return (v.startswith("masked"), int(v.split("v")[-1]))
    return next((c for f, lo, hi, c in CHAPTERS if f == family and key(lo) <= key(name) <= key(hi)), "-")


def version_table(family: str) -> str:
    """The README's version table of a family ('fwd', 'decode', 'bwd') as Markdown."""
    rows = ["| version | file | idea | head dims | status | chapter |", "|---|---|---|---|---|---|"]
    for prefix, key in _tables(family):
        for version, kernel in sorted(registry.TABLES[key].items()):
            name = prefix + version
            dims = ", ".join(str(d) for d in kernel.head_dims) + (" (sm_90a)" if kernel.capabilities else "")
            rows.append(f"| {name} | `{kernel.source}` | {IDEAS.get((family, name), '-')} | {dims} | "
                        f"{_status(key, version)} | {_chapter(family, name)} |")
    return "\n".join(rows) + "\n"


def block(text: str) -> str:
    """The generated table as it stands between the markers of a README's text."""
    match = re.search(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), text, re.S)
    if not match:
        raise ValueError(f"no {BEGIN} ... {END} block")
    return match.group(1)


def write(root: Path = ROOT) -> list[str]:
    """Rewrite each README's block with the generated table; returns the READMEs that changed."""
    changed = []
    for family, rel in README.items():
        path = root / rel
        text = path.read_text()
        new = text.replace(BEGIN + "\n" + block(text) + END, BEGIN + "\n" + version_table(family) + END)
        if new != text:
            path.write_text(new)
            changed.append(rel)
    return changed


def main(argv: list[str]) -> int:
    for rel in write():
        print(f"rewrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
