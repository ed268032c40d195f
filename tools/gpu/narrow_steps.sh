#!/bin/bash
# LAB_FWD_NARROW_QK_STEPS' level 2 (the default: D = 32 on Narrow<Cfg64, 2>, S over the k16 steps that hold data)
# and level 3 (a candidate: D = 160 on fwd v10's Narrow<Cfg192, 10>) in one GPU call: the builds at once (with the
# D = 32 LAB_FWD_BUG_NARROW_SHORT builds and level 1, the default before); lab.fwd.narrow_gpu's checks at D = 32
# (the bug builds must fail); level 1 against the default at D = 32 (v07, kernel-level in rounds, with the public op
# and SDPA-cuDNN); V10=1: level 3 against the default at D = 160 (v10, the same), each build checked first; memcheck,
# racecheck, synccheck, initcheck over tools/gpu/narrow_sanitize.py --dims 32; the narrow-vs-padded GPU test.
# Logs under $OUT (records gzipped).
#   LAB_COMMIT=<sha> [V10=1] bash tools/gpu/narrow_steps.sh
set -u
OUT=${OUT:-/tmp/narrow_steps}; L=$OUT; mkdir -p "$OUT"
. tools/gpu/n14_builds.sh
n14_env
for src in fwd/v05_wgmma.cu fwd/v07_overlap.cu; do
  build $src & build $src "{'LAB_FWD_BUG_NARROW_SHORT': None}" &
done
build fwd/v07_overlap.cu "{'LAB_FWD_NARROW_QK_STEPS': '1'}" &
if [ -n "${V10:-}" ]; then build fwd/v10_wide.cu & build fwd/v10_wide.cu "{'LAB_FWD_NARROW_QK_STEPS': '3'}" & fi
wait
export LAB_SESSION_DIR=/tmp/narrow_steps_records
timeout ${CHECK_TIMEOUT:-90} python3 -c "import sys; from lab.fwd import narrow_gpu
sys.exit(1 if narrow_gpu.narrow_checks(dims=(32,), bugs=(('v07', 32), ('v05', 32))) else 0)" > "$L/checks.log" 2>&1
echo "checks rc=$?" >> "$L/checks.log"
for spec in "v07 32 1" ${V10:+"v10 160 3"}; do
  set -- $spec
  timeout ${AB_TIMEOUT:-90} python3 -c "import sys; from lab.fwd import narrow_gpu
sys.exit(1 if narrow_gpu.candidate({'LAB_FWD_NARROW_QK_STEPS': '$3'}, '$1', dims=($2,)) else 0)" > "$L/ab-$1-d$2.log" 2>&1
  echo "candidate rc=$?" >> "$L/ab-$1-d$2.log"
done
unset LAB_SESSION_DIR
for tool in memcheck racecheck synccheck initcheck; do
  (timeout ${SAN_TIMEOUT:-90} compute-sanitizer --tool $tool python3 tools/gpu/narrow_sanitize.py --dims 32 > "$L/$tool.log" 2>&1
   echo "$tool rc=$?" >> "$L/$tool.log") &
done
wait
T=tests/test_hopper_gpu.py::test_a_narrow_call_is_the_padded_call_bit_for_bit  # the cases the builds above serve
timeout 60 python3 -m pytest -q -p no:cacheprovider "$T[32-65-130-True]" "$T[32-1025-63-False]" "$T[80-130-2100-False]" \
  "$T[96-4097-4097-True]" > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
gzip -9 -c /tmp/narrow_steps_records/records.jsonl > "$L/records.jsonl.gz" 2>/dev/null
grep -h "narrow head-dim checks\|FAILS\|PASSES\|rc=" "$L/checks.log"; tail -22 "$L"/ab-*.log
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log; tail -2 "$L/pytest.log"
true
