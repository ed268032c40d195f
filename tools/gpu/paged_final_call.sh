#!/bin/bash
# The paged decode's closing call, after the probe (tools/gpu/paged_probe_call.sh): every decode kernel built; then, side
# by side and untimed, initcheck on pass 1 and the split-K combine over tools/gpu/decode_dims_cases.py once with
# programmatic dependent launch and once without (LAB_DECODE_NO_PDL: does a report depend on it?), logs kept whole (no
# kernel filter: one that leaves pass 1 out hides its stores and flags every read of the partials); compute-sanitizer
# on pass 1 of v03 / v04 (PASS1=1: tools/gpu/sanitize_pagerow.sh, after a kernel change); the public ops' GPU tests
# (tests/test_ops_gpu.py, tests/test_paged_gpu.py); then, alone on the GPU, the chapter sessions n11 (full) and n7
# (quick) by tools/gpu/paged_session.sh (SANITIZE=0). $OUT gets final.tgz, the sessions' tarballs and their logs.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/paged_final_call.sh      (carry .whl: papermill for the sessions)
set -u
OUT=${OUT:-/tmp/paged_final}; D=$OUT/final; mkdir -p "$D"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv
  compute-sanitizer --version | tail -1; python3 -c "import torch; print('torch', torch.__version__)"; } > "$D/gpu.txt" 2>&1
source tools/gpu/paged_builds.sh; paged_builds "$D/build.log" "$D/steps.txt"
t0=$(date +%s)
for pdl in on off; do
  ( LOG=$D/initcheck-combine-pdl-$pdl.log
    [ $pdl = off ] && export LAB_DECODE_NO_PDL=1
    { echo "== compute-sanitizer --tool initcheck --check-api-memory-access no" \
           "python3 tools/gpu/decode_dims_cases.py (DIMS=${DIMS:-64 80 96 128 192 256}, programmatic dependent launch $pdl)"
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${TOOL_TIMEOUT:-200} compute-sanitizer --tool initcheck \
        --check-api-memory-access no python3 tools/gpu/decode_dims_cases.py 2>&1
      echo "rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 )) s"; } > "$LOG" 2>&1 ) &
done
[ "${PASS1:-0}" != 0 ] && ( timeout 200 bash tools/gpu/sanitize_pagerow.sh "$D" > "$D/sanitize_pass1_summary.log" 2>&1 ) &
( timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py tests/test_paged_gpu.py > "$D/tests.log" 2>&1
  echo "tests rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt" ) &
wait
echo "sanitizers and tests $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
(cd "$OUT" && tar czf final.tgz final && rm -rf final)
OUT=$OUT SANITIZE=0 bash tools/gpu/paged_session.sh
tar xzOf "$OUT/final.tgz" final/steps.txt final/gpu.txt; tail -n 3 <(tar xzOf "$OUT/final.tgz" final/tests.log)
for f in $(tar tzf "$OUT/final.tgz" | grep -E "initcheck|sanitize"); do
  echo "== $f"; tar xzOf "$OUT/final.tgz" "$f" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|FAIL|Uninitialized" | head -8
done
