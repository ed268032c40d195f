#!/bin/bash
# fwd v10 (head dims 192 / 256, forward only) on the GPU in one call: the binding and the kernel built, the
# wide checks (tools/gpu/head_dims.py --wide --checks-only), compute-sanitizer memcheck and racecheck over
# tools/gpu/wide_sanitize.py, then the race against SDPA's backends (lab.cases.wide_head_dim_cases), all into
# $OUT/wide.tgz (records.jsonl, logs). Usage inside `run`: LAB_COMMIT=<sha> [WIDE_ALT='NAME=VALUE ...'] bash
# tools/gpu/wide_session.sh [quick]
set -u
OUT=${OUT:-/tmp/wide_session}; W=$OUT; mkdir -p "$W"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_SESSION_DIR=$W
Q=$([ "${1:-}" = quick ] && echo --quick)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$W/gpu.txt"
python3 -c "from lab import build; build.binding()" > "$W/build.log" 2>&1 &
python3 -c "from lab import build; build.build_kernel('fwd/v10_wide.cu')" >> "$W/build.log" 2>&1 &
if [ -n "${WIDE_ALT:-}" ]; then  # a second build (NAME=VALUE ...) checked, sanitized and raced beside the default
  python3 -c "import os; from lab import build; build.build_kernel('fwd/v10_wide.cu', dict(i.split('=', 1) for i in
os.environ['WIDE_ALT'].split()))" >> "$W/build.log" 2>&1 &
fi
wait
timeout ${CHECK_TIMEOUT:-150} python3 tools/gpu/head_dims.py --wide --checks-only $Q > "$W/checks.log" 2>&1
echo "checks rc=$?" >> "$W/checks.log"
timeout ${RACE_TIMEOUT:-120} python3 -c "import sys; sys.path.insert(0, 'tools/gpu'); import head_dims, torch
torch.backends.cuda.matmul.allow_tf32 = False; head_dims.wide_race('$Q' == '--quick')" > "$W/race.log" 2>&1
echo "race rc=$?" >> "$W/race.log"
for tool in memcheck racecheck; do
  timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool python3 tools/gpu/wide_sanitize.py > "$W/$tool.log" 2>&1
  echo "$tool rc=$?" >> "$W/$tool.log"
done
tail -3 "$W/checks.log"; grep -h "ERROR SUMMARY\|rc=" "$W/memcheck.log" "$W/racecheck.log"; tail -22 "$W/race.log"
