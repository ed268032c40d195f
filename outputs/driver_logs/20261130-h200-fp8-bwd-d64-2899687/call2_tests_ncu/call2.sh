# Call 2: the FP8 backward's GPU tests on a prebuilt cache; ncu of the FP8 backward and bwd v14 at D 64 and 128.
T=${TMPDIR:-/tmp}  # scratch on the GPU machine
python3 -m pip install -q --no-index --no-deps --no-compile --target $T/site .whl/*.whl || exit 1
export LAB_COMMIT=${LAB_COMMIT:-unknown} PYTHONPATH=$T/site:$PWD PATH=$T/site/bin:$PATH LAB_CACHE_DIR=$T/lc TORCH_EXTENSIONS_DIR=$T/te
export MPLCONFIGDIR=$T/mpl PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/gpu.txt
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version())" >> $OUT/gpu.txt; nvcc --version | tail -1 >> $OUT/gpu.txt
ncu --version | tail -1 >> $OUT/gpu.txt; echo "commit $LAB_COMMIT" >> $OUT/gpu.txt
t0=$(date +%s)
python3 -c "
from lab import build, prebuild
prebuild.prebuild(build.device_arch_flags(), sources=['binding', 'kernels/fwd/v13_fp8.cu', 'kernels/bwd/v22_fp8.cu', 'kernels/bwd/v14_tail.cu', 'kernels/bwd/fp8_cast.cu', 'kernels/bwd/v18_signal.cu'])
" >> $OUT/gpu.txt 2>&1
echo "prebuild $(( $(date +%s) - t0 ))s" >> $OUT/gpu.txt
timeout 240 python3 -u -m pytest -q -p no:cacheprovider tests/fp8/test_fp8_kernel_bwd_gpu.py tests/fp8/test_fp8_training.py > $OUT/gpu_tests.txt 2>&1; echo "rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/gpu_tests.txt
cat > $T/prof.py <<'PY'
import torch, lab.ops as ops
from lab.fp8.backward import attention_fp8_train
g = torch.Generator(device="cuda").manual_seed(0)
for D in (64, 128):
    q, k, v = (torch.randn(2, 16, 8192, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    do = torch.randn(2, 16, 8192, D, generator=g, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        torch.autograd.grad(attention_fp8_train(q, k, v, backward="fp8"), (q, k, v), do)
        torch.autograd.grad(ops.attention(q, k, v), (q, k, v), do)
    torch.cuda.synchronize()
PY
python3 $T/prof.py > $OUT/prof_plain.txt 2>&1; echo "plain rc=$?" >> $OUT/prof_plain.txt
timeout 200 ncu --clock-control none --set full --kernel-name regex:"bwd_fp8_kernel|bwd_dkdv_stagger" --launch-skip 2 --launch-count 6 -o $T/prof python3 $T/prof.py > $OUT/ncu_log.txt 2>&1; echo "ncu rc=$?" >> $OUT/ncu_log.txt
ncu --import $T/prof.ncu-rep --page details --csv > $T/details.csv 2>> $OUT/ncu_log.txt
ncu --import $T/prof.ncu-rep --page raw --csv > $T/raw.csv 2>> $OUT/ncu_log.txt
gzip -c $T/details.csv > $OUT/details.csv.gz; gzip -c $T/raw.csv > $OUT/raw.csv.gz
echo "total $(( $(date +%s) - t0 ))s" >> $OUT/gpu.txt
