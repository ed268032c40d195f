"""Two PTX files of one decode source compared kernel by kernel, names normalised (anonymous namespace, the smem
symbol, branch labels, .loc lines, comments): checks that moving decode v06's pass 1 into
kernels/common/decode_warp_ring_pass1.cuh (a fifth template argument, kSwizzle false) left its code as it was, and
that the shared tile step's lane type (common/decode_pv.cuh's lane_at) left v02-v06's as they were; BEFORE may be
compiled from another checkout.

    nvcc -std=c++17 -O3 -I kernels -gencode=arch=compute_90a,code=compute_90a -ptx -o A.ptx kernels/decode/v06_warpring.cu
    python3 tools/gpu/paged_ptx_same.py BEFORE.ptx AFTER.ptx   # "same N diff 0", exit 0, when only names moved
"""
from __future__ import annotations

import re
import sys

from ptx_same import entries


def kernels(path: str) -> dict:
    """Each kernel's normalised body (ptx_same.entries) keyed by its name with pass 1's kernel and the kSwizzle
    argument's default folded away, so v06's kernels before and after the shared header pair up by name."""
    out = {}
    for name, body in entries(path):
        key = re.sub(r".*warpring_partial_kernel", "K", name)
        key = key.replace("Lb1ELb0EE", "Lb1EE").replace("Lb0ELb0EE", "Lb0EE")  # kSwizzle false
        out[key] = body.replace(".visible .entry", ".entry")
    return out


def main() -> int:
    before, after = kernels(sys.argv[1]), kernels(sys.argv[2])
    same = sum(1 for k, v in before.items() if after.get(k) == v)
    for k in before:
        if after.get(k) != before[k]:
            print("DIFF" if k in after else "MISSING", k)
    print("same", same, "diff", len(before) - same)
    return 0 if same == len(before) else 1


if __name__ == "__main__":
    sys.exit(main())
