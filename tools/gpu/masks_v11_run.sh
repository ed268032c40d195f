#!/bin/bash
# fwd v11 in one call, before it is the masked default: the builds at once (v11, its wrong-window build, v09, v07),
# the chapter's correctness grid on v11 (lab.masks.gpu.checks, the wrong-window build included), the A/B against v09,
# FlexAttention and the dense default (tools/gpu/masks_v11_ab.py), Nsight Compute on both masked kernels at the
# window cell that missed (S 16384, window 4096; clocks as they run), and the four compute-sanitizer tools over the
# public calls of tools/gpu/masks_sanitize.py with v11 named. Everything into $OUT/v11.tgz (unpack anywhere).
#   LAB_COMMIT=<sha> bash tools/gpu/masks_v11_run.sh
set -u
OUT=${OUT:-/tmp/masks_v11}; R=$OUT/v11; mkdir -p "$R/san"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.max.sm \
  --format=csv; compute-sanitizer --version | tail -2; } > "$R/env.log" 2>&1
build() { python3 -c "from lab import build, registry; build.build_kernel(registry.$1['$2'].source${3:+, $3})" \
  >> "$R/build.log" 2>&1; }
python3 -c "from lab import build; build.binding()" >> "$R/build.log" 2>&1 &
build MASKED_FWD v11 & build MASKED_FWD v11 "{'LAB_FWD_MASK_BUG_NO_WINDOW': '1'}" & build MASKED_FWD v09 &
python3 -c "from lab import build; build.build_kernel('fwd/v07_overlap.cu'); build.build_kernel('fwd/v05_wgmma.cu')" \
  >> "$R/build.log" 2>&1 &
wait
echo "builds done $(date -u +%T)" >> "$R/build.log"
LAB_SESSION_DIR=$R/checks timeout ${CHECK_TIMEOUT:-120} python3 -c "
import sys; from lab.masks import gpu; sys.exit(1 if gpu.checks('v11') else 0)" > "$R/checks.log" 2>&1
echo "rc=$?" >> "$R/checks.log"; grep -c "^ok" "$R/checks.log"; grep "^BAD\|done\|rc=" "$R/checks.log" | tail -5
OUT=$R timeout ${AB_TIMEOUT:-150} python3 tools/gpu/masks_v11_ab.py > "$R/ab.log" 2>&1; echo "rc=$?" >> "$R/ab.log"
python3 -c "import json
for l in open('$R/v11_ab.jsonl'):
    r = json.loads(l); m = r['median_ms']; print(r['case'], {k: round(v, 3) for k, v in m.items() if isinstance(v, float)})" \
  2>&1 | tee "$R/ab_summary.txt"
cat > /tmp/ncu_cell.py <<'EOF'
import torch
from lab import ops
q, k, v = (torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for ver in ("v09", "v11"):
    ops.attention(q, k, v, is_causal=True, window_size=(4096, 0), version=ver)
torch.cuda.synchronize()
EOF
timeout ${NCU_TIMEOUT:-90} ncu --clock-control none --kernel-name regex:'attn_fwd_v(09|11)' --launch-count 2 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
  python3 /tmp/ncu_cell.py > "$R/ncu_window16k.txt" 2>&1; echo "rc=$?" >> "$R/ncu_window16k.txt"
for tool in memcheck racecheck synccheck initcheck; do  # initcheck unfiltered (tools/gpu/masks_bwd_sanitize.sh says why)
  filter="--kernel-name kns=attn_fwd_v11"; [ $tool = initcheck ] && filter="--check-api-memory-access no"
  ( PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool --print-limit 20 \
      $filter python3 tools/gpu/masks_sanitize.py v11 > "$R/san/$tool.log" 2>&1; echo "rc=$?" >> "$R/san/$tool.log" ) &
done
wait
tail -n 3 "$R"/san/*.log
tar czf "$OUT/v11.tgz" -C "$OUT" v11
