// Pass 1 of the warp-private-ring decode kernels, once: decode v06 (the ring padded to D + 8 elements a row), v07
// and v08 (kSwizzle: rows D apart, 16-byte chunks XORed by row, common/decode_swizzle.cuh; v07 at D 64 / 128, v08 at
// D 80 / 96). The algorithm, the launch shape and the limits are in kernels/decode/v06_warpring.cu's header;
// v07_swizzle.cu's says what the swizzle changes. Each version file holds its launch traits and its extern "C" launcher.
// The masks (window, softcap, sinks: DecodeParams' run-time fields) are common/decode_masks.cuh's steps: the window's
// first key in the split's keys, each row's key range in the tile step, the softcap on the scores.
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_masks.cuh"
#include "common/decode_paged_launch.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_swizzle.cuh"
#include "common/decode_tile_step.cuh"
#include "common/decode_util.cuh"
#include "common/decode_warp_ring.cuh"
#include "common/paged.cuh"
#include "common/params.h"

namespace lab {
namespace decode {

template <int kHeadDim_, int kStages_, bool kSwizzle_>
struct WarpRingConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // v03's ring per head dim (common/decode_head_dim.cuh)
  static constexpr bool kSwizzle = kSwizzle_;  // v07 / v08: rows D apart, chunks XORed (common/decode_swizzle.cuh)
  static constexpr int kRows = 16;          // one m16 tile of query rows per block
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockN = 64;       // keys per tile; lab/decode/splits.py BLOCK_N
  static constexpr int kSliceKeys = 16;    // a warp's keys of a tile: one k16 step of P V
  static constexpr int kVecPerRow = kHeadDim / 8;
  // Lanes per row: a power of two, so a lane's rows are a fixed step apart (v03's rule; at D 80, 96, 192 the lanes
  // past kVecPerRow copy nothing: a masked column tail, the cache is read as it is).
  static constexpr int kVecSlots = kVecPerRow <= 8 ? 8 : (kVecPerRow <= 16 ? 16 : 32);
  static constexpr bool kFullRows = kVecSlots == kVecPerRow;
  static constexpr int kRowStep = 32 / kVecSlots;             // rows between two of a lane's copies
  static constexpr int kLoadRows = kSliceKeys / kRowStep;     // rows a lane copies per tile (K and V each)
  // v06: a padded smem row keeps ldmatrix rows in 8 bank quads; v07 / v08: the swizzle does, rows unpadded
  static constexpr int kStride = kSwizzle ? kHeadDim : kHeadDim + 8;
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr bool kQInSmem = kHeadDim > 128;  // as v03: Q's 16 rows after the ring
  static constexpr int kSmemBytes = kRingBytes + (kQInSmem ? kRows * kStride * 2 : 0);
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 2) * 4;  // O, m, l of every warp, fp32
  static_assert(kBlockN == kWarps * kSliceKeys, "a tile is one 16-key slice per warp");
  static_assert(kVecPerRow <= kVecSlots && kSliceKeys % kRowStep == 0, "fixed rows per lane");
  static_assert(kMergeBytes <= kRingBytes, "merge scratch reuses the ring");
  static_assert(!kSwizzle || kHeadDim <= 128, "the swizzled ring keeps Q in registers");
  static_assert(kSmemBytes <= 163 * 1024, "fits an A100 block (sm_80's opt-in limit)");
};

// Pass 1 (decode v06's header; kSwizzle: v07's).
template <typename T, int kHeadDim, int kStages, bool kPaged, bool kSwizzle>
__global__ void __launch_bounds__(WarpRingConfig<kHeadDim, kStages, kSwizzle>::kThreads)
    warpring_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                            const int row_groups) {
  using Cfg = WarpRingConfig<kHeadDim, kStages, kSwizzle>;
  constexpr int D = kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  const lab::decode::KVRing<T, Cfg::kStageBytes, Cfg::kTileElems> ring{smem};  // common/decode_util.cuh

  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // mma fragment row and column pair
  const lab::decode::RowBlock blk = lab::decode::row_block<Cfg::kRows>(p, rows_total, row_groups);  // as v02
  const int split = blk.split, b = blk.b, h_kv = blk.h_kv, row0 = blk.row0, rows = blk.rows, rg = blk.rg;

  // Prologue: the sequence's length (clamped to the keys that exist), the split's keys, the warp's slice walk.
  // (a window: from its first key on, common/decode_masks.cuh)
  const lab::paged::SplitKeys keys = lab::decode::window_split_keys<kPaged>(p, b, split, chunk);
  int errors = keys.errors, n_keys = keys.n_keys;
  const int len = keys.len, key_begin = keys.key_begin;

#ifdef LAB_WARPRING_BUG_SLICE  // the wrong build: a warp copies the next warp's slice into its own rows (must fail)
  const int slice0 = ((warp + 1) % Cfg::kWarps) * Cfg::kSliceKeys;
#else
  const int slice0 = warp * Cfg::kSliceKeys;  // the warp's first key of every tile
#endif
  const int r0 = lane / Cfg::kVecSlots;             // the lane's first row of the slice
  const int col = (lane % Cfg::kVecSlots) * 8;      // and its 16-byte column
  const bool copies = Cfg::kFullRows || col < D;    // false: a lane of the masked column tail
  const int64_t k_row = kPaged ? p.k_stride[1] : p.k_stride[2], v_row = kPaged ? p.v_stride[1] : p.v_stride[2];
  const T* k_base = static_cast<const T*>(p.k_cache) + col + r0 * k_row;
  const T* v_base = static_cast<const T*>(p.v_cache) + col + r0 * v_row;
  if (kPaged) {
    k_base += h_kv * p.k_stride[2];
    v_base += h_kv * p.v_stride[2];
  } else {
    k_base += b * p.k_stride[0] + h_kv * p.k_stride[1] + static_cast<int64_t>(key_begin + slice0) * k_row;
    v_base += b * p.v_stride[0] + h_kv * p.v_stride[1] + static_cast<int64_t>(key_begin + slice0) * v_row;
  }
  const int32_t* table_row = kPaged ? p.block_table + b * p.block_table_stride : nullptr;
  lab::paged::RowWalk<Bc> walk;  // the warp's slice: one page id per tile
  if (kPaged) walk.start(table_row, p.page_size, p.num_pages, key_begin + slice0, n_keys - slice0 > 0);

  // Issue tile t's slice of this warp into `stage` (paged: the walk holds its page id and reads the next one).
  auto load_tile = [&](int t, int stage) {
    const int first = t * Bc + slice0;  // the slice's first key in the split
    T* sK = ring.k(stage) + (warp * Cfg::kSliceKeys + r0) * Cfg::kStride + (kSwizzle ? 0 : col);
    T* sV = ring.v(stage) + (warp * Cfg::kSliceKeys + r0) * Cfg::kStride + (kSwizzle ? 0 : col);
    int64_t ko = 0, vo = 0;
    bool ok = true;
    if (kPaged) {
      ok = walk.offset(p.k_stride[0], k_row, &ko);
      walk.offset(p.v_stride[0], v_row, &vo);
      walk.advance(n_keys - first - Bc > 0);
    } else {
      ko = static_cast<int64_t>(t) * Bc * k_row;
      vo = static_cast<int64_t>(t) * Bc * v_row;
    }
#pragma unroll
    for (int i = 0; i < Cfg::kLoadRows; ++i) {
      const int r = i * Cfg::kRowStep;  // the lane's row r0 + r of the slice
      const bool valid = ok && first + r0 + r < n_keys;
      // v07 / v08: a slice starts on a multiple of 16 rows, so the row's swizzle term is that of row r0 + r
      const int at = r * Cfg::kStride + (kSwizzle ? lab::decode::swizzle_chunk<D>(r0 + r, col >> 3) * 8 : 0);
      if (copies) {
        lab::paged::cp_async_16_l2(sK + at, k_base + (valid ? ko + r * k_row : 0), valid);
        lab::paged::cp_async_16_l2(sV + at, v_base + (valid ? vo + r * v_row : 0), valid);
      }
    }
  };

  int n_tiles = (n_keys + Bc - 1) / Bc;
  lab::decode::ring_prologue<Cfg::kStages>(n_tiles, load_tile);  // common/decode_util.cuh

  // The page-table check, while the first tiles are in flight (common/paged.cuh), as v03.
  if (kPaged) {
    lab::paged::check_page_table<Cfg::kThreads>(p, table_row, len, errors, n_keys, n_tiles);
    if (split == 0 && h_kv == 0 && rg == 0 && tid == 0) p.page_errors[b] = errors;
  }

  // Q fragments and each fragment row's causal key limit in the split (common/paged.cuh).
  uint32_t qf[Cfg::kQInSmem ? 1 : Cfg::kKSteps][4];
  int row_keys[2];
  T* const sQ = reinterpret_cast<T*>(smem + Cfg::kRingBytes);  // D > 128 only
  // v03's first ring_step published Q; the warp ring has no block barrier
  lab::decode::load_q_rows<T, D, Cfg, true>(qf, row_keys, sQ, p, b, h_kv, group, row0, rows, len, key_begin,
                                            n_keys, tid, gid, tig);
  int row_lo[2];  // each fragment row's key range in the split: window and causal (common/decode_masks.cuh)
  lab::decode::block_row_ranges(p, len, row0, gid, key_begin, n_keys, row_lo, row_keys);

  const float qk_scale = p.scale * kLog2e;
  const lab::decode::ScoreMap map = lab::decode::score_map(p, qk_scale);
  float acc[Cfg::kDTiles][4] = {};
  lab::decode::TileRowState st;
  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);  // as v02: the warp's own rows
  const T* q_lane = sQ + (lane % 16) * Cfg::kStride + (lane / 16) * 8;

  // Main loop
  for (int t = 0; t < n_tiles; ++t) {
    lab::decode::warp_ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_warp_ring.cuh
    const int stage = t % Cfg::kStages;
    const int first[2] = {row_lo[0] - t * Bc, row_lo[1] - t * Bc};
    const int limit[2] = {row_keys[0] - t * Bc, row_keys[1] - t * Bc};
    if constexpr (kSwizzle)  // the same tile step on the swizzled ring's lanes (common/decode_swizzle.cuh)
      lab::decode::tile_softmax_pv_masked<T, Cfg::kKSteps, Cfg::kDTiles, Cfg::kQInSmem>(
          acc, st, qf, q_lane, lab::decode::swizzle_lane<T, D>(ring.k(stage), kvl.k_key, kvl.k_col),
          lab::decode::swizzle_lane<T, D>(ring.v(stage), kvl.v_key, kvl.v_col), first, limit, warp, tig, map);
    else
      lab::decode::tile_softmax_pv_masked<T, Cfg::kKSteps, Cfg::kDTiles, Cfg::kQInSmem>(
          acc, st, qf, q_lane, ring.k(stage) + kvl.k_key * Cfg::kStride + kvl.k_col,
          ring.v(stage) + kvl.v_key * Cfg::kStride + kvl.v_col, first, limit, warp, tig, map);
  }

  // Epilogue: every copy landed (a bad table emptied the loop after the first tiles were issued), then the 4 warps'
  // (m, l, O) through the freed ring, then O (one split) or the fp32 partials.
  lab::decode::cp_async_wait<0>();
  __syncthreads();
  float *sO, *sM, *sL;
  lab::decode::stash_warp_state<Cfg::kWarps, Cfg::kRows, D>(smem, acc, st, warp, gid, tig, sO, sM, sL);
  __syncthreads();
  lab::decode::merge_warps_store<T, Cfg::kWarps, Cfg::kRows, D, Cfg::kThreads>(sO, sM, sL, p, rows, row0, b, h_kv,
                                                                                group, split, tid);  // as v02
}

// The kernel's launch traits for common/decode_paged_launch.cuh (the grid, the combine and the dispatch the family
// shares), as the Partial<T, D, kStages, kPaged> it takes: decode v06 the padded ring, v07 and v08 the swizzled one.
template <bool kSwizzle>
struct WarpRingPartial {
  template <typename T, int kHeadDim, int kStages, bool kPaged>
  using Launch = PartialTraits<warpring_partial_kernel<T, kHeadDim, kStages, kPaged, kSwizzle>,
                               WarpRingConfig<kHeadDim, kStages, kSwizzle>>;
};
template <typename T, int kHeadDim, int kStages, bool kPaged>
using PaddedRingPartial = WarpRingPartial<false>::Launch<T, kHeadDim, kStages, kPaged>;
template <typename T, int kHeadDim, int kStages, bool kPaged>
using SwizzledRingPartial = WarpRingPartial<true>::Launch<T, kHeadDim, kStages, kPaged>;

}  // namespace decode
}  // namespace lab
