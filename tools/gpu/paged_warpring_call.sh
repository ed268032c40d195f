#!/bin/bash
# Decode v06 (the warp-private ring, kernels/decode/v06_warpring.cu) in one call, under one deadline (BUDGET seconds
# from the start, 420 by default; a step that would not fit is skipped and says so in steps.txt):
#   1. the binding, v02, v03, v06 and v06's two wrong builds (LAB_WARPRING_BUG_SLICE, LAB_PAGED_BUG_IDENTITY) at once;
#   2. tools/gpu/paged_warpring.py check (every paged case through lab.ops.decode, paged and contiguous; the wrong
#      build must fail) and tests/test_paged_gpu.py -k v06 (split counts, bad tables, the table-blind kernel);
#   3. the race (paged_warpring.py ab: GPU time and graph replays of the public op beside SDPA-cuDNN);
#   4. Nsight Compute (tools/gpu/paged_profile.py ncu, --clock-control none) of v03, v06, v02 and cuDNN's kernel on the
#      cells PAGED_PROFILE_CELLS at pages PAGED_PROFILE_PAGES;
#   5. compute-sanitizer memcheck, racecheck, synccheck and initcheck on paged_warpring.py sanitize (no kernel filter:
#      pass 1 and the combine both seen; inputs made on the CPU).
# Everything in $OUT/warpring.tgz.   LAB_COMMIT=<sha> bash tools/gpu/paged_warpring_call.sh
# LAB_PAGED_NEW=v07: the same steps for v07 (v06 with the swizzled ring; v06 stays in the race and the profile);
# LAB_PAGED_NEW=v08 AB_DIMS="80 96" PAGED_PROFILE_D=80: v08 (v07's ring at D 80 / 96) at its head dims;
# STEPS: the steps to run, in this order (default all: "check pytest ab ncu sanitize").
# With .cache/tree.tar carried (git archive of the commit), the committed tree replaces the shared checkout's files first.
set -u
NEW=${LAB_PAGED_NEW:-v06}; STEPS=${STEPS:-"check pytest ab ncu sanitize"}
start=$(date +%s); END=$(( start + ${BUDGET:-420} ))
[ -f .cache/tree.tar ] && tar xf .cache/tree.tar
OUT=${OUT:-/tmp/paged_warpring}; D=$OUT/warpring; mkdir -p "$D"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
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
t0=$(date +%s)
python3 -c "from lab import build; build.binding()" > "$D/build.log" 2>&1 &
for v in v02 v03 v06 $NEW; do
  python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['$v'].source)" >> "$D/build.log" 2>&1 &
done
for define in LAB_WARPRING_BUG_SLICE LAB_PAGED_BUG_IDENTITY; do
  python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['$NEW'].source, {'$define': None})" \
    >> "$D/build.log" 2>&1 &
done
wait
echo "builds $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
export PAGED_PROFILE_VERSIONS=${PAGED_PROFILE_VERSIONS:-"v03 v06 ${NEW/v06/}"}
export PAGED_PROFILE_CONTIGUOUS=${PAGED_PROFILE_CONTIGUOUS:-"v02 v06"}
export PAGED_PROFILE_CELLS=${PAGED_PROFILE_CELLS:-"64x1024 32x4096 1x131072"} PAGED_PROFILE_PAGES=${PAGED_PROFILE_PAGES:-"16 64"}
for s in $STEPS; do case $s in
  check) step check 100 python3 tools/gpu/paged_warpring.py check ;;
  pytest) step pytest 80 python3 -m pytest -q -p no:cacheprovider -x tests/test_paged_gpu.py tests/test_gpu.py -k "$NEW and (paged or decode)" ;;
  ab) step ab 120 python3 tools/gpu/paged_warpring.py ab "$D/ab.jsonl" ;;
  ncu) step ncu 150 python3 tools/gpu/paged_profile.py ncu "$D/ncu"
       rm -f "$D"/ncu/*.ncu-rep; gzip -9 -f "$D"/ncu/raw.csv 2>/dev/null ;;
  sanitize) for tool in memcheck racecheck synccheck initcheck; do
      step "sanitize_$tool" 90 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool $tool \
        python3 tools/gpu/paged_warpring.py sanitize
    done ;;
esac; done
for f in "$D"/sanitize_*.log; do gzip -9 -f "$f"; done
(cd "$OUT" && tar czf warpring.tgz warpring && rm -rf warpring)
tar xzOf "$OUT/warpring.tgz" warpring/steps.txt warpring/gpu.txt
tar xzOf "$OUT/warpring.tgz" warpring/check.log 2>/dev/null | tail -n 5
tar xzOf "$OUT/warpring.tgz" warpring/pytest.log 2>/dev/null | tail -n 3
tar xzOf "$OUT/warpring.tgz" warpring/ab.log 2>/dev/null | grep -v graph | cut -c1-90 | tail -n 80
tar xzOf "$OUT/warpring.tgz" warpring/ncu.log 2>/dev/null | tail -n 26
for t in memcheck racecheck synccheck initcheck; do
  echo "== $t"; tar xzOf "$OUT/warpring.tgz" "warpring/sanitize_$t.log.gz" 2>/dev/null | zcat | grep -E "SUMMARY|all passed|FAIL" | head -4
done
exit 0
