#!/bin/bash
# SASS facts for the Hopper kernels: HGMMA / TMA / barrier instruction counts and local-memory traffic per
# instantiation (cuobjdump -sass on an sm_90a object). Needs nvcc and cuobjdump (+ nvdisasm) on PATH; no GPU.
# Usage: bash tools/sass/hopper_sass.sh [v05_wgmma v06_warpspec v07_overlap]
set -e
cd "$(dirname "$0")/../.."
for name in ${@:-v05_wgmma v06_warpspec v07_overlap}; do
  obj=$(mktemp --suffix=.o)
  nvcc -std=c++17 -O3 -Xptxas -v -I kernels -gencode=arch=compute_90a,code=sm_90a -c kernels/fwd/$name.cu -o $obj 2>&1 |
    grep -E "Compiling entry|Used|spill" | sed -E 's/.*(Cfg0[0-9]I[^E]*E[^E]*E[^E]*E[^E]*E[^E]*E)[^ ]*(__half|__nv_bfloat16).*/\1 \2/'
  cuobjdump -sass $obj | awk -v file=$name '
    /Function :/ { if (fn) report(); fn = $3; delete n }
    { for (i = 1; i <= NF; i++) if ($i ~ /^(HGMMA|UTMALDG|SYNCS|LDL|STL|USETMAXREG|WARPGROUP|HMMA|LDSM)/) { split($i, a, "."); n[a[1]]++ } }
    function report() { s = ""; for (k in n) s = s " " k "=" n[k]; print file ": " fn ":" s }
    END { if (fn) report() }'
  rm -f $obj
done
