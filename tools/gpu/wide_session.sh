#!/bin/bash
# Head dims above 128 on the GPU in one call (fwd v10, bwd v09): the binding and the kernels built (and bwd v09's
# forgotten-D-term build); the backward race against SDPA's backends over lab.cases.wide_head_dim_cases alone on
# the GPU (FWD_RACE=1: the forward race too); then, side by side since none of them is timed: the wide checks,
# forward and gradients (tools/gpu/head_dims.py --wide --checks-only), compute-sanitizer memcheck, racecheck,
# synccheck and initcheck over tools/gpu/wide_sanitize.py, and (TRANSFORMERS=1, its wheels carried in .whl-tf)
# tools/gpu/transformers_models.py; all into $OUT (records.jsonl, logs).
# BWD_ALT='NAME=VALUE ...': a second build of bwd v09 whose gradients are checked beside the default's.
# CHECKS_QUICK=1: the checks' quick grid (lengths up to 1025) with the full race.
# PROFILE=1: ncu of bwd v09 and FA2's backward kernel at one cell (tools/gpu/wide_profile.sh, raw CSV).
# BWD_ABLATION='v09:LAB_BWD_WIDE_SM80_RED=1 ...': those builds of bwd v09 timed beside the default (GPU time, a few cells).
# Usage inside `run`: LAB_COMMIT=<sha> [WIDE_ALT='NAME=VALUE ...'] [FWD_RACE=1] [TRANSFORMERS=1] [BWD_ABLATION=...]
#   bash tools/gpu/wide_session.sh [quick]
set -u
# The records' session is the folder's name ($SESSION_NAME), their chapter n14_head_dims (which shows them).
OUT=${OUT:-/tmp/wide_session}; W=$OUT/${SESSION_NAME:-wide}; mkdir -p "$W"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_SESSION_DIR=$W LAB_CHAPTER=n14_head_dims
Q=$([ "${1:-}" = quick ] && echo --quick)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$W/gpu.txt"
[ -n "${TRANSFORMERS:-}" ] && (python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tfsite .whl-tf/*.whl \
  > "$W/pip.log" 2>&1 &)
python3 -c "from lab import build; build.binding()" > "$W/build.log" 2>&1 &
python3 -c "from lab import build; build.build_kernel('fwd/v10_wide.cu')" >> "$W/build.log" 2>&1 &
python3 -c "from lab import build; build.build_kernel('bwd/v09_wide.cu')" >> "$W/build.log" 2>&1 &
python3 -c "from lab import build; build.build_kernel('bwd/v09_wide.cu', {'LAB_BWD_BUG_NO_DELTA': None})" >> "$W/build.log" 2>&1 &
if [ -n "${BWD_ALT:-}" ]; then  # a second build of bwd v09 (NAME=VALUE ...) checked beside the default
  python3 -c "import os; from lab import build; build.build_kernel('bwd/v09_wide.cu', dict(i.split('=', 1) for i in
os.environ['BWD_ALT'].split()))" >> "$W/build.log" 2>&1 &
fi
for a in ${BWD_ABLATION:-}; do  # bwd v09 rebuilt with switches (v09:NAME=VALUE,...), timed beside the default
  python3 -c "from lab import build; from lab.backward.race import ablation; build.build_kernel('bwd/v09_wide.cu',
ablation('$a')[1])" >> "$W/build.log" 2>&1 &
done
if [ -n "${WIDE_ALT:-}" ]; then  # a second build (NAME=VALUE ...) checked, sanitized and raced beside the default
  python3 -c "import os; from lab import build; build.build_kernel('fwd/v10_wide.cu', dict(i.split('=', 1) for i in
os.environ['WIDE_ALT'].split()))" >> "$W/build.log" 2>&1 &
fi
wait
RACE="head_dims.wide_bwd_race('$Q' == '--quick', ('bwd', 'fwd+bwd'))"
[ -n "${FWD_RACE:-}" ] && RACE="head_dims.wide_race('$Q' == '--quick'); $RACE"
timeout ${RACE_TIMEOUT:-240} python3 -c "from lab.fwd import head_dims_gpu as head_dims; import torch
torch.backends.cuda.matmul.allow_tf32 = False; $RACE" > "$W/race.log" 2>&1
echo "race rc=$?" >> "$W/race.log"
if [ -n "${BWD_ABLATION:-}" ]; then  # GPU time of each build, kernel-level, at a few cells (lab.backward.race.versions)
  timeout ${ABLATION_TIMEOUT:-120} python3 -c "from lab.fwd import head_dims_gpu
for r in head_dims_gpu.wide_bwd_ablation('${BWD_ABLATION}'.split()):
    print(r['case']['name'], r['impl'], round(r['timing']['median_ms'], 3) if 'timing' in r else r.get('unsupported'))
" > "$W/ablation.log" 2>&1
  echo "ablation rc=$?" >> "$W/ablation.log"
fi
[ -n "${PROFILE:-}" ] && bash tools/gpu/wide_profile.sh "$W"  # ncu of bwd v09's main kernel and FA2's, one cell
(timeout ${CHECK_TIMEOUT:-240} python3 tools/gpu/head_dims.py --wide --checks-only $Q ${CHECKS_QUICK:+--quick} > "$W/checks.log" 2>&1
 echo "checks rc=$?" >> "$W/checks.log") &
for tool in memcheck racecheck synccheck initcheck; do
  (timeout ${SAN_TIMEOUT:-240} compute-sanitizer --tool $tool python3 tools/gpu/wide_sanitize.py > "$W/$tool.log" 2>&1
   echo "$tool rc=$?" >> "$W/$tool.log") &
done
if [ -n "${TRANSFORMERS:-}" ]; then
  (PYTHONPATH=/tmp/tfsite:$PWD timeout 240 python3 tools/gpu/transformers_models.py > "$W/transformers.log" 2>&1
   echo "transformers rc=$?" >> "$W/transformers.log") &
fi
wait
[ -n "${BWD_ABLATION:-}" ] && cat "$W/ablation.log"
tail -3 "$W/checks.log"; grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$W"/*check.log; tail -40 "$W/race.log"
[ -n "${TRANSFORMERS:-}" ] && tail -5 "$W/transformers.log"
true
