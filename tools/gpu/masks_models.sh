#!/bin/bash
# The masks' model checks (tools/gpu/masks_models.py) in one call: transformers from the carried wheels (carry
# .whl-tf alone: with .whl the tree passes the transfer limit), the kernels built at once, then the checks.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_models.sh   -> $OUT/masks_models.jsonl, $OUT/models.log
set -u
OUT=${OUT:-/tmp/masks_models}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfsite .whl-tf/*.whl > "$OUT/models.log" 2>&1 || exit 1
export PYTHONPATH=/tmp/tfsite:$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
python3 -c "from lab import build; build.binding()" >> "$OUT/models.log" 2>&1 &
for k in "MASKED_FWD['v09']" "MASKED_BWD['v08']" "FWD['v07']" "BWD['v07']"; do
  python3 -c "from lab import build, registry; build.build_kernel(registry.$k.source)" >> "$OUT/models.log" 2>&1 &
done
wait
timeout ${MODELS_TIMEOUT:-300} python3 tools/gpu/masks_models.py >> "$OUT/models.log" 2>&1
echo "models rc=$?" >> "$OUT/models.log"
tail -n 12 "$OUT/models.log"
