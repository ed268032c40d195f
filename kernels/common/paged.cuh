// Paged KV-cache pieces for the decode kernels (kernels/decode/v03_paged.cu): where a key's K/V row lives,
// the block-table walk of the tile loader, the page-table check, and the bottom-right causal row limit.
//
// Layout (vLLM, flash_attn_with_kvcache): k_cache, v_cache [num_pages, page_size, Hkv, D]; key j of
// sequence b is row j % page_size of page block_table[b][j / page_size]. DecodeParams (common/params.h) holds
// the table, its sizes and the page_errors output; with block_table NULL the same code reads the contiguous
// [B, Hkv, S_cache, D] cache of decode v01/v02.
//
// Never an out-of-bounds read: the loader reads a table slot only for a key below the sequence's length,
// which the kernel clamps to max_pages * page_size (so the slot is < max_pages), and a page id outside
// [0, num_pages) is never dereferenced (its rows are zero-filled by cp.async with src-size 0). Whether the
// whole sequence is valid is decided by check_pages(), which every block runs over the sequence's table.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/params.h"

namespace lab {
namespace paged {

// 16-byte cp.async, L1-bypassing, with the L2::128B prefetch-size hint (decode v02 measured +2-3 % from the
// hint on the large bench-decode cells, H200). valid == false: nothing is read, the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16_l2(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Device code reads the table through the read-only cache; host code (tests/cuda/paged_cursor_check.cu checks
// the cursor on the CPU against plain division) reads it directly.
__host__ __device__ __forceinline__ int32_t table_entry(const int32_t* entry) {
#ifdef __CUDA_ARCH__
  return __ldg(entry);
#else
  return *entry;
#endif
}

// The keys one thread loads in every tile are first + kStep * it, it < kRows (the loader's fixed pattern:
// thread tid owns rows tid / vectors-per-row + kStep * it of each tile, at one 16-byte column). The cursor
// follows them through the block table with no division in the loop: (slot, row) of the first key of the
// next tile to issue, moved by kTileKeys per tile; the page ids of that tile are fetched one tile ahead, so
// the table load's latency hides under a tile of math instead of delaying the cp.async behind it.
// [lab:page-cursor] each thread's rows of a tile, found through the block table one tile ahead
template <int kRows, int kStep, int kTileKeys>
struct PageCursor {
  const int32_t* table;  // this sequence's row of block_table
  int page_size;
  unsigned num_pages;
  int slot, row;         // table slot and row in page of the thread's first key of the next tile
  int page[kRows];       // page ids of that tile's keys, -1 for a key past the end

  __host__ __device__ __forceinline__ void start(const int32_t* table_row, int ps, int np, int first_key) {
    table = table_row;
    page_size = ps;
    num_pages = static_cast<unsigned>(np);
    slot = first_key / ps;  // the one division per block
    row = first_key - slot * ps;
  }

  // Key it of the tile: (slot offset, row in page). kStep * it < 64 and page_size >= 16: at most 4 steps.
  __host__ __device__ __forceinline__ int locate(int it, int* row_in_page) const {
    int r = row + kStep * it, s = 0;
    while (r >= page_size) {
      r -= page_size;
      ++s;
    }
    *row_in_page = r;
    return s;
  }

  // Fetch the page ids of the next tile; keys_left = keys of the split from this thread's first key on.
  __host__ __device__ __forceinline__ void fetch(int keys_left) {
#pragma unroll
    for (int it = 0; it < kRows; ++it) {
      int r;
      const int s = locate(it, &r);
#ifdef LAB_PAGED_BUG_IDENTITY  // the self-test's wrong kernel: slot i read as page i, the table ignored
      page[it] = kStep * it < keys_left ? slot + s : -1;
#else
      page[it] = kStep * it < keys_left ? table_entry(table + slot + s) : -1;
#endif
    }
  }

  // Element offset of key it's row in a cache with (page, row) strides; false: no key or a bad page id
  // (the caller zero-fills, the offset is then 0 and never read).
  __host__ __device__ __forceinline__ bool offset(int it, int64_t page_stride, int64_t row_stride, int64_t* off) const {
    int r;
    locate(it, &r);
    const bool ok = static_cast<unsigned>(page[it]) < num_pages;
    *off = ok ? static_cast<int64_t>(page[it]) * page_stride + static_cast<int64_t>(r) * row_stride : 0;
    return ok;
  }

  __host__ __device__ __forceinline__ void advance() {
    row += kTileKeys;
    while (row >= page_size) {
      row -= page_size;
      ++slot;
    }
  }
};
// [/lab:page-cursor]

// The page-table check of one sequence, by the whole block: true when a page id among its first
// n_pages slots is outside [0, num_pages). Every block of the sequence runs it, so all of them agree to
// zero the sequence without talking to each other (no workspace to clear between graph replays).
template <int kThreads>
__device__ __forceinline__ bool bad_pages(const int32_t* table_row, int n_pages, int num_pages) {
  bool bad = false;
  for (int i = threadIdx.x; i < n_pages; i += kThreads)
    bad |= static_cast<unsigned>(__ldg(table_row + i)) >= static_cast<unsigned>(num_pages);
  return __syncthreads_or(bad) != 0;
}

// Bottom-right causal limit of query token tok (0-based of q_len) in a sequence of len keys: it sees keys
// [0, len - q_len + tok], FlashAttention's rule when q_len new tokens are appended to the cache (the last
// token sees the whole cache). Returned relative to the split's first key, capped at the split's n_keys;
// <= 0: the token sees nothing in this split.
__device__ __forceinline__ int causal_keys(bool causal, int len, int q_len, int tok, int key_begin, int n_keys) {
  return causal ? min(n_keys, len - q_len + tok + 1 - key_begin) : n_keys;
}

}  // namespace paged
}  // namespace lab
