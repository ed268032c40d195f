#!/bin/bash
# compute-sanitizer on decode v04 (kernels/decode/v04_pagerow.cu) and v03 through torch: tools/gpu/pagerow_cases.py (paged
# pages 16/48/256, bad tables, the contiguous cache, causal, fp16/bf16, D 64/128, forced splits) under memcheck,
# racecheck, initcheck and synccheck, each limited to the pass-1 kernels (the combine is v02's, sanitized with it): torch's
# own kernels are not ours to judge. PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so a
# read past a cache or a table leaves its allocation and memcheck sees it.
#   bash tools/gpu/sanitize_pagerow.sh OUT_DIR     # inside `run`; about 3-4 minutes (TOOLS, PAGED_PAGES: a subset)
set -u
OUT=${1:-${OUT:-/tmp/sanitize_pagerow}}; mkdir -p "$OUT"; LOG=$OUT/sanitize_pagerow.log
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv; compute-sanitizer --version | tail -2
  echo "commit ${LAB_COMMIT:-unknown}"; } > "$LOG" 2>&1
{ echo "== no tool"; python3 tools/gpu/pagerow_cases.py | tail -3; echo "rc=${PIPESTATUS[0]}"; } >> "$LOG" 2>&1
for tool in ${TOOLS:-memcheck racecheck initcheck synccheck}; do
  { echo "== compute-sanitizer --tool $tool (kernel filter: partial_kernel: pass 1 of v03 and v04)"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 compute-sanitizer --tool $tool \
      --kernel-name kns=partial_kernel python3 tools/gpu/pagerow_cases.py 2>&1 \
      | grep -vE "^PASS" | tail -25
    echo "rc=${PIPESTATUS[0]}"; } >> "$LOG" 2>&1
done
grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|rc=|passed|FAIL" "$LOG"
