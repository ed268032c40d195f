#!/bin/bash
# The paged decode's probe call, before a change is chosen: every decode kernel and the probe's loader variants built at
# once, then, alone on the GPU and timed, tools/gpu/paged_loader_probe.py (the loader variants on the serving cells beside
# SDPA-cuDNN, then `host`: the contiguous public op's host path at n7's small cells; HOST=0 skips it). TESTS=1 adds the
# public ops' GPU tests (tests/test_ops_gpu.py), run while the variants build (untimed work beside untimed work; the
# probe waits for both). Everything lands in $OUT/probe.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/paged_probe_call.sh
set -u
OUT=${OUT:-/tmp/paged_probe}; D=$OUT/probe; mkdir -p "$D"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch; print('torch', torch.__version__)"; } > "$D/gpu.txt" 2>&1
t0=$(date +%s)
source tools/gpu/paged_builds.sh
( paged_builds "$D/build.log" "$D/steps.txt"  # beside the variants' builds; the tests load what it built
  if [ "${TESTS:-0}" != 0 ]; then
    t1=$(date +%s); timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider tests/test_ops_gpu.py \
      > "$D/tests.log" 2>&1
    echo "tests rc=$? $(( $(date +%s) - t1 )) s" >> "$D/steps.txt"
  fi ) &
python3 - >> "$D/variant_build.log" 2>&1 <<'EOF'
import sys
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, "tools/gpu")
from lab import build, registry
from paged_loader_probe import VARIANTS, defines_of
with ThreadPoolExecutor(8) as pool:  # nvcc runs in subprocesses: threads are enough
    for lib in pool.map(lambda n: build.build_kernel(registry.DECODE[VARIANTS[n][0]].source, defines_of(n)), VARIANTS):
        print(lib.path.name, lib.build_seconds)
EOF
echo "variant builds rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
wait  # the default builds and the tests, if any: the probe times alone
step() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2; local t1; t1=$(date +%s)
  timeout "$limit" "$@" > "$D/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t1 )) s" >> "$D/steps.txt"
}
step probe ${PROBE_TIMEOUT:-150} python3 tools/gpu/paged_loader_probe.py "$D/probe.jsonl"
[ "${HOST:-1}" != 0 ] && step host ${HOST_TIMEOUT:-60} python3 tools/gpu/paged_loader_probe.py host "$D/host.jsonl"
(cd "$OUT" && tar czf probe.tgz probe && rm -rf probe)
tar xzOf "$OUT/probe.tgz" probe/steps.txt probe/gpu.txt
tar xzOf "$OUT/probe.tgz" probe/probe.log probe/host.log | grep -v "^$" | tail -n 90
tar xzOf "$OUT/probe.tgz" probe/tests.log 2>/dev/null | tail -n 5
