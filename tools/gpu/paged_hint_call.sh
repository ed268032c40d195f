#!/bin/bash
# tools/gpu/paged_hint_probe.py in one call: v06 built with each L2 prefetch-size hint, GPU time beside SDPA-cuDNN, then
# ncu's sector and request counts of each launch (--clock-control none). Into $OUT/hint.tgz.
#   LAB_COMMIT=<sha> bash tools/gpu/paged_hint_call.sh
set -u
OUT=${OUT:-/tmp/paged_hint}; D=$OUT/hint; mkdir -p "$D"
export PYTHONPATH=$PWD:$PWD/tools/gpu TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$D/gpu.txt"
t0=$(date +%s)
python3 -c "from lab import build; build.binding()" > "$D/build.log" 2>&1 &
for h in 128 0 256; do
  python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['v06'].source, {'LAB_PAGED_PREFETCH': '$h'} if '$h' != '128' else None)" >> "$D/build.log" 2>&1 &
done
wait; echo "builds $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
timeout 90 python3 tools/gpu/paged_hint_probe.py time "$D/time.jsonl" > "$D/time.log" 2>&1; echo "time rc=$?" >> "$D/steps.txt"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
METRICS=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__sectors_read.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_sectors.sum,\
lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum,lts__t_sector_hit_rate.pct
timeout 120 $NCU --clock-control none --cache-control all --nvtx --nvtx-include lab.profile/ -k "regex:partial_kernel|cudnn" \
  --metrics "$METRICS" --csv --print-units base python3 tools/gpu/paged_hint_probe.py child > "$D/ncu.csv" 2> "$D/ncu.err"
echo "ncu rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
(cd "$OUT" && tar czf hint.tgz hint && rm -rf hint)
tar xzOf "$OUT/hint.tgz" hint/steps.txt hint/time.log; tar xzOf "$OUT/hint.tgz" hint/ncu.csv | grep -E "PROFILED|__" | cut -c1-220
exit 0
