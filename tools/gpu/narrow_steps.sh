#!/bin/bash
# LAB_FWD_NARROW_QK_STEPS in one GPU call, the level under test being the default (the build without defines):
# - plain: level 2's D = 32 (Narrow<Cfg64, 2> in fwd v05 / v07): checks at D = 32 with the LAB_FWD_BUG_NARROW_SHORT
#   builds (they must fail), level 1 against the default at D = 32 (v07, kernel-level in rounds, with the public op
#   and SDPA-cuDNN), compute-sanitizer at D = 32;
# - V10=1: level 3's D = 160 (fwd v10's Narrow<Cfg192, 10>): the wide narrow checks at D 160 / 200 with the v10
#   bug build, level 2 against the default at D 160 (kernel-level in rounds, outputs compared bit for bit; AB_DIMS
#   overrides), the public op against SDPA at D 160 / 200 (lab.fwd.narrow_gpu.narrow_race), compute-sanitizer
#   (memcheck, racecheck, synccheck, initcheck) at D 160 / 200.
# Both end with the narrow-vs-padded GPU test at the dims they cover. Logs under $OUT (records gzipped).
#   LAB_COMMIT=<sha> [V10=1] bash tools/gpu/narrow_steps.sh
set -u
OUT=${OUT:-/tmp/narrow_steps}; L=$OUT; mkdir -p "$OUT"
. tools/gpu/n14_builds.sh
n14_env
BUG="{'LAB_FWD_BUG_NARROW_SHORT': None}"
T=tests/test_hopper_gpu.py::test_a_narrow_call_is_the_padded_call_bit_for_bit  # the cases the builds below serve
if [ -n "${V10:-}" ]; then
  build fwd/v10_wide.cu & build fwd/v10_wide.cu "$BUG" & build fwd/v10_wide.cu "{'LAB_FWD_NARROW_QK_STEPS': '2'}" &
  DIMS=160,200; CHECK="dims=(160, 200), bugs=(('v10', 200),)"; AB="v10 ${AB_DIMS:-160} 2"
  TESTS="$T[200-257-63-True] $T[160-65-2100-True]"
else
  for src in fwd/v05_wgmma.cu fwd/v07_overlap.cu; do build $src & build $src "$BUG" & done
  build fwd/v07_overlap.cu "{'LAB_FWD_NARROW_QK_STEPS': '1'}" &
  DIMS=32; CHECK="dims=(32,), bugs=(('v07', 32), ('v05', 32))"; AB="v07 32 1"
  TESTS="$T[32-65-130-True] $T[32-1025-63-False] $T[80-130-2100-False] $T[96-4097-4097-True]"
fi
wait
export LAB_SESSION_DIR=/tmp/narrow_steps_records
timeout ${CHECK_TIMEOUT:-120} python3 -c "import sys; from lab.fwd import narrow_gpu
sys.exit(1 if narrow_gpu.narrow_checks($CHECK) else 0)" > "$L/checks.log" 2>&1
echo "checks rc=$?" >> "$L/checks.log"
set -- $AB
timeout ${AB_TIMEOUT:-150} python3 -c "import sys; from lab import cases; from lab.fwd import narrow_gpu
dims = ($2,)
grid = [c for c in cases.wide_head_dim_cases(head_dims=dims) if c.D in dims] if '$1' == 'v10' else None
sys.exit(1 if narrow_gpu.candidate({'LAB_FWD_NARROW_QK_STEPS': '$3'}, '$1', dims=dims, grid=grid,
                                   exact='$1' == 'v10') else 0)" > "$L/ab-$1-d${2/,/-}.log" 2>&1
echo "candidate rc=$?" >> "$L/ab-$1-d${2/,/-}.log"
if [ -n "${V10:-}" ]; then
  timeout ${RACE_TIMEOUT:-120} python3 -c "from lab.fwd import narrow_gpu; narrow_gpu.narrow_race(wide=True)" \
    > "$L/race.log" 2>&1
  echo "race rc=$?" >> "$L/race.log"
fi
unset LAB_SESSION_DIR
for tool in memcheck racecheck synccheck initcheck; do
  (timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool python3 tools/gpu/narrow_sanitize.py --dims $DIMS \
     > "$L/$tool.log" 2>&1
   echo "$tool rc=$?" >> "$L/$tool.log") &
done
wait
timeout 90 python3 -m pytest -q -p no:cacheprovider $TESTS > "$L/pytest.log" 2>&1
echo "pytest rc=$?" >> "$L/pytest.log"
gzip -9 -c /tmp/narrow_steps_records/records.jsonl > "$L/records.jsonl.gz" 2>/dev/null
grep -h "narrow head-dim checks\|FAILS\|PASSES\|rc=" "$L/checks.log"; tail -30 "$L"/ab-*.log
tail -8 "$L/race.log" 2>/dev/null
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log; tail -2 "$L/pytest.log"
true
