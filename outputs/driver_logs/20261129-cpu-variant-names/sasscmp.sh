#!/usr/bin/env bash
# sasscmp.sh: before/ vs after/ cubins, disassembled and normalised as tools/sass/sass_guard.sh does
export NVDISASM_PATH=${TMPDIR:-/tmp}/cuobj/x/nvidia/cu13/bin/nvdisasm
CU=${TMPDIR:-/tmp}/cuobj/x/nvidia/cu13/bin/cuobjdump
norm() { sed -E 's/Function : .*/Function/; s@/\*[^*]*\*/@@g; s/[[:space:]]+/ /g; s/^ //; s/ $//' "$1" | grep -v '^$' | grep -v '^\.'; }
for b in before/*.cubin; do n=$(basename $b .cubin); a=after/$n.cubin; [ -s "$a" ] || continue
  $CU -sass $b > ${TMPDIR:-/tmp}/sassD/b.sass; $CU -sass $a > ${TMPDIR:-/tmp}/sassD/a.sass
  k=$(grep -c 'Function :' ${TMPDIR:-/tmp}/sassD/a.sass); i=$(norm ${TMPDIR:-/tmp}/sassD/a.sass | grep -vc Function)
  if cmp -s <(norm ${TMPDIR:-/tmp}/sassD/b.sass) <(norm ${TMPDIR:-/tmp}/sassD/a.sass); then echo "$n: identical SASS ($k kernels, $i instructions)"; else echo "$n: DIFFERENT"; fi
done
