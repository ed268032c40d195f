// The unpadded, swizzled K/V ring of decode v07: a tile's rows are D elements apart (no pad), and the 16-byte chunk
// c of row r sits at chunk c ^ (r & 7) of its row. ldmatrix reads one 16-byte chunk of 8 consecutive rows per 8x8
// matrix: the XOR puts those 8 chunks in 8 different bank quads, as v03's pad of 8 elements did, and a row's 16-byte
// copies stay a permutation of its own 128-byte groups. Needs D a multiple of 64 (whole groups of 8 chunks).
//   swizzle_chunk   - where chunk c of row r lives
//   SwizzleLane     - a lane's ldmatrix row and the XOR term of its chunk (the ldmatrix column is 2 k + t)
//   warp_qk_swizzled, pv_swizzled - common/decode_pv.cuh's warp_qk and rescale_pv on this layout
//   tile_softmax_pv_swizzled      - common/decode_tile_step.cuh's tile_softmax_pv on this layout
// The softmax lines of the tile step are the same as decode_tile_step.cuh's: that header takes lane pointers to a
// padded ring, where a k-step is an immediate offset; here a k-step's chunk is an XOR of the lane's term.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/decode_pv.cuh"
#include "common/decode_tile_step.cuh"
#include "common/decode_util.cuh"

namespace lab::decode {

__device__ __forceinline__ int swizzle_chunk(int r, int c) { return c ^ (r & 7); }

// row: the lane's ldmatrix row (its first element); t: its chunk's XOR term (base chunk 0 / 1 ^ (row & 7)).
template <class T>
struct SwizzleLane {
  const T* row;
  int t;
  __device__ __forceinline__ const T* at(int k) const { return row + (((2 * k) ^ t) << 3); }  // chunk 2 k (+1)
};

template <class T, int D>
__device__ __forceinline__ SwizzleLane<T> swizzle_lane(const T* tile, int key, int col) {
  return {tile + key * D, (col >> 3) ^ (key & 7)};
}

template <class T, int kKSteps>
__device__ __forceinline__ void warp_qk_swizzled(float (&s)[2][4], const uint32_t (&qf)[kKSteps][4],
                                                 SwizzleLane<T> k) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t kb[4];
    ldmatrix_x4(kb, smem_u32(k.at(kk)));
    mma_16816<T>(s[0], qf[kk], kb[0], kb[1]);
    mma_16816<T>(s[1], qf[kk], kb[2], kb[3]);
  }
}

template <class T, int kDTiles>
__device__ __forceinline__ void pv_swizzled(float (&acc)[kDTiles][4], const float (&alpha)[2], const uint32_t (&pa)[4],
                                            SwizzleLane<T> v) {
  if (__any_sync(kFullMask, alpha[0] != 1.f || alpha[1] != 1.f)) {  // as rescale_pv: skip alpha == 1 exactly
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
      acc[i][0] *= alpha[0];
      acc[i][1] *= alpha[0];
      acc[i][2] *= alpha[1];
      acc[i][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int dp = 0; dp < kDTiles / 2; ++dp) {
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, smem_u32(v.at(dp)));
    mma_16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
    mma_16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
  }
}

// tile_softmax_pv (common/decode_tile_step.cuh) with Q in registers and K, V on the swizzled ring.
template <class T, int kKSteps, int kDTiles>
__device__ __forceinline__ void tile_softmax_pv_swizzled(float (&acc)[kDTiles][4], TileRowState& st,
                                                         const uint32_t (&qf)[kKSteps][4], SwizzleLane<T> k,
                                                         SwizzleLane<T> v, const int (&limit)[2], int warp, int tig,
                                                         float qk_scale) {
  float s[2][4] = {};
  warp_qk_swizzled<T, kKSteps>(s, qf, k);
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int half = (e / 2) % 2, key = warp * 16 + (e / 4) * 8 + 2 * tig + (e % 2);
    float& x = s[e / 4][e % 4];
    x = key < limit[half] ? x * qk_scale : -INFINITY;
    tile_max[half] = fmaxf(tile_max[half], x);
  }
  float alpha[2], m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
    tile_max[h] = fmaxf(fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 2)), st.m[h]);
    m_use[h] = tile_max[h] == -INFINITY ? 0.f : tile_max[h];
    alpha[h] = exp2f(st.m[h] - m_use[h]);
    st.m[h] = tile_max[h];
    st.l[h] *= alpha[h];
  }
  uint32_t pa[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int h = i % 2;
    pa[i] = Elem<T>::from_float2(exp2f(s[i / 2][2 * h] - m_use[h]), exp2f(s[i / 2][2 * h + 1] - m_use[h]));
    const float2 rounded = Elem<T>::to_float2(pa[i]);
    st.l[h] += rounded.x + rounded.y;
  }
  pv_swizzled<T, kDTiles>(acc, alpha, pa, v);
}

}  // namespace lab::decode
