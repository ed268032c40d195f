// The head dims of the tensor-core decode kernels (decode v02, v03) and the one place that picks each one's ring
// depth; launchers dispatch through with_head_dim.
//
// Why these D work with no padding of the cache: the kernels tile D only in steps of 16 (k16 steps of Q K^T, pairs
// of n8 tiles per ldmatrix.x4.trans in P V, 16-byte row copies), so every multiple of 16 is exact. A smem row is
// padded to D + 8 elements: (D + 8) / 8 is odd for D a multiple of 16, so ldmatrix's 8 rows always land in 8
// different bank quads. The loaders that give each row a power-of-two number of threads (v03) leave the threads
// past D / 8 idle (a masked column tail, D 80, 96, 192); nothing is copied or padded in global memory.
//
// The ring depth: bytes in flight per SM are (stages - 1) x 64 keys x 2 (K, V) x D x 2 bytes, and one 4-warp
// block per SM is what the split plan counts on (lab/decode/splits.py, BLOCKS_PER_SM_V02).
//   D 64: 4 stages, 72 KiB smem, 48 KiB in flight     (measured: outputs/experiments/20261121-decode-v02-mma.json)
//   D 80: 4 stages, 88 KiB, 60 KiB in flight          (as D 64/128; 3 stages would leave 40 KiB: not tried)
//   D 96: 4 stages, 104 KiB, 72 KiB in flight
//   D 128: 3 stages, 102 KiB, 64 KiB in flight        (measured; 6 stages at one block per SM: no gain, H200)
//   D 192: 3 stages, 150 KiB, 96 KiB in flight        (2 stages, 100 KiB, 48 KiB in flight: not tried)
//   D 256: 2 stages, 132 KiB, 64 KiB in flight        (3 stages, 198 KiB, is over an A100 block's 163 KiB)
#pragma once
#include <type_traits>

#include "common/params.h"

namespace lab {
namespace decode {

// LAB_DECODE_STAGES_D128: another ring depth at D 128 (a probe switch:
// outputs/experiments/20261126-paged-loader-switches.json).
#ifndef LAB_DECODE_STAGES_D128
#define LAB_DECODE_STAGES_D128 3
#endif
template <int D>
struct HeadDimPlan {
  static_assert(D % 16 == 0 && D >= 64 && D <= 256, "a decode head dim is a multiple of 16 in [64, 256]");
  static constexpr int kStages = D <= 96 ? 4 : (D <= 128 ? LAB_DECODE_STAGES_D128 : (D <= 192 ? 3 : 2));
};

// Calls launch(std::integral_constant<int, D>) for the call's head dim, LAB_E_HEAD_DIM for any other.
template <class Launch>
int with_head_dim(int head_dim, Launch&& launch) {
#ifdef LAB_DECODE_ONLY_D128  // probe builds (20261126-paged-loader-switches): one head dim, a quarter of the build
  return head_dim == 128 ? launch(std::integral_constant<int, 128>{}) : LAB_E_HEAD_DIM;
#else
  switch (head_dim) {
    case 64: return launch(std::integral_constant<int, 64>{});
    case 80: return launch(std::integral_constant<int, 80>{});
    case 96: return launch(std::integral_constant<int, 96>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    case 192: return launch(std::integral_constant<int, 192>{});
    case 256: return launch(std::integral_constant<int, 256>{});
    default: return LAB_E_HEAD_DIM;
  }
#endif
}

}  // namespace decode
}  // namespace lab
