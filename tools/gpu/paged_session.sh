#!/bin/bash
# The paged decode's closing call: compute-sanitizer on decode v03 and v04 (tools/gpu/sanitize_pagerow.sh; SANITIZE=0
# skips it), then the chapters as GPU sessions: n11_paged_decode (N11_CASES: full by default) and n7_split_k (N7_CASES:
# quick by default), none skipping either, each packed into $OUT/<chapter>.tgz (unpack into outputs/sessions/). The
# wheels papermill needs come in .whl (carry it), the decode kernels are built at once first (carry .cache/dev where they were prebuilt with LAB_CACHE_DIR=.cache/dev).
#   LAB_COMMIT=<sha> bash tools/gpu/paged_session.sh
set -u
OUT=${OUT:-/tmp/paged_session}; mkdir -p "$OUT/logs"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
export LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/logs/gpu.txt"
source tools/gpu/paged_builds.sh; paged_builds "$OUT/logs/build.log" "$OUT/logs/steps.txt"
t0=$(date +%s)
if [ "${SANITIZE:-1}" != 0 ]; then  # SANITIZE=0: sanitized elsewhere (tools/gpu/paged_dims_call.sh)
  timeout ${SANITIZE_TIMEOUT:-170} bash tools/gpu/sanitize_pagerow.sh "$OUT/logs" > "$OUT/logs/sanitize_summary.log" 2>&1
  echo "sanitize rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/logs/steps.txt"
fi
: >> "$OUT/logs/sanitize_summary.log"
for spec in "n11_paged_decode:${N11_CASES:-full}:${N11_TIMEOUT:-270}" "n7_split_k:${N7_CASES:-quick}:${N7_TIMEOUT:-150}"; do
  IFS=: read -r chapter cases limit <<< "$spec"
  [ "$cases" = none ] && continue
  t0=$(date +%s)
  timeout "$limit" python3 -m lab session --device cuda --cases "$cases" --chapters "$chapter" \
    --tarball "$OUT/$chapter.tgz" --no-log > "$OUT/logs/$chapter.log" 2>&1
  echo "$chapter ($cases) rc=$? $(( $(date +%s) - t0 )) s" >> "$OUT/logs/steps.txt"
done
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
tar xzOf "$OUT/logs.tgz" logs/steps.txt logs/sanitize_summary.log
for c in n11_paged_decode n7_split_k; do tar xzOf "$OUT/logs.tgz" "logs/$c.log" | tail -n 14; done
