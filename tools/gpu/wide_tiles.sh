#!/bin/bash
# fwd v10's causal consumer tile count (LAB_FWD_WIDE_WG_TILES, the default: the upper consumer of a diagonal CTA stops at
# its own last key tile), its direct epilogue (LAB_FWD_WIDE_EPILOGUE_DIRECT=1, a candidate) and level 3 of
# LAB_FWD_NARROW_QK_STEPS (D = 160), then chapter n14 as a session, in one GPU call: the wheels papermill needs
# (carry .whl); every n14 build and the three other v10 builds at once; through lab.fwd.narrow_gpu.candidate (forward
# checks, kernel-level timing in rounds beside the default build, the public op and SDPA-cuDNN): the old tile count
# (WG_TILES=0; it must equal the default bit for bit) over the causal wide cells and S = 512, the direct epilogue
# over S 512 / 2048; `python -m lab session --chapters n14_head_dims` packed into $OUT/n14.tgz (unpack at the
# repository root); memcheck, racecheck and synccheck over tools/gpu/wide_sanitize.py --fwd-only (fwd v10's default,
# and the direct-epilogue build beside it); level 3 against level 2 at D = 160 last, if the time left allows. Logs
# in $OUT/logs.tgz (records gzipped).
#   LAB_COMMIT=<sha> bash tools/gpu/wide_tiles.sh
set -u
START=$SECONDS; BUDGET=${BUDGET:-500}  # seconds for everything; the A/Bs shrink to what is left
OUT=${OUT:-/tmp/wide_tiles}; L=/tmp/wide_tiles_logs/logs; mkdir -p "$OUT" "$L"
. tools/gpu/n14_builds.sh
n14_env --wheels || exit 1
n14_builds
build fwd/v10_wide.cu "{'LAB_FWD_WIDE_WG_TILES': '0'}" &
build fwd/v10_wide.cu "{'LAB_FWD_NARROW_QK_STEPS': '3'}" &
build fwd/v10_wide.cu "{'LAB_FWD_WIDE_EPILOGUE_DIRECT': '1'}" &
wait
echo "builds done at $((SECONDS - START)) s" >> "$L/build.log"
ab() {  # ab LOG DEFINES DIMS GRID EXACT
  LAB_SESSION_DIR=$L/records timeout ${AB_TIMEOUT:-150} python3 -c "import sys; from lab import cases
from lab.fwd import narrow_gpu
extra = [((1, 4, 2, 200, 130), 'float16', True), ((2, 2, 1, 130, 300), 'bfloat16', True)]
sys.exit(1 if narrow_gpu.candidate($2, 'v10', dims=$3, grid=$4, exact=$5, shapes=narrow_gpu.SHAPES + extra) else 0)" \
    > "$L/$1" 2>&1
  echo "candidate rc=$?" >> "$L/$1"
}
timeout ${SESSION_TIMEOUT:-300} python3 -m lab session --device cuda --chapters n14_head_dims --tarball "$OUT/n14.tgz" \
  --no-log > "$L/session.log" 2>&1
echo "session rc=$? at $((SECONDS - START)) s" >> "$L/session.log"
sanitize_fwd LAB_FWD_WIDE_EPILOGUE_DIRECT=1
left() { echo $((BUDGET - (SECONDS - START))); }
[ $(left) -gt 60 ] && AB_TIMEOUT=$(( $(left) < 120 ? $(left) - 5 : 115 )) ab ab-wg-tiles.log "{'LAB_FWD_WIDE_WG_TILES': '0'}" \
  "(192, 256, 200)" "[c for c in cases.wide_head_dim_cases() if c.causal or c.Sq == 512]" True
[ $(left) -gt 60 ] && AB_TIMEOUT=$(( $(left) < 100 ? $(left) - 5 : 95 )) ab ab-epilogue.log \
  "{'LAB_FWD_WIDE_EPILOGUE_DIRECT': '1'}" "(192, 256, 200)" \
  "[c for c in cases.wide_head_dim_cases() if c.Sq in (512, 2048) and c.D != 200]" False
if [ $(left) -gt 60 ]; then
  AB_TIMEOUT=$(( $(left) - 5 )) ab ab-d160.log "{'LAB_FWD_NARROW_QK_STEPS': '3'}" "(160,)" None True
fi
gzip -9 -f "$L"/records/*.jsonl 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "${L%/logs}" logs
grep -h "candidate checks\|DIFFERENT\|FAIL\|rc=\| time " "$L"/ab-*.log; tail -12 "$L/session.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log
true
