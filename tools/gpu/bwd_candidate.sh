#!/bin/bash
# A backward candidate against the default in one call: tools/gpu/bwd_hopper.sh's driver checks and four
# sanitizers, bwd_race.py's gradient checks through lab.check, then bwd_versions.py in GPU time beside the
# default and SDPA-cuDNN. Usage inside `run`: bash tools/gpu/bwd_candidate.sh VERSION BASELINE "CELL_FILTERS"
# (VERSIONS="v12,v13,v13:LAB_BWD_Q128_KV_REGS=1" times those instead of BASELINE,VERSION).
set -u
OUT=${OUT:-/tmp/bwd_candidate}; mkdir -p "$OUT"
V=$1; BASE=$2; CELLS=$3
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_OUTPUTS=$OUT/outputs PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for src in $(python3 -c "from lab import registry; print(registry.BWD['$V'].source, registry.BWD['$BASE'].source)") fwd/v05_wgmma.cu fwd/v07_overlap.cu; do
  python3 -c "from lab import build; build.build_kernel('$src')" >> "$OUT/build.log" 2>&1 &
done
bash tools/gpu/bwd_hopper.sh "$V" none > /dev/null 2>&1
wait
timeout 200 python3 tools/gpu/bwd_race.py "$V" x --checks-only > "$OUT/checks_$V.log" 2>&1; echo "rc=$?" >> "$OUT/checks_$V.log"
timeout ${VERSIONS_TIMEOUT:-240} python3 tools/gpu/bwd_versions.py "${VERSIONS:-$BASE,$V}" "$CELLS" > "$OUT/versions.log" 2>&1
echo "rc=$?" >> "$OUT/versions.log"
tar -C "$OUT" -czf "$OUT/records.tgz" outputs 2>/dev/null && rm -rf "$OUT/outputs"
tail -3 "$OUT/checks_$V.log"; grep -E "driver|rc=|sanitize|pass|FAIL" "$OUT/bwd_$V.log" | tail -12; cat "$OUT/versions.log"
