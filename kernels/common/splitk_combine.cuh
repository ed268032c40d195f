// Pass 2 of split-K decoding, shared by every decode kernel (kernels/decode/*.cu).
//
// Merges the per-split partial outputs O^(s) (fp32, normalised) and their log-sum-exps L^(s):
//   L = log sum_s exp(L^(s)),   O = sum_s exp(L^(s) - L) O^(s)
// One warp per output row (b, h, token); each lane owns 2 or 4 consecutive columns of every 64 or 128 (D 80, 96:
// the last chunk masked). A row whose splits are all empty (L^(s) = -inf everywhere: a sequence of length 0)
// gets O = 0 and L = -inf, never NaN. With sinks (DecodeParams.sinks, one logit s_h per query head) the normaliser
// is sum_s exp(L^(s)) + exp(s_h): the sink is added here, once, never to a split's partial.
// On sm_90 it is launched with programmatic dependent launch, so its launch latency hides under
// pass 1; pass 1 calls lab::decode::pdl_launch_dependents() once its partials are written.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_util.cuh"
#include "common/launch.h"
#include "common/params.h"

namespace lab {
namespace decode {

constexpr int kCombineThreads = 128;  // 4 rows per block: rows are independent, small blocks spread best
constexpr int kCombineRowsPerBlock = kCombineThreads / 32;
constexpr int kCombineUnroll = 4;  // splits whose partials are loaded before the first is used

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kCombineThreads) splitk_combine_kernel(const DecodeParams p) {
  // A lane's columns: kVec consecutive ones (a float4 where 32 lanes x 4 columns tile D, else a float2) in each
  // of kChunks chunks of 32 x kVec columns. D 80 and 96 end in a partial chunk: its lanes past D are masked.
  constexpr int kVec = kHeadDim % 128 == 0 ? 4 : 2;
  constexpr int kChunk = 32 * kVec;
  constexpr int kChunks = (kHeadDim + kChunk - 1) / kChunk;
  constexpr bool kTail = kChunks * kChunk != kHeadDim;
  static_assert(kHeadDim % 16 == 0, "whole float2 column pairs");
  // Prologue
  pdl_wait_for_producer();  // partials of pass 1 are visible after this

  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineRowsPerBlock + threadIdx.x / 32;
  const int64_t rows_total = static_cast<int64_t>(p.batch) * p.heads_q * p.q_len;
  if (row >= rows_total) return;
  const int ns = p.num_splits;
  const float* plse = p.partial_lse + row * ns;
  const float* po = p.partial_o + row * ns * kHeadDim + lane * kVec;
  auto live = [&](int c) { return !kTail || c + 1 < kChunks || c * kChunk + lane * kVec < kHeadDim; };

  float lse_max = -INFINITY;
  for (int s = lane; s < ns; s += 32) lse_max = fmaxf(lse_max, plse[s]);
  lse_max = warp_max(lse_max);
  const int tok = static_cast<int>(row % p.q_len);
  const int h = static_cast<int>((row / p.q_len) % p.heads_q);
  const int b = static_cast<int>(row / (static_cast<int64_t>(p.q_len) * p.heads_q));
  // A sink (common/decode_masks.cuh) joins the final normaliser, once: it sets the max with the splits' LSEs and
  // adds exp(sink - max) to the weights' sum, so a row that saw no key gets O = 0 and LSE = sink.
  float sink = -INFINITY;
#ifndef LAB_DECODE_BUG_SINK_PER_SPLIT  // the wrong build added it to every split's partial instead
  if (p.sinks != nullptr) {
    sink = __ldg(p.sinks + h);
    lse_max = fmaxf(lse_max, sink);
  }
#endif

  // Main loop
  float acc[kChunks][kVec];
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[c][e] = 0.f;
  float w_sum = sink == -INFINITY ? 0.f : __expf(sink - lse_max);
  if (lse_max != -INFINITY) {  // else every split was empty: O = 0, LSE = -inf, no exp(-inf + inf)
#pragma unroll kCombineUnroll
    for (int s = 0; s < ns; ++s) {
      const float w = __expf(plse[s] - lse_max);  // empty split: exp(-inf) = 0, its O^(s) is 0 too
      w_sum += w;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        if (!live(c)) continue;
        float x[kVec];
        if constexpr (kVec == 4) {
          const float4 v = *reinterpret_cast<const float4*>(po + s * kHeadDim + c * kChunk);
          x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
        } else {
          const float2 v = *reinterpret_cast<const float2*>(po + s * kHeadDim + c * kChunk);
          x[0] = v.x; x[1] = v.y;
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[c][e] = fmaf(w, x[e], acc[c][e]);
      }
    }
  }

  // Epilogue
  const float inv = w_sum > 0.f ? 1.f / w_sum : 0.f;  // w_sum >= 1 when lse_max is finite
  T* dst = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + tok * p.o_stride[2] + lane * kVec;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (!live(c)) continue;
#pragma unroll
    for (int e = 0; e < kVec; e += 2)
      *reinterpret_cast<uint32_t*>(dst + c * kChunk + e) = Elem<T>::from_float2(acc[c][e] * inv, acc[c][e + 1] * inv);
  }
  if (p.lse != nullptr && lane == 0) p.lse[row] = w_sum > 0.f ? lse_max + logf(w_sum) : -INFINITY;
}

// Launch pass 2 after pass 1 on the same stream (programmatic dependent launch when use_pdl).
template <typename T, int kHeadDim>
cudaError_t launch_splitk_combine(const DecodeParams* p, cudaStream_t stream, bool use_pdl) {
  const int64_t rows_out = static_cast<int64_t>(p->batch) * p->heads_q * p->q_len;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((rows_out + kCombineRowsPerBlock - 1) / kCombineRowsPerBlock));
  config.blockDim = dim3(kCombineThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = use_pdl ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&config, splitk_combine_kernel<T, kHeadDim>, *p);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace decode
}  // namespace lab
