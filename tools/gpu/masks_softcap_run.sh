#!/bin/bash
# The softcap's fixed-offset softmax (fwd v09, LAB_FWD_MASK_SOFTCAP) and the staged dK / dV of the masked backward (bwd v08,
# LAB_BWD_MASK_STAGE) in one call, for whichever defaults the tree has:
# every build at once, the A/B and the checks of the builds that are not the default (tools/gpu/masks_softcap_ab.py),
# compute-sanitizer on the changed kernels (fwd v09: memcheck, racecheck, synccheck, initcheck under
# tools/gpu/masks_sanitize.py; bwd v08: tools/gpu/masks_bwd_sanitize.sh), then chapter n13 as a session
# (tools/gpu/masks_session.sh). Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_softcap_run.sh  -> $OUT/ab.tgz, $OUT/sanitize_fwd.tgz, $OUT/sanitize.tgz,
#                                                             $OUT/n13.tgz, $OUT/session.log
set -u
OUT=${OUT:-/tmp/masks_softcap}; mkdir -p "$OUT/ab" "$OUT/sanf"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
build() { python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source${3:+, $3})" \
  >> "$OUT/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" >> "$OUT/build.log" 2>&1 &
build MASKED_FWD v09 & build MASKED_FWD v09 "{'LAB_FWD_MASK_SOFTCAP': 0}" & build MASKED_FWD v09 "{'LAB_FWD_MASK_SOFTCAP': 1}" &
build MASKED_FWD v09 "{'LAB_FWD_MASK_SOFTCAP': 2}" &
build MASKED_FWD v08 & build MASKED_FWD v09 "{'LAB_FWD_MASK_BUG_NO_WINDOW': '1'}" & build MASKED_FWD v08 "{'LAB_FWD_MASK_BUG_NO_WINDOW': '1'}" &
build MASKED_BWD v08 & build MASKED_BWD v08 "{'LAB_BWD_MASK_STAGE': 0, 'LAB_BWD_MASK_TANH_HALF': 0}" &
build MASKED_BWD v08 "{'LAB_BWD_MASK_STAGE': 1, 'LAB_BWD_MASK_TANH_HALF': 0}" &
build MASKED_BWD v08 "{'LAB_BWD_MASK_STAGE': 1, 'LAB_BWD_MASK_TANH_HALF': 1}" &
build MASKED_BWD v08 "{'LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD': '1'}" & build MASKED_BWD v08 "{'LAB_BWD_MASK_BUG_NO_WINDOW': '1'}" &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" >> "$OUT/build.log" 2>&1 &
wait
echo "builds done $(date -u +%T)" >> "$OUT/build.log"
# A/B first, on a quiet GPU
LAB_SESSION_DIR=$OUT/ab/session OUT=$OUT timeout ${AB_TIMEOUT:-170} python3 tools/gpu/masks_softcap_ab.py > "$OUT/ab/ab.log" 2>&1
echo "rc=$?" >> "$OUT/ab/ab.log"
tail -3 "$OUT/ab/ab.log"
mv "$OUT/softcap_ab.jsonl" "$OUT/ab/" 2>/dev/null
tar czf "$OUT/ab.tgz" -C "$OUT" ab build.log && rm -rf "$OUT/ab"
# the session next (its gates are the headline)
SESSION_TIMEOUT=${SESSION_TIMEOUT:-230} OUT=$OUT bash tools/gpu/masks_session.sh
# sanitizers last: fwd v09's four tools and bwd v08's four, at once
export PYTHONPATH=$PWD
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  compute-sanitizer --version | tail -2; } > "$OUT/sanf/env.log" 2>&1
for tool in memcheck racecheck synccheck initcheck; do  # initcheck unfiltered: tools/gpu/masks_bwd_sanitize.sh says why
  filter="--kernel-name kns=attn_fwd_v09"; [ $tool = initcheck ] && filter="--check-api-memory-access no"
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --print-limit 20 \
      $filter python3 tools/gpu/masks_sanitize.py > "$OUT/sanf/$tool.log" 2>&1; echo "rc=$?" >> "$OUT/sanf/$tool.log" ) &
done
SAN_TIMEOUT=${SAN_TIMEOUT:-150} OUT=$OUT bash tools/gpu/masks_bwd_sanitize.sh &
wait
tail -n 3 "$OUT"/sanf/*.log
tar czf "$OUT/sanitize_fwd.tgz" -C "$OUT" sanf && rm -rf "$OUT/sanf"
