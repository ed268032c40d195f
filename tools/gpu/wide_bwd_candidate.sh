#!/bin/bash
# A wide-head backward candidate in one call (tools/gpu/wide_bwd_candidate.py has the steps): the binding and the
# kernels built (fwd v10, bwd v09 and VERSION, each backward also without the D term), one small call under a
# short timeout first (a hang ends the call there), then the gradient checks beside compute-sanitizer memcheck,
# racecheck, synccheck and initcheck over tools/gpu/wide_sanitize.py's calls (VERSION preferred), then the race
# alone on the GPU. Logs and records packed as $OUT/logs.tgz.
# ALSO=NAME: a build timed beside them (wide_bwd_candidate.py --also).
#   LAB_COMMIT=<sha> [ALSO=v19:LAB_BWD_WIDE_SM90_DQ_UNDER_DP=1] bash tools/gpu/wide_bwd_candidate.sh VERSION [quick]
set -u
V=$1; Q=$([ "${2:-}" = quick ] && echo --quick)
OUT=${OUT:-/tmp/wide_bwd}; L=/tmp/wide_bwd_logs/logs; mkdir -p "$OUT" "$L"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_SESSION_DIR=$L/records LAB_CHAPTER=n14_head_dims
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$L/gpu.txt"
python3 -c "from lab import build; build.binding()" > "$L/build.log" 2>&1 &
for src in fwd/v10_wide.cu $(python3 -c "from lab import registry; print(registry.BWD['v09'].source, registry.BWD['$V'].source)"); do
  python3 -c "from lab import build; build.build_kernel('$src')" >> "$L/build.log" 2>&1 &
  python3 -c "from lab import build; build.build_kernel('$src', {'LAB_BWD_BUG_NO_DELTA': None})" >> "$L/build.log" 2>&1 &
done
[ -n "${ALSO:-}" ] && python3 -c "from lab import build, registry; from lab.backward.race import ablation
v, d = ablation('$ALSO'); build.build_kernel(registry.BWD[v].source, d)" >> "$L/build.log" 2>&1 &
wait
python3 - "$V" >> "$L/canary.log" 2>&1 <<'PY' &
import sys, torch
from lab import check
from lab.backward import harness
from lab.cases import Case
v = sys.argv[1]
for D in (192, 256):
    res = check.check_backward(harness.bwd_runner(v), Case(f"canary-{D}", 1, 2, 2, 130, 130, D, "bfloat16", True), v,
                               trials=1, save=False)
    print(D, "PASS" if check.backward_passed(res) else "FAIL", [repr(r) for r in res.values()])
torch.cuda.synchronize()
PY
pid=$!; ( sleep 60; kill -9 $pid 2>/dev/null && echo "canary HUNG: killed" >> "$L/canary.log" ) & w=$!
wait $pid; rc=$?; kill $w 2>/dev/null; echo "canary rc=$rc" >> "$L/canary.log"
if [ $rc = 0 ]; then
  (timeout ${CHECKS_TIMEOUT:-200} python3 tools/gpu/wide_bwd_candidate.py "$V" --checks $Q > "$L/checks.log" 2>&1
   echo "checks rc=$?" >> "$L/checks.log") &
  for tool in memcheck racecheck synccheck initcheck; do
    (timeout ${SAN_TIMEOUT:-200} compute-sanitizer --tool $tool python3 tools/gpu/wide_bwd_candidate.py "$V" --calls \
       > "$L/$tool.log" 2>&1; echo "$tool rc=$?" >> "$L/$tool.log") &
  done
  wait
  timeout ${RACE_TIMEOUT:-200} python3 tools/gpu/wide_bwd_candidate.py "$V" --race $Q \
    ${ALSO:+--also $ALSO} > "$L/race.log" 2>&1
  echo "race rc=$?" >> "$L/race.log"
fi
gzip -9 -f "$L"/*check.log
tar -czf "$OUT/logs.tgz" -C "${L%/logs}" logs
cat "$L/canary.log"; tail -4 "$L/checks.log" 2>/dev/null; grep -h "FAIL\|forgotten" "$L/checks.log" 2>/dev/null | head -20
zgrep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log.gz 2>/dev/null; cat "$L/race.log" 2>/dev/null
true
