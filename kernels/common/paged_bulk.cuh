// Whole-row bulk copies of a paged (or contiguous) KV cache into a padded shared-memory ring (decode v05, sm_90):
// one cp.async.bulk per K or V row (D x 2 bytes, contiguous in both layouts), completing on the stage's mbarrier
// by its byte count, and each thread's walk of its row through the block table.
//
// Why rows and not a tensor map: a row is contiguous in the page-major cache (num_pages, page_size, H_kv, D) and
// in the contiguous one (B, H_kv, S, D), and a bulk copy may land at any 16-byte aligned address, so the ring
// keeps v03's padded rows (D + 8 elements: ldmatrix without bank conflicts) and every compute step of v03 stays
// as it is. A tensor-map box would land dense (row stride D x 2 bytes: an 8-way ldmatrix conflict without a
// swizzle, and a 128-byte swizzle would rewrite every ldmatrix address of the step).
#pragma once
#include <stdint.h>

#include "common/hopper/mbarrier.cuh"
#include "common/paged.cuh"

namespace lab {
namespace paged {

// cp.async.bulk global -> shared: `bytes` (a multiple of 16; both addresses 16-byte aligned) completing as
// transaction bytes on the mbarrier `bar`. The copy engine reads whole 32-byte sectors of whole lines, where a
// thread's 16-byte cp.async asks for half a sector at a time.
__device__ __forceinline__ void bulk_row_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Orders this thread's earlier generic-proxy writes to shared memory (a zero-filled row) before later
// async-proxy writes to the same bytes (the next bulk copy into that row).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One thread's row of every kTileKeys-key tile: key first_key + t * kTileKeys for tile t. The walk holds that
// key's table slot and row in its page, moves by kTileKeys per tile with no division, and holds the page id of
// the tile to issue next, read one tile ahead (the table load's latency hides under the tile in between).
// Host code runs it too (tests/fixtures/paged_rowwalk_check.cu checks it against plain division).
template <int kTileKeys>
struct RowWalk {
  const int32_t* table;  // this sequence's row of block_table
  int page_size;
  unsigned num_pages;
  int step_slots, step_rows;  // kTileKeys = step_slots * page_size + step_rows
  int slot, row;              // the next tile's key: table slot, row in its page
  int page;                   // its page id, -1 past the split's keys

  // first_key: the thread's key in the split's first tile; live: that key exists. The thread's only divisions.
  __host__ __device__ __forceinline__ void start(const int32_t* table_row, int ps, int np, int first_key, bool live) {
    table = table_row;
    page_size = ps;
    num_pages = static_cast<unsigned>(np);
    step_slots = kTileKeys / ps;
    step_rows = kTileKeys - step_slots * ps;
    slot = first_key / ps;
    row = first_key - slot * ps;
    fetch(live);
  }

  __host__ __device__ __forceinline__ void fetch(bool live) {
#ifdef LAB_PAGED_BUG_IDENTITY  // the self-test's wrong kernel: slot i read as page i, the table ignored
    page = live ? slot : -1;
#else
    page = live ? table_entry(table + slot) : -1;
#endif
  }

  // Element offset of the row in a cache with (page, row) strides; false: a bad page id or past the end
  // (the caller zero-fills; the offset is then 0 and never read).
  __host__ __device__ __forceinline__ bool offset(int64_t page_stride, int64_t row_stride, int64_t* off) const {
    const bool ok = static_cast<unsigned>(page) < num_pages;
    *off = ok ? static_cast<int64_t>(page) * page_stride + static_cast<int64_t>(row) * row_stride : 0;
    return ok;
  }

  // To the next tile; live: its key exists.
  __host__ __device__ __forceinline__ void advance(bool live) {
    slot += step_slots;
    row += step_rows;
    if (row >= page_size) {  // step_rows < page_size: at most one carry
      row -= page_size;
      ++slot;
    }
    fetch(live);
  }
};

}  // namespace paged
}  // namespace lab
