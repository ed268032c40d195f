#!/bin/bash
# One device call for the backward (issue 16): standalone driver (correctness, the D-term self-test build),
# compute-sanitizer memcheck (--small list) and racecheck (--tiny list) on the backward kernels, the GPU pytest
# file, then the timings alone on the GPU. Logs to $OUT. Usage inside `run`: bash tests/cuda/bwd_gpu.sh [bench-lengths]
set -u
OUT=${OUT:-/tmp/bwd_out}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE=$PWD/.bwdcache
LENGTHS=${1:-2048,8192}
LOG=$OUT/bwd.log
{ date -u; git rev-parse --short=10 HEAD; git status --short kernels/bwd lab tests | head -20
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv; nvcc --version | tail -2
  compute-sanitizer --version | tail -2; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$LOG" 2>&1
B=$(mktemp -d)
NV="nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a"
$NV tests/cuda/bwd_main.cu kernels/bwd/v01_mma.cu -o $B/bwd > /dev/null 2>&1 &
$NV -DLAB_BWD_BUG_NO_DELTA tests/cuda/bwd_main.cu kernels/bwd/v01_mma.cu -o $B/bwd_bug > /dev/null 2>&1 &
python3 -c "from lab import build; build.binding(); print('binding ok')" > "$OUT/binding.log" 2>&1 &
wait
cat "$OUT/binding.log" >> "$LOG"
echo "== driver, full list (no tool)" >> "$LOG"; $B/bwd >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"
echo "== driver, LAB_BWD_BUG_NO_DELTA build (must FAIL)" >> "$LOG"; $B/bwd_bug 2>&1 | tail -4 >> "$LOG"; echo "rc=${PIPESTATUS[0]}" >> "$LOG"
( timeout 240 compute-sanitizer --tool memcheck $B/bwd --small > "$OUT/sanitize_memcheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitize_memcheck.log" ) &
( timeout 240 compute-sanitizer --tool racecheck $B/bwd --tiny > "$OUT/sanitize_racecheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitize_racecheck.log" ) &
timeout ${PYTEST_TIMEOUT:-170} python3 -m pytest -q -p no:cacheprovider tests/test_backward_gpu.py -x -rf > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.log"
wait
echo "== timings" >> "$LOG"
timeout ${BENCH_TIMEOUT:-100} python3 tests/cuda/bwd_bench.py "$OUT/bench_rows.jsonl" --lengths "$LENGTHS" --modes bwd > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"
tail -3 "$OUT/pytest.log" >> "$LOG"; tail -2 "$OUT/sanitize_memcheck.log" "$OUT/sanitize_racecheck.log" >> "$LOG"
date -u >> "$LOG"
