#!/bin/bash
# fwd v10 at D = 256 with B_c = 64 (LAB_FWD_WIDE_D256_BC=64, a candidate for short keys) against the default B_c = 80,
# both on the persistent grid, in one GPU call. Why: at S = 512 a CTA's keys are 6.4 tiles of 80, so its last tile
# is 40 % full; 64 divides 512. Before the persistent grid the same build measured +2 / +3 % at S = 512 and -6 to -9 %
# from S = 2048 (v10's header); whether it still gains with the fill and epilogue hidden decides whether a per-call
# B_c by S_k is worth an instantiation. lab.fwd.narrow_gpu.candidate: forward checks at D 256 / 200 (the narrow
# width-256 instantiation takes the same B_c) over narrow_gpu.SHAPES, then kernel-level timing in rounds beside the
# default, the public op and SDPA-cuDNN over the D 256 / 200 cells at S 512 / 2048; memcheck, racecheck and
# synccheck over tools/gpu/wide_sanitize.py --fwd-only with WIDE_ALT=LAB_FWD_WIDE_D256_BC=64. Logs in $OUT/logs.tgz.
#   LAB_COMMIT=<sha> AB_TIMEOUT=60 SAN_TIMEOUT=45 [SAN=0] bash tools/gpu/wide_short_bc.sh
set -u
OUT=${OUT:-/tmp/wide_short_bc}; L=/tmp/wide_short_bc_logs/logs; mkdir -p "$OUT" "$L"
. tools/gpu/n14_builds.sh
n14_env
build fwd/v10_wide.cu &
build fwd/v10_wide.cu "{'LAB_FWD_WIDE_D256_BC': '64'}" &
wait
LAB_SESSION_DIR=$L/records timeout ${AB_TIMEOUT:-90} python3 -c "import sys; from lab import cases
from lab.fwd import narrow_gpu
grid = [c for c in cases.wide_head_dim_cases() if c.Sq in (512, 2048) and c.D in (256, 200)]
sys.exit(1 if narrow_gpu.candidate({'LAB_FWD_WIDE_D256_BC': '64'}, 'v10', dims=(256, 200), grid=grid) else 0)" \
  > "$L/ab-bc64.log" 2>&1
echo "candidate rc=$?" >> "$L/ab-bc64.log"
[ "${SAN:-1}" = 0 ] || sanitize_fwd LAB_FWD_WIDE_D256_BC=64  # SAN=0: timing and checks only
gzip -9 -f "$L"/records/*.jsonl 2>/dev/null
tar -czf "$OUT/logs.tgz" -C "${L%/logs}" logs
grep -h "candidate checks\|FAIL\|rc=\| time \|forward, kernel-level" "$L/ab-bc64.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY\|rc=" "$L"/*check.log
true
