// The unpadded, swizzled K/V ring of decode v07: a tile's rows are D elements apart (no pad), and the 16-byte chunk
// c of row r sits at chunk c ^ (r & 7) of its row. ldmatrix reads one 16-byte chunk of 8 consecutive rows per 8x8
// matrix: the XOR puts those 8 chunks in 8 different bank quads, as v03's pad of 8 elements did, and a row's 16-byte
// copies stay a permutation of its own 128-byte groups. Needs D a multiple of 64 (whole groups of 8 chunks).
//   swizzle_chunk   - where chunk c of row r lives
//   SwizzleLane     - a lane's ldmatrix row and the XOR term of its chunk (the ldmatrix column is 2 k + t)
//   lane_at         - its k-step's address, so the shared tile step (common/decode_tile_step.cuh's
//                     tile_softmax_pv) runs on this layout as on a padded ring, where a k-step is an immediate offset
#pragma once

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

// k-step (or d-pair) kk of a lane: common/decode_pv.cuh's warp_qk and rescale_pv (and so
// common/decode_tile_step.cuh's tile_softmax_pv) find this by argument-dependent lookup.
template <class T>
__device__ __forceinline__ const T* lane_at(SwizzleLane<T> lane, int kk) { return lane.at(kk); }

}  // namespace lab::decode
