// The unpadded, swizzled K/V ring of decode v07 and v08: a tile's rows are D elements apart (no pad), and the 16-byte
// chunk c of row r sits at chunk c ^ ((r & 7) >> SwizzleRows<D>::kShift) of its row. ldmatrix reads one 16-byte chunk
// of 8 consecutive rows (the first a multiple of 8) per 8x8 matrix: row r starts n r chunks into the tile (n = D / 8),
// so the 8 rows' bank quads repeat every 8 / gcd(n, 8) rows (1 at D 64 / 128, 2 at D 96, 4 at D 80), and the XOR term
// (r & 7) >> kShift (kShift 0, 1, 2) tells the repeats apart: 8 different bank quads, as v03's pad of 8 elements
// gave. The term stays under gcd(n, 8), so a row's chunks are permuted only inside its own aligned pairs (D 80),
// quads (D 96) or octets (D 64 / 128) of chunks: each 32-byte sector of the cache lands whole in one aligned 32-byte
// sector of the ring (and at D 64 / 128 each 128-byte line in one aligned 128-byte chunk).
//   SwizzleRows     - kShift per head dim
//   swizzle_chunk   - where chunk c of row r lives
//   SwizzleLane     - a lane's ldmatrix row and the XOR term of its chunk (the ldmatrix column is 2 k + t)
//   lane_at         - its k-step's address, so the shared tile step (common/decode_tile_step.cuh's
//                     tile_softmax_pv) runs on this layout as on a padded ring, where a k-step is an immediate offset
#pragma once

namespace lab::decode {

template <int D>
struct SwizzleRows {
  static_assert(D % 16 == 0, "rows of whole 32-byte sectors");
  static constexpr int kChunks = D / 8;
  static constexpr int kShift = kChunks % 8 == 0 ? 0 : (kChunks % 4 == 0 ? 1 : 2);
};

template <int D>
__device__ __forceinline__ int swizzle_chunk(int r, int c) { return c ^ ((r & 7) >> SwizzleRows<D>::kShift); }

// row: the lane's ldmatrix row (its first element); t: its chunk's XOR term (base chunk 0 / 1 ^ (row & 7)).
template <class T>
struct SwizzleLane {
  const T* row;
  int t;
  __device__ __forceinline__ const T* at(int k) const { return row + (((2 * k) ^ t) << 3); }  // chunk 2 k (+1)
};

template <class T, int D>
__device__ __forceinline__ SwizzleLane<T> swizzle_lane(const T* tile, int key, int col) {
  return {tile + key * D, (col >> 3) ^ ((key & 7) >> SwizzleRows<D>::kShift)};
}

// k-step (or d-pair) kk of a lane: common/decode_pv.cuh's warp_qk and rescale_pv (and so
// common/decode_tile_step.cuh's tile_softmax_pv) find this by argument-dependent lookup.
template <class T>
__device__ __forceinline__ const T* lane_at(SwizzleLane<T> lane, int kk) { return lane.at(kk); }

}  // namespace lab::decode
