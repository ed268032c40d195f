#!/bin/bash
# v04 checks in one GPU run, with driver binaries built on the workstation
# into .bin/ (ignored, carried; name .bin in `run`'s carry). Inside `run`:
#   bash tools/gpu/v04_checks.sh [variant ...]     # logs to $OUT
# Each .bin/<name> is tools/gpu/fwd_mma_main.cu linked with one kernel build:
#   nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a \
#        -DFWD_FN=attn_fwd_v04 [-DLAB_FWD_LAZY_TILE='FwdConfig<128\,4\,2\,64\,2\,2\,true\,false\,false\,1\,false>'] \
#        tools/gpu/fwd_mma_main.cu kernels/fwd/v04_lazy.cu -o .bin/<name>
# (a variant is one tile config of one head dim, through v04's one sweep switch LAB_FWD_LAZY_TILE; the example
# is D = 128 with LAZY off; the fields are FwdConfig's, in kernels/fwd/v04_lazy.cu)
# (.bin/v03 the same with attn_fwd_v03 / v03_qsmem.cu). Steps: SASS counts of
# the D=128 bf16 kernel (cuobjdump), the full driver test list for every
# binary except v03, two rounds of the bench grid for every binary with
# PyTorch SDPA-flash at the end of each round, compute-sanitizer memcheck and
# racecheck on .bin/v04 --quick. About 1-2 minutes on an H200 (2026-11-21).
set -u
OUT=${OUT:-/tmp/v04_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
B=.bin
VARS=${*:-$(cd $B && ls)}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; ls -la $B; } > "$OUT/env.log" 2>&1

# SASS of the D=128 bf16 kernels: local-memory traffic and instruction mix.
for b in $VARS; do
  cuobjdump -sass $B/$b > /tmp/$b.sass 2>&1
  awk '/Function :/ {f=$3} f ~ /ILi128.*bfloat16/ {print}' /tmp/$b.sass > /tmp/$b.d128.sass
  printf "%-15s D128 bf16: instr=%d HMMA=%d LDSM=%d LDL=%d STL=%d MUFU.EX2=%d FMUL=%d FFMA=%d LDGSTS=%d BAR=%d VOTE=%d\n" $b \
    $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' /tmp/$b.d128.sass) $(grep -c HMMA /tmp/$b.d128.sass) $(grep -c LDSM /tmp/$b.d128.sass) \
    $(grep -c 'LDL' /tmp/$b.d128.sass) $(grep -c 'STL' /tmp/$b.d128.sass) $(grep -c 'MUFU.EX2' /tmp/$b.d128.sass) \
    $(grep -c 'FMUL' /tmp/$b.d128.sass) $(grep -c 'FFMA' /tmp/$b.d128.sass) $(grep -c 'LDGSTS' /tmp/$b.d128.sass) \
    $(grep -c 'BAR.SYNC' /tmp/$b.d128.sass) $(grep -c 'VOTE' /tmp/$b.d128.sass)
done > "$OUT/sass.log" 2>&1
[ -f /tmp/v04.d128.sass ] && gzip -c /tmp/v04.d128.sass > "$OUT/v04-d128-bf16.sass.gz"

# Correctness: the full driver test list for every v04 build.
for b in $VARS; do
  [ "$b" = v03 ] && continue
  echo "== $b (full test list)"; $B/$b --no-bench | grep -vE "^PASS"; echo "rc=${PIPESTATUS[0]}"
done > "$OUT/v04-driver.log" 2>&1

# Speed: two rounds, SDPA-flash at the end of each.
for round in 1 2; do
  for b in $VARS; do echo "== round $round $b"; $B/$b --no-test; echo "rc=$?"; done
  echo "== round $round sdpa-flash"; python3 tools/gpu/sdpa_flash_bench.py; echo "rc=$?"
done > "$OUT/v04-bench.log" 2>&1

for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool v04 --quick"
  timeout 120 compute-sanitizer --tool $tool $B/v04 --quick 2>&1 | grep -v "^PASS"
  echo "rc=${PIPESTATUS[0]}"
done > "$OUT/v04-sanitizer.log" 2>&1

# Summary: TFLOP/s per cell (rows) and binary (columns), both rounds.
cat "$OUT/sass.log"; grep -hE "^==|FAIL|passed|SUMMARY|rc=" "$OUT"/v04-driver.log "$OUT"/v04-sanitizer.log
awk '/^== round/ {r=$3; n=$4; if (!(n in seen)) {seen[n]=1; names[++k]=n}; next}
     /^(bench|sdpa-flash) bf16/ {key=$3" "$4" "$5; if (!(key in ks)) {ks[key]=1; keys[++m]=key};
       for (i=1;i<=NF;i++) if ($i=="TFLOP/s") v[key,n,r]=$(i-1)}
     END {printf "%-26s", "cell"; for (i=1;i<=k;i++) printf " %13s", names[i]; printf "\n";
       for (j=1;j<=m;j++) {printf "%-26s", keys[j]; for (i=1;i<=k;i++) printf " %6s/%-6s", v[keys[j],names[i],1], v[keys[j],names[i],2]; printf "\n"}}' "$OUT/v04-bench.log"
