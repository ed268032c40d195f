// Changes: vs decode v03: the ring is warp-private. Warp w copies only the 16 keys of each 64-key tile it reads (its
// rows 16 w .. 16 w + 15 of K and V, in v03's ring layout), one page id per slice (common/paged.cuh's
// RowWalk, v05's walk), and waits for and refills its own rows with __syncwarp (warp_ring_step): the main loop has no block
// barrier. The split plan, the ring's layout and depth, the page-table check, the tile's math
// (common/decode_tile_step.cuh) and the merge of the 4 warps are v03's.
// Compile check: python -m lab compile (sm_80 and sm_90a); GPU: tools/gpu/paged_warpring_call.sh (checks, the wrong
// builds, sanitizers, the race against v03 and cuDNN, Nsight Compute). Measured: kernels/decode/README.md, "decode v06".
//
// decode_warpring_v06: split-K decoding over a paged (or contiguous) KV cache, tensor cores for Q K^T and P V.
//
// Algorithm: v03's pass 1 (read its header): one block (4 warps) per (split s, b, h_kv, row group of 16); 64-key
// tiles K_j, V_j in a kStages ring; warp w owns keys 16 w .. 16 w + 15 of each tile with its own (m_i, l_i, O_i)
// (S = Q K_w^T, exp2, P V_w); the warps merged through the freed ring at the end; pass 2 the shared LSE combine.
// What is new is who copies a tile: lane l of warp w copies 16-byte column (l % kVecSlots) of rows
// l / kVecSlots + kRowStep i of its slice (kVecSlots: the power of two that holds a row's vectors, as in v03), so a
// lane's copies are the rows its own warp reads, and no other warp waits for them.
//
// Prediction (from the profiles of v03 and cuDNN on the H100 one-token serving cells, kernels/decode/README.md):
// every switch of v03's loader (hint, L2 policy, ring depth, request order, whole-row copies, a fifth fewer
// instructions) left its DRAM throughput at 80-86 % of peak against cuDNN's 85-90 %, so neither the bytes a block
// has asked for nor the requests' shape is the bound. What every one of them kept is the block barrier at the top of
// each tile: the next tile's copies go out only once all 128 threads' copies of the current tile have landed and
// all 4 warps finished the tile before it, so one late 256-byte row holds back 32 KiB of requests and the SM's
// queue empties in bursts. With warp-private rings each warp refills as soon as its own rows landed. Prediction:
// pass 1 0.96-0.99x v03's GPU time on the serving cells (pages 16/64/256 and the contiguous cache), the gain largest
// where a block has the most tiles to stream (32 x 4096, 8 x 16384, 1 x 131072), ncu DRAM throughput up by 2-4
// points, "barrier" stalls gone from the stall mix; 64 x 1024 (16 tiles a block, 1.94 waves) moves least.
// Outcome (H100 80GB HBM3, outputs/driver_logs/20261126-h100-paged-warpring-5be331d/): the prediction was wrong.
// Correct (216/216 checks through lab.ops.decode, the wrong build failing 8/8) and clean under memcheck, racecheck,
// synccheck and initcheck, but v03's GPU time over v06's is 1.005-1.011 at 64 x 1024, 0.999-1.008 at 32 x 4096,
// 8 x 16384 and 128 x 2048, 0.992-1.005 at 1 x 131072 (two identical v03 calls: up to 0.6 % apart); ncu DRAM throughput
// within a point of v03's (84.4 % at 32 x 4096 page 16, cuDNN 89.7 %). The barrier stall left the mix and the long and
// short scoreboard took its place: the warps wait for the same bytes. Off lab.ops.decode's default list
// (lab.registry.BEST_PAGED); a call may name it (kernels/decode/README.md, "decode v06").
//
// Launch: as v03: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; shared memory v03's ring (+ Q at
// D > 128). Limits: as v03 (D 64-256, fp16 / bf16, q_len >= 1, page_size a multiple of 16, strides of 8 elements,
// 16-byte aligned bases, page_errors for a paged call); sm_80 and sm_90a.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_paged_launch.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_tile_step.cuh"
#include "common/decode_util.cuh"
#include "common/decode_warp_ring.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/params.h"
#include "common/splitk_combine.cuh"

namespace {

using lab::decode::kLog2e;

template <int kHeadDim_, int kStages_>
struct WarpRingConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // v03's ring per head dim (common/decode_head_dim.cuh)
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
  static constexpr int kStride = kHeadDim + 8;                // padded smem row: ldmatrix rows in 8 bank quads
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
  static_assert(kSmemBytes <= 163 * 1024, "fits an A100 block (sm_80's opt-in limit)");
};

// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kStages, bool kPaged>
__global__ void __launch_bounds__(WarpRingConfig<kHeadDim, kStages>::kThreads)
    warpring_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                            const int row_groups) {
  using Cfg = WarpRingConfig<kHeadDim, kStages>;
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
  const int cap = p.seqlen_cache;  // paged: max_pages * page_size
  const int asked = p.cache_seqlens ? p.cache_seqlens[b] : cap;
  int errors = kPaged && asked > cap ? LAB_PAGE_E_SHORT : 0;
  const int len = max(0, min(asked, cap));
  const int key_begin = split * chunk;
  int n_keys = max(0, min(key_begin + chunk, len) - key_begin);

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
    T* sK = ring.k(stage) + (warp * Cfg::kSliceKeys + r0) * Cfg::kStride + col;
    T* sV = ring.v(stage) + (warp * Cfg::kSliceKeys + r0) * Cfg::kStride + col;
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
      if (copies) {
        lab::paged::cp_async_16_l2(sK + r * Cfg::kStride, k_base + (valid ? ko + r * k_row : 0), valid);
        lab::paged::cp_async_16_l2(sV + r * Cfg::kStride, v_base + (valid ? vo + r * v_row : 0), valid);
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
  if constexpr (Cfg::kQInSmem) {
    lab::decode::stage_q_rows<T, D, Cfg::kThreads, Cfg::kStride>(sQ, p, b, h_kv, group, row0, rows, tid);
    __syncthreads();  // v03's first ring_step published Q; the warp ring has no block barrier
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_keys[half] = lab::paged::causal_keys(p.causal, len, p.q_len, (row0 + gid + 8 * half) % p.q_len, key_begin,
                                               n_keys);
  } else {
    lab::paged::load_q_frags<T, Cfg::kKSteps>(qf, row_keys, p, b, h_kv, group, row0, rows, len, key_begin, n_keys,
                                              gid, tig);
  }

  const float qk_scale = p.scale * kLog2e;
  float acc[Cfg::kDTiles][4] = {};
  lab::decode::TileRowState st;
  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);  // as v02: the warp's own rows
  const T* q_lane = sQ + (lane % 16) * Cfg::kStride + (lane / 16) * 8;

  // Main loop
  for (int t = 0; t < n_tiles; ++t) {
    lab::decode::warp_ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_warp_ring.cuh
    const int stage = t % Cfg::kStages;
    const int limit[2] = {row_keys[0] - t * Bc, row_keys[1] - t * Bc};
    lab::decode::tile_softmax_pv<T, Cfg::kKSteps, Cfg::kDTiles, Cfg::kQInSmem>(
        acc, st, qf, q_lane, ring.k(stage) + kvl.k_key * Cfg::kStride + kvl.k_col,
        ring.v(stage) + kvl.v_key * Cfg::kStride + kvl.v_col, limit, warp, tig, qk_scale);
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

// Its launch traits for common/decode_paged_launch.cuh (the grid, the combine and the dispatch the family shares).
template <typename T, int kHeadDim, int kStages, bool kPaged>
struct Partial {
  static constexpr auto kernel = warpring_partial_kernel<T, kHeadDim, kStages, kPaged>;
  using Cfg = WarpRingConfig<kHeadDim, kStages>;
  static constexpr int kSmemBytes = Cfg::kSmemBytes, kThreads = Cfg::kThreads;
};

constexpr int kKeyBlock = 64;  // WarpRingConfig::kBlockN, lab/decode/splits.py BLOCK_N: chunks are whole tiles

}  // namespace

extern "C" int decode_warpring_v06(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == WarpRingConfig<128, 3>::kBlockN && kKeyBlock == WarpRingConfig<64, 4>::kBlockN,
                "chunk rounding must match the kernel's key block");
  const int rc = lab::check_decode_params(p);  // common/launch.h
  if (rc < 0) return rc;
  if (const int bad = lab::paged::check_paged_params(p)) return bad;  // common/paged.cuh
  if (rc > 0) return 0;  // nothing to compute
  lab::DecodeLaunch l;  // rows in 16-row groups, chunk, device, PDL, stream (common/launch.h)
  if (const int bad = lab::decode_launch(p, kKeyBlock, 16, stream_ptr, &l)) return bad;
  return lab::decode::launch_paged_family<Partial>(p, l);
}
