#!/bin/bash
# All standalone GPU checks in one GPU run (builds there with nvcc):
#   bash tools/gpu/gpu_checks.sh            # inside `run`, writes 8 logs to $OUT
# v01 (normal, LAB_BUG_LAYOUT, LAB_DEBUG_DUMP), v02 and v03 (full tests + bench
# grid), decode (tests + bench), PyTorch SDPA-flash on the v02 bench grid, and
# compute-sanitizer memcheck + racecheck on every driver's --quick configs.
# About 3-4 minutes on an H100 (2026-11-21). Logs: $OUT/<date>-<gpu>-*.log.
set -u
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
BIN=$(mktemp -d)
NV="nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a"
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
P=$OUT/$(date -u +%Y%m%d)-${GPU:-gpu}
export PYTHONUNBUFFERED=1

{ date -u; nvidia-smi; } > "$P-env.log" 2>&1
$NV tools/gpu/fwd_v01_main.cu kernels/fwd/v01_scalar.cu -o $BIN/v01 &
$NV -DLAB_BUG_LAYOUT tools/gpu/fwd_v01_main.cu kernels/fwd/v01_scalar.cu -o $BIN/v01_bug_layout &
$NV -DLAB_DEBUG_DUMP tools/gpu/fwd_v01_main.cu kernels/fwd/v01_scalar.cu -o $BIN/v01_debug &
$NV tools/gpu/fwd_mma_main.cu kernels/fwd/v02_mma.cu -o $BIN/v02 &
$NV -DFWD_FN=attn_fwd_v03 tools/gpu/fwd_mma_main.cu kernels/fwd/v03_qsmem.cu -o $BIN/v03 &
$NV tools/gpu/decode_main.cu kernels/decode/v01_splitk.cu -o $BIN/dec &
wait
ls $BIN >> "$P-env.log"

{ echo "== v01 normal"; $BIN/v01; echo "rc=$?"
  echo "== v01 LAB_BUG_LAYOUT --no-timing (bshd configs expected to FAIL)"; $BIN/v01_bug_layout --no-timing; echo "rc=$?"
  echo "== v01 LAB_DEBUG_DUMP --no-timing"; $BIN/v01_debug --no-timing; echo "rc=$?"; } > "$P-v01-driver.log" 2>&1
for v in v02 v03; do { $BIN/$v; echo "rc=$?"; } > "$P-$v-driver.log" 2>&1; done
{ $BIN/dec; echo "rc=$?"; } > "$P-decode-driver.log" 2>&1
python3 tools/gpu/sdpa_flash_bench.py > "$P-sdpa-flash.log" 2>&1
for b in v01 v01_debug v02 v03 dec; do
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool $b --quick"
    timeout 150 compute-sanitizer --tool $tool $BIN/$b --quick 2>&1 | grep -v "^PASS"
    echo "rc=${PIPESTATUS[0]}"
  done
done > "$P-sanitizer.log" 2>&1
grep -hE "FAIL|passed|ALL PASS|SUMMARY|rc=" "$P"-*.log
