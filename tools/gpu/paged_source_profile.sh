#!/bin/bash
# Per-instruction counts (ncu SourceCounters, SASS) and the L2 / DRAM sector counts of pass 1 beside SDPA-cuDNN's decode
# kernel on one serving cell: which loads each kernel issues (LDG / LDGSTS / LDSM and their widths and cache hints), how
# many, and how many sectors each level moves for the same bytes. Launches: tools/gpu/paged_profile.py child (the public
# op, warmed up, one launch each in an NVTX range) for PAGED_PROFILE_CELLS (32x4096), PAGED_PROFILE_PAGES (16),
# PAGED_PROFILE_VERSIONS (v03 v06), PAGED_PROFILE_CONTIGUOUS (v02).
#   LAB_COMMIT=<sha> bash tools/gpu/paged_source_profile.sh      -> $OUT/source.tgz
set -u
OUT=${OUT:-/tmp/paged_source}; D=$OUT/source; mkdir -p "$D"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 LAB_CACHE_DIR=${LAB_CACHE_DIR:-$PWD/.cache/dev}
export PAGED_PROFILE_CELLS=${PAGED_PROFILE_CELLS:-32x4096} PAGED_PROFILE_PAGES=${PAGED_PROFILE_PAGES:-16}
export PAGED_PROFILE_VERSIONS=${PAGED_PROFILE_VERSIONS:-"v03 v06"} PAGED_PROFILE_CONTIGUOUS=${PAGED_PROFILE_CONTIGUOUS:-v02}
{ date -u; echo "commit ${LAB_COMMIT:-unknown}"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } > "$D/gpu.txt"
t0=$(date +%s)
python3 -c "from lab import build; build.binding()" > "$D/build.log" 2>&1 &
for v in v02 v03 v06; do python3 -c "from lab import build, registry; build.build_kernel(registry.DECODE['$v'].source)" >> "$D/build.log" 2>&1 & done
wait; echo "builds $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu); REP=/tmp/paged_source
METRICS=dram__sectors_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,\
lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,l1tex__m_xbar2l1tex_read_sectors.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,\
smsp__sass_inst_executed_op_ldgsts.sum,smsp__sass_inst_executed_op_global_ld.sum,smsp__sass_inst_executed_op_ldsm.sum,\
smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
gpu__time_duration.sum,l1tex__m_l1tex2xbar_req.sum,lts__t_sectors_srcunit_tex_op_read_lookup_miss.sum
timeout 200 $NCU --clock-control none --cache-control all --nvtx --nvtx-include lab.profile/ -k "regex:partial_kernel|cudnn|fmha" \
  --section SourceCounters --section WarpStateStats --metrics "$METRICS" -f -o $REP python3 tools/gpu/paged_profile.py child \
  > "$D/ncu.log" 2>&1
echo "ncu rc=$? $(( $(date +%s) - t0 )) s" >> "$D/steps.txt"
$NCU -i $REP.ncu-rep --page raw --csv --print-units base 2>>"$D/ncu.log" | gzip -9 > "$D/raw.csv.gz"
$NCU -i $REP.ncu-rep --page source --csv --print-source sass 2>>"$D/ncu.log" | gzip -9 > "$D/source.csv.gz"
(cd "$OUT" && tar czf source.tgz source && rm -rf source)
tar xzOf "$OUT/source.tgz" source/steps.txt source/gpu.txt; tar xzOf "$OUT/source.tgz" source/ncu.log | grep -E "ORDER|==PROF==|ERR" | head -12
tar xzOf "$OUT/source.tgz" source/source.csv.gz | zcat | grep -oE '(LDGSTS|LDG|LDSM|LDS|STS|BAR|DEPBAR|LDGDEPBAR)[A-Z0-9._]*' | sort | uniq -c | sort -rn | head -40
exit 0
