#!/bin/bash
# The paged decode's evidence in one run on a GPU machine: every decode kernel built at once, the paged GPU checks of every
# registered paged version (tests/test_paged_gpu.py, the wrong-table kernel must fail), the race and copy ceiling
# on the serving cells, Nsight Compute on them (tools/gpu/paged_profile.py), compute-sanitizer (step sanitize:
# tools/gpu/sanitize_pagerow.sh) and the split-cap A/B (step ab: tools/gpu/split_cap_ab.py), the steps named in
# STEPS. Everything lands in $OUT/paged_profile.tgz.
# On the GPU machine (with .cache/dev carried there when the kernels were prebuilt with LAB_CACHE_DIR=.cache/dev):
#   LAB_COMMIT=<sha> STEPS="checks race ncu" bash tools/gpu/paged_profile.sh
set -u
OUT=${OUT:-/tmp/paged_profile}; LOGS=$OUT/logs; mkdir -p "$LOGS"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
STEPS=${STEPS:-checks race ncu}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$LOGS/gpu.txt"
source tools/gpu/paged_builds.sh; paged_builds "$LOGS/build.log" "$LOGS/steps.txt"; tail -1 "$LOGS/steps.txt"
step() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s" | tee -a "$LOGS/steps.txt"
}
for s in $STEPS; do
  case $s in
    checks) step checks ${CHECKS_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider --maxfail=5 tests/test_paged_gpu.py ;;
    race) step race ${RACE_TIMEOUT:-240} python3 tools/gpu/paged_profile.py race "$LOGS/race.jsonl" ;;
    ncu) step ncu ${NCU_TIMEOUT:-240} python3 tools/gpu/paged_profile.py ncu "$LOGS/ncu" ;;
    sanitize) step sanitize ${SANITIZE_TIMEOUT:-300} bash tools/gpu/sanitize_pagerow.sh "$LOGS" ;;
    ab) step ab ${AB_TIMEOUT:-150} python3 tools/gpu/split_cap_ab.py ;;
  esac
done
for f in checks sanitize ab race ncu; do [ -f "$LOGS/$f.log" ] && { echo "== $f"; tail -n ${TAIL:-40} "$LOGS/$f.log"; }; done
(cd "$OUT" && tar czf paged_profile.tgz logs && rm -rf logs)
tar tzvf "$OUT/paged_profile.tgz" | awk '{print $3, $6}' | tail -20
