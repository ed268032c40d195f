#!/bin/bash
# fwd v10's persistent loop (LAB_FWD_WIDE_PERSIST=1, a candidate: one CTA per SM, work tiles in snake order, the next Q
# loaded under the last P V, O stored from registers) in one GPU call: the default build, the direct-epilogue build
# (what the persistent one must equal bit for bit: the same math, other scheduling) and the persistent one at once;
# lab.fwd.narrow_gpu.candidate (forward checks at D 192 / 256 / 200 over SHAPES plus calls of more work tiles than
# SMs, each output equal to the direct-epilogue build's, then kernel-level timing in rounds beside the default, the
# public op and SDPA-cuDNN over the wide cells at S 512 / 2048, where the prediction puts the gain); memcheck,
# racecheck and synccheck over tools/gpu/wide_sanitize.py --fwd-only with WIDE_ALT=LAB_FWD_WIDE_PERSIST=1. Logs in
# $OUT/logs.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/wide_persist.sh
set -u
OUT=${OUT:-/tmp/wide_persist}; L=/tmp/wide_persist_logs/logs; mkdir -p "$OUT" "$L"
. tools/gpu/n14_builds.sh
n14_env
build fwd/v10_wide.cu &
build fwd/v10_wide.cu "{'LAB_FWD_WIDE_EPILOGUE_DIRECT': '1'}" &
build fwd/v10_wide.cu "{'LAB_FWD_WIDE_PERSIST': '1'}" &
wait
LAB_SESSION_DIR=$L/records timeout ${AB_TIMEOUT:-180} python3 -c "import sys; from lab import cases
from lab.fwd import narrow_gpu
extra = [((1, 4, 2, 200, 130), 'float16', True), ((2, 16, 8, 1100, 1100), 'bfloat16', True),
         ((1, 32, 8, 2100, 700), 'float16', False)]
grid = [c for c in cases.wide_head_dim_cases() if c.Sq in (512, 2048) and c.D != 200]
sys.exit(1 if narrow_gpu.candidate({'LAB_FWD_WIDE_PERSIST': '1'}, 'v10', dims=(192, 256, 200), grid=grid,
                                   exact={'LAB_FWD_WIDE_EPILOGUE_DIRECT': '1'}, shapes=narrow_gpu.SHAPES + extra) else 0)" > "$L/ab-persist.log" 2>&1
echo "candidate rc=$?" >> "$L/ab-persist.log"
sanitize_fwd LAB_FWD_WIDE_PERSIST=1
gzip -9 -f "$L"/records/*.jsonl 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "${L%/logs}" logs
grep -h "candidate checks\|DIFFERENT\|FAIL\|rc=\| time " "$L/ab-persist.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log
true
