#!/bin/bash
# Whether the narrow head dims lose to rows that start off 128-byte lines, in one GPU call: fwd v05 / v07 / v10
# built, then lab.fwd.narrow_gpu.aligned_race (the public op on contiguous K / V, on K / V copied to aligned rows in
# the call, on aligned copies made before it, against SDPA-cuDNN, at D 80 / 96 / 160 / 200; each case first checks
# the aligned calls equal the plain one bit for bit). Logs and records (gzipped) under $OUT.
#   LAB_COMMIT=<sha> bash tools/gpu/narrow_aligned.sh
set -u
OUT=${OUT:-/tmp/narrow_aligned}; L=$OUT; mkdir -p "$OUT"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$L/gpu.txt"
. tools/gpu/n14_builds.sh
python3 -c "from lab import build; build.binding()" > "$L/build.log" 2>&1 &
for src in fwd/v05_wgmma.cu fwd/v07_overlap.cu fwd/v10_wide.cu; do build $src & done
wait
LAB_SESSION_DIR=/tmp/narrow_aligned_records timeout ${RACE_TIMEOUT:-240} python3 -c "from lab.fwd import narrow_gpu
narrow_gpu.aligned_race()" > "$L/aligned.log" 2>&1
echo "aligned race rc=$?" >> "$L/aligned.log"
gzip -9 -c /tmp/narrow_aligned_records/records.jsonl > "$L/records.jsonl.gz" 2>/dev/null
cp /tmp/narrow_aligned_records/ceilings.json "$L/" 2>/dev/null
grep -c "bit for bit: True" "$L/aligned.log"; grep "bit for bit: False\|Error" "$L/aligned.log"; tail -40 "$L/aligned.log"
true
