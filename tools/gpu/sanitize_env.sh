#!/bin/bash
# Sourced by tools/gpu/sanitize_all.sh and sanitize_paged.sh: the set-up both runs share.
# sanitize_env DEFAULT_OUT LOG_NAME: OUT (from the environment, else DEFAULT_OUT; made), BIN (a fresh temp
#   dir for the binaries), CAP (the GPU's compute capability without the dot), ARCH (nvcc's arch: 90a on
#   Hopper, else CAP) and LOG ($OUT/LOG_NAME).
sanitize_env() {
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  BIN=$(mktemp -d)
  CAP=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  ARCH=$([ "$CAP" = 90 ] && echo 90a || echo "$CAP")
  LOG=$OUT/$2
}
# sanitize_log_head [--nvcc] PATH...: starts $LOG with the date, the revision, `git status --short` of the
#   PATHs, the GPU (name, driver, capability), with --nvcc nvcc's version, and compute-sanitizer's version.
sanitize_log_head() {
  local nvcc=0
  if [ "$1" = --nvcc ]; then nvcc=1; shift; fi
  { date -u; git rev-parse --short=10 HEAD 2>/dev/null; git status --short "$@" 2>/dev/null
    nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
    [ $nvcc = 1 ] && nvcc --version | tail -2
    compute-sanitizer --version | tail -2; } > "$LOG" 2>&1
}
