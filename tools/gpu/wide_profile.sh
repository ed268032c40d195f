#!/bin/bash
# ncu of bwd v09's main kernel (bwd_dkdv_wide) and FlashAttention-2's backward kernel (SDPA-flash) at one cell, one
# warm launch each, into DIR/profile-{lab,flash}.csv: --page raw, so the warp-stall reasons of WarpStateStats
# (smsp__average_warps_issue_stalled_*) come with the speed-of-light, pipe and memory metrics.
# Usage: [IMPLS=lab] bash tools/gpu/wide_profile.sh DIR [CELL] (CELL: a lab.cases.wide_head_dim_cases name;
# hdw-d256-s2048)
set -u
DIR=$1; CELL=${2:-hdw-d256-s2048}; mkdir -p "$DIR"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for impl in ${IMPLS:-lab flash}; do
  regex=$([ $impl = lab ] && echo "bwd_dkdv_wide" || echo "flash_bwd_dq_dk_dv")
  timeout ${NCU_TIMEOUT:-90} "$NCU" --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats \
    --kernel-name "regex:$regex" --launch-skip 2 --launch-count 1 --csv --page raw \
    python3 tools/gpu/wide_profile.py $impl "$CELL" > "$DIR/profile-$impl.csv" 2> "$DIR/profile-$impl.log"
  echo "ncu $impl $CELL rc=$?" >> "$DIR/profile-$impl.log"
done
