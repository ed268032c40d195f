#!/usr/bin/env bash
# pp.sh TREE OUT: the device-side preprocessed translation unit (nvcc's own cpp line) of each default kernel
set -u
T=$1; O=$2; mkdir -p $O; cd ${TMPDIR:-/tmp}/sassD; ln -sfn $T K
for f in $(cat files.txt); do for arch in sm_80 sm_90a; do
  n=$(echo $f | tr / -)-$arch
  line=$(nvcc -std=c++17 -O3 -I K -gencode=arch=compute_${arch#sm_},code=$arch -cubin K/$f -o ${TMPDIR:-/tmp}/sassD/x.cubin --dryrun 2>&1 | grep -- '-D__CUDA_ARCH__=' | grep -- ' -E ' | head -1 | sed 's/^#\$ //')
  line=$(echo "$line" | sed -E 's/ -o "[^"]*"/ -o "\/tmp\/sassD\/pp.tmp"/')
  bash -c "$line" && grep -v '^#' pp.tmp | grep -v '^[[:space:]]*$' > $O/$n.ii
  echo "$n $? $(wc -l < $O/$n.ii)"
done; done
