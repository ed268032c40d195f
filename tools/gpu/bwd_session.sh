#!/bin/bash
# The backward chapter as a GPU session in one call: the wheels papermill needs, every kernel the chapter
# builds compiled at once (the kernel cache lets concurrent builders share a key), then
# `python -m lab session --chapters n10_backward`, packed into $OUT/n10.tgz (unpack into outputs/sessions/).
# Usage inside `run` (carry .whl): bash tools/gpu/bwd_session.sh [full|quick] [reps]
set -u
OUT=${OUT:-/tmp/bwd_session}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
CASES=${1:-full}; REPS=${2:-1}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv > "$OUT/gpu.txt"
python3 -c "from lab import build; build.binding()" > "$OUT/build.log" 2>&1 &
for src in $(python3 -c "from lab import registry; print(' '.join(k.source for k in registry.BWD.values()))") \
           fwd/v05_wgmma.cu fwd/v07_overlap.cu; do
  python3 -c "from lab import build; build.build_kernel('$src')" >> "$OUT/build.log" 2>&1 &
  case $src in bwd/v04*) for ab in LAB_BWD_PERSIST_DS_BUFS=1 LAB_BWD_PERSIST_PERSISTENT=0; do
                          python3 -c "from lab import build; build.build_kernel('$src', {'${ab%=*}': '${ab#*=}'})" \
                            >> "$OUT/build.log" 2>&1 & done ;;
                      bwd/v05*) for ab in LAB_BWD_STAGGER=0 LAB_BWD_STAGGER=1 LAB_BWD_STAGGER_DQ_RED=0; do
                          python3 -c "from lab import build; build.build_kernel('$src', {'${ab%=*}': '${ab#*=}'})" \
                            >> "$OUT/build.log" 2>&1 & done ;; esac
  case $src in bwd/*) python3 -c "from lab import build; build.build_kernel('$src', {'LAB_BWD_BUG_NO_DELTA': None})" \
                        >> "$OUT/build.log" 2>&1 & ;; esac
done
wait
timeout ${SESSION_TIMEOUT:-480} python3 -m lab session --device cuda --cases "$CASES" --reps "$REPS" \
  --chapters n10_backward --tarball "$OUT/n10.tgz" --no-log > "$OUT/session.log" 2>&1
echo "session rc=$?" >> "$OUT/session.log"
tail -25 "$OUT/session.log"
