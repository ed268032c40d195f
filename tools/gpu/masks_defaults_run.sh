#!/bin/bash
# After a masks candidate became the default (tools/gpu/masks_candidates_run.sh judged it): the defaults' evidence in one
# call. compute-sanitizer's four tools over the public calls (fwd: masks_sanitize.py, bwd: masks_bwd_sanitize.py;
# memcheck, racecheck, synccheck under the kernel filters of masks_softcap_run.sh / masks_bwd_sanitize.sh, initcheck on
# every kernel), the host profile of the masked calls (masks_host_profile.py), the masks' GPU tests
# (tests/test_masks_gpu.py), then chapter n13 as a session on a quiet GPU (masks_session.sh). Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_defaults_run.sh   -> $OUT/san.tgz, $OUT/n13.tgz, $OUT/session.log, ...
set -u
TOP=${OUT:-/tmp/masks_defaults}; R=$TOP/san; mkdir -p "$R"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  compute-sanitizer --version | tail -2; } > "$R/env.log" 2>&1
python3 -c "from lab import build, registry; build.binding(); build.build_kernel(registry.MASKED_FWD['v09'].source)" \
  > "$R/build.log" 2>&1 &
python3 -c "from lab import build, registry; build.build_kernel(registry.MASKED_BWD['v08'].source)" >> "$R/build.log" 2>&1 &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" \
  >> "$R/build.log" 2>&1 &
b() { python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source${3:+, {'$3': '1'\}})" \
  >> "$R/build.log" 2>&1; }  # the session's other builds too, at once (masks_session.sh finds them cached)
b MASKED_FWD v08 & b BWD v07 & b MASKED_FWD v08 LAB_FWD_MASK_BUG_NO_WINDOW & b MASKED_FWD v09 LAB_FWD_MASK_BUG_NO_WINDOW &
b MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD & b MASKED_BWD v08 LAB_BWD_MASK_BUG_NO_WINDOW &
wait
for tool in memcheck racecheck synccheck initcheck; do
  f="--kernel-name kns=attn_fwd_v09" b="--kernel-name kns=bwd"
  [ $tool = initcheck ] && f="--check-api-memory-access no" b="--check-api-memory-access no"
  for side in fwd bwd; do
    script=tools/gpu/masks_sanitize.py filter=$f; [ $side = bwd ] && script=tools/gpu/masks_bwd_sanitize.py filter=$b
    ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-150} compute-sanitizer --tool $tool --print-limit 20 \
        $filter python3 $script > "$R/$side-$tool.log" 2>&1; echo "rc=$?" >> "$R/$side-$tool.log" ) &
  done
done
wait
for f in "$R"/*-*.log; do echo "== $(basename $f): $(grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | head -1) $(tail -n 1 $f)"; done
gzip -9 "$R"/*initcheck.log
tar czf "$TOP/san.tgz" -C "$TOP" san && rm -rf "$R"
timeout ${PROFILE_TIMEOUT:-60} python3 tools/gpu/masks_host_profile.py > "$TOP/host_profile.log" 2>&1
echo "rc=$?" >> "$TOP/host_profile.log"
timeout ${PYTEST_TIMEOUT:-90} python3 -m pytest -q -p no:cacheprovider -rf tests/test_masks_gpu.py > "$TOP/pytest_gpu.log" 2>&1
echo "pytest rc=$?" >> "$TOP/pytest_gpu.log"; tail -n 3 "$TOP/pytest_gpu.log"
SESSION_TIMEOUT=${SESSION_TIMEOUT:-220} OUT=$TOP bash tools/gpu/masks_session.sh
