#!/bin/bash
# The eager gradient call's C++ autograd node (lab.backward.node) on a GPU in one call: the binding and the
# kernels it binds built at once, the node's GPU tests (bit-identical to the Python route, deterministic mode,
# the float64 reference), the backward's GPU test file, then tools/gpu/grad_node_gap.py's rounds (node, Python
# route, SDPA-cuDNN; cold and GPU time). Everything lands in $OUT/grad_node.tgz.
# Usage inside `run`: export LAB_COMMIT=<sha>; bash tools/gpu/grad_node_run.sh [CASE_NAME ...]
set -u
OUT=${OUT:-/tmp/grad_node}; R=$OUT/grad_node; mkdir -p "$R"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$R/gpu.txt"
python3 -c "from lab import build; build.binding()" > "$R/build.log" 2>&1 &
for src in bwd/v14_tail.cu bwd/v01_mma.cu fwd/v05_wgmma.cu fwd/v07_overlap.cu; do
  python3 -c "from lab import build; build.build_kernel('$src')" >> "$R/build.log" 2>&1 &
done
wait
timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -p no:cacheprovider tests/test_grad_node_gpu.py \
  tests/test_backward_gpu.py > "$R/pytest.log" 2>&1
echo "pytest rc=$?" >> "$R/pytest.log"
tail -3 "$R/pytest.log"
timeout ${GAP_TIMEOUT:-240} python3 tools/gpu/grad_node_gap.py "$R/gap.jsonl" "$@" > "$R/gap.log" 2>&1
echo "gap rc=$?" >> "$R/gap.log"
cat "$R/gap.log"
tar -C "$OUT" -czf "$OUT/grad_node.tgz" grad_node && rm -rf "$R"
