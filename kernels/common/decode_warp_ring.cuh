// The warp-private K/V ring of decode v06: each warp of a decode block copies, waits for and refills only the 16 keys
// of every 64-key tile that it reads (warp w: keys 16 w .. 16 w + 15, common/decode_pv.cuh warp_kv_lanes), so the
// main loop has no block barrier. A warp's 16-key slice of each tile lies in one page (page_size is a multiple of
// 16, a slice starts on a multiple of 16), so it walks the block table as one row of common/paged.cuh's RowWalk: one
// page id per slice, read one tile ahead, no division in the loop. What is new here:
//   warp_ring_step - v03's ring_step (common/decode_util.cuh) with __syncwarp for __syncthreads: the lane's own
//                    copies of tile t have landed, the warp's barrier makes its lanes' copies visible to each other
//                    and tells every lane that tile t - 1's stage (its 16 rows) was read by all of them.
// Why: in v03 a tile's refill waits for the slowest of the block's 128 threads (its copies landed and its math done)
// before any thread issues the next copies; here each warp runs on as soon as its own rows have landed.
#pragma once
#include <stdint.h>

#include "common/decode_util.cuh"
#include "common/paged.cuh"

namespace lab {
namespace decode {

// The top of a warp's ring iteration: tile t's 16 rows are complete once at most kStages - 2 younger groups of the
// lane are pending; the warp barrier publishes every lane's copies and says that the stage refilled here (tile t -
// 1's) was read by every lane; then tile t + kStages - 1 goes into that stage and its group is committed (always:
// keeps the group count uniform).
template <int kStages, typename LoadTile>
__device__ __forceinline__ void warp_ring_step(int t, int n_tiles, LoadTile&& load_tile) {
  cp_async_wait<kStages - 2>();
  __syncwarp();
  const int next = t + kStages - 1;
  if (next < n_tiles) load_tile(next, next % kStages);
  cp_async_commit();
}

}  // namespace decode
}  // namespace lab
