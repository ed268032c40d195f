# Call 1: the FP8 backward at D 64 (GPU tests, sanitizers), then chapter n15 in a session that prebuilds every kernel.
T=${TMPDIR:-/tmp}  # scratch on the GPU machine
python3 -m pip install -q --no-index --no-deps --no-compile --target $T/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target $T/peers .peers/*.whl || exit 1
export LAB_COMMIT=${LAB_COMMIT:-unknown} PYTHONPATH=$T/peers:$T/site:$PWD PATH=$T/site/bin:$PATH LAB_CACHE_DIR=$T/lc TORCH_EXTENSIONS_DIR=$T/te
export MPLCONFIGDIR=$T/mpl JUPYTER_CONFIG_DIR=$T/jc JUPYTER_DATA_DIR=$T/jd PYTHONWARNINGS=ignore
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> $OUT/gpu.txt; nvcc --version | tail -1 >> $OUT/gpu.txt
compute-sanitizer --version | tail -1 >> $OUT/gpu.txt; echo "commit $LAB_COMMIT" >> $OUT/gpu.txt
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/fp8/test_fp8_kernel_bwd_gpu.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/gpu_tests.txt
cat > $T/fp8_bwd_small.py <<'PY'
import torch
from lab.fp8.backward import attention_fp8_train
g = torch.Generator(device="cuda").manual_seed(0)
for D in (64, 128):
    for causal in (True, False):
        q = torch.randn(1, 4, 130, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
        k, v = (torch.randn(1, 2, 200, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(2))
        o = attention_fp8_train(q, k, v, is_causal=causal, enable_gqa=True, backward="fp8")
        grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
        torch.cuda.synchronize()
        print("D", D, "causal", causal, "finite", all(bool(torch.isfinite(x.float()).all()) for x in grads))
PY
mkdir -p $OUT/san
python3 $T/fp8_bwd_small.py > $OUT/san/plain.log 2>&1
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --print-limit 20 python3 $T/fp8_bwd_small.py > $OUT/san/$tool.log 2>&1; echo "$tool rc=$?" >> $OUT/san/plain.log
done
echo "tests+sanitizers $(( $(date +%s) - t0 ))s" >> $OUT/gpu.txt
t1=$(date +%s)
timeout ${SESSION_LIMIT:-330} python3 -m lab session --chapters n15_fp8 --prebuild --no-log --heartbeat 60 --cases quick > $OUT/session.txt 2>&1
echo "session rc=$? $(( $(date +%s) - t1 ))s" >> $OUT/session.txt
d=$(ls -td outputs/sessions/*/ | head -1)
tar czf $OUT/n15.tgz -C outputs/sessions $(basename $d)
echo "total $(( $(date +%s) - t0 ))s" >> $OUT/gpu.txt
