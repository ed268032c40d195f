#!/bin/bash
# Where does v07's FUSE lose (H200 runs 14 and 17: -15 % at D=128 S=512)? ncu source counters of one launch
# of the few-keys config with and without FUSE; per-instruction stall samples exported as CSV to $OUT.
# Usage (device machine, repo root): bash tests/cuda/fuse_profile.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/tx}
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for fuse in 0 1; do
  python3 - "$fuse" <<'PY'  # build first, so ncu times nothing but the launches
import sys
from lab import ops
ops.launcher(ops.FWD, "v07", {"LAB_V07_D128_FUSE": sys.argv[1]})
PY
  timeout 240 "$NCU" --clock-control none --set full --import-source no --kernel-name regex:attn_fwd_v07 \
    --launch-skip 3 --launch-count 1 -f -o "$OUT/fuse$fuse" python3 - "$fuse" > "$OUT/fuse$fuse.log" 2>&1 <<'PY'
import sys, torch
from lab import cases, ops, sweep
case = {c.name: c for c in cases.bench_fwd_cases("bfloat16")}["fwd-d128-s512"]
q, k, v, causal = sweep.case_inputs(case)
call = ops.fwd_call_factory("v07", {"LAB_V07_D128_FUSE": sys.argv[1]})(q, k, v, causal)
for _ in range(5):
    call()
torch.cuda.synchronize()
PY
  echo "fuse=$fuse ncu rc=$?" >> "$OUT/fuse$fuse.log"
  "$NCU" -i "$OUT/fuse$fuse.ncu-rep" --page source --csv --print-source sass > "$OUT/fuse$fuse-source.csv" 2>/dev/null
  "$NCU" -i "$OUT/fuse$fuse.ncu-rep" --page details --csv > "$OUT/fuse$fuse-details.csv" 2>/dev/null
  gzip -f "$OUT/fuse$fuse-source.csv"
  tail -2 "$OUT/fuse$fuse.log"; ls -la "$OUT"/fuse$fuse*
done
