#!/bin/bash
# The backward in one GPU run: standalone driver (correctness, the D-term self-test build),
# compute-sanitizer memcheck (--small list) and racecheck (--tiny list) on the backward kernels, the GPU pytest
# file, then chapters/n10_backward.ipynb by papermill (its timings run after the sanitizers finished). Logs to $OUT.
# Usage inside `run` (carry .whl and .bwdcache, prebuilt sm_90a kernels): bash tools/gpu/bwd_gpu.sh [quick|full]
set -u
OUT=${OUT:-/tmp/bwd_out}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE=$PWD/.bwdcache
CASES=${1:-quick}
LOG=$OUT/bwd.log
{ date -u; git rev-parse --short=10 HEAD; git status --short kernels/bwd lab tests | head -20
  nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv; nvcc --version | tail -2
  compute-sanitizer --version | tail -2; python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)"; } > "$LOG" 2>&1
B=$(mktemp -d)
NV="nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a"
$NV tools/gpu/bwd_main.cu kernels/bwd/v01_mma.cu -o $B/bwd > /dev/null 2>&1 &
$NV -DLAB_BWD_BUG_NO_DELTA tools/gpu/bwd_main.cu kernels/bwd/v01_mma.cu -o $B/bwd_bug > /dev/null 2>&1 &
VARIANTS="4:4 8:1 8:4"  # LAB_BWD_WARPS:LAB_BWD_RED builds beside the default (4:1), for the driver and the sweep
for wr in $VARIANTS; do
  $NV -DLAB_BWD_WARPS=${wr%:*} -DLAB_BWD_RED=${wr#*:} tools/gpu/bwd_main.cu kernels/bwd/v01_mma.cu -o $B/bwd_w${wr/:/r} > /dev/null 2>&1 &
done
python3 -c "from lab import build; build.binding(); print('binding ok')" > "$OUT/binding.log" 2>&1 &
wait
cat "$OUT/binding.log" >> "$LOG"; rm -f "$OUT/binding.log"
echo "== driver, full list (no tool)" >> "$LOG"; $B/bwd >> "$LOG" 2>&1; echo "rc=$?" >> "$LOG"
for wr in $VARIANTS; do
  echo "== driver, LAB_BWD_WARPS=${wr%:*} LAB_BWD_RED=${wr#*:}" >> "$LOG"; $B/bwd_w${wr/:/r} | tail -1 >> "$LOG" 2>&1; echo "rc=${PIPESTATUS[0]}" >> "$LOG"
done
echo "== driver, LAB_BWD_BUG_NO_DELTA build (must FAIL)" >> "$LOG"; $B/bwd_bug 2>&1 | tail -4 >> "$LOG"; echo "rc=${PIPESTATUS[0]}" >> "$LOG"
( timeout 240 compute-sanitizer --tool memcheck $B/bwd --small > "$OUT/sanitize_memcheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitize_memcheck.log" ) &
( timeout 240 compute-sanitizer --tool racecheck $B/bwd --tiny > "$OUT/sanitize_racecheck.log" 2>&1; echo "rc=$?" >> "$OUT/sanitize_racecheck.log" ) &
timeout ${PYTEST_TIMEOUT:-130} python3 -m pytest -q -p no:cacheprovider tests/test_backward_gpu.py -rf > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.log"
wait
echo "== variants (kernel-only backward, bf16)" >> "$LOG"
timeout ${VARIANTS_TIMEOUT:-90} python3 tools/gpu/bwd_variants.py "$OUT/variants.jsonl" >> "$LOG" 2>&1
echo "variants rc=$?" >> "$LOG"
echo "== chapter n10_backward (papermill, cases=$CASES)" >> "$LOG"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH LAB_OUTPUTS=$OUT/chapter_outputs
timeout ${CHAPTER_TIMEOUT:-150} python3 -m papermill chapters/n10_backward.ipynb "$OUT/n10_backward.ipynb" -p device cuda \
  -p cases "$CASES" -p reps 1 --cwd "$PWD" > "$OUT/papermill.log" 2>&1
echo "papermill rc=$?" >> "$LOG"; tail -3 "$OUT/papermill.log" >> "$LOG"; rm -f "$OUT/papermill.log"
tar -C "$OUT" -czf "$OUT/chapter_outputs.tgz" chapter_outputs 2>/dev/null && rm -rf "$OUT/chapter_outputs"
tail -n 3 "$OUT/pytest.log" >> "$LOG"; for f in "$OUT"/sanitize_*.log; do tail -n 2 "$f"; done >> "$LOG"
date -u >> "$LOG"
