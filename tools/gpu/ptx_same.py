"""Two PTX files of one source compared as multisets of kernel bodies, every kernel's own name normalised away
(and the anonymous namespace's and internal names' hashes, the smem symbol, branch labels, .loc lines, comments):
checks that a change to a shared header (a template argument added, code a narrow config compiles in) left the kernels a source already had
as they were, whatever their mangled names became. BEFORE may be compiled from another checkout.

    nvcc -std=c++17 -O3 -I kernels -arch=compute_90a -ptx -o A.ptx kernels/bwd/v14_tail.cu
    python3 tools/gpu/ptx_same.py BEFORE.ptx AFTER.ptx   # "same N of N", exit 0, when every body is unchanged
"""
from __future__ import annotations

import collections
import re
import sys


def entries(path: str) -> list[tuple[str, str]]:
    """(mangled name, normalised body) of every kernel and function in a PTX file, in file order; the body has its
    own name replaced by NAME (tools/gpu/paged_ptx_same.py keys them by a name of its own)."""
    text = open(path).read()
    text = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__ANON_", text)  # the hash of the file's path and contents
    text = re.sub(r"_INTERNAL_[0-9a-f]+_", "_INTERNAL_HASH_", text)  # static locals' internal names carry it too
    text = re.sub(r"\.loc\s+.*\n", "", text)
    text = re.sub(r"//.*\n", "\n", text)
    out = []
    for part in re.split(r"\n(?=(?:\.(?:visible|weak) )?\.entry |\.func )", text)[1:]:
        name = re.match(r"(?:\.\w+ )?\.(?:entry|func) (?:\([^)]*\) )?(\S+?)\(", part).group(1)
        body = re.sub(r"\$L__BB\d+_", "LBB_", part.replace(name, "NAME"))
        out.append((name, re.sub(r"\w*?4smemE", "SMEM", body).strip()))
    return out


def bodies(path: str) -> collections.Counter:
    return collections.Counter(body for _, body in entries(path))


def main() -> int:
    before, after = bodies(sys.argv[1]), bodies(sys.argv[2])
    same = sum((before & after).values())
    print(f"same {same} of {sum(before.values())} (after: {sum(after.values())} kernels)")
    return 0 if same == sum(before.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
