#!/bin/bash
# The Hopper backward on one GPU in one call: the standalone driver (every config of tools/gpu/bwd_main.cu against
# float64 gradients, and the D-term self-test build that must fail), compute-sanitizer (memcheck, racecheck,
# synccheck, initcheck) on the driver, then tools/gpu/bwd_race.py (checks through lab.check, the race).
# Usage inside `run`: bash tools/gpu/bwd_hopper.sh VERSION CASE_FILTER [race flags]; logs and records to $OUT.
# BWD_NVCC_FLAGS adds compile switches to the driver builds (e.g. -DLAB_BWD_PERSIST_MAX_CTAS=2: several tiles per CTA);
# BWD_MODES=2 runs the deterministic mode too (bwd v17).
set -u
OUT=${OUT:-/tmp/bwd_out}; mkdir -p "$OUT"
V=${1:-v02}; FILTER=${2:-}; shift 2 || true
SRC=$(ls kernels/bwd/${V}_*.cu); SYM=attn_bwd_$V
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_OUTPUTS=$OUT/outputs PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
TAG=$V${BWD_TAG:+_$BWD_TAG}; LOG=$OUT/bwd_$TAG.log
{ date -u; git rev-parse --short=10 HEAD; git status --short kernels lab | head -20
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv
  nvcc --version | tail -1; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$LOG" 2>&1
B=$(mktemp -d); DRV=tools/gpu/bwd_main.cu
NV="nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a -DBWD_FN=$SYM -DBWD_MODES=${BWD_MODES:-1} ${BWD_NVCC_FLAGS:-}"
$NV $DRV $SRC -o $B/bwd > $B/build.log 2>&1 &
$NV -DLAB_BWD_BUG_NO_DELTA $DRV $SRC -o $B/bwd_bug > /dev/null 2>&1 &
python3 -c "from lab import build; build.binding(); print('binding ok')" > $B/binding.log 2>&1 &
wait; cat $B/build.log $B/binding.log >> "$LOG"
echo "== driver $V, full list" >> "$LOG"; timeout 120 $B/bwd >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"
echo "== driver $V, LAB_BWD_BUG_NO_DELTA build (must FAIL)" >> "$LOG"; timeout 60 $B/bwd_bug 2>&1 | tail -2 >> "$LOG"
for tool in ${TOOLS-memcheck racecheck synccheck initcheck}; do
  list=--tiny; [ $tool = memcheck ] && list=--small
  ( timeout 200 compute-sanitizer --tool $tool $B/bwd $list > "$OUT/sanitize_${TAG}_$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanitize_${TAG}_$tool.log" ) &
done
wait
for f in "$OUT"/sanitize_${TAG}_*.log; do echo "$(basename $f): $(tail -n 3 $f | tr '\n' ' ')"; done >> "$LOG"
[ "$FILTER" = none ] && { cat "$LOG"; exit 0; }
echo "== race ($FILTER)" >> "$LOG"
timeout ${RACE_TIMEOUT:-300} python3 tools/gpu/bwd_race.py $V "$FILTER" "$@" >> "$LOG" 2>&1; echo "race rc=$?" >> "$LOG"
tar -C "$OUT" -czf "$OUT/records_$TAG.tgz" outputs 2>/dev/null && rm -rf "$OUT/outputs"
cat "$LOG"
