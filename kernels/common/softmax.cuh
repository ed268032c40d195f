// Online-softmax pieces shared by the tensor-core forward kernels (fwd/v02..v04).
//
// Any finite softmax scale on the one-FFMA-per-score path. These kernels take the running row max
// over the raw scores s = q.k and fold the scale into the exponent, P = exp2(s*c - m*c) with
// c = scale * log2(e). That is right only for c > 0: for c < 0 the max of the scaled scores is the
// *min* of s (exp2 of a positive offset overflows), and for c = 0 a masked score gives -inf * 0 = NaN.
// Folding the scale into every score before the max would cost one more instruction per score in
// the issue-bound inner loop; two exact rewrites keep the loop as it is:
//   scale < 0:  scale * (q.k) = |scale| * ((-q).k). The CTA flips the sign bit of every element of
//               its Q tile in shared memory once, before the first Q fragment is read (exact for fp16
//               and bf16), and runs with |scale|.
//   scale == 0: runs with FLT_MIN instead. Every weight exp2(s*c - m*c) rounds to exactly 1.0f while
//               |q.k| < 1e30 (|s*c| < 2e-8, under half an fp32 ulp of 1), so O is the plain mean of
//               the visible V rows and LSE = m*FLT_MIN + ln(count) = ln(count) to fp32 precision; a
//               masked score stays -inf * FLT_MIN = -inf, weight 0.
// The float64 reference checks of tests/product/test_gpu.py (scale in {-0.125, 0, 0.3, default}) cover both.
#pragma once
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "common/mma.cuh"

namespace lab {

// Host side, in each launcher: the scale the kernel receives. 0 becomes FLT_MIN (see above); any
// other value passes unchanged. The kernel then reads fabsf(p.scale) and p.scale < 0 straight from the
// parameter bank, so no register is held for them in the main loop (computing |scale| and the 0 case
// in the kernel cost v04 D=128 a live register: 56 B of spills).
inline float softmax_kernel_scale(float scale) { return scale == 0.f ? FLT_MIN : scale; }

// True when the CTA must negate its Q tile (see above).
__host__ __device__ __forceinline__ bool softmax_negate_q(float kernel_scale) { return kernel_scale < 0.f; }

// Flip the sign of every 16-bit element in kBytes of shared memory (16-byte aligned), spread over
// kThreads threads. The caller puts a __syncthreads() before (the tile has landed) and after (others
// read it).
template <int kBytes, int kThreads>
__device__ __forceinline__ void negate_smem_16bit(void* smem, int tid) {
  static_assert(kBytes % 16 == 0, "whole 16-byte vectors");
  uint4* vec = static_cast<uint4*>(smem);
#pragma unroll 4
  for (int i = tid; i < kBytes / 16; i += kThreads) {
    uint4 x = vec[i];
    x.x ^= 0x80008000u;
    x.y ^= 0x80008000u;
    x.z ^= 0x80008000u;
    x.w ^= 0x80008000u;
    vec[i] = x;
  }
}

// ---------------------------------------------------------------- the online-softmax step
// On a warp's S fragments in the m16n8 accumulator layout (common/mma.cuh): thread (g, t) holds, per m
// tile mt, two rows (hh = 0: row g, hh = 1: row g + 8), each over kNT n tiles x 2 columns. The four
// lanes of a quad hold the same rows, so a row's max and sum end with two xor shuffles. row_max is the
// running max of the *unscaled* scores; row_sum is this thread's partial sum (the quad reduces it once,
// at the end: normalise_rows). c = |scale| * log2(e) > 0 (see above).

// The state before the first tile: O = 0, every row's max -inf and sum 0.
template <int kMT, int kNO>
__device__ __forceinline__ void init_softmax_state(float (&o)[kMT][kNO][4], float (&row_max)[kMT][2],
                                                   float (&row_sum)[kMT][2]) {
  zero_frags(o);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      row_max[mt][hh] = -INFINITY;
      row_sum[mt][hh] = 0.f;
    }
}

// Running max of row (mt, hh) after this tile, reduced over the quad.
template <int kMT, int kNT>
__device__ __forceinline__ float quad_row_max(const float (&s)[kMT][kNT][4], float running, int mt, int hh) {
  float m = running;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) m = fmaxf(m, fmaxf(s[mt][nt][2 * hh], s[mt][nt][2 * hh + 1]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// The exp2 offset of a row whose max is m: a row with nothing visible yet keeps max -inf, and
// subtracting 0 instead of -inf keeps exp2 at 0 rather than NaN.
__device__ __forceinline__ float row_offset(float m, float c) { return (m == -INFINITY) ? 0.f : m * c; }

// S -> P = exp2(s c - m c) in place for row (mt, hh); returns the row's partial sum.
template <int kMT, int kNT>
__device__ __forceinline__ float exp_row(float (&s)[kMT][kNT][4], int mt, int hh, float offset, float c) {
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
      const float pe = fast_exp2(fmaf(s[mt][nt][e], c, -offset));
      s[mt][nt][e] = pe;
      sum += pe;
    }
  }
  return sum;
}

// O rows (mt, hh) *= alpha.
template <int kMT, int kNO>
__device__ __forceinline__ void rescale_row(float (&o)[kMT][kNO][4], int mt, int hh, float alpha) {
#pragma unroll
  for (int nt = 0; nt < kNO; ++nt) {
    o[mt][nt][2 * hh] *= alpha;
    o[mt][nt][2 * hh + 1] *= alpha;
  }
}

// FA2's step (v02, v03): move every row's offset to its new max, rescale l and O by
// alpha = exp2(m_old c - m_new c), then S -> P.
template <int kMT, int kNT, int kNO>
__device__ __forceinline__ void online_softmax(float (&s)[kMT][kNT][4], float (&row_max)[kMT][2],
                                               float (&row_sum)[kMT][2], float (&o)[kMT][kNO][4], float c) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const float mx = quad_row_max(s, row_max[mt][hh], mt, hh);
      const float mx_scaled = row_offset(mx, c);
      const float alpha = fast_exp2(row_max[mt][hh] * c - mx_scaled);
      row_max[mt][hh] = mx;
      const float sum = exp_row(s, mt, hh, mx_scaled, c);
      row_sum[mt][hh] = row_sum[mt][hh] * alpha + sum;
      rescale_row(o, mt, hh, alpha);
    }
  }
}

// P of k-step kk as the A fragment of P V: the S accumulators of n tiles 2kk and 2kk + 1 are exactly
// that fragment once packed to 16 bits (FA2's register reuse; no trip through shared memory).
template <class T, int kMT, int kNT>
__device__ __forceinline__ void pack_p(const float (&s)[kMT][kNT][4], int mt, int kk, uint32_t (&a)[4]) {
  a[0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
  a[1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
  a[2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
  a[3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
}

// End of the loop: O /= l per row (l = 0, no key seen: O = 0) and, when lse is set, LSE = m |scale| +
// ln(l) (-inf for a row that saw nothing) at lse[lse_offset + row] for rows below seqlen_q. kQuadSum: l
// is still this thread's partial sum and the quad reduces it here.
template <bool kQuadSum, int kMT, int kNO>
__device__ __forceinline__ void normalise_rows(float (&o)[kMT][kNO][4], const float (&row_max)[kMT][2],
                                               const float (&row_sum)[kMT][2], float scale_ln, float* lse,
                                               int64_t lse_offset, int row0, int seqlen_q, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mt][hh];
      if constexpr (kQuadSum) {
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
      }
      rescale_row(o, mt, hh, l > 0.f ? 1.f / l : 0.f);
      const int row = row0 + mt * 16 + hh * 8 + g;
      if (lse != nullptr && t == 0 && row < seqlen_q) {
        const float m = row_max[mt][hh];
        lse[lse_offset + row] = (l > 0.f && m != -INFINITY) ? m * scale_ln + logf(l) : -INFINITY;
      }
    }
  }
}

// normalise_rows with an attention sink (fwd v08): the sink's logit joins the normaliser, l += exp2(sink_log2 -
// m c), taken against top = max(m c, sink_log2) so that a large sink cannot overflow; sink_log2 = -inf: none.
// c is the exp2 factor of the scores (|scale| log2 e, or softcap log2 e); LSE = (top + log2 l) ln 2 includes the
// sink. lse_row0 points at row 0's LSE (stride 1), written for rows below seqlen_q when not null.
template <int kMT, int kNO>
__device__ __forceinline__ void normalise_rows_sink(float (&o)[kMT][kNO][4], const float (&row_max)[kMT][2],
                                                    const float (&row_sum)[kMT][2], float c, float sink_log2,
                                                    float* lse_row0, int row0, int seqlen_q, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float l = row_sum[mt][hh];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const float m = row_max[mt][hh];
      const float mc = m == -INFINITY ? -INFINITY : m * c;
      const float top = fmaxf(mc, sink_log2);
      float o_scale = 0.f, lse = -INFINITY;
      if (top != -INFINITY) {
        const float a = exp2f(mc - top);
        const float total = l * a + exp2f(sink_log2 - top);
        if (total > 0.f) {
          o_scale = a / total;
          lse = (top + log2f(total)) * 0.6931471805599453f;
        }
      }
      rescale_row(o, mt, hh, o_scale);
      const int row = row0 + mt * 16 + hh * 8 + g;
      if (lse_row0 != nullptr && t == 0 && row < seqlen_q) lse_row0[row] = lse;
    }
  }
}

}  // namespace lab
