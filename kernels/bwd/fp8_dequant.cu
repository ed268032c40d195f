// FP8 training's backward pre-pass (lab.fp8.backward): the e4m3 Q, K, V the FP8 forward saved, back to bf16.
//
//   y[b, h, :, :] = bf16_rn(float(x[b, h, :, :]) * descale[b, h])
//
// One rounding, the same as torch's (x.float() * descale).to(bfloat16), bit for bit (e4m3 -> float is exact,
// the product is a float32 multiply, bf16 round-to-nearest-even). Why a kernel: torch runs it as three
// passes with a float32 tensor between them (~15 bytes moved per element); here each thread reads 16 bytes
// and writes 32 (3 bytes per element), once per tensor per backward.
//
// Launch: grid-stride over 16-byte chunks, 256 threads, no shared memory. Limits: contiguous (B, H, S, D)
// e4m3 with S * D a multiple of 16 (D 64 / 128 always) and 16-byte aligned base pointers (the launcher checks
// and returns -3); descale contiguous float32 (B, H). Any S, B, H. sm_80 converts in software, sm_89+ in
// hardware.
//
// Compile: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC -I kernels \
//            kernels/bwd/fp8_dequant.cu   (lab.fp8.backward builds and calls it through ctypes)
// Measured: lab.fp8.race_bwd's "dequantise q, k, v" row (outputs/experiments/20261129-fp8-train-backward.json).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kChunkBytes = 16;  // one 16-byte load of e4m3, two 16-byte stores of bf16
constexpr int kMaxBlocksPerSm = 8;

__global__ void __launch_bounds__(kThreads) dequant_kernel(const uint4* __restrict__ x,
                                                           const float* __restrict__ descale, uint4* __restrict__ y,
                                                           int64_t chunks, int64_t chunks_per_head) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float d = descale[i / chunks_per_head];
    const uint4 in = x[i];
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&in);
    uint4 out[2];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
    for (int j = 0; j < kChunkBytes / 2; ++j) {
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
      o[j] = __floats2bfloat162_rn(f.x * d, f.y * d);
    }
    y[2 * i] = out[0];
    y[2 * i + 1] = out[1];
  }
}

}  // namespace

// x: e4m3 (heads, per_head) contiguous; descale: float32 (heads,); y: bf16 (heads, per_head). 0, or -3 for a
// layout the kernel does not take, or the CUDA error.
extern "C" int fp8_dequant_bf16(const void* x, const float* descale, void* y, int64_t heads, int64_t per_head,
                                cudaStream_t stream) {
  if (heads < 0 || per_head < 0 || per_head % kChunkBytes || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(y) % 16)
    return -3;
  const int64_t chunks = heads * per_head / kChunkBytes;
  if (chunks == 0) return 0;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wanted = (chunks + kThreads - 1) / kThreads;
  const int64_t cap = int64_t(sms) * kMaxBlocksPerSm;  // grid-stride beyond: no tail of tiny waves
  const int blocks = static_cast<int>(wanted < cap ? wanted : cap);
  dequant_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const uint4*>(x), descale, static_cast<uint4*>(y),
                                                  chunks, per_head / kChunkBytes);
  return static_cast<int>(cudaGetLastError());
}
