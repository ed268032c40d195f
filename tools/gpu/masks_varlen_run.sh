#!/bin/bash
# The packed backward on the GPU in one call: the masked kernels built at once (the wrong builds too), the four
# compute-sanitizer tools on bwd v08's dense and packed calls (tools/gpu/masks_bwd_sanitize.py; the kernels of
# bwd v08 only: pre-pass, loop, dQ convert, sink gradient), then chapter n13 as a session (tools/gpu/masks_session.sh,
# which runs lab.masks.gpu_varlen's checks with the dense ones). Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_varlen_run.sh   -> $OUT/sanitize.tgz, $OUT/n13.tgz, logs
set -u
OUT=${OUT:-/tmp/masks_varlen}; mkdir -p "$OUT/san"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
python3 -c "from lab import build, registry; build.build_kernel(registry.MASKED_BWD['v08'].source)" > "$OUT/san/build.log" 2>&1
for tool in memcheck racecheck synccheck initcheck; do
  extra=""; [ $tool = initcheck ] && extra="--track-unused-memory no"
  ( timeout 300 compute-sanitizer --tool $tool $extra --print-limit 20 --kernel-name "regex:bwd|convert_dq|sink_grad" \
      python3 tools/gpu/masks_bwd_sanitize.py > "$OUT/san/$tool.log" 2>&1; echo "rc=$?" >> "$OUT/san/$tool.log" ) &
done
wait
tail -n 3 "$OUT"/san/*.log
tar czf "$OUT/sanitize.tgz" -C "$OUT" san && rm -rf "$OUT/san"
SESSION_TIMEOUT=${SESSION_TIMEOUT:-400} OUT=$OUT bash tools/gpu/masks_session.sh
