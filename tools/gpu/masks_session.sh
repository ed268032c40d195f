#!/bin/bash
# Chapter n13_masks as a GPU session in one call: the wheels papermill needs (carry .whl), the masked kernels and
# their deliberately wrong builds compiled at once (the kernel cache lets concurrent builders share a key), then
# `python -m lab session --chapters n13_masks`, packed into $OUT/n13.tgz (unpack at the repository root).
#   LAB_COMMIT=<sha> bash tools/gpu/masks_session.sh
set -u
OUT=${OUT:-/tmp/masks_session}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
build() { local d=""; [ -n "${3:-}" ] && d=", {'$3': '1'}"  # (a brace inside ${3:+...} would end it early)
  python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source$d)" >> "$OUT/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" > "$OUT/build.log" 2>&1 &
build MASKED_FWD v08 & build MASKED_FWD v11 & build MASKED_BWD v08 & build BWD v07 &
build MASKED_FWD v08 LAB_FWD_MASK_BUG_NO_WINDOW &
build MASKED_FWD v11 LAB_FWD_MASK_BUG_NO_WINDOW &
build MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD & build MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_WINDOW &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" >> "$OUT/build.log" 2>&1 &
wait
timeout ${SESSION_TIMEOUT:-420} python3 -m lab session --device cuda --chapters n13_masks --tarball "$OUT/n13.tgz" \
  --no-log > "$OUT/session.log" 2>&1
echo "session rc=$?" >> "$OUT/session.log"
tail -22 "$OUT/session.log"
