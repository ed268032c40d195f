#!/bin/bash
# fwd v11's softcap in one call, for whichever defaults the tree has: every build at once (the session's and the softcap
# builds), the builds' A/B and the checks of those that are not the default (tools/gpu/masks_cap_ab.py), chapter n13
# as a session (tools/gpu/masks_session.sh), then compute-sanitizer's four tools over the public calls
# (tools/gpu/masks_sanitize.py) for the default and, through masks_sanitize_with.py, the fp16-pair tanh build, and ncu's
# pipe counters of v11 (named: the plain call would take v07) with and without softcap (S 16384, D 128; before the
# sanitizers, on a quiet GPU).
# Carry .whl.
#   LAB_COMMIT=<sha> bash tools/gpu/masks_cap_run.sh  -> $OUT/cap.tgz, $OUT/n13.tgz, $OUT/session.log
#   AB_ONLY=1 stops after the A/B and checks (cap.tgz only).
set -u
OUT=${OUT:-/tmp/masks_cap}; C=$OUT/cap; mkdir -p "$C/san"
export PYTHONPATH=$PWD TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
# every build as data, nvcc runs side by side (the kernel cache lets concurrent builders share a key)
python3 - >> "$C/build.log" 2>&1 <<'PY'
from concurrent.futures import ThreadPoolExecutor
from lab import build, registry
cap = [{"LAB_FWD_MASK_CAP_POLY": p, "LAB_FWD_MASK_CAP_TANH_HALF": t} for p, t in ((0, 0), (2, 0), (0, 1), (2, 1), (4, 1))]
wrong = [{"LAB_FWD_MASK_BUG_NO_WINDOW": "1"}]
jobs = [(registry.MASKED_FWD[v].source, d) for v, ds in (("v11", [None, *wrong, *cap]), ("v08", [None, *wrong]))
        for d in ds]
jobs += [(registry.MASKED_BWD["v08"].source, d) for d in (None, {"LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD": "1"},
                                                          {"LAB_BWD_MASK_BUG_NO_WINDOW": "1"})]
jobs += [(registry.BWD["v07"].source, None), ("fwd/v07_overlap.cu", None), ("fwd/v05_wgmma.cu", None)]
with ThreadPoolExecutor(16) as pool:
    futures = [pool.submit(build.binding)] + [pool.submit(build.build_kernel, src, d) for src, d in jobs]
    for f in futures:
        try:
            f.result()
        except Exception as e:  # a build that fails is reported by the calls that need it
            print(type(e).__name__, str(e)[:2000], flush=True)
PY
echo "builds done $(date -u +%T)" >> "$C/build.log"
LAB_SESSION_DIR=$C/checks OUT=$C timeout ${AB_TIMEOUT:-100} python3 tools/gpu/masks_cap_ab.py > "$C/ab.log" 2>&1
echo "rc=$?" >> "$C/ab.log"; grep -v '^ok ' "$C/ab.log" | tail -8
# AB_ONLY=1: the builds' A/B and checks alone (no session, ncu or sanitizers)
[ "${AB_ONLY:-0}" = 1 ] && { tar czf "$OUT/cap.tgz" -C "$OUT" cap && rm -rf "$C"; exit 0; }
SESSION_TIMEOUT=${SESSION_TIMEOUT:-240} OUT=$OUT bash tools/gpu/masks_session.sh
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for cap in 0 30; do
  timeout 60 "$NCU" --clock-control none --kernel-name regex:attn_fwd_v11 --launch-skip 1 --launch-count 1 \
    --section ComputeWorkloadAnalysis --section SpeedOfLight --page raw --csv python3 -c "
import torch; from lab import ops
q = torch.randn(1, 16, 16384, 128, device='cuda', dtype=torch.bfloat16)
for _ in range(2): ops.attention(q, q, q, is_causal=True, softcap=$cap.0, version='v11')
torch.cuda.synchronize()" > "$C/ncu-cap$cap.csv" 2> "$C/ncu-cap$cap.err"
done
export PYTHONPATH=$PWD
{ date -u; echo "commit ${LAB_COMMIT:-?}"; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv
  compute-sanitizer --version | tail -2; } > "$C/san/env.log" 2>&1
half='{"LAB_FWD_MASK_CAP_POLY": 2, "LAB_FWD_MASK_CAP_TANH_HALF": 1}'
for tool in memcheck racecheck synccheck initcheck; do  # initcheck unfiltered: tools/gpu/masks_bwd_sanitize.sh says why
  filter="--kernel-name kns=attn_fwd_v11"; [ $tool = initcheck ] && filter="--check-api-memory-access no"
  for b in default half_poly2; do
    ( arg=""; [ $b = half_poly2 ] && export LAB_FWD_DEFINES="$half" && arg=v11  # named: the launch path, not the plan
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool --print-limit 20 \
        $filter python3 tools/gpu/masks_sanitize_with.py tools/gpu/masks_sanitize.py $arg > "$C/san/$b-$tool.log" 2>&1
      echo "rc=$?" >> "$C/san/$b-$tool.log" ) &
  done
done
wait
tail -qn 1 "$C"/san/*.log
tar czf "$OUT/cap.tgz" -C "$OUT" cap && rm -rf "$C"
