#!/bin/bash
# fwd v11 as the masked default, in one call: every build at once (the session's and v11's candidates),
# chapter n13 as a session (tools/gpu/masks_session.sh, whose builds are then in the cache), then the candidates' A/B
# and checks (tools/gpu/masks_v11_cand.py) in the time left. Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_v11_session.sh  -> $OUT/cand.tgz, $OUT/n13.tgz, $OUT/session.log
set -u
OUT=${OUT:-/tmp/masks_v11_session}; mkdir -p "$OUT/cand"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
build() { python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source${3:+, $3})" \
  >> "$OUT/cand/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" >> "$OUT/cand/build.log" 2>&1 &
build MASKED_FWD v11 & build MASKED_FWD v11 "{'LAB_FWD_MASK_BUG_NO_WINDOW': '1'}" &
build MASKED_FWD v08 & build MASKED_FWD v08 "{'LAB_FWD_MASK_BUG_NO_WINDOW': '1'}" &
build MASKED_FWD v11 "{'LAB_FWD_MASK_CAP_POLY': 2}" &
build MASKED_FWD v11 "{'LAB_FWD_MASK_OVERLAP_D128_STAGES': 3}" &
build MASKED_BWD v08 & build BWD v07 & build MASKED_BWD v08 "{'LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD': '1'}" &
build MASKED_BWD v08 "{'LAB_BWD_MASK_BUG_NO_WINDOW': '1'}" &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" \
  >> "$OUT/cand/build.log" 2>&1 &
wait
echo "builds done $(date -u +%T)" >> "$OUT/cand/build.log"
SESSION_TIMEOUT=${SESSION_TIMEOUT:-280} OUT=$OUT bash tools/gpu/masks_session.sh
LAB_SESSION_DIR=$OUT/cand/checks OUT=$OUT/cand timeout ${CAND_TIMEOUT:-60} python3 tools/gpu/masks_v11_cand.py \
  > "$OUT/cand/cand.log" 2>&1; echo "rc=$?" >> "$OUT/cand/cand.log"
grep -v '^ok ' "$OUT/cand/cand.log" | tail -12
tar czf "$OUT/cand.tgz" -C "$OUT" cand && rm -rf "$OUT/cand"
