#!/bin/bash
# ncu of one bench-fwd cell: lab.ops.attention (the public op, as users call it) and SDPA-cuDNN, one launch
# each after warm-up; the details page and the per-instruction source counters (SASS) as CSV under $OUT.
# Usage (device machine, repo root): bash tools/gpu/cell_profile.sh fwd-d128-s512 [fwd-d128-s512-c ...]
# (fuse_profile.sh, which profiled v07's FUSE switch this way, is in the git history: git show d4219ec:tests/cuda/fuse_profile.sh)
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/tx}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for cell in "$@"; do
  for impl in lab cudnn; do
    name=$cell-$impl
    # lab: the launcher kernels are attn_fwd_v0*; cuDNN's SDPA kernels carry "cudnn" or "sm90" in their names
    regex=$([ $impl = lab ] && echo "attn_fwd_v0" || echo "cudnn|sm90|fmha|flash")
    timeout 240 "$NCU" --clock-control none --set full --import-source no --kernel-name "regex:$regex" \
      --launch-skip 3 --launch-count 1 -f -o "$OUT/$name" python3 - "$cell" "$impl" > "$OUT/$name.log" 2>&1 <<'PY'
import sys, torch
from lab import bench, cases, ops, sweep
case = {c.name: c for c in cases.bench_fwd_cases("bfloat16")}[sys.argv[1]]
q, k, v, causal = sweep.case_inputs(case)
sdpa = torch.nn.functional.scaled_dot_product_attention
for _ in range(5):
    if sys.argv[2] == "lab":
        ops.attention(q, k, v, is_causal=causal)
    else:
        with bench.sdpa_backend("cudnn"):
            sdpa(q, k, v, is_causal=causal)
torch.cuda.synchronize()
PY
    echo "$name ncu rc=$?" >> "$OUT/$name.log"
    "$NCU" -i "$OUT/$name.ncu-rep" --page details --csv > "$OUT/$name-details.csv" 2>/dev/null
    "$NCU" -i "$OUT/$name.ncu-rep" --page source --csv --print-source sass 2>/dev/null | gzip > "$OUT/$name-source.csv.gz"
    # one archive per profile: the device returns only a few files per call
    (cd "$OUT" && tar czf "$name.tgz" "$name".ncu-rep "$name"-*.csv* "$name".log && rm -f "$name".ncu-rep "$name"-*.csv* "$name".log)
    tar xzOf "$OUT/$name.tgz" "$name.log" | tail -1
  done
done
