// The backward's pre-pass, shared by every backward version (bwd/v01.., bwd/v02..): per query row
//   Delta_i = rowsum(dO_i * O_i) - dLSE_i      (the "D term" of dS = P * (dP - Delta))
//   LSE_i * log2(e)                            (so that P = exp2(s * scale * log2 e - LSE * log2 e))
// into float workspaces of LAB_BWD_ROW_PAD-padded rows [B, Hq, padded_rows(S_q)]. Pad rows get 0 in both:
// a consumer that reads a whole padded block must mask its rows >= S_q itself (P = exp2(0) = 1 there).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"

namespace lab::bwd {

constexpr float kPreLog2e = 1.4426950408889634f;

__host__ __device__ __forceinline__ int padded_rows(int sq) {
  return (sq + LAB_BWD_ROW_PAD - 1) / LAB_BWD_ROW_PAD * LAB_BWD_ROW_PAD;
}

// Threads per row: D/8 (one 16-byte chunk of O and dO each) rounded up to a power of two, since the shuffle
// tree halves the lane count (D = 192: 24 chunks on 32 lanes, the last 8 add 0).
__host__ __device__ constexpr int pre_lanes(int D) {
  return D / 8 <= 8 ? 8 : D / 8 <= 16 ? 16 : 32;
}

// pre_lanes(D) threads per row, one 16-byte chunk of O and dO each, reduced with shuffles. kZeroAccum: each lane
// also zeroes 8 floats of dq_accum (D floats per padded row, whatever order a version keeps them in), so the
// Hopper launch needs no memset of it (LAB_BWD_ZERO_IN_PRE, common/hopper/attn_bwd_sm90.cuh). kNarrow: O and dO
// end at p.head_dim (a multiple of 8 below D, read unpadded); the lanes past it add 0.
template <class T, int D, bool kZeroAccum = false, bool kNarrow = false>
__global__ void __launch_bounds__(128) bwd_pre(const AttnBwdParams p) {
  constexpr int kLanes = pre_lanes(D);
  static_assert(D % 8 == 0 && D / 8 <= 32, "one 16-byte chunk per lane, at most a warp per row");
  const int sq_pad = padded_rows(p.seqlen_q);
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t row = idx / kLanes;  // over B * Hq * sq_pad
  const int chunk = (int)(idx % kLanes);
  const int64_t rows = (int64_t)p.batch * p.heads_q * sq_pad;
  const int64_t bh = row / sq_pad;
  const int i = (int)(row % sq_pad);
  const bool live = row < rows && i < p.seqlen_q;
  if constexpr (kZeroAccum) {
    if (row < rows && chunk < D / 8) {
      float4* z = reinterpret_cast<float4*>(p.dq_accum + row * D + chunk * 8);
      z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  float dot = 0.f;
  if (live && chunk < (kNarrow ? p.head_dim : D) / 8) {
    const int b = (int)(bh / p.heads_q), h = (int)(bh % p.heads_q);
    const T* o = static_cast<const T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + i * p.o_stride[2] + chunk * 8;
    const T* d = static_cast<const T*>(p.dout) + b * p.do_stride[0] + h * p.do_stride[1] + i * p.do_stride[2] +
                 chunk * 8;
    const uint4 ov = *reinterpret_cast<const uint4*>(o), dv = *reinterpret_cast<const uint4*>(d);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (row < rows && chunk == 0) {
    float delta = 0.f, lse2 = 0.f;
    if (live) {
      const int64_t r = bh * p.seqlen_q + i;
      delta = dot - (p.dlse != nullptr ? p.dlse[r] : 0.f);
      lse2 = p.lse[r] * kPreLog2e;
    }
#ifdef LAB_BWD_BUG_NO_DELTA
    delta = 0.f;  // self-test: the D term forgotten
#endif
    p.delta[row] = delta;
    p.lse_log2[row] = lse2;
  }
}

// Threads of the pre-pass for a call (0: no query rows).
inline int64_t bwd_pre_threads(const AttnBwdParams& p, int D) {
  return (int64_t)p.batch * p.heads_q * padded_rows(p.seqlen_q) * pre_lanes(D);
}

}  // namespace lab::bwd
