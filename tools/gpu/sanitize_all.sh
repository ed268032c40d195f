#!/bin/bash
# compute-sanitizer memcheck, racecheck, initcheck and synccheck on the default kernel paths, in one
# GPU run (builds there with nvcc; about 5-8 minutes on an H200):
#   PYTHONPATH=$PWD bash tools/gpu/sanitize_all.sh   # on a GPU machine (python3 reads lab.registry); logs to $OUT
# Binaries: one per kernel the registry lists for this GPU (python -m lab.registry drivers <cap> --defaults:
# the versions some call gets by default here; SANITIZE_ALL=1: every registered version), each its driver
# (tools/gpu/*_main.cu) linked with the kernel, with the driver's --sanitize list:
#   fwd (fwd_mma_main.cu): B = 2, S_q/S_k in {1025, 63, 65, 130} both ways, D 64/128, causal and not, MHA
#            and GQA, fp16/bf16, strided, scale default/-/0; v04 twice, its 128-row tile forced
#            (-DLAB_FWD_LAZY_SMALL=0, fwd_v04_128) and its 64-row small-grid tile (=2, fwd_v04_64)
#   decode (decode_main.cu): cache lengths 0, 1, 63, 4097 in one batch, num_splits 1..1024
#            (LAB_MAX_NUM_SPLITS), GQA/MHA/MQA, q_len 1/4/16: every num_splits > 1 also runs the shared
#            split-K combine kernel (common/splitk_combine.cuh)
# fwd v01 (the default only at D = 16/32; its own driver has no --sanitize list) is left out.
# Each binary first runs its list without a tool (correctness), then under every tool; the forward lists
# are cut into 4 parts (--part i/4) that run in parallel. Summary: one line per (tool, binary) with the
# sanitizer's own summary counts.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/sanitize_env.sh"
sanitize_env /tmp/sanitize_all sanitize.log  # OUT BIN CAP ARCH LOG
NV="nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_$ARCH,code=sm_$ARCH"
PARTS=4
TIMEOUT=${SANITIZE_TIMEOUT:-420}

sanitize_log_head --nvcc kernels lab/binding.cpp tools/gpu

CAPDOT=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)
NAMES=()
while IFS=$'\t' read -r name main src def; do
  if [ "$name" = fwd_v04 ]; then
    $NV $def -DLAB_FWD_LAZY_SMALL=0 $main $src -o $BIN/fwd_v04_128 & NAMES+=(fwd_v04_128)
    $NV $def -DLAB_FWD_LAZY_SMALL=2 $main $src -o $BIN/fwd_v04_64 & NAMES+=(fwd_v04_64)
  else
    $NV $def $main $src -o $BIN/$name & NAMES+=("$name")
  fi
done < <(python3 -m lab.registry drivers "$CAPDOT" $([ "${SANITIZE_ALL:-0}" = 1 ] || echo --defaults) | grep -v "^fwd_v01")
wait
echo "binaries: ${NAMES[*]}" >> "$LOG"
ls $BIN >> "$LOG"

echo "== correctness of the lists (no tool)" >> "$LOG"
for b in "${NAMES[@]}"; do
  echo "-- $b"; $BIN/$b --sanitize | grep -vE "^PASS"; echo "rc=${PIPESTATUS[0]}"
done >> "$LOG" 2>&1

# One job per (tool, binary, part); at most 16 at a time.
jobs=$BIN/jobs
: > "$jobs"
for tool in memcheck racecheck initcheck synccheck; do
  for b in "${NAMES[@]}"; do
    case $b in
      fwd_*) for i in $(seq 0 $((PARTS - 1))); do echo "$tool $b --sanitize --part $i/$PARTS" >> "$jobs"; done ;;
      *) echo "$tool $b --sanitize" >> "$jobs" ;;
    esac
  done
done
run_one() {  # tool binary args...
  local tool=$1 b=$2; shift 2
  local name="$tool.$b.$(echo "$*" | tr -c 'a-z0-9' '_')"
  { echo "== compute-sanitizer --tool $tool $b $*"
    timeout "$TIMEOUT" compute-sanitizer --tool "$tool" "$BIN/$b" "$@" 2>&1 | grep -vE "^PASS"
    echo "rc=${PIPESTATUS[0]}"; } > "$BIN/out.$name" 2>&1
}
export -f run_one
export BIN TIMEOUT
xargs -P 16 -L 1 bash -c 'run_one "$@"' _ < "$jobs"
cat "$BIN"/out.* >> "$LOG"

# Summary: per (tool, binary), the sanitizer's counts summed over parts, and every rc.
{ echo; echo "== summary (tool binary: errors / hazards, runs, nonzero rc)"
  for tool in memcheck racecheck initcheck synccheck; do
    for b in "${NAMES[@]}"; do
      files=$(ls "$BIN"/out."$tool"."$b".* 2>/dev/null)
      errs=$(cat $files | grep -hoE "ERROR SUMMARY: [0-9]+" | awk '{s+=$3} END {print s+0}')
      haz=$(cat $files | grep -hoE "RACECHECK SUMMARY: [0-9]+ hazard" | awk '{s+=$3} END {print s+0}')
      runs=$(cat $files | grep -c "^== compute-sanitizer")
      summaries=$(cat $files | grep -cE "ERROR SUMMARY|RACECHECK SUMMARY")
      bad=$(cat $files | grep -E "^rc=" | grep -vc "^rc=0$")
      printf "%-10s %-8s errors=%s hazards=%s runs=%s summaries=%s nonzero_rc=%s\n" $tool $b $errs $haz $runs $summaries $bad
    done
  done; date -u; } >> "$LOG"
tail -20 "$LOG"
