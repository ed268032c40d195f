#!/bin/bash
# The narrow backward (bwd v20: the gradients of D_qk = D_v below 128 unpadded, lab.backward.narrow_gpu) in one GPU
# call: the builds at once (v20, its LAB_BWD_BUG_NARROW_SHORT build, the narrow forwards, v18 for deterministic
# mode); the gradient checks (the bug build must fail; bit for bit with the padded call); the race of the narrow
# call, the padded call and SDPA's backends in one process (GPU time, records in logs/records); v20's cut k16 steps
# against the build with every step (lab.backward.narrow_gpu.steps_ab, steps_ab.log); then, untimed,
# compute-sanitizer's memcheck, racecheck, synccheck and initcheck over tools/gpu/narrow_bwd_sanitize.py.
# Logs: $OUT/narrow-bwd-logs.tgz. Chapter n14 as a session is tools/gpu/n14_session.sh (its gates time the same
# public op).
#   LAB_COMMIT=<sha> [QUICK=1] bash tools/gpu/narrow_bwd.sh
set -u
OUT=${OUT:-/tmp/narrow_bwd}; L=/tmp/narrow_bwd_logs/logs; mkdir -p "$OUT" "$L"
. tools/gpu/n14_builds.sh
n14_env || exit 1
BUG="{'LAB_BWD_BUG_NARROW_SHORT': None}"
for src in bwd/v20_narrow.cu fwd/v05_wgmma.cu fwd/v07_overlap.cu bwd/v18_signal.cu bwd/v14_tail.cu; do build $src & done
build bwd/v20_narrow.cu "$BUG" &
build bwd/v20_narrow.cu "{'LAB_BWD_NARROW_QK_STEPS': '0'}" &
wait
export LAB_SESSION_DIR=$L/records
timeout ${CHECK_TIMEOUT:-200} python3 -c "import os, sys; from lab.backward import narrow_gpu
sys.exit(1 if narrow_gpu.narrow_bwd_checks(quick=bool(os.environ.get('QUICK'))) else 0)" > "$L/checks.log" 2>&1
echo "checks rc=$?" >> "$L/checks.log"
timeout ${RACE_TIMEOUT:-200} python3 -c "import os; from lab.backward import narrow_gpu
narrow_gpu.narrow_bwd_race(quick=bool(os.environ.get('QUICK')))" > "$L/race.log" 2>&1
echo "race rc=$?" >> "$L/race.log"
timeout ${AB_TIMEOUT:-120} python3 -c "from lab.backward import narrow_gpu; narrow_gpu.steps_ab()" > "$L/steps_ab.log" 2>&1
echo "steps_ab rc=$?" >> "$L/steps_ab.log"
{ date -u; echo "commit ${LAB_COMMIT:-?}"; compute-sanitizer --version | tail -1; } > "$L/sanitize-env.txt" 2>&1
for tool in memcheck racecheck synccheck initcheck; do
  (PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --print-limit 20 \
     python3 tools/gpu/narrow_bwd_sanitize.py > "$L/$tool.log" 2>&1; echo "$tool rc=$?" >> "$L/$tool.log") &
done
wait
gzip -9 -f "$L"/records/*.jsonl 2>/dev/null
tar -czf "$OUT/narrow-bwd-logs.tgz" -C "${L%/logs}" logs
grep -v "^PASS" "$L/checks.log" | tail -20; grep -E "x$|narrow .* ms" "$L/race.log" | head -60; tail -40 "$L/race.log"; cat "$L/steps_ab.log"
for tool in memcheck racecheck synccheck initcheck; do echo "== $tool"; grep -E "SUMMARY|done|rc=" "$L/$tool.log"; done
