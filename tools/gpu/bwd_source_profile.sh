#!/bin/bash
# Per-instruction stall samples of one backward kernel launch (ncu's SourceCounters), exported as the source
# page's CSV with SASS for lab.profile.source_regions. Usage inside `run`: bash tools/gpu/bwd_source_profile.sh
# VERSION [CASE]; writes $OUT/<version>-<case>-source.csv.gz.
set -u
V=${1:-v05}; CASE=${2:-bwd-d128-s4096}; OUT=${OUT:-/tmp/bwd_source}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/tx}
python3 -c "from lab import build; from lab.registry import BWD; build.build_kernel(BWD['$V'].source); build.binding()" || exit 1
REP=/tmp/src-$V; NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
K=$(python3 -c "from lab.profile import targets; print(targets.kernel_regex('bwd:$V', None))")
$NCU --clock-control none --section SourceCounters --section WarpStateStats -k "regex:$K" --launch-skip 3 \
  --launch-count 1 -f -o $REP python3 -m lab.profile child "bwd:$V" "$CASE" --warmup 3 --dtype bfloat16 > "$OUT/ncu-$V.log" 2>&1
$NCU -i $REP.ncu-rep --page source --csv --print-source sass 2>>"$OUT/ncu-$V.log" | gzip > "$OUT/$V-$CASE-source.csv.gz"
tail -3 "$OUT/ncu-$V.log"; ls -la "$OUT"
