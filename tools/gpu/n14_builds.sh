#!/bin/bash
# Sourced by n14_session.sh, narrow_run.sh, narrow_steps.sh, wide_tiles.sh and wide_persist.sh (after they set L):
# `n14_env [--wheels]` is the set-up they share (with --wheels the carried papermill wheels into /tmp/site; the
# environment; the GPU's name and clocks in $L/gpu.txt; the binding built in the background); `build SRC [DEFINES]`
# compiles one kernel into the kernel cache; `n14_builds` starts in the background every build chapter n14 runs
# (fwd v05 / v07 / v10, the Hopper backward default, bwd v09 and v19 with their forgotten-D-term builds, v09's ablation
# builds, the register table's compile check; concurrent builders share a cache key), logging to $L/build.log. The
# caller waits.
n14_env() {
  if [ "${1:-}" = --wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || return 1
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$L/gpu.txt"
  python3 -c "from lab import build; build.binding()" > "$L/build.log" 2>&1 &
}
build() { python3 -c "from lab import build; build.build_kernel('$1'${2:+, $2})" >> "$L/build.log" 2>&1; }
n14_builds() {
  local src a
  for src in fwd/v05_wgmma.cu fwd/v07_overlap.cu fwd/v10_wide.cu bwd/v09_wide.cu bwd/v19_wide.cu \
             $(python3 -c "from lab import registry; print(registry.BWD[registry.BEST_BWD_HOPPER[0]].source)"); do
    build $src &
  done
  build bwd/v09_wide.cu "{'LAB_BWD_BUG_NO_DELTA': None}" &
  build bwd/v19_wide.cu "{'LAB_BWD_BUG_NO_DELTA': None}" &
  for a in $(python3 -c "from lab.fwd.head_dims_gpu import V09_ABLATIONS; print(' '.join(V09_ABLATIONS))"); do
    python3 -c "from lab import build; from lab.backward.race import ablation; build.build_kernel('bwd/v09_wide.cu',
ablation('$a')[1])" >> "$L/build.log" 2>&1 &
  done
  python3 -c "from lab import build, paths; from lab.registry import BWD
build.compile_check(sources=[paths.KERNELS / BWD[v].source for v in ('v01', 'v09', 'v19')])" >> "$L/build.log" 2>&1 &
}
# `sanitize_fwd ALT`: memcheck, racecheck and synccheck at once over wide_sanitize.py --fwd-only (fwd v10's default,
# and with ALT, NAME=VALUE ..., that build beside it), logs $L/<tool>.log; waits for them (and any other background
# job of the caller).
sanitize_fwd() {
  local tool
  for tool in memcheck racecheck synccheck; do
    (WIDE_ALT=$1 timeout ${SAN_TIMEOUT:-100} compute-sanitizer --tool $tool python3 tools/gpu/wide_sanitize.py \
       --fwd-only > "$L/$tool.log" 2>&1; echo "$tool rc=$?" >> "$L/$tool.log") &
  done
  wait
}
