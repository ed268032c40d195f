#!/bin/bash
# decode v05's call (whole-row bulk copies, kernels/decode/v05_bulkrow.cu): every decode kernel built at once
# (tools/gpu/paged_builds.sh); then, side by side and untimed: the paged GPU tests (tests/test_paged_gpu.py: every paged
# version, v05 among them, its wrong-table build included), v05 at every head dim (tools/gpu/decode_dims_cases.py,
# DIMS_VERSIONS=v05) plain and under memcheck, racecheck, synccheck and initcheck (no kernel filter: pass 1 and the
# combine both seen), and tools/gpu/pagerow_cases.py (pages 16/48/256, bad tables, contiguous and causal) under
# memcheck, racecheck and synccheck on pass 1; then, alone on the GPU: the race (tools/gpu/paged_bulk_bench.py: v05,
# v03, the default and SDPA-cuDNN on the serving cells, GPU time) and ncu's DRAM and L2 numbers of v03 and v05; then
# the n11 session (tools/gpu/paged_session.sh, SANITIZE=0, N7_CASES=none unless set). $OUT: bulk.tgz, the session's
# tarball and logs.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/paged_bulk_call.sh      (carry .whl: papermill for the session; SESSION=0 skips it)
set -u
OUT=${OUT:-/tmp/paged_bulk}; D=$OUT/bulk; mkdir -p "$D"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,clocks.mem --format=csv
  compute-sanitizer --version | tail -1; python3 -c "import torch; print('torch', torch.__version__)"; } > "$D/gpu.txt" 2>&1
source tools/gpu/paged_builds.sh; paged_builds "$D/build.log" "$D/steps.txt"
t0=$(date +%s)
LIMIT=${TOOL_TIMEOUT:-150}
sanitize() {  # log name, tool, then the command
  local log=$1 tool=$2; shift 2
  { echo "== compute-sanitizer --tool $tool $*"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $LIMIT compute-sanitizer --tool $tool "$@" 2>&1 | grep -vE "^PASS" | tail -30
    echo "rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 )) s"; } > "$D/$log.log" 2>&1
}
( timeout $LIMIT python3 -m pytest -q -p no:cacheprovider tests/test_paged_gpu.py > "$D/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt" ) &
( DIMS_VERSIONS=v05 timeout $LIMIT python3 tools/gpu/decode_dims_cases.py > "$D/dims_v05.log" 2>&1
  echo "dims v05 rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt" ) &
for tool in memcheck racecheck synccheck initcheck; do
  DIMS_VERSIONS=v05 sanitize dims-$tool $tool python3 tools/gpu/decode_dims_cases.py &
done
for tool in memcheck racecheck synccheck; do
  PAGED_VERSIONS=v05 sanitize pagerow-$tool $tool --kernel-name kns=partial_kernel python3 tools/gpu/pagerow_cases.py &
done
wait
echo "checks and sanitizers $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
t1=$(date +%s)
timeout ${BENCH_TIMEOUT:-120} python3 tools/gpu/paged_bulk_bench.py "$D/race.jsonl" > "$D/race.log" 2>&1
echo "race rc=$? $(( $(date +%s) - t1 )) s" >> "$D/steps.txt"
t1=$(date +%s)
timeout ${NCU_TIMEOUT:-90} ncu --kernel-name regex:partial_kernel --csv --page raw --metrics \
  gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,dram__bytes_read.sum \
  python3 tools/gpu/paged_bulk_bench.py ncu > "$D/ncu.csv" 2> "$D/ncu.err"
echo "ncu rc=$? $(( $(date +%s) - t1 )) s" >> "$D/steps.txt"
(cd "$OUT" && tar czf bulk.tgz bulk && rm -rf bulk)
tar xzOf "$OUT/bulk.tgz" bulk/steps.txt bulk/gpu.txt; tail -n 3 <(tar xzOf "$OUT/bulk.tgz" bulk/tests.log)
tar xzOf "$OUT/bulk.tgz" bulk/dims_v05.log | tail -n 2
for f in $(tar tzf "$OUT/bulk.tgz" | grep -E "dims-|pagerow-"); do
  echo "== $f"; tar xzOf "$OUT/bulk.tgz" "$f" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|FAIL" | head -6
done
tar xzOf "$OUT/bulk.tgz" bulk/race.log | grep -E " p(16|64|256) (v03|v05|default) | sdpa|contiguous|x131072|:" | head -80
[ "${SESSION:-1}" != 0 ] && OUT=$OUT SANITIZE=0 N7_CASES=${N7_CASES:-none} bash tools/gpu/paged_session.sh
exit 0
