#!/bin/bash
# The decode head dims' GPU call, before the chapters (tools/gpu/paged_session.sh with SANITIZE=0 next, on the same
# machine: the builds stay in .cache/dev): every decode kernel built at once; then, side by side (nothing here is
# timed), tools/gpu/decode_head_dims.py (the chapters' head-dim checks and the wrong-scale control) and
# compute-sanitizer over tools/gpu/decode_dims_cases.py: memcheck, racecheck, initcheck, synccheck on pass 1 of decode
# v02/v03 (D 80-256) and v03/v04 (D 64, 128), memcheck and initcheck on the combine. PYTORCH_NO_CUDA_MEMORY_CACHING=1
# under the tools: a read past a tensor leaves its allocation. Everything lands in $OUT/dims.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/paged_dims_call.sh   (CHECKS=0: no checks; SPECS: tool:kernel pairs;
#   PROBE=1: tools/gpu/decode_dims_probe.py first)
set -u
OUT=${OUT:-/tmp/paged_dims}; D=$OUT/dims; mkdir -p "$D/session"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm --format=csv
  compute-sanitizer --version | tail -1; python3 -c "import torch; print('torch', torch.__version__)"; } > "$D/gpu.txt" 2>&1
source tools/gpu/paged_builds.sh; paged_builds "$D/build.log" "$D/steps.txt"
if [ "${PROBE:-0}" != 0 ]; then  # timed, so alone on the GPU before anything else starts
  t0=$(date +%s); LAB_SESSION_DIR=$D/session timeout 120 python3 tools/gpu/decode_dims_probe.py > "$D/probe.log" 2>&1
  echo "probe rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
fi
t0=$(date +%s)
[ "${CHECKS:-1}" != 0 ] && ( LAB_SESSION_DIR=$D/session timeout ${DIMS_TIMEOUT:-240} python3 tools/gpu/decode_head_dims.py \
  > "$D/decode_head_dims.log" 2>&1; echo "decode_head_dims rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt" ) &
for spec in ${SPECS:-memcheck:partial_kernel racecheck:partial_kernel initcheck:partial_kernel synccheck:partial_kernel \
            memcheck:combine_kernel initcheck:combine_kernel}; do
  IFS=: read -r tool kernel <<< "$spec"
  ( LOG=$D/sanitize-$tool-$kernel.log
    { echo "== compute-sanitizer --tool $tool --kernel-name kns=$kernel python3 tools/gpu/decode_dims_cases.py (DIMS=${DIMS:-64 80 96 128 192 256})"
      # initcheck: no host API checks (torch's own copies of its scratch are not ours to judge)
      api=$([ $tool = initcheck ] && echo "--check-api-memory-access no")
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${TOOL_TIMEOUT:-240} compute-sanitizer --tool $tool $api --kernel-name kns=$kernel \
        python3 tools/gpu/decode_dims_cases.py 2>&1 | grep -vE "^PASS"  # whole reports, never cut
      echo "rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 )) s"; } > "$LOG" 2>&1 ) &
done
wait
(cd "$OUT" && tar czf dims.tgz dims && rm -rf dims)
tar xzOf "$OUT/dims.tgz" dims/steps.txt; tar xzOf "$OUT/dims.tgz" dims/probe.log 2>/dev/null; tar xzOf "$OUT/dims.tgz" dims/decode_head_dims.log 2>/dev/null | grep -vE "^PASS" | tail -20
for f in $(tar tzf "$OUT/dims.tgz" | grep sanitize-); do tar xzOf "$OUT/dims.tgz" "$f" | grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|FAIL"; done
