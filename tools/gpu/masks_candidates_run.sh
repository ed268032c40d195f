#!/bin/bash
# The masks' candidates against their defaults in one call, no session (chapter n13 is tools/gpu/masks_session.sh):
#   1. every build at once (the defaults, and each variant by its explicit switches);
#   2. on a quiet GPU: tools/gpu/masks_varlen_host.py (the packed call's host / fill / kernel split, the softcap's
#      public gap), then tools/gpu/masks_softcap_ab.py time (fwd v09 LAB_FWD_MASK_SOFTCAP 0 / 1 / 2, bwd v08 with and
#      without LAB_BWD_MASK_TANH_HALF);
#   3. together: the candidates' checks (masks_softcap_ab.py check) and compute-sanitizer: initcheck on every kernel
#      (no filter) over the defaults' calls, and the four tools over the candidates' calls (masks_sanitize_with.py;
#      memcheck, racecheck and synccheck under the kernel filters of masks_softcap_run.sh / masks_bwd_sanitize.sh).
# Carry nothing.   LAB_COMMIT=<sha> bash tools/gpu/masks_candidates_run.sh   -> $OUT/masks.tgz
set -u
TOP=${OUT:-/tmp/masks_candidates}; R=$TOP/masks; mkdir -p "$R/san"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 OUT=$R  # the scripts' JSON lines land in $R
FWD2='{"LAB_FWD_MASK_SOFTCAP": 2}' BWDH='{"LAB_BWD_MASK_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 1}'
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  compute-sanitizer --version | tail -2; } > "$R/env.log" 2>&1
build() { python3 -c "import json; from lab import build, registry
build.build_kernel(registry.$1['$2'].source, json.loads('''${3:-null}'''))" >> "$R/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" >> "$R/build.log" 2>&1 &
build MASKED_FWD v09 & build MASKED_FWD v09 '{"LAB_FWD_MASK_SOFTCAP": 0}' & build MASKED_FWD v09 '{"LAB_FWD_MASK_SOFTCAP": 1}' &
build MASKED_FWD v09 "$FWD2" & build MASKED_BWD v08 & build MASKED_BWD v08 '{"LAB_BWD_MASK_STAGE": 1, "LAB_BWD_MASK_TANH_HALF": 0}' &
build MASKED_BWD v08 "$BWDH" & build MASKED_FWD v08 &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" >> "$R/build.log" 2>&1 &
wait
echo "builds done $(date -u +%T)" >> "$R/build.log"
timeout ${HOST_TIMEOUT:-70} python3 tools/gpu/masks_varlen_host.py > "$R/varlen_host.log" 2>&1; echo "rc=$?" >> "$R/varlen_host.log"
LAB_SESSION_DIR=$R/ab timeout ${AB_TIMEOUT:-100} python3 tools/gpu/masks_softcap_ab.py time > "$R/ab_time.log" 2>&1
echo "rc=$? $(date -u +%T)" >> "$R/ab_time.log"
LAB_SESSION_DIR=$R/ab timeout ${SAN_TIMEOUT:-170} python3 tools/gpu/masks_softcap_ab.py check > "$R/ab_check.log" 2>&1 &
san() {  # tool, filter or "", script, FWD defines, BWD defines, log name
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 LAB_FWD_DEFINES=$4 LAB_BWD_DEFINES=$5 timeout ${SAN_TIMEOUT:-170} \
      compute-sanitizer --tool $1 --print-limit 20 $2 python3 tools/gpu/masks_sanitize_with.py $3 > "$R/san/$6.log" 2>&1
    echo "rc=$?" >> "$R/san/$6.log" ) &
}
san initcheck "--check-api-memory-access no" tools/gpu/masks_sanitize.py "" "" fwd-default-initcheck
san initcheck "--check-api-memory-access no" tools/gpu/masks_bwd_sanitize.py "" "" bwd-default-initcheck
for tool in memcheck racecheck synccheck initcheck; do
  f="--kernel-name kns=attn_fwd_v09" b="--kernel-name kns=bwd"
  [ $tool = initcheck ] && f="--check-api-memory-access no" b="--check-api-memory-access no"
  san $tool "$f" tools/gpu/masks_sanitize.py "$FWD2" "" fwd-softcap2-$tool
  san $tool "$b" tools/gpu/masks_bwd_sanitize.py "" "$BWDH" bwd-tanhhalf-$tool
done
wait
echo "rc(checks)=done $(date -u +%T)" >> "$R/ab_check.log"
for f in "$R"/san/*.log; do echo "== $(basename $f): $(grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | head -1) $(tail -n 1 $f)"; done
tail -n 2 "$R/varlen_host.log" "$R/ab_time.log" "$R/ab_check.log"
gzip -9 "$R"/san/*initcheck.log "$R/ab_check.log" 2>/dev/null
tar czf "$TOP/masks.tgz" -C "$TOP" masks && rm -rf "$R"  # one file back (at most 8 come back)
