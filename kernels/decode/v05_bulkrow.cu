// Changes: vs decode v03: the loader. Each K or V row of a 64-key tile comes in as one bulk copy (cp.async.bulk,
// D x 2 bytes, one row per thread: 128 threads, 64 K rows and 64 V rows) completing on the stage's mbarrier by
// its byte count, where v03's threads copy 16 bytes a cp.async (16 per thread and tile at D 128). The ring, the
// split plan, the tile's softmax and P V (common/decode_tile_step.cuh: v03's loop body), the page-table check
// and the merge are v03's. sm_90 only (the copy engine's bulk copies); elsewhere the launcher refuses (LAB_E_MODE).
// Compile check: python -m lab compile (sm_90a; sm_80 builds an empty kernel); GPU checks: tests/decode/test_paged_gpu.py;
// the sanitizers and the race against v03 and cuDNN: outputs/experiments/20261126-paged-v05-bulkrow.json.
//
// decode_bulkrow_v05: split-K decoding over a paged (or contiguous) KV cache, tensor cores for Q K^T and P V.
//
// Algorithm: v03's pass 1 (read its header): one block (4 warps) per (split s, b, h_kv, row group of 16); 64-key
// tiles K_j, V_j in a kStages ring; warp w owns keys 16w..16w+15 of each tile with its own (m_i, l_i, O_i); the
// 4 warps merged through the freed ring; pass 2 the shared LSE combine. What is new is how a tile lands:
//  * Thread i copies row i % 64 of K (i < 64) or of V (i >= 64): key j = t * 64 + i % 64 of the split, through
//    its own RowWalk (common/paged.cuh: the key's table slot and row in page, moved by 64 keys a tile, the
//    page id read one tile ahead), as one bulk copy of D x 2 bytes into the padded ring row.
//  * A row past the split's keys, or on a bad page id, is never read: its thread writes zeros with st.shared (V
//    must be finite: P = 0 times a stale NaN is NaN) and fences them from the next bulk copy into that row.
//  * Stage s has an mbarrier (4 arrivals: one lane per warp, with the warp's copy bytes as expected
//    transactions, after the warp's zero fills). A consumer waits on it with the parity of the stage's round.
//    The refill of a stage stays behind v03's block barrier at the top of each tile (every warp done with it).
//  * Every started tile is waited for before the ring is reused for the merge (a bad table empties the loop
//    after the first tiles were started).
//
// Prediction (from the profile of v03 and cuDNN on the H100 one-token serving cells: ncu DRAM throughput v03 80-86 %
// of peak against cuDNN's 85-90 % on the same grid shape, L2 sector hits 48 % against 1-2 %, the 16-byte copies'
// half sectors hitting the line their first request prefetched; 13 cp.async switches of v03 moved nothing by more
// than ~1.5 %): whole-row copies read DRAM like cuDNN's whole-line loads, so pass 1's GPU time goes to v03 x (v03's
// DRAM % / cuDNN's): 0.95-0.98x v03's at every page size (a row copy does not see the page size), bringing the paged
// public op to 0.97-1.0x SDPA-cuDNN on the serving cells; 1 x 131072 page 16 keeps the page-table check's ~2.7 %.
// The risk: 128 copies of 256 bytes per 32 KiB tile are small for the copy engine (one per ~20 cycles per SM at two
// blocks an SM); if it cannot start them that fast, v05 is slower than v03 where two blocks share an SM.
// Outcome (H100 80GB HBM3, outputs/driver_logs/20261126-h100-paged-bulkrow-475b5f8/): the prediction was
// wrong. Correct at every head dim and clean under memcheck, racecheck, synccheck and initcheck, but 0.984-1.000x
// v03's speed on the serving cells (median 0.989 over 30 rows; v03 timed twice in a round: 0.996-1.002), slowest at
// 64 x 1024 (0.984-0.987), level at 128 x 2048 and 1 x 131072 page 16. ncu at 32 x 4096 and 1 x 131072: L2 sector
// hits fell from 48 % to 19-20 %, the DRAM bytes stayed the same, and DRAM throughput did not rise (82-83 % of peak
// against v03's 83-85 %; 80.6 against 80.0 at 1 x 131072 page 16). The 48 % was a symptom of 16-byte requests, not
// the bound. Off lab.ops.decode's default list (lab.registry.BEST_PAGED); a call may name it (outputs/experiments/20261126-paged-v05-bulkrow.json).
//
// Launch: as v03: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; shared memory v03's ring (+ Q at
// D > 128) + kStages mbarriers. Limits: as v03 (D 64-256, fp16 / bf16, page_size a multiple of 16, strides of 8
// elements, 16-byte aligned bases, page_errors for a paged call), compute capability 9.0.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_paged_launch.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_tile_step.cuh"
#include "common/decode_util.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/paged_bulk.cuh"
#include "common/params.h"
#include "common/splitk_combine.cuh"

namespace {

using lab::decode::kLog2e;
using lab::sm90::smem_u32;

template <int kHeadDim_, int kStages_>
struct BulkRowConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // v03's ring per head dim (common/decode_head_dim.cuh)
  static constexpr int kRows = 16;          // one m16 tile of query rows per block
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kBlockN = 64;                  // keys per tile; lab/decode/splits.py BLOCK_N
  static constexpr int kRowBytes = kHeadDim * 2;      // one bulk copy
  static constexpr int kStride = kHeadDim + 8;        // padded smem row: ldmatrix rows in 8 bank quads
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr bool kQInSmem = kHeadDim > 128;  // as v03: Q's 16 rows after the ring
  static constexpr int kQBytes = kQInSmem ? kRows * kStride * 2 : 0;
  static constexpr int kBarOffset = kRingBytes + kQBytes;
  static constexpr int kSmemBytes = kBarOffset + kStages * 8;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 2) * 4;
  static_assert(kThreads == 2 * kBlockN, "one K or V row per thread and tile");
  static_assert(kRowBytes % 16 == 0 && (kStride * 2) % 16 == 0 && kBarOffset % 8 == 0, "bulk copy alignment");
  static_assert(kMergeBytes <= kRingBytes, "merge scratch reuses the ring");
  static_assert(kSmemBytes <= 227 * 1024, "fits a Hopper block");
};

// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kStages, bool kPaged>
__global__ void __launch_bounds__(BulkRowConfig<kHeadDim, kStages>::kThreads)
    bulkrow_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                           const int row_groups) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = BulkRowConfig<kHeadDim, kStages>;
  constexpr int D = kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  const lab::decode::KVRing<T, Cfg::kStageBytes, Cfg::kTileElems> ring{smem};
  const uint32_t bars = smem_u32(smem + Cfg::kBarOffset);  // stage s: bars + 8 s

  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;
  const lab::decode::RowBlock blk = lab::decode::row_block<Cfg::kRows>(p, rows_total, row_groups);  // as v02
  const int split = blk.split, b = blk.b, h_kv = blk.h_kv, row0 = blk.row0, rows = blk.rows, rg = blk.rg;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) lab::sm90::mbar_init(bars + 8 * s, Cfg::kWarps);
    lab::sm90::fence_barrier_init();
  }
  __syncthreads();

  // Prologue: the sequence's length (clamped to the keys that exist), the split's keys, this thread's row.
  const lab::paged::SplitKeys keys = lab::paged::split_keys<kPaged>(p, b, split, chunk);  // common/paged.cuh
  int errors = keys.errors, n_keys = keys.n_keys;
  const int len = keys.len, key_begin = keys.key_begin;

  const bool is_v = tid >= Bc;
  const int r = tid % Bc;  // this thread's row of every tile
  const T* base = static_cast<const T*>(is_v ? p.v_cache : p.k_cache);
  // The row's strides as values: a pointer to either param array would copy the params to local memory.
  const int64_t page_stride = is_v ? p.v_stride[0] : p.k_stride[0], row_stride = is_v ? p.v_stride[1] : p.k_stride[1];
  const int64_t key_stride = is_v ? p.v_stride[2] : p.k_stride[2];
  T* const row_dst0 = (is_v ? ring.v(0) : ring.k(0)) + r * Cfg::kStride;  // stage s: + s * kStageBytes
  const int32_t* table_row = kPaged ? p.block_table + b * p.block_table_stride : nullptr;
  lab::paged::RowWalk<Bc> walk;
  if (kPaged) {
    base += h_kv * key_stride;  // paged: (page, row in page, head) strides
    walk.start(table_row, p.page_size, p.num_pages, key_begin + r, r < n_keys);
  } else {
    base += b * page_stride + h_kv * row_stride + static_cast<int64_t>(key_begin) * key_stride;  // (b, head, key)
  }

  // Start tile t's copy into `stage`: a bulk copy of this thread's row, or zeros where the row must not be read.
  int started = 0;
  auto load_tile = [&](int t, int stage) {
    T* dst = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(row_dst0) + stage * Cfg::kStageBytes);
    const int key = t * Bc + r;  // in the split
    bool valid = key < n_keys;
    int64_t off;
    if (kPaged) {
      valid &= walk.offset(page_stride, row_stride, &off);
      walk.advance(key + Bc < n_keys);
    } else {
      off = valid ? static_cast<int64_t>(key) * key_stride : 0;
    }
    if (!valid) {
#pragma unroll
      for (int c = 0; c < D; c += 8) *reinterpret_cast<uint4*>(dst + c) = make_uint4(0, 0, 0, 0);
      lab::paged::fence_proxy_async_smem();
    }
    const unsigned copying = __ballot_sync(lab::decode::kFullMask, valid);
    __syncwarp();  // the warp's zero fills before its lane 0 arrives (release)
    const uint32_t bar = bars + 8 * stage;
    if (lane == 0) lab::sm90::mbar_arrive_expect_tx(bar, __popc(copying) * Cfg::kRowBytes);
    if (valid) lab::paged::bulk_row_g2s(smem_u32(dst), base + off, Cfg::kRowBytes, bar);
    ++started;
  };

  int n_tiles = (n_keys + Bc - 1) / Bc;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s)
    if (s < n_tiles) load_tile(s, s);

  // The page-table check, while the first tiles are in flight (common/paged.cuh), as v03.
  if (kPaged) {
    lab::paged::check_page_table<Cfg::kThreads>(p, table_row, len, errors, n_keys, n_tiles);
    if (split == 0 && h_kv == 0 && rg == 0 && tid == 0) p.page_errors[b] = errors;
  }

  uint32_t qf[Cfg::kQInSmem ? 1 : Cfg::kKSteps][4];
  int row_keys[2];
  T* const sQ = reinterpret_cast<T*>(smem + Cfg::kRingBytes);  // D > 128 only
  lab::decode::load_q_rows<T, D, Cfg, false>(qf, row_keys, sQ, p, b, h_kv, group, row0, rows, len, key_begin,
                                             n_keys, tid, gid, tig);

  const float qk_scale = p.scale * kLog2e;
  float acc[Cfg::kDTiles][4] = {};
  lab::decode::TileRowState st;
  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);
  const T* q_lane = sQ + (lane % 16) * Cfg::kStride + (lane / 16) * 8;

  // Main loop
  for (int t = 0; t < n_tiles; ++t) {
    __syncthreads();  // every warp is done with tile t - 1's stage, which tile t + kStages - 1 refills
    const int next = t + kStages - 1;
    if (next < n_tiles) load_tile(next, next % kStages);
    const int stage = t % kStages;
    lab::sm90::mbar_wait(bars + 8 * stage, (t / kStages) & 1);
    const int limit[2] = {row_keys[0] - t * Bc, row_keys[1] - t * Bc};
    lab::decode::tile_softmax_pv<T, Cfg::kKSteps, Cfg::kDTiles, Cfg::kQInSmem>(
        acc, st, qf, q_lane, ring.k(stage) + kvl.k_key * Cfg::kStride + kvl.k_col,
        ring.v(stage) + kvl.v_key * Cfg::kStride + kvl.v_col, limit, warp, tig, qk_scale);
  }

  // Epilogue: tiles started but not consumed (a bad table emptied the loop) land before the ring is reused.
  for (int t = n_tiles; t < started; ++t) lab::sm90::mbar_wait(bars + 8 * (t % kStages), (t / kStages) & 1);
  __syncthreads();
  float *sO, *sM, *sL;
  lab::decode::stash_warp_state<Cfg::kWarps, Cfg::kRows, D>(smem, acc, st, warp, gid, tig, sO, sM, sL);
  __syncthreads();
  lab::decode::merge_warps_store<T, Cfg::kWarps, Cfg::kRows, D, Cfg::kThreads>(sO, sM, sL, p, rows, row0, b, h_kv,
                                                                                group, split, tid);  // as v02
#endif
}

// Its launch traits for common/decode_paged_launch.cuh (the grid, the combine and the dispatch the family shares).
template <typename T, int kHeadDim, int kStages, bool kPaged>
using Partial =
    lab::decode::PartialTraits<bulkrow_partial_kernel<T, kHeadDim, kStages, kPaged>, BulkRowConfig<kHeadDim, kStages>>;

constexpr int kKeyBlock = 64;  // BulkRowConfig::kBlockN, lab/decode/splits.py BLOCK_N: chunks are whole tiles

}  // namespace

extern "C" int decode_bulkrow_v05(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == BulkRowConfig<128, 3>::kBlockN, "chunk rounding must match the kernel's key block");
  if (lab::decode::decode_masks_set(p)) return LAB_E_MODE;  // no mask steps (common/decode_masks.cuh)
  lab::DecodeLaunch l;
  if (const int rc = lab::decode::paged_entry(p, kKeyBlock, stream_ptr, &l)) return rc < 0 ? rc : 0;
  if (lab::capability(l.device) != 90) return LAB_E_MODE;  // bulk copies and their mbarriers: sm_90
  return lab::decode::launch_paged_family<Partial>(p, l);
}
