#!/bin/bash
# The GPU checks of what a CPU-only session builds, in the fewest GPU runs (each under a 600 s limit).
# Inside `run` (carry .whl for papermill; see README "Next GPU session"):
#   bash tools/gpu/pending_gpu.sh tests      # 1: the GPU tests of everything new or changed
#   bash tools/gpu/pending_gpu.sh sanitize   # 2: compute-sanitizer on the default paths of this GPU + paged tables
#   bash tools/gpu/pending_gpu.sh session    # 3: the n11 session (paged race) and the n6/n7 guard session
# Logs and the session tarballs go to $OUT (first run: H200 and H100, 2026-11-23).
set -u
OUT=${OUT:-/tmp/pending_gpu}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/tx}
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv; nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__)"; echo "commit ${LAB_COMMIT:-unknown}"; } > "$OUT/env.log" 2>&1
case ${1:-tests} in
  tests)  # lower_right (lab.fwd.causal), paged decode v03, the registry-driven kernel tests (v02-v04 share new
          # device functions; the SASS guard says v04-v07 and decode are unchanged), binding run_launcher
    timeout 560 python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py tests/test_paged_gpu.py \
      tests/test_gpu.py tests/test_hopper_gpu.py > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$?" >> "$OUT/pytest.log"; tail -5 "$OUT/pytest.log" ;;
  sanitize)  # the registry's default paths of this GPU (v05/v07 and decode v01-v03 on Hopper), then paged tables
    SANITIZE_TIMEOUT=200 timeout 380 bash tools/gpu/sanitize_all.sh > /dev/null 2>&1
    timeout 200 bash tools/gpu/sanitize_paged.sh > /dev/null 2>&1
    tail -25 "$OUT/sanitize.log"; tail -8 "$OUT/sanitize_paged.log" ;;
  session)
    timeout 300 python3 -m lab session --device cuda --cases full --chapters n11_paged_decode \
      --tarball "$OUT/n11.tgz" --no-log > "$OUT/n11.log" 2>&1; echo "n11 rc=$?" >> "$OUT/n11.log"
    timeout 280 python3 -m lab session --device cuda --cases quick --chapters n6_fa2,n7_split_k \
      --tarball "$OUT/guard.tgz" --no-log > "$OUT/guard.log" 2>&1; echo "guard rc=$?" >> "$OUT/guard.log"
    tail -5 "$OUT/n11.log" "$OUT/guard.log" ;;
esac
