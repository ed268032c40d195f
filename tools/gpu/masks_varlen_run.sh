#!/bin/bash
# The packed backward on the GPU in one call: the masked kernels and their wrong builds compiled at once, the four
# compute-sanitizer tools on bwd v08's dense and packed calls (tools/gpu/masks_bwd_sanitize.py; bwd v08's kernels
# only: pre-pass, loop, dQ convert, sink gradient), then chapter n13 as a session (tools/gpu/masks_session.sh, whose
# backward cell runs lab.masks.gpu_varlen's checks beside the dense ones). Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_varlen_run.sh   -> $OUT/sanitize.tgz, $OUT/n13.tgz, $OUT/session.log
set -u
OUT=${OUT:-/tmp/masks_varlen}; mkdir -p "$OUT"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
build() { local d=""; [ -n "${3:-}" ] && d=", {'$3': '1'}"
  python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source$d)" >> "$OUT/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" >> "$OUT/build.log" 2>&1 &
build MASKED_FWD v08 & build MASKED_FWD v09 & build MASKED_BWD v08 & build BWD v07 &
build MASKED_FWD v08 LAB_FWD_MASK_BUG_NO_WINDOW & build MASKED_FWD v09 LAB_FWD_MASK_BUG_NO_WINDOW &
build MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD & build MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_WINDOW &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" >> "$OUT/build.log" 2>&1 &
wait
OUT=$OUT bash tools/gpu/masks_bwd_sanitize.sh
SESSION_TIMEOUT=${SESSION_TIMEOUT:-400} OUT=$OUT bash tools/gpu/masks_session.sh
