#!/bin/bash
# The paged decode's call for v03's lean-loader switch (LAB_PAGED_LEAN_LOADER, kernels/decode/v03_paged.cu) and the
# chapters with the committed defaults, under one deadline (BUDGET seconds from the start, 520 by default; a step that
# would not fit is skipped and says so in steps.txt):
#   1. every decode kernel (tools/gpu/paged_builds.sh) and the switch's two builds (right and wrong) at once;
#   2. chapters n11_paged_decode (full) and n7_split_k (quick) as GPU sessions, each into $OUT/<chapter>.tgz;
#   3. tools/gpu/paged_lean.py: check (the switch on every paged case, paged and contiguous; the wrong build must
#      fail), ab (GPU time against v03's default loader beside SDPA-cuDNN), then sanitize under memcheck, racecheck and
#      initcheck (no kernel filter: pass 1 and the combine both seen; inputs made on the CPU).
# Logs and the A/B's JSON lines in $OUT/lean.tgz.   LAB_COMMIT=<sha> bash tools/gpu/paged_lean_call.sh   (carry .whl)
# CHAPTERS=0 skips step 2, AB=0 the A/B.
set -u
start=$(date +%s); END=$(( start + ${BUDGET:-520} ))
OUT=${OUT:-/tmp/paged_lean}; D=$OUT/lean; mkdir -p "$D"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
export LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  compute-sanitizer --version | tail -1; python3 -c "import torch; print('torch', torch.__version__)"; } > "$D/gpu.txt" 2>&1
step() {  # name, limit, command...: runs if at least 20 s are left, limited to what is left
  local name=$1 limit=$2; shift 2; local left=$(( END - $(date +%s) )) t1
  [ "$left" -lt 20 ] && { echo "$name skipped: $left s left" >> "$D/steps.txt"; return; }
  [ "$limit" -gt "$left" ] && limit=$left
  t1=$(date +%s); timeout "$limit" "$@" > "$D/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s (limit $limit)" >> "$D/steps.txt"
}
source tools/gpu/paged_builds.sh
paged_builds "$D/build.log" "$D/steps.txt" &
python3 - > "$D/lean_build.log" 2>&1 <<'EOF' &
import sys
sys.path.insert(0, "tools/gpu")
from concurrent.futures import ThreadPoolExecutor
from lab import build, registry
from paged_lean import LEAN, WRONG
with ThreadPoolExecutor(2) as pool:
    for lib in pool.map(lambda d: build.build_kernel(registry.DECODE["v03"].source, d), (LEAN, WRONG)):
        print(lib.path.name, lib.build_seconds)
EOF
wait
echo "builds done $(( $(date +%s) - start )) s" >> "$D/steps.txt"
[ "${CHAPTERS:-1}" = 0 ] || for spec in "n11_paged_decode:full:${N11_LIMIT:-300}" "n7_split_k:quick:${N7_LIMIT:-150}"; do
  IFS=: read -r chapter cases limit <<< "$spec"
  step "$chapter" "$limit" python3 -m lab session --device cuda --cases "$cases" --chapters "$chapter" \
    --tarball "$OUT/$chapter.tgz" --no-log
done
step lean_check 90 python3 tools/gpu/paged_lean.py check
[ "${AB:-1}" = 0 ] || step lean_ab 90 python3 tools/gpu/paged_lean.py ab "$D/ab.jsonl"
for tool in memcheck racecheck initcheck; do
  step "sanitize_$tool" 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool $tool \
    python3 tools/gpu/paged_lean.py sanitize
done
for f in "$D"/sanitize_*.log; do gzip -9 -f "$f"; done  # PASS lines and the tool's summary; small once zipped
(cd "$OUT" && tar czf lean.tgz lean && rm -rf lean)
tar xzOf "$OUT/lean.tgz" lean/steps.txt lean/gpu.txt
for c in n11_paged_decode n7_split_k; do tar xzOf "$OUT/lean.tgz" "lean/$c.log" 2>/dev/null | grep -E "^gate|session " | tail -n 14; done
tar xzOf "$OUT/lean.tgz" lean/lean_check.log 2>/dev/null | tail -n 6
tar xzOf "$OUT/lean.tgz" lean/lean_ab.log 2>/dev/null | tail -n 75
for t in memcheck racecheck initcheck; do
  echo "== $t"; tar xzOf "$OUT/lean.tgz" "lean/sanitize_$t.log.gz" 2>/dev/null | zcat | grep -E "SUMMARY|all passed|FAIL" | head -4
done
exit 0
