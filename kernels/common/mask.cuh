// The attention mask, once: which (query row, key column) pairs a score may use, and the step that
// applies it to the score fragments of the mma.sync kernels (fwd v02..v04).
//
// Separated from the softmax the way FlashAttention's mask.h is: the kernels ask "does this tile need
// a mask?" once per tile (most tiles do not: only the one crossing S_k and the causal diagonal tiles),
// and only those tiles pay for the per-element compares.
//
// Causal here is SDPA's top-left alignment: row i sees keys 0..i. The Hopper kernels (common/hopper/
// attn_fwd_sm90.cuh) use the same predicate on their wgmma fragment layout, as one bound per row.
#pragma once
#include <cuda_fp16.h>
#include <limits.h>
#include <stdint.h>
#include <math.h>

namespace lab {

// True when the key at `col` is hidden from query row `row`.
__device__ __forceinline__ bool masked(int row, int col, int seqlen_k, bool causal) {
  return col >= seqlen_k || (causal && col > row);
}

// True when the kBc-key tile starting at key n0 hides some key from a block whose first row is m0:
// it crosses S_k, or (causal) its last key lies past the block's first row.
__device__ __forceinline__ bool tile_needs_mask(int n0, int bc, int m0, int seqlen_k, bool causal) {
  return n0 + bc > seqlen_k || (causal && n0 + bc - 1 > m0);
}

// Sets the scores that hidden(row, key) hides to -inf in a warp's S fragments (m16n8 accumulator layout,
// common/mma.cuh): element e of m tile mt and n tile nt is row row0 + 16 mt + 8 (e / 2) + g,
// key n0 + 8 nt + 2 t + e % 2.
template <int kMT, int kNT, class Hidden>
__device__ __forceinline__ void mask_fragments(float (&s)[kMT][kNT][4], int row0, int n0, int g, int t, Hidden hidden) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + mt * 16 + (e / 2) * 8 + g;
        const int col = n0 + nt * 8 + 2 * t + (e % 2);
        if (hidden(row, col)) s[mt][nt][e] = -INFINITY;
      }
}

// mask_fragments with S_k and the causal rule (masked).
template <int kMT, int kNT>
__device__ __forceinline__ void mask_scores(float (&s)[kMT][kNT][4], int row0, int n0, int seqlen_k, bool causal,
                                            int g, int t) {
  mask_fragments(s, row0, n0, g, t, [=](int row, int col) { return masked(row, col, seqlen_k, causal); });
}

// ---------------------------------------------------------------- windows (fwd v08; lab/masks/spec.py)
// Query row i aligned with key i + off; left/right: keys before/after the diagonal a row sees (-1: all).

// True when the key at `col` is hidden from row `row` by S_k or the window.
__device__ __forceinline__ bool window_masked(int row, int col, int seqlen_k, int off, int left, int right) {
  return col >= seqlen_k || (left >= 0 && col < row + off - left) || (right >= 0 && col > row + off + right);
}

// q >= S_q || window_masked(q, key, S_k, off, left, right) as one predicate, for the masked backward's steps: the
// bounds taken once (lo = off - left, hi = off + right, in 64 bits and clamped to +-2^30, beyond any key - q of a
// call; an unbounded side never hides), then per element four compares on d = key - q and no branch. window_masked
// per element compiled to a branch an element with the bounds loaded again from the parameter bank
// (common/hopper/attn_bwd_mask_sm90.cuh has the measurement). Host and device: a CPU test
// holds it to the rule (tests/fixtures/flat_window_check.cu).
struct FlatWindow {
  int sq, sk, lo, hi;
  __host__ __device__ __forceinline__ static int clamp30(long long x) {
    return (int)(x < -(1ll << 30) ? -(1ll << 30) : x > (1ll << 30) ? (1ll << 30) : x);
  }
  __host__ __device__ __forceinline__ FlatWindow(int seqlen_q, int seqlen_k, int off, int left, int right)
      : sq(seqlen_q), sk(seqlen_k), lo(left >= 0 ? clamp30((long long)off - left) : INT_MIN),
        hi(right >= 0 ? clamp30((long long)off + right) : INT_MAX) {}
  __host__ __device__ __forceinline__ bool hidden(int q, int key) const {
    const int d = key - q;
    return (q >= sq) | (key >= sk) | (d < lo) | (d > hi);
  }
};

// [lo, hi) of the keys some row of [m0, m1) sees (hi <= lo: none): the tiles outside it are never loaded.
__device__ __forceinline__ int2 window_key_range(int m0, int m1, int seqlen_k, int off, int left, int right) {
  const int lo = left >= 0 ? max(0, m0 + off - left) : 0;
  const int hi = right >= 0 ? min(seqlen_k, m1 - 1 + off + right + 1) : seqlen_k;
  return make_int2(lo, hi);
}

// True when the tile of keys [n0, n0 + bc) hides some key from some row of [m0, m1).
__device__ __forceinline__ bool window_tile_needs_mask(int n0, int bc, int m0, int m1, int seqlen_k, int off,
                                                       int left, int right) {
  return n0 + bc > seqlen_k || (left >= 0 && n0 < m1 - 1 + off - left) || (right >= 0 && n0 + bc - 1 > m0 + off + right);
}

// mask_fragments with the window rule.
template <int kMT, int kNT>
__device__ __forceinline__ void mask_scores_window(float (&s)[kMT][kNT][4], int row0, int n0, int seqlen_k, int off,
                                                   int left, int right, int g, int t) {
  mask_fragments(s, row0, n0, g, t,
                 [=](int row, int col) { return window_masked(row, col, seqlen_k, off, left, right); });
}

// Softcap, before the mask: s -> tanh(s * scale / softcap) in place (the caller's exp2 factor becomes
// softcap * log2(e)). tanh.approx: relative error ~2^-11, below the 16-bit P it feeds.
__device__ __forceinline__ float tanh_fast(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// tanh of two floats through one tanh.approx.f16x2 (sm_75+): inputs and results rounded to fp16 (relative
// 2^-11 each) around an approximation of about tanh.approx.f32's error, for half its MUFU issues.
__device__ __forceinline__ void tanh_pair(float a, float b, float& ta, float& tb) {
  const __half2 x = __floats2half2_rn(a, b);
  uint32_t y;
  asm("tanh.approx.f16x2 %0, %1;" : "=r"(y) : "r"(*reinterpret_cast<const uint32_t*>(&x)));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&y));
  ta = f.x;
  tb = f.y;
}
template <int kMT, int kNT>
__device__ __forceinline__ void softcap_scores(float (&s)[kMT][kNT][4], float scale_over_cap) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = tanh_fast(s[mt][nt][e] * scale_over_cap);
}

}  // namespace lab
