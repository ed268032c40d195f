// FP8 training's casts (lab.fp8.backward): bf16 Q, K, V to e4m3 with an amax descale before the FP8 forward, and
// the e4m3 tensors the forward saved back to bf16 for the backward.
//
//   quantise    amax[b, h] = max |x[b, h]| (or over the tensor); descale = amax * RN(1 / 448) (1 where amax is 0)
//               x8[b, h] = e4m3_rn_satfinite(float(x[b, h]) / descale[b, h])
//   dequantise  y[b, h] = bf16_rn(float(x8[b, h]) * descale[b, h])
//
// Each is bit for bit lab.fp8.quant.quantize / torch's (x8.float() * descale).to(bfloat16): the division and
// product are IEEE float32 (no fast math), the conversions round to nearest even, e4m3 saturates at +-448 as
// quantize's clamp does. Why kernels: torch runs the quantise as ~8 passes with float32 tensors between them
// and the dequantise as three (~30 and ~15 bytes moved per element); here the amax pass reads 2 bytes, the
// quantise pass 2 + 1, the dequantise 1 + 2. The dequantise cost 0.44 ms of a 1.87 ms backward in torch
// (B 2, H 16, S 4096, D 128; outputs/driver_logs/20261129-h200-batch4-b88a6be/T/race_bwd.txt). Measured with
// these kernels, three such tensors, cold calls with their host time: quantise 0.33 ms (torch 0.98), dequantise
// 0.23 ms (torch 0.42) (outputs/driver_logs/20261129-h200-batch5-9c9667b/T/race_bwd.txt); the amax is read
// once more than a fused producer would (the previous layer's epilogue), which the lab's op cannot see.
//
// Launch: grid-stride over 16-byte (dequantise) or 8-element (quantise) chunks, 256 threads; the amax pass a
// (slices, B * H) grid, one atomicMax per block after a warp-shuffle reduction (32 bytes of shared memory).
// Limits: contiguous (B, H, S, D) tensors, S * D a multiple of 16 (D 64 / 128 always), B * H <= 65535 for the
// quantise, and 16-byte aligned bases (the launchers check and return -3); descale contiguous float32 (B, H).
// Any S. sm_80 converts in software, sm_89+ in hardware.
//
// Compile: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC -I kernels \
//            kernels/bwd/fp8_cast.cu   (lab.fp8.backward builds and calls it through ctypes)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kChunkBytes = 16;  // one 16-byte load of e4m3, two 16-byte stores of bf16
constexpr int kMaxBlocksPerSm = 8;
constexpr float kE4m3Max = 448.f;
constexpr float kInvE4m3Max = 1.f / 448.f;  // rounded to float32 once, as torch's reciprocal is
constexpr int kAmaxChunks = kThreads * 16;  // 8-element chunks a block of the amax pass reduces (32K elements)

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

__device__ __forceinline__ void load8(const __nv_bfloat16* p, float* f) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 v = __bfloat1622float2(h[j]);
    f[2 * j] = v.x;
    f[2 * j + 1] = v.y;
  }
}

// amax_bits[head] = max over the head's elements of |x|, as the bits of a non-negative float (they order as the
// floats do, so atomicMax on the bits is a max on the values; a NaN's bits exceed inf's: NaN in, NaN out).
// Grid (slices, heads): a block reduces kAmaxChunks chunks of one head, then one atomic per block.
__global__ void __launch_bounds__(kThreads) amax_kernel(const __nv_bfloat16* __restrict__ x,
                                                        unsigned int* __restrict__ amax_bits,
                                                        int64_t chunks_per_head) {
  const int64_t head = blockIdx.y;
  const int64_t begin = blockIdx.x * static_cast<int64_t>(kAmaxChunks);
  const int64_t end = begin + kAmaxChunks < chunks_per_head ? begin + kAmaxChunks : chunks_per_head;
  unsigned int m = 0u;  // bits of a non-negative float (or NaN): integer max is the float max
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float f[8];
    load8(x + 8 * (head * chunks_per_head + i), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) m = max(m, __float_as_uint(fabsf(f[j])));  // fabsf(NaN) keeps NaN's bits
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __shared__ unsigned int warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = max(m, warp_max[w]);
    atomicMax(amax_bits + head, m);
  }
}

// descale[h] = amax / 448 (1 where it is 0), over the head's amax or, per tensor, the max over all heads.
__global__ void descale_kernel(const unsigned int* __restrict__ amax_bits, float* __restrict__ descale, int heads,
                               int per_tensor) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  unsigned int bits = amax_bits[h];
  if (per_tensor)
    for (int g = 0; g < heads; ++g) bits = max(bits, amax_bits[g]);
  // amax * RN(1 / 448), not amax / 448: torch divides a tensor by a Python scalar as a product with the scalar's
  // float32 reciprocal, and quant.amax_descale's `amax / 448.0` is that; the two differ by an ulp on some amaxes
  // (per-head descales did, outputs/driver_logs/20261129-h200-batch5-9c9667b/T/checks_bwd.txt).
  const float d = __fmul_rn(__uint_as_float(bits), kInvE4m3Max);
  descale[h] = d > 0.f ? d : 1.f;  // quant.amax_descale: torch.where(descale > 0, descale, 1); NaN > 0 is false
}

__global__ void __launch_bounds__(kThreads) quantize_kernel(const __nv_bfloat16* __restrict__ x,
                                                            const float* __restrict__ descale,
                                                            uint2* __restrict__ y, int64_t chunks,
                                                            int64_t chunks_per_head) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float d = descale[i / chunks_per_head];
    float f[8];
    load8(x + 8 * i, f);
    uint2 out;
    __nv_fp8x2_storage_t* o = reinterpret_cast<__nv_fp8x2_storage_t*>(&out);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // quantize's clamp(-448, 448) then a saturating round to nearest even: the same e4m3 value
      const float2 v = make_float2(fminf(fmaxf(f[2 * j] / d, -kE4m3Max), kE4m3Max),
                                   fminf(fmaxf(f[2 * j + 1] / d, -kE4m3Max), kE4m3Max));
      o[j] = __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
    }
    y[i] = out;
  }
}

int grid_for(int64_t chunks) {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t wanted = (chunks + kThreads - 1) / kThreads;
  const int64_t cap = int64_t(sms) * kMaxBlocksPerSm;  // grid-stride beyond: no tail of tiny waves
  return static_cast<int>(wanted < cap ? wanted : cap);
}

}  // namespace

// x: bf16 (heads, per_head) contiguous; amax_bits: uint32 (heads,) scratch; descale: float32 (heads,) out;
// y: e4m3 (heads, per_head) out. 0, or -3 for a layout the kernels do not take, or the CUDA error.
extern "C" int fp8_quantize_e4m3(const void* x, void* amax_bits, float* descale, void* y, int64_t heads,
                                 int64_t per_head, int per_tensor, cudaStream_t stream) {
  if (heads <= 0 || per_head <= 0 || per_head % kChunkBytes || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(y) % 16)
    return -3;
  const int64_t chunks = heads * per_head / 8;
  if (heads > 65535) return -3;  // the amax grid's y dimension
  cudaMemsetAsync(amax_bits, 0, sizeof(unsigned int) * heads, stream);
  const dim3 slices(static_cast<unsigned>((per_head / 8 + kAmaxChunks - 1) / kAmaxChunks),
                    static_cast<unsigned>(heads));
  amax_kernel<<<slices, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                               static_cast<unsigned int*>(amax_bits), per_head / 8);
  descale_kernel<<<static_cast<int>((heads + 127) / 128), 128, 0, stream>>>(
      static_cast<const unsigned int*>(amax_bits), descale, static_cast<int>(heads), per_tensor);
  quantize_kernel<<<grid_for(chunks), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x), descale,
                                                             static_cast<uint2*>(y), chunks, per_head / 8);
  return static_cast<int>(cudaGetLastError());
}

// x: e4m3 (heads, per_head) contiguous; descale: float32 (heads,); y: bf16 (heads, per_head). 0, or -3 for a
// layout the kernel does not take, or the CUDA error.
extern "C" int fp8_dequant_bf16(const void* x, const float* descale, void* y, int64_t heads, int64_t per_head,
                                cudaStream_t stream) {
  if (heads < 0 || per_head < 0 || per_head % kChunkBytes || reinterpret_cast<uintptr_t>(x) % 16 ||
      reinterpret_cast<uintptr_t>(y) % 16)
    return -3;
  const int64_t chunks = heads * per_head / kChunkBytes;
  if (chunks == 0) return 0;
  dequant_kernel<<<grid_for(chunks), kThreads, 0, stream>>>(static_cast<const uint4*>(x), descale,
                                                            static_cast<uint4*>(y), chunks, per_head / kChunkBytes);
  return static_cast<int>(cudaGetLastError());
}
