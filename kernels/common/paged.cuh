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

// Loader switches of the probe in outputs/experiments/20261126-paged-loader-switches.json (the defaults are what
// lab.ops runs):
//   LAB_PAGED_PREFETCH 128 | 0 | 256: the L2 prefetch-size hint of the K/V copies;
//   LAB_PAGED_EVICT_FIRST: the copies also carry an L2 evict-first policy (every K/V byte is read once);
//   LAB_PAGED_CHECK_UNROLL: page ids in flight per thread in the page-table check (bad_pages);
//   LAB_PAGED_SKIP_CHECK: no page-table check at all (timing only: a bad id is then zero-filled, not flagged).
#ifndef LAB_PAGED_PREFETCH
#define LAB_PAGED_PREFETCH 128
#endif
#ifndef LAB_PAGED_CHECK_UNROLL
#define LAB_PAGED_CHECK_UNROLL 8
#endif

// 16-byte cp.async, L1-bypassing, with the L2::128B prefetch-size hint (decode v02 measured +2-3 % from the
// hint on the large bench-decode cells, H200). valid == false: nothing is read, the 16 bytes are zero-filled.
__device__ __forceinline__ void cp_async_16_l2(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
#if defined(LAB_PAGED_EVICT_FIRST)
  uint64_t policy;  // not volatile: the compiler may hoist it out of the loader
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::128B [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(gmem_src), "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
#elif LAB_PAGED_PREFETCH == 0
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(valid ? 16 : 0)
               : "memory");
#elif LAB_PAGED_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src),
               "r"(valid ? 16 : 0)
               : "memory");
#endif
}

// Device code reads the table through the read-only cache; host code (tests/fixtures/paged_cursor_check.cu checks
// the cursor on the CPU against plain division) reads it directly.
__host__ __device__ __forceinline__ int32_t table_entry(const int32_t* entry) {
#ifdef __CUDA_ARCH__
  return __ldg(entry);
#else
  return *entry;
#endif
}

// The block's tile of kTileKeys keys, walked 16 keys at a time: a tile starts on a multiple of 64 keys and
// page_size is a multiple of 16, so each 16-key group lies in one page. The cursor holds, for each group of
// the next tile to issue, its table slot and row in page, moved by kTileKeys per tile with no division in the
// loop, and the group's page id fetched one tile ahead (the table load's latency hides under a tile of math).
// Everything here is the same for every thread of the block: the loader adds each thread's row in its group.
// (The first version walked every thread's 8 rows with a while loop each, K and V apart: 964 SASS
// instructions per tile against the contiguous loop's 477, and 0.59x the contiguous decode on an H200.)
// [lab:page-cursor] the block's tile through the block table, one page id per 16 keys, one tile ahead
template <int kTileKeys>
struct PageCursor {
  static constexpr int kGroups = kTileKeys / 16;
  const int32_t* table;  // this sequence's row of block_table
  int page_size;
  unsigned num_pages;
  int step_slots, step_rows;                    // kTileKeys = step_slots * page_size + step_rows
  int slot[kGroups], row[kGroups];              // group g's first key of the next tile: table slot, row in page
  int page[kGroups];                            // that tile's page ids, -1 for a group past the end

  // first_key: the split's first key, a multiple of kTileKeys. The block's only divisions.
  __host__ __device__ __forceinline__ void start(const int32_t* table_row, int ps, int np, int first_key) {
    table = table_row;
    page_size = ps;
    num_pages = static_cast<unsigned>(np);
    step_slots = kTileKeys / ps;
    step_rows = kTileKeys - step_slots * ps;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      slot[g] = (first_key + 16 * g) / ps;
      row[g] = first_key + 16 * g - slot[g] * ps;
    }
  }

  // Fetch the page ids of the next tile; keys_left = keys of the split from that tile's first key on.
  __host__ __device__ __forceinline__ void fetch(int keys_left) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
#ifdef LAB_PAGED_BUG_IDENTITY  // the self-test's wrong kernel: slot i read as page i, the table ignored
      page[g] = 16 * g < keys_left ? slot[g] : -1;
#else
      page[g] = 16 * g < keys_left ? table_entry(table + slot[g]) : -1;
#endif
    }
  }

  // Element offset of group g's first key in a cache with (page, row) strides; false: past the end or a bad
  // page id (the caller zero-fills, the offset is then 0 and never read).
  __host__ __device__ __forceinline__ bool offset(int g, int64_t page_stride, int64_t row_stride, int64_t* off) const {
    const bool ok = static_cast<unsigned>(page[g]) < num_pages;
    *off = ok ? static_cast<int64_t>(page[g]) * page_stride + static_cast<int64_t>(row[g]) * row_stride : 0;
    return ok;
  }

  // Every group of the next tile on a page of the pool (a group past the end, page -1, is not).
  __host__ __device__ __forceinline__ bool all_pages_ok() const {
    bool ok = true;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) ok &= static_cast<unsigned>(page[g]) < num_pages;
    return ok;
  }

  __host__ __device__ __forceinline__ void advance() {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      slot[g] += step_slots;
      row[g] += step_rows;
      if (row[g] >= page_size) {  // step_rows < page_size: at most one carry
        row[g] -= page_size;
        ++slot[g];
      }
    }
  }
};
// [/lab:page-cursor]

// The block's walk over 16-key tiles (decode v04): a tile starts on a multiple of 16 keys and page_size is a
// multiple of 16, so a tile lies in one page and has one page id, the same for every thread of the block. The
// walk holds that id for the tile being issued and moves on with no division; a new id is read from the table
// only when the walk enters a new page (every tile at page 16, every 16th at page 256), one tile ahead of its
// use, so its load latency hides under the tile in between.
// [lab:page-walk] one page id per 16-key tile, read when the page changes, one tile ahead
struct PageWalk {
  const int32_t* table;  // this sequence's row of block_table
  int page_size;
  unsigned num_pages;
  int slot, row;  // the next tile to issue: table slot and first row in its page
  int page;       // its page id (-1 past the split's keys)

  // first_key: the split's first key, a multiple of 16; keys: the split's keys. The block's only division.
  __host__ __device__ __forceinline__ void start(const int32_t* table_row, int ps, int np, int first_key, int keys) {
    table = table_row;
    page_size = ps;
    num_pages = static_cast<unsigned>(np);
    slot = first_key / ps;
    row = first_key - slot * ps;
    page = keys > 0 ? read(slot) : -1;
  }

  __host__ __device__ __forceinline__ int32_t read(int s) const {
#ifdef LAB_PAGED_BUG_IDENTITY  // the self-test's wrong kernel: slot i read as page i, the table ignored
    return s;
#else
    return table_entry(table + s);
#endif
  }

  // Element offset of the tile's first row in a cache with (page, row) strides; false for a bad page id or
  // a tile past the end (the caller zero-fills; the offset is then 0 and never read).
  __host__ __device__ __forceinline__ bool offset(int64_t page_stride, int64_t row_stride, int64_t* off) const {
    const bool ok = static_cast<unsigned>(page) < num_pages;
    *off = ok ? static_cast<int64_t>(page) * page_stride + static_cast<int64_t>(row) * row_stride : 0;
    return ok;
  }

  // To the next tile; keys_left: the split's keys from that tile on.
  __host__ __device__ __forceinline__ void advance(int keys_left) {
    row += 16;
    if (row == page_size) {
      row = 0;
      ++slot;
      page = keys_left > 0 ? read(slot) : -1;
    } else if (keys_left <= 0) {
      page = -1;
    }
  }
};

// One row of every kTileKeys-key tile (decode v05: a thread's key; v06: a warp's 16-key slice, which lies in one page
// since page_size is a multiple of 16): key first_key + t * kTileKeys for tile t. The walk holds that
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

// [/lab:page-walk]

// The page-table check of one sequence, by the whole block: true when a page id among its first
// n_pages slots is outside [0, num_pages). Every block of the sequence runs it, so all of them agree to
// zero the sequence without talking to each other (no workspace to clear between graph replays).
// The loads go kUnroll at a time: one at a time, a 131072-key sequence in pages of 16 (8192 ids, 64 per thread of
// a 128-thread block) was 64 serial L2 round trips in every block's prologue, ~12 us of a ~200 us call (H100).
template <int kThreads>
__device__ __forceinline__ bool bad_pages(const int32_t* table_row, int n_pages, int num_pages) {
  constexpr int kUnroll = LAB_PAGED_CHECK_UNROLL;
  const unsigned limit = static_cast<unsigned>(num_pages);
  bool bad = false;
  int i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < n_pages; i += kUnroll * kThreads) {
    int32_t id[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) id[u] = __ldg(table_row + i + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) bad |= static_cast<unsigned>(id[u]) >= limit;
  }
  for (; i < n_pages; i += kThreads) bad |= static_cast<unsigned>(__ldg(table_row + i)) >= limit;
  return __syncthreads_or(bad) != 0;
}

// The paged fields of a call with a block table (decode v03, v04): LAB_E_WORKSPACE without
// page_errors, LAB_E_SHAPE for a page size that is not a positive multiple of 16 or a table whose capacity is
// not seqlen_cache; 0 otherwise, and for a call with no table.
inline int check_paged_params(const DecodeParams* p) {
  if (p->block_table == nullptr) return 0;
  if (p->page_errors == nullptr) return LAB_E_WORKSPACE;
  if (p->page_size <= 0 || p->page_size % 16 != 0 || p->num_pages < 0 || p->max_pages < 0 ||
      p->block_table_stride < p->max_pages ||
      static_cast<int64_t>(p->max_pages) * p->page_size != p->seqlen_cache)
    return LAB_E_SHAPE;
  return 0;
}

// Bottom-right causal limit of query token tok (0-based of q_len) in a sequence of len keys: it sees keys
// [0, len - q_len + tok], FlashAttention's rule when q_len new tokens are appended to the cache (the last
// token sees the whole cache). Returned relative to the split's first key, capped at the split's n_keys;
// <= 0: the token sees nothing in this split.
__device__ __forceinline__ int causal_keys(bool causal, int len, int q_len, int tok, int key_begin, int n_keys) {
  return causal ? min(n_keys, len - q_len + tok + 1 - key_begin) : n_keys;
}

// The keys split `split` of sequence b holds (the prologue of decode v03-v08's pass 1): the sequence's length clamped
// to the keys that exist (paged: max_pages * page_size), the split's first key and its count; errors starts with
// LAB_PAGE_E_SHORT where a paged length asks for more keys than the table holds.
struct SplitKeys {
  int errors, len, key_begin, n_keys;
};
template <bool kPaged>
__device__ __forceinline__ SplitKeys split_keys(const DecodeParams& p, int b, int split, int chunk) {
  const int cap = p.seqlen_cache;  // paged: max_pages * page_size
  const int asked = p.cache_seqlens ? p.cache_seqlens[b] : cap;
  const int errors = kPaged && asked > cap ? LAB_PAGE_E_SHORT : 0;
  const int len = max(0, min(asked, cap));
  const int key_begin = split * chunk;
  return {errors, len, key_begin, max(0, min(key_begin + chunk, len) - key_begin)};
}

// The page-table check of a sequence in decode v03 / v04, run while the first tiles are in flight (their bad
// ids were zero-filled, not read): a bad id adds LAB_PAGE_E_INDEX; with any error every block of the sequence
// drops its keys (n_keys = n_tiles = 0: its rows become O = 0). The caller's one reporting thread writes
// page_errors: with that store in here, nvcc schedules v04's prologue differently (sass_guard).
template <int kThreads>
__device__ __forceinline__ void check_page_table(const DecodeParams& p, const int32_t* table_row, int len,
                                                 int& errors, int& n_keys, int& n_tiles) {
#ifndef LAB_PAGED_SKIP_CHECK
  if (bad_pages<kThreads>(table_row, (len + p.page_size - 1) / p.page_size, p.num_pages))
    errors |= LAB_PAGE_E_INDEX;
  if (errors) n_keys = n_tiles = 0;
#endif
}

// A warp's Q fragments in decode v03 / v04 (m16n8k16 A layout, unscaled, input dtype; rows row0 + r of
// the rows of KV head h_kv, query token (row0 + r) % q_len) and each fragment row's causal key limit in the
// split. Rows past `rows` load zeros.
template <typename T, int kKSteps>
__device__ __forceinline__ void load_q_frags(uint32_t (&qf)[kKSteps][4], int (&row_keys)[2], const DecodeParams& p,
                                             int b, int h_kv, int group, int row0, int rows, int len,
                                             int key_begin, int n_keys, int gid, int tig) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = gid + 8 * half;
    const int rr = row0 + r;
    const int tok = rr % p.q_len;
    row_keys[half] = causal_keys(p.causal, len, p.q_len, tok, key_begin, n_keys);
    const T* q_row = r < rows ? static_cast<const T*>(p.q) + b * p.q_stride[0] +
                                    (h_kv * group + rr / p.q_len) * p.q_stride[1] + tok * p.q_stride[2]
                              : nullptr;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
      for (int hi = 0; hi < 2; ++hi)  // a0/a1: columns 2 tig, a2/a3: 2 tig + 8
        qf[kk][half + 2 * hi] =
            q_row ? __ldg(reinterpret_cast<const unsigned int*>(q_row + kk * 16 + 2 * tig + 8 * hi)) : 0u;
  }
}

}  // namespace paged
}  // namespace lab
