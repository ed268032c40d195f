#!/bin/bash
# One GPU call for the Hopper kernels: correctness on every `tests` case, compute-sanitizer
# (memcheck, racecheck, synccheck) on uneven shapes, and the bench-fwd race; logs under $OUT.
# Usage (on the device machine, repo root): bash tools/gpu/hopper_gpu.sh "v05,v06" "v04,v05,v06" [steps]
# steps: any of check,memcheck,racecheck,synccheck,bench (default: all).
CHECKED=${1:-v05,v06}
RACED=${2:-v04,v05,v06}
STEPS=${3:-check,memcheck,racecheck,synccheck,bench}
SAN=${4:-$CHECKED}  # versions run under compute-sanitizer
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PYTHONPATH
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/env.log
nvcc --version | tail -1 >> $OUT/env.log
python3 -c "import lab.build as b; b.binding(); print('binding ok')" 2>&1 | tail -3
for step in ${STEPS//,/ }; do
  case $step in
    check) timeout 240 python3 tools/gpu/hopper_run.py check $CHECKED > $OUT/check.log 2>&1; echo "check rc $?" | tee -a $OUT/check.log; grep SUMMARY $OUT/check.log; grep -m5 FAIL $OUT/check.log ;;
    memcheck|racecheck|synccheck)
      timeout 200 compute-sanitizer --tool $step --print-limit 20 --kernel-regex kns=attn_fwd python3 tools/gpu/hopper_run.py sanitize $SAN > $OUT/$step.log 2>&1
      echo "$step rc $?" | tee -a $OUT/$step.log; tail -3 $OUT/$step.log ;;
    bench) timeout 300 python3 tools/gpu/hopper_run.py bench $RACED $OUT/bench.json > $OUT/bench.log 2>&1; echo "bench rc $?"; cat $OUT/bench.log | grep -v "^$" | cut -c1-150 ;;
  esac
done
# chapter: papermill run of chapters/n9_hopper.ipynb on the GPU (needs .whl carried); executed copy under $OUT
if [[ ",$STEPS," == *",chapter,"* ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
  timeout 420 python3 -m papermill chapters/n9_hopper.ipynb $OUT/n9_hopper_gpu.ipynb -p device cuda -p cases ${CHAPTER_CASES:-quick} --cwd $PWD > $OUT/chapter.log 2>&1
  echo "chapter rc $?" | tee -a $OUT/chapter.log; tail -3 $OUT/chapter.log
  tar czf $OUT/chapter_records.tgz outputs/adhoc 2>/dev/null
fi
