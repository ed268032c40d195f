#!/bin/bash
# The four compute-sanitizer tools on bwd v08's dense and packed calls (tools/gpu/masks_bwd_sanitize.py); memcheck,
# racecheck and synccheck on bwd v08's kernels only (pre-pass, loop, dQ convert, sink gradient: every name holds "bwd",
# bwd_pre or lab::sm90::bwd; kns is a substring, not a regex: the alternation this filter once was reads as one
# literal, which no kernel name holds), initcheck on every kernel (below).
# Torch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), as the decode runs have it for initcheck.
# -> $OUT/sanitize.tgz (san/<tool>.log).
set -u
OUT=${OUT:-/tmp/masks_san}; mkdir -p "$OUT/san"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
python3 -c "from lab import build, registry; build.binding(); build.build_kernel(registry.MASKED_BWD['v08'].source)
build.build_kernel(registry.MASKED_FWD['v09'].source)" > "$OUT/san/build.log" 2>&1
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  compute-sanitizer --version | tail -2; } > "$OUT/san/env.log" 2>&1
# initcheck counts memory as written only by the kernels it instruments (and host copies): under this filter the
# forward's O and LSE and torch's tensors read as uninitialised (every report of the filtered run was such a read), so
# initcheck instruments every kernel, torch's too (a report names its kernel), without the host API checks.
for tool in memcheck racecheck synccheck initcheck; do
  filter="--kernel-name kns=bwd"; [ $tool = initcheck ] && filter="--check-api-memory-access no"
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-180} compute-sanitizer --tool $tool --print-limit 20 \
      $filter python3 tools/gpu/masks_bwd_sanitize.py > "$OUT/san/$tool.log" 2>&1
    echo "rc=$?" >> "$OUT/san/$tool.log" ) &
done
wait
tail -n 4 "$OUT"/san/*.log
tar czf "$OUT/sanitize.tgz" -C "$OUT" san && rm -rf "$OUT/san"
