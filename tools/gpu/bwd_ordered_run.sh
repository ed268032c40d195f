#!/bin/bash
# A backward with an ordered dQ (bwd v17, v18: the deterministic mode on Hopper) on one GPU in one call: the
# standalone driver in both dQ modes with its four sanitizers (tools/gpu/bwd_hopper.sh, BWD_MODES=2), the GPU tests
# of the version and of the deterministic mode (tests/test_backward_gpu.py, tests/test_grad_node_gpu.py), the
# gradient checks through lab.check (bwd_race.py --checks-only), then tools/gpu/bwd_determinism.py's rounds on CELLS.
# Everything lands in $OUT/ordered.tgz. Usage inside `run`: export LAB_COMMIT=<sha>;
# bash tools/gpu/bwd_ordered_run.sh "CELLS" [VERSION (default v17)]
set -u
V=${2:-v17}
OUT=${OUT:-/tmp/bwd_ordered}; R=$OUT/ordered; mkdir -p "$R"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_OUTPUTS=$R/outputs
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu.txt"
python3 -c "from lab import build; build.binding()" > "$R/build.log" 2>&1 &
for src in $(python3 -c "from lab import registry as r; print(' '.join(r.BWD[v].source for v in {*r.DETERMINISTIC_BWD, 'v14'}))") \
           fwd/v05_wgmma.cu fwd/v07_overlap.cu; do  # every kernel bwd_determinism.py times
  python3 -c "from lab import build; build.build_kernel('$src')" >> "$R/build.log" 2>&1 &
done
( OUT=$R BWD_MODES=2 bash tools/gpu/bwd_hopper.sh $V none > /dev/null 2>&1 ) &
wait
grep -E "^rc=|FAIL|passed|sanitize_" "$R/bwd_$V.log" | tail -12
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -p no:cacheprovider tests/test_backward_gpu.py tests/test_grad_node_gpu.py \
  -k "$V or deterministic" > "$R/pytest.log" 2>&1
echo "pytest rc=$?" >> "$R/pytest.log"; tail -3 "$R/pytest.log"
timeout ${CHECKS_TIMEOUT:-120} python3 tools/gpu/bwd_race.py $V x --checks-only > "$R/checks.log" 2>&1
echo "checks rc=$?" >> "$R/checks.log"; tail -3 "$R/checks.log"
timeout ${TIME_TIMEOUT:-200} python3 tools/gpu/bwd_determinism.py "$1" > "$R/determinism.log" 2>&1
echo "determinism rc=$?" >> "$R/determinism.log"; cat "$R/determinism.log"
tar -C "$OUT" -czf "$OUT/ordered.tgz" ordered && rm -rf "$R"
