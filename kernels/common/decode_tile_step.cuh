// One key tile of the 4-warp decode block (decode v03's main-loop body, once; decode v05 composes it): warp w
// owns keys 16 w .. 16 w + 15 of a 64-key tile with its own online-softmax state (m_i, l_i, O_i) for the block's
// 16 query rows. S = Q K_w^T, scores scaled by scale * log2 e in fp32 and masked by each row's key limit, the
// running max moved, P = exp2(S - m) rounded to the input dtype (l_i summed from the rounded P), O_i += P V_w.
// Where K and V came from (cp.async, bulk copies) is the caller's business: it hands in the tile's stage once it
// has landed. v03 keeps its own copy of the tile step for now: calling it from v03 changed its SASS (14 of 37
// kernels, sm_80 and sm_90a, address arithmetic only; tools/sass/sass_guard.sh), which a GPU A/B must clear first.
// v03 takes its row state (TileRowState) and end (stash_warp_state) from here: those leave its SASS as it was.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/decode_masks.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_util.cuh"

namespace lab::decode {

// Per-row state of one warp's online softmax over its 16 keys of every tile (fragment rows gid and gid + 8).
struct TileRowState {
  float m[2] = {-INFINITY, -INFINITY};  // running max, log2 units, quad-uniform
  float l[2] = {0.f, 0.f};              // this lane's share of the row sum
};

// One tile. qf: Q's A fragments (kQInSmem false) or unused; q_lane: this lane's ldmatrix row of Q in shared
// memory (kQInSmem true, D > 128); k_lane / v_lane: this lane's ldmatrix rows of the stage's K and V
// (warp_kv_lanes); limit[h]: keys of the tile that fragment row half h may see (its key limit minus the
// tile's first key; <= 0 sees none). tile_softmax_pv_masked adds each row's first key and the softcap.
// (k_lane and v_lane: pointers into a padded ring, or common/decode_swizzle.cuh's lanes, where Q is in registers.)
// The masked form (common/decode_masks.cuh): row half h sees keys [first[h], limit[h]) of the tile, and the
// scores go through `map` (softcap, or the plain scale). A plain call passes first <= 0 and map.cap_in 0.
template <class T, int kKSteps, int kDTiles, bool kQInSmem, int kQFrags, class Lane>
__device__ __forceinline__ void tile_softmax_pv_masked(float (&acc)[kDTiles][4], TileRowState& st,
                                                       const uint32_t (&qf)[kQFrags][4], const T* q_lane, Lane k_lane,
                                                       Lane v_lane, const int (&first)[2], const int (&limit)[2],
                                                       int warp, int tig, const ScoreMap& map) {
  float s[2][4] = {};
  if constexpr (kQInSmem)
    warp_qk_smem<T, kKSteps>(s, q_lane, k_lane);
  else
    warp_qk<T, kKSteps>(s, qf, k_lane);
  softcap_scores(s, map);
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int nt = e / 4, half = (e / 2) % 2;
    const int key = warp * 16 + nt * 8 + 2 * tig + (e % 2);
    float& x = s[nt][e % 4];
    // a select: a NaN score of a masked key never leaks
    x = key >= first[half] && key < limit[half] ? x * map.mul : -INFINITY;
    tile_max[half] = fmaxf(tile_max[half], x);
  }
  float alpha[2], m_use[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 2));
    const float m_new = fmaxf(st.m[h], tile_max[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp2(-inf - 0) = 0, never NaN
    alpha[h] = exp2f(st.m[h] - m_use[h]);
    st.m[h] = m_new;
    st.l[h] *= alpha[h];
  }
  uint32_t pa[4];  // P as the A fragment: a0 (gid, keys 0-7), a1 (gid+8, 0-7), a2 (gid, 8-15), a3 (gid+8, 8-15)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int nt = i / 2, h = i % 2;
    pa[i] = Elem<T>::from_float2(exp2f(s[nt][2 * h] - m_use[h]), exp2f(s[nt][2 * h + 1] - m_use[h]));
    const float2 rounded = Elem<T>::to_float2(pa[i]);
    st.l[h] += rounded.x + rounded.y;
  }
  rescale_pv<T, kDTiles>(acc, alpha, pa, v_lane);
}

// The plain tile (decode v05): every key below the row's limit, scores times qk_scale.
template <class T, int kKSteps, int kDTiles, bool kQInSmem, int kQFrags, class Lane>
__device__ __forceinline__ void tile_softmax_pv(float (&acc)[kDTiles][4], TileRowState& st,
                                                const uint32_t (&qf)[kQFrags][4], const T* q_lane, Lane k_lane,
                                                Lane v_lane, const int (&limit)[2], int warp, int tig,
                                                float qk_scale) {
  const int kAll[2] = {INT32_MIN, INT32_MIN};
  tile_softmax_pv_masked<T, kKSteps, kDTiles, kQInSmem>(acc, st, qf, q_lane, k_lane, v_lane, kAll, limit, warp, tig,
                                                        ScoreMap{qk_scale, 0.f, 0.f});
}

// The end of the block's tiles: each warp's (m, l, O) into the freed ring as fp32 (sO [warp][16][D], sM, sL
// [warp][16]), for merge_warps_store. The caller has made sure no copy still writes the ring, and syncs after.
template <int kWarps, int kRows, int D, int kDTiles>
__device__ __forceinline__ void stash_warp_state(unsigned char* ring, const float (&acc)[kDTiles][4],
                                                 TileRowState& st, int warp, int gid, int tig, float*& sO,
                                                 float*& sM, float*& sL) {
  sO = reinterpret_cast<float*>(ring);  // [warp][16][D]
  sM = sO + kWarps * kRows * D;         // [warp][16]
  sL = sM + kWarps * kRows;             // [warp][16]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(kFullMask, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(kFullMask, st.l[h], 2);
    const int r = warp * kRows + gid + 8 * h;
#pragma unroll
    for (int i = 0; i < kDTiles; ++i)
      *reinterpret_cast<float2*>(sO + r * D + i * 8 + 2 * tig) = make_float2(acc[i][2 * h], acc[i][2 * h + 1]);
    if (tig == 0) {
      sM[r] = st.m[h];
      sL[r] = st.l[h];
    }
  }
}

}  // namespace lab::decode
