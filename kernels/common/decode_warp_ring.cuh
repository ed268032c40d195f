// The warp-private K/V ring of decode v06: each warp of a decode block copies, waits for and refills only the 16 keys
// of every 64-key tile that it reads (warp w: keys 16 w .. 16 w + 15, common/decode_pv.cuh warp_kv_lanes), so the
// main loop has no block barrier. Two parts:
//   SliceWalk      - one warp's 16-key slice of each tile through the block table: a slice lies in one page
//                    (page_size is a multiple of 16, a slice starts on a multiple of 16), so it has one page id,
//                    read one tile ahead of its use, with no division in the loop;
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

// [lab:slice-walk] one warp's 16-key slice of each tile: one page id, read one tile ahead
template <int kTileKeys>
struct SliceWalk {
  const int32_t* table;  // this sequence's row of block_table
  int page_size;
  unsigned num_pages;
  int step_slots, step_rows;  // kTileKeys = step_slots * page_size + step_rows
  int slot, row;              // the next slice to issue: table slot and first row in its page
  int page;                   // its page id (-1 for a slice past the split's keys)

  __host__ __device__ __forceinline__ int32_t read(int s) const {
#ifdef LAB_PAGED_BUG_IDENTITY  // the self-test's wrong kernel: slot i read as page i, the table ignored
    return s;
#else
    return lab::paged::table_entry(table + s);
#endif
  }

  // first_key: the slice's first key in the sequence (a multiple of 16); keys_left: the split's keys from it on.
  // The walk's only division.
  __host__ __device__ __forceinline__ void start(const int32_t* table_row, int ps, int np, int first_key,
                                                 int keys_left) {
    table = table_row;
    page_size = ps;
    num_pages = static_cast<unsigned>(np);
    step_slots = kTileKeys / ps;
    step_rows = kTileKeys - step_slots * ps;
    slot = first_key / ps;
    row = first_key - slot * ps;
    page = keys_left > 0 ? read(slot) : -1;
  }

  // Element offset of the slice's first row in a cache with (page, row) strides; false for a bad page id or a
  // slice past the end (the caller zero-fills; the offset is then 0 and never read).
  __host__ __device__ __forceinline__ bool offset(int64_t page_stride, int64_t row_stride, int64_t* off) const {
    const bool ok = static_cast<unsigned>(page) < num_pages;
    *off = ok ? static_cast<int64_t>(page) * page_stride + static_cast<int64_t>(row) * row_stride : 0;
    return ok;
  }

  // To the next tile's slice; keys_left: the split's keys from that slice's first key on (the slot is read only
  // for a slice that holds a key below the clamped length, so it is < max_pages).
  __host__ __device__ __forceinline__ void advance(int keys_left) {
    slot += step_slots;
    row += step_rows;
    if (row >= page_size) {  // step_rows < page_size: at most one carry
      row -= page_size;
      ++slot;
    }
    page = keys_left > 0 ? read(slot) : -1;
  }
};
// [/lab:slice-walk]

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
