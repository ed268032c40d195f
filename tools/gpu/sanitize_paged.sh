#!/bin/bash
# compute-sanitizer on decode v03 (kernels/decode/v03_paged.cu); first run on an H200 on 2026-11-23:
#   bash tools/gpu/sanitize_paged.sh        # on a GPU machine; logs to $OUT (about 5-10 minutes)
# 1. The contiguous path: tools/gpu/decode_main.cu linked with v03 (its --sanitize list: lengths 0, 1, 63,
#    4097, num_splits 1..1024, GQA/MHA/MQA, q_len 1/4/16) under memcheck, racecheck, initcheck, synccheck.
# 2. The paged path through torch: shuffled tables (page 16/48/256, forced splits) and out-of-range tables
#    (a page id past the pool, a negative one, a huge one past the length, a length past the table) under
#    memcheck. PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so a read past a
#    cache or a table is outside an allocation and memcheck sees it (the caching allocator's pools hide it).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/sanitize_env.sh"
sanitize_env /tmp/sanitize_paged sanitize_paged.log  # OUT BIN CAP ARCH LOG
sanitize_log_head kernels lab/binding.cpp

nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_$ARCH,code=sm_$ARCH -DDECODE_FN=decode_paged_v03 \
  tools/gpu/decode_main.cu kernels/decode/v03_paged.cu -o $BIN/dec_v03 >> "$LOG" 2>&1
{ echo "== dec_v03 --sanitize (no tool)"; $BIN/dec_v03 --sanitize | grep -vE "^PASS"; echo "rc=${PIPESTATUS[0]}"; } >> "$LOG" 2>&1
for tool in memcheck racecheck initcheck synccheck; do
  { echo "== compute-sanitizer --tool $tool dec_v03 --sanitize"
    timeout 420 compute-sanitizer --tool $tool $BIN/dec_v03 --sanitize 2>&1 | grep -vE "^PASS" | tail -20
    echo "rc=${PIPESTATUS[0]}"; } >> "$LOG" 2>&1
done

{ echo "== compute-sanitizer --tool memcheck pytest tests/decode/test_paged_gpu.py (shuffled and out-of-range tables)"
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 LAB_SDPA_NO_CUDNN=1 timeout 900 compute-sanitizer --tool memcheck --target-processes all \
    "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider tests/decode/test_paged_gpu.py \
    -k "out_of_range or split_counts or contiguous_causal or p16-8x2 or p256-16x2" 2>&1 | tail -40
  echo "rc=${PIPESTATUS[0]}"; } >> "$LOG" 2>&1
grep -E "^==|ERROR SUMMARY|rc=|passed|failed" "$LOG"
