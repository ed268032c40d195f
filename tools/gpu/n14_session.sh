#!/bin/bash
# Chapter n14_head_dims as a GPU session in one call: the wheels papermill needs (carry .whl), every kernel the
# chapter runs compiled at once (the kernel cache lets concurrent builders share a key: fwd v05 / v07 / v10, the
# Hopper backward default, bwd v09 with its ablation builds and its forgotten-D-term build, the register table's
# compile check), then `python -m lab session --chapters n14_head_dims` packed into $OUT/n14.tgz (unpack at the
# repository root); after it, untimed: compute-sanitizer memcheck, racecheck, synccheck and initcheck over
# tools/gpu/wide_sanitize.py and (PROFILE=1) ncu of bwd v09 and FA2's backward (tools/gpu/wide_profile.sh), as
# $OUT/n14-logs.tgz. CANDIDATE='NAME=VALUE ...': a build of bwd v09 not yet the default, timed after the session
# beside the default (ablation.log, records in logs/candidate/), its gradients checked (the --wide quick grid,
# checks-candidate.log) and sanitized with the default's.
#   LAB_COMMIT=<sha> [PROFILE=1] [CANDIDATE=...] bash tools/gpu/n14_session.sh
set -u
OUT=${OUT:-/tmp/n14_session}; L=/tmp/n14_logs/logs; mkdir -p "$OUT" "$L"  # logs packed: $OUT takes 8 files
. tools/gpu/n14_builds.sh
n14_env --wheels || exit 1
n14_builds
[ -n "${CANDIDATE:-}" ] && python3 -c "import os; from lab import build; build.build_kernel('bwd/v09_wide.cu',
dict(i.split('=', 1) for i in os.environ['CANDIDATE'].split()))" >> "$L/build.log" 2>&1 &
wait
timeout ${SESSION_TIMEOUT:-360} python3 -m lab session --device cuda --chapters n14_head_dims --tarball "$OUT/n14.tgz" \
  --no-log > "$L/session.log" 2>&1
echo "session rc=$?" >> "$L/session.log"
if [ -n "${CANDIDATE:-}" ]; then  # timed alone first, then checked beside the sanitizers
  LAB_SESSION_DIR=$L/candidate timeout 90 python3 -c "import os; from lab.fwd import head_dims_gpu
name = 'v09:' + ','.join(os.environ['CANDIDATE'].split())
for r in head_dims_gpu.wide_bwd_ablation((name, 'v09:LAB_BWD_WIDE_SM80_ROW_LOAD=0')):
    print(r['case']['name'], r['impl'], round(r['timing']['median_ms'], 3) if 'timing' in r else r.get('unsupported'))
" > "$L/ablation.log" 2>&1; echo "ablation rc=$?" >> "$L/ablation.log"
  (BWD_ALT=$CANDIDATE LAB_SESSION_DIR=$L/candidate timeout 150 python3 tools/gpu/head_dims.py --wide --checks-only \
     --quick > "$L/checks-candidate.log" 2>&1; echo "checks rc=$?" >> "$L/checks-candidate.log") &
fi
for tool in memcheck racecheck synccheck initcheck; do
  (BWD_ALT=${CANDIDATE:-} timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool python3 tools/gpu/wide_sanitize.py \
     > "$L/$tool.log" 2>&1; echo "$tool rc=$?" >> "$L/$tool.log") &
done
wait
[ -n "${PROFILE:-}" ] && NCU_TIMEOUT=${NCU_TIMEOUT:-60} bash tools/gpu/wide_profile.sh "$L"
gzip -9 -f "$L"/profile-*.csv 2>/dev/null
tar -czf "$OUT/n14-logs.tgz" -C "${L%/logs}" logs
tail -25 "$L/session.log"; cat "$L/ablation.log" 2>/dev/null; tail -3 "$L/checks-candidate.log" 2>/dev/null
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log "$L"/profile-*.log 2>/dev/null
true
