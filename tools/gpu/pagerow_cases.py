"""Small paged-decode calls (decode v03 and v04; PAGED_VERSIONS picks) for compute-sanitizer
(tools/gpu/sanitize_pagerow.sh): paged caches at pages 16/48/256 (a 16-key tile never crosses a page; 48 is not a multiple of the old 64-key tile), ragged lengths with 0 and 1,
q_len 1 and 3 (bottom-right causal), fp16 D 64 and bf16 D 128, H_kv 8 and 16 (two head chunks), one split, three
and the plan's; bad tables (a page id past the pool, a negative one, a length past the table); the contiguous
cache, plain and causal. Each output is checked against the float64 reference, so a run that only stays quiet
under the tool without computing the right thing does not pass. Prints PASS/FAIL per call and exits 1 on a FAIL.
"""
from __future__ import annotations

import os
import sys

import torch

from lab import check, ops
from lab.cases import PagedCase
from lab.decode import paged

VERSIONS = os.environ.get("PAGED_VERSIONS", "v03 v04").split()  # every paged version; the contiguous rows run it too
PAGES = [int(p) for p in os.environ.get("PAGED_PAGES", "16 48 256").split()]  # 16 holds the bad-table calls


def main() -> int:
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for V, page in ((v, p) for v in VERSIONS for p in PAGES):
        for (Hq, Hkv, q_len, causal, D, dtype) in ((32, 8, 1, False, 128, "bfloat16"), (32, 16, 3, True, 64, "float16")):
            case = PagedCase(f"san-p{page}-{Hq}x{Hkv}-q{q_len}", 4, Hq, Hkv, q_len, 300, D, dtype, (0, 1, 65, 300), page,
                             causal)
            a = paged.paged_inputs(case, gen, "cuda")
            ref = paged.reference(a["q"], a["k"], a["v"], case.lengths(), causal)
            yard = paged.yardstick(a["q"], a["k"], a["v"], case.lengths(), causal)
            for splits in (1, 3, None):
                flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
                out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], None, splits, block_table=a["table"],
                                 is_causal=causal, page_errors=flags, version=V)
                ok = check.compare(out, ref, yard)["passed"] and flags.tolist() == [0] * case.B
                failed += not ok
                print(("PASS" if ok else "FAIL"), V, case.name, "splits", splits, flush=True)
            if page == 16:  # bad tables: zeroed and flagged, never read
                table = a["table"].clone()
                table[1, 0] = a["k_pages"].shape[0]
                table[2, 1] = -3
                seqlens = a["seqlens"].clone()
                seqlens[3] = table.shape[1] * page + 1
                flags = torch.full((case.B,), -1, dtype=torch.int32, device="cuda")
                out = ops.decode(a["q"], a["k_pages"], a["v_pages"], seqlens, None, 2, block_table=table,
                                 is_causal=causal, page_errors=flags, version=V)
                ok = flags.tolist() == [0, 1, 1, 2] and bool((out[1:] == 0).all())
                failed += not ok
                print(("PASS" if ok else "FAIL"), V, case.name, "bad table", flags.tolist(), flush=True)
            k, v = a["k"], a["v"]
            out = ops.decode(a["q"], k, v, a["seqlens"], is_causal=causal, version=V)  # contiguous
            ok = check.compare(out, ref, yard)["passed"]
            failed += not ok
            print(("PASS" if ok else "FAIL"), V, case.name, "contiguous", flush=True)
    torch.cuda.synchronize()
    print(f"{'FAILED ' + str(failed) if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
