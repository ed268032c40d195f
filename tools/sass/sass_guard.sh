#!/usr/bin/env bash
# SASS guard for refactors that must not change a kernel: compiles each kernel at a base revision and in
# the working tree, for sm_80 and sm_90a, and compares the machine code. Verdicts per kernel and arch:
#   (kernel names are not compared: a template argument with its default value renames a kernel)
#   identical SASS        - the refactor cannot change speed or results (the strongest guard, no GPU needed);
#                           also per kernel when only the kernels' order in the cubin moved
#   same opcode sequence  - only register numbers differ
#   every base kernel has an identical kernel in the tree - instantiations were added, none changed
#   DIFFERENT             - the opcode histogram diff follows; the change needs a GPU guard (the n6/n7 sessions on both revisions, within ±2 %)
# Usage: tools/sass/sass_guard.sh BASE_REV kernels/fwd/v04_lazy.cu [more.cu ...]
# Needs nvcc and cuobjdump + nvdisasm (CUDA toolkit, or the nvidia-cuda-cuobjdump / -nvdisasm wheels:
# CUOBJDUMP=/path/to/cuobjdump NVDISASM_PATH=/path/to/nvdisasm).
set -euo pipefail
base=$1; shift
cuobjdump=${CUOBJDUMP:-cuobjdump}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$base" kernels | tar -x -C "$work"
norm() { sed -E 's/Function : .*/Function/; s@/\*[^*]*\*/@@g; s/[[:space:]]+/ /g; s/^ //; s/ $//' "$1" | grep -v '^$' | grep -v '^\.'; }
blocks() { norm "$1" | awk '/^Function/ { if (b != "") print b; b = ""; next } { b = b " ; " $0 } END { if (b != "") print b }' | sort; }
ops() { norm "$1" | sed -E '/Function/!{s/^(@!?U?P[0-9T]+ )?([A-Z0-9_.]+).*/\1\2/; s/^@!?U?P[0-9T]+ /@P /}'; }
sass() {  # sass KERNELS_DIR FILE ARCH OUT
  nvcc -std=c++17 -O3 -I "$1" -gencode=arch=compute_${3#sm_},code=$3 -cubin "$1/${2#kernels/}" -o "$4.cubin"
  "$cuobjdump" -sass "$4.cubin" > "$4"
}
echo "sass_guard: base $(git -C "$root" rev-parse --short=10 "$base"), tree $(git -C "$root" rev-parse --short=10 HEAD)$(git -C "$root" diff --quiet -- kernels || echo '+changes'), $(nvcc --version | tail -1)"
for f in "$@"; do
  for arch in sm_80 sm_90a; do
    n=$(echo "$f" | tr / -)-$arch
    sass "$work/kernels" "$f" $arch "$work/$n.before"
    sass "$root/kernels" "$f" $arch "$work/$n.after"
    b=$work/$n.before; a=$work/$n.after
    if cmp -s <(norm "$b") <(norm "$a"); then echo "$f $arch: identical SASS ($(ops "$a" | grep -vc Function) instructions)"
    elif cmp -s <(blocks "$b") <(blocks "$a"); then echo "$f $arch: identical SASS per kernel, kernels in another order in the cubin"
    elif cmp -s <(ops "$b") <(ops "$a"); then echo "$f $arch: same opcode sequence, registers renamed"
    elif [ -z "$(comm -23 <(blocks "$b") <(blocks "$a"))" ]; then  # instantiations added, none changed
      echo "$f $arch: every base kernel has an identical kernel in the tree ($(blocks "$b" | wc -l) base, $(blocks "$a" | wc -l) tree kernels)"
    else
      echo "$f $arch: DIFFERENT, $(ops "$b" | grep -vc Function) -> $(ops "$a" | grep -vc Function) instructions;" \
        "$(comm -23 <(blocks "$b") <(blocks "$a") | wc -l) of $(blocks "$b" | wc -l) base kernels without an identical tree kernel; opcode counts before | after:"
      diff <(ops "$b" | sort | uniq -c) <(ops "$a" | sort | uniq -c) | grep '^[<>]' | sed 's/^/    /' || true
    fi
  done
done
