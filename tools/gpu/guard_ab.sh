#!/bin/bash
# A kernel refactor's GPU guard as an A/B on one machine: the n6/n7 guard session on the kernels of a base revision,
# then on the working tree's, same process setup and timing method, so a refactor that changed SASS is
# judged cell by cell (within +-2 %) without a session from another day or another timing rule in between.
# Here:   rm -rf .cache/base && mkdir -p .cache/base && git archive BASE kernels | tar -x -C .cache/base
# Device: run(carry=[".whl", ".cache/base"]): LAB_COMMIT=HEAD BASE=BASE bash tools/gpu/guard_ab.sh
# Then:   PYTHONPATH=. python3 tools/gpu/guard_ab.py OUT/base.tgz OUT/head.tgz   (the cell-by-cell ratio table)
set -u
OUT=${OUT:-/tmp/guard_ab}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/tx}
head=${LAB_COMMIT:-unknown}
session() {  # session LABEL: the n6/n7 quick session on the kernels/ now in place
  rm -rf outputs/adhoc
  LAB_COMMIT=$2 timeout 270 python3 -m lab session --device cuda --cases quick --chapters n6_fa2,n7_split_k \
    --tarball "$OUT/$1.tgz" --no-log > "$OUT/$1.log" 2>&1
  echo "$1 rc=$?" | tee -a "$OUT/$1.log"; grep -E "gate|complete" "$OUT/$1.log" | tail -4
}
mv kernels .cache/head_kernels && cp -r .cache/base/kernels kernels
session base "${BASE:-base}"
rm -rf kernels && mv .cache/head_kernels kernels
session head "$head"
