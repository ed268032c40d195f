"""Small decode calls at every head dim for compute-sanitizer (tools/gpu/paged_dims_sanitize.sh): decode v02 (contiguous)
and v03 (paged pages 16 and 48, shuffled tables; contiguous causal) at D 80/96/192/256 (DIMS picks), and v03/v04 at
D 64/128, whose initcheck and synccheck logs were missing; lengths 0, 65, 300, GQA 4, q_len 1 and 3 (bottom-right
causal), one split and three (the combine). Each output is checked against float64 (lab.check.compare), so a run that
only stays quiet under the tool does not pass. Prints PASS/FAIL per call and exits 1 on a FAIL.
"""
from __future__ import annotations

import os
import sys

import torch

from lab import check, ops
from lab.cases import PagedCase
from lab.decode import paged

DIMS = [int(d) for d in os.environ.get("DIMS", "64 80 96 128 192 256").split()]
VERSIONS = os.environ.get("DIMS_VERSIONS", "").split()  # these versions at every D instead (e.g. "v05": paged and causal)


def main() -> int:
    failed = 0
    gen = torch.Generator().manual_seed(0)
    for D in DIMS:
        versions = VERSIONS or (("v03", "v04") if D in (64, 128) else ("v02", "v03"))
        for q_len, causal, dtype in ((1, False, "bfloat16"), (3, True, "float16")):
            case = PagedCase(f"san-d{D}-q{q_len}", 3, 32, 8, q_len, 300, D, dtype, (0, 65, 300), 16 if q_len == 1 else 48,
                             causal)
            # Inputs, reference and yardstick made on the CPU and copied over: under initcheck every GPU kernel of
            # torch's is tracked too (the tool then ran past four minutes), and a copy marks its bytes initialised.
            host = paged.paged_inputs(case, gen, "cpu")
            ref = paged.reference(host["q"], host["k"], host["v"], case.lengths(), causal)
            yard = paged.yardstick(host["q"], host["k"], host["v"], case.lengths(), causal)
            a = {name: t.to("cuda") for name, t in host.items()}
            for V in versions:
                for splits in (1, 3):
                    if V == "v02":  # contiguous only, no mask: q_len 1
                        if causal:
                            continue
                        out = ops.decode(a["q"], a["k"], a["v"], a["seqlens"], None, splits, version=V)
                        flags_ok = True
                    else:
                        flags = torch.full((case.B,), -1, dtype=torch.int32).to("cuda")
                        out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], None, splits,
                                         block_table=a["table"], is_causal=causal, page_errors=flags, version=V)
                        flags_ok = flags.tolist() == [0] * case.B
                    ok = check.compare(out.cpu(), ref, yard)["passed"] and flags_ok
                    failed += not ok
                    print("PASS" if ok else "FAIL", V, case.name, "splits", splits, flush=True)
    torch.cuda.synchronize()
    print(f"{'FAILED ' + str(failed) if failed else 'all passed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
