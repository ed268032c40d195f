#!/bin/bash
# v04 small-S checks in one GPU run (binaries built on the workstation into
# .bin/, carried): seed-shape latency of v04 builds against every SDPA backend
# (tools/gpu/fwd_seed_bench.py), the full driver test list of the default build
# and of a build that takes the small config always (LAB_FWD_LAZY_SMALL=2),
# compute-sanitizer memcheck on --quick for both, and the bf16 bench grid for
# v04 before/after with SDPA-flash. Binary lists: env TESTS, MEMCHECK, BIGRID.
# Builds (sm_90a, -O3):
#   .bin/lib_<name>.so : -shared -Xcompiler -fPIC kernels/fwd/v04_lazy.cu [-D...]
#     (lib_before.so from `git show <commit>:kernels/fwd/v04_lazy.cu`)
#   .bin/fwd_<name>    : -DFWD_FN=attn_fwd_v04 tools/gpu/fwd_mma_main.cu <kernel .cu> [-D...]
# Ran 2026-11-21 on an H200 (~35-55 s per call), logs
# outputs/driver_logs/20261121-h200-v04-small-run{1,2}-*.log; run 2 was
#   TESTS="fwd_ks2 fwd_always fwd_ks2_always fwd_ks3_always fwd_kb32_always" \
#   MEMCHECK="fwd_ks2_always fwd_kb32_always fwd_always" BIGRID="fwd_before fwd_ks2" bash tools/gpu/v04_small_checks.sh
set -u
OUT=${OUT:-/tmp/v04_small}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; ls -la .bin; } > "$OUT/env.log" 2>&1
LIBS=""
for f in .bin/lib_*.so; do n=${f#.bin/lib_}; LIBS="$LIBS ${n%.so}=$f"; done
timeout 120 python3 tools/gpu/fwd_seed_bench.py $LIBS --reps ${REPS:-300} > "$OUT/seed.log" 2>&1; echo "seed rc=$?" >> "$OUT/seed.log"
TESTS=${TESTS:-fwd_after fwd_always}
MEMCHECK=${MEMCHECK:-fwd_after fwd_always}
BIGRID=${BIGRID:-fwd_before fwd_after}
for b in $TESTS; do
  echo "== $b (full test list)"; timeout 90 .bin/$b --no-bench | grep -vE "^PASS"; echo "rc=${PIPESTATUS[0]}"
done > "$OUT/driver.log" 2>&1
for b in $MEMCHECK; do
  echo "== compute-sanitizer --tool memcheck $b --quick"
  timeout 90 compute-sanitizer --tool memcheck .bin/$b --quick 2>&1 | grep -v "^PASS"; echo "rc=${PIPESTATUS[0]}"
done > "$OUT/sanitizer.log" 2>&1
{ for b in $BIGRID; do echo "== $b"; timeout 60 .bin/$b --no-test; echo "rc=$?"; done
  echo "== sdpa-flash"; timeout 60 python3 tools/gpu/sdpa_flash_bench.py; echo "rc=$?"; } > "$OUT/bigrid.log" 2>&1
grep -hE "^seed|^ratio|FAIL|rc=|unavailable" "$OUT/seed.log"; cat "$OUT/driver.log" "$OUT/sanitizer.log"; grep -E "^==|D=|rc=" "$OUT/bigrid.log"
