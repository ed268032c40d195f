#!/bin/bash
# ncu of fwd v10 at one shape, D = 200 (Narrow<Cfg256>: tensor maps over 200 columns, TMA's zero fill for the
# last 56) against D = 256 (the native kernel, the same FLOPs): why the narrow call at S = 8192 takes longer than
# the native one (kernels/README.md, "The narrow head dims": the last column block only 8 of 64 columns inside the
# tensor, or 400-byte rows that start off 128-byte lines). One warm launch each through lab.ops.attention, into
# DIR/profile-d{200,256}.csv (--page raw: speed of light, warp stalls, memory tables, L2 / DRAM sectors).
# Usage (device machine, repo root): bash tools/gpu/narrow_profile.sh DIR [S] [DIMS]   (S: 8192, DIMS: '200 256')
set -u
DIR=$1; S=${2:-8192}; mkdir -p "$DIR"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for D in ${3:-200 256}; do
  timeout ${NCU_TIMEOUT:-90} "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section SchedulerStats --kernel-name "regex:attn_fwd_v10" --launch-skip 2 --launch-count 1 --csv --page raw \
    python3 - "$D" "$S" > "$DIR/profile-d$D.csv" 2> "$DIR/profile-d$D.log" <<'PY'
import sys, torch
from lab import ops
D, S = int(sys.argv[1]), int(sys.argv[2])
q, k, v = (torch.randn(16384 // S, 16, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
with torch.no_grad():
    for _ in range(4):
        ops.attention(q, k, v)
torch.cuda.synchronize()
PY
  echo "ncu d$D s$S rc=$?" >> "$DIR/profile-d$D.log"
done
