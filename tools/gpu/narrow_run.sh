#!/bin/bash
# The narrow head dims (fwd v05 / v07 reading D_qk = D_v below 128 unpadded, lab.fwd.head_dims.narrow) in one GPU
# call: the builds at once (with the LAB_FWD_BUG_NARROW_SHORT builds); lab.fwd.narrow_gpu's checks (those builds
# must fail) and lab.fwd.head_dims_gpu's quick padded-dims checks (the gradients still pad); the forward race of the
# narrow call, the padded call and SDPA in one process (records in logs/records); N14=1 (carry .whl): chapter n14
# as a session next if every check passed, its kernels built with the others, packed into $OUT/n14.tgz; last,
# untimed, compute-sanitizer's memcheck, racecheck, synccheck and initcheck over tools/gpu/narrow_sanitize.py.
# Logs: $OUT/narrow-logs.tgz. WIDE=1: fwd v10's narrow dims instead (136-248: its checks with the v10 bug build,
# the race over wide_head_dim_cases at D 160 / 200, the sanitizers at 136 / 200). CANDIDATE='NAME=VALUE ...': only
# a fwd v07 build not yet the default, checked and timed kernel-level beside the default at D 80 / 96
# (lab.fwd.narrow_gpu.candidate); no sanitizers (owed before such a build becomes the default). DIMS='80 96': the
# checks, the race and the sanitizers at those narrow dims only (both bug builds at the first; no padded-dims checks).
# PROFILE=1: after the sanitizers, ncu of fwd v10 at D = 200 against D = 256 (tools/gpu/narrow_profile.sh).
#   LAB_COMMIT=<sha> [N14=1 | WIDE=1 | CANDIDATE=... | DIMS='80 96'] [PROFILE=1] bash tools/gpu/narrow_run.sh
set -u
OUT=${OUT:-/tmp/narrow_run}; L=/tmp/narrow_logs/logs; mkdir -p "$OUT" "$L"
. tools/gpu/n14_builds.sh
n14_env ${N14:+--wheels} || exit 1
BUG="{'LAB_FWD_BUG_NARROW_SHORT': None}"
if [ -n "${CANDIDATE:-}" ]; then
  build fwd/v07_overlap.cu &
  python3 -c "import os; from lab import build; build.build_kernel('fwd/v07_overlap.cu',
dict(i.split('=', 1) for i in os.environ['CANDIDATE'].split()))" >> "$L/build.log" 2>&1 &
  wait
  LAB_SESSION_DIR=$L/records timeout ${CHECK_TIMEOUT:-150} python3 -c "import os, sys; from lab.fwd import narrow_gpu
sys.exit(1 if narrow_gpu.candidate(dict(i.split('=', 1) for i in os.environ['CANDIDATE'].split())) else 0)" \
    > "$L/candidate.log" 2>&1; echo "candidate rc=$?" >> "$L/candidate.log"
  gzip -9 -f "$L"/records/records.jsonl 2>/dev/null
  tar -czf "$OUT/narrow-logs.tgz" -C "${L%/logs}" logs
  tail -45 "$L/candidate.log"
  exit 0
elif [ -n "${WIDE:-}" ]; then build fwd/v10_wide.cu & build fwd/v10_wide.cu "$BUG" &
else
  for src in fwd/v05_wgmma.cu fwd/v07_overlap.cu; do build $src "$BUG" & done
  if [ -n "${N14:-}" ]; then n14_builds; else build fwd/v05_wgmma.cu & build fwd/v07_overlap.cu & fi
fi
[ -n "${PROFILE:-}" ] && build fwd/v10_wide.cu &
wait
export LAB_SESSION_DIR=$L/records
timeout ${CHECK_TIMEOUT:-150} python3 -c "import os, sys; from lab.fwd import narrow_gpu, head_dims_gpu
if os.environ.get('WIDE'):
    sys.exit(1 if narrow_gpu.narrow_checks(dims=narrow_gpu.WIDE_DIMS, bugs=(('v10', 200),)) else 0)
if os.environ.get('DIMS'):
    dims = tuple(int(d) for d in os.environ['DIMS'].split())
    sys.exit(1 if narrow_gpu.narrow_checks(dims=dims, bugs=(('v07', dims[0]), ('v05', dims[0]))) else 0)
fails = narrow_gpu.narrow_checks()
fails += head_dims_gpu.checks(quick=True)
sys.exit(1 if fails else 0)" > "$L/checks.log" 2>&1; CHECKS=$?; echo "checks rc=$CHECKS" >> "$L/checks.log"
timeout ${RACE_TIMEOUT:-120} python3 -c "import os; from lab.fwd import narrow_gpu
narrow_gpu.narrow_race(wide=bool(os.environ.get('WIDE')), dims=tuple(int(d) for d in os.environ.get('DIMS', '32 80 96').split()))" \
  > "$L/race.log" 2>&1
echo "race rc=$?" >> "$L/race.log"
unset LAB_SESSION_DIR
if [ -n "${N14:-}" ] && [ $CHECKS = 0 ]; then  # a session only over checked kernels
  timeout ${SESSION_TIMEOUT:-300} python3 -m lab session --device cuda --chapters n14_head_dims --tarball "$OUT/n14.tgz" \
    --no-log > "$L/session.log" 2>&1
  echo "session rc=$?" >> "$L/session.log"
fi
for tool in memcheck racecheck synccheck initcheck; do
  (timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool python3 tools/gpu/narrow_sanitize.py ${WIDE:+--wide} \
     ${DIMS:+--dims $(echo $DIMS | tr ' ' ,)} > "$L/$tool.log" 2>&1
   echo "$tool rc=$?" >> "$L/$tool.log") &
done
wait
[ -n "${PROFILE:-}" ] && bash tools/gpu/narrow_profile.sh "$L"
gzip -9 -f "$L"/records/records.jsonl "$L"/profile-*.csv 2>/dev/null
tar -czf "$OUT/narrow-logs.tgz" -C "${L%/logs}" logs
grep -h "narrow head-dim checks\|head-dim checks:\|FAIL\|FAILS\|PASSES\|rc=" "$L/checks.log" | tail -20; tail -60 "$L/race.log"
tail -25 "$L/session.log" 2>/dev/null
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log "$L"/profile-*.log 2>/dev/null
true
