// The P V step of the tensor-core decode kernels (decode v02, v03), once.
#pragma once
#include <stdint.h>

#include "common/decode_util.cuh"
#include "common/mma.cuh"

namespace lab::decode {

// O += P V for one warp's 16 keys. O is rescaled by alpha (per row half) first, but only when some row max
// of the warp moved: alpha is exactly 1 otherwise (exp2f(0)), and the vote keeps the branch warp-uniform.
// pa: P as the A fragment; v_lane: this lane's ldmatrix.trans row of V (v_ld_key row, v_ld_col column);
// two n-tiles of 8 dims per ldmatrix.x4.trans.
template <class T, int kDTiles, bool kLazy = true>
__device__ __forceinline__ void rescale_pv(float (&acc)[kDTiles][4], const float (&alpha)[2], const uint32_t (&pa)[4],
                                           const T* v_lane) {
  if (!kLazy || __any_sync(kFullMask, alpha[0] != 1.f || alpha[1] != 1.f)) {
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
    ldmatrix_x4_trans(vb, smem_u32(v_lane + dp * 16));
    mma_16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
    mma_16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
  }
}

}  // namespace lab::decode
