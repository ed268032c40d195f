// Changes: vs decode v02: K/V rows addressed through a block table (paged cache, any page size that is a
// multiple of 16), a bottom-right causal mask for q_len > 1, a device-side page-table check (bad sequences
// zeroed and flagged in page_errors, never read out of bounds); with no block table it is v02's contiguous
// decode plus the causal mask.
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a -DDECODE_FN=decode_paged_v03 tools/gpu/decode_main.cu kernels/decode/v03_paged.cu -o /tmp/dec3 && /tmp/dec3
//   (contiguous driver list); paged: .venv/bin/python -m pytest -q tests/decode/test_paged_gpu.py; compile check:
//   python -m lab compile; sanitizers: bash tools/gpu/sanitize_paged.sh
// Measured: outputs/experiments/20261123-paged-v03-first-race.json.
//
// decode_paged_v03: split-K decoding over a paged KV cache, tensor cores for Q K^T and P V.
//
// Algorithm (v02's pass 1, read its header): one block (4 warps) per (split s, b, h_kv, row group of 16);
// the R = G * q_len query rows of the KV head in one m16 tile (Q_i in registers as mma A fragments); 64-key
// tiles K_j, V_j by 16-byte cp.async in a kStages ring; warp w owns keys 16w..16w+15 of each tile with its
// own (m_i, l_i, O_i): S = Q K_w^T, scores scaled by scale * log2 e in fp32, exp2, P rounded to the input
// dtype (l_i summed from the rounded P), O_i += P V_w; the 4 warps merged through the freed ring; pass 2 is
// the shared LSE combine (common/splitk_combine.cuh).
//
// What is new:
//  * Pages. Key j of sequence b is row j % page_size of page block_table[b][j / page_size]. The split plan
//    is v02's, over the table's capacity max_pages * page_size (chosen on the host from shapes only, so a
//    captured graph replays with any lengths and tables); chunks are whole 64-key tiles and a tile may cross
//    pages (page 16: 4 pages a tile; page >= 64 and a multiple of 64: one). A PageCursor (common/paged.cuh)
//    holds one page id and offset per 16-key group of the tile (a group never crosses a page), the same for
//    the whole block; each thread adds its row in the group, known at compile time but for j0. No division
//    in the loop, page ids fetched one tile ahead.
//  * Bad tables. The length is clamped to [0, max_pages * page_size] (the table slots that exist); a longer
//    cache_seqlens[b] sets LAB_PAGE_E_SHORT. Every block checks the page ids of the sequence's whole
//    length (bad_pages, ~len / page_size int32 loads from L2 per block, overlapped with the first tiles'
//    cp.async); an id outside [0, num_pages) sets LAB_PAGE_E_INDEX. Either way every block of the sequence
//    skips its keys, so the output rows are 0 (LSE -inf), and block (split 0, h_kv 0, row group 0) writes
//    page_errors[b] (0 when fine), every call, with no workspace to clear: graph-safe, no host sync. The
//    tile loader never dereferences a bad id either (zero-fill), so not even the first tiles, issued before
//    the check ends, read outside the cache.
//  * Causal, bottom-right (FlashAttention's decode rule; lab.ops.attention's is SDPA's top-left): token i of
//    q_len sees keys [0, len - q_len + i]. A per-row key limit replaces v02's per-block one in the mask;
//    a token that sees no key gets O = 0.
//  * Masks (later, common/decode_masks.cuh): a sliding window (splits from the window's first tile, the chunk over
//    its span), each row's key range [lo, hi) in place of the causal limit, softcap on the scores, sinks in the
//    combine; run-time DecodeParams fields, the plain call unchanged (LAB_DECODE_NO_MASKS is the A/B baseline).
//
// Launch: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; smem 102 KiB (D 128, 3 stages),
// 72 KiB (D 64, 4 stages), as v02 (every head dim: common/decode_head_dim.cuh). Limits: D in {64, 80, 96, 128,
// 192, 256} (at 80, 96, 192 a row's copies take a power of two of threads, the last ones idle; at D > 128 Q is
// read from shared memory, as in v02); fp16, bf16;
// q_len >= 1; Hq multiple of Hkv; page_size a positive multiple of 16; strides multiples of 8 elements, 16-byte aligned bases
// (LAB_E_SHAPE otherwise); a paged call needs page_errors (LAB_E_WORKSPACE).
//
// Prediction (H200, bf16, D 128, Hkv 8): the same bytes as v02 plus ~1 % of table reads, so within 5 % of
// v02 at page 64 and 256 (one table entry per tile) and within 15 % at page 16 (4 pages a tile: 64-byte K
// and V runs per page and head, i.e. 2 x 256 B segments instead of 64 x 256 B contiguous ones); >= 90 % of
// copy bandwidth at >= 1 GB caches for page >= 64.
// Outcome (H200, 2026-11-23): first loader (each thread walked its own rows, a while loop per row, for K and
// V apart; 964 SASS instructions per tile against the contiguous loop's 477): 0.47-0.99x the contiguous
// decode, 0.59 at pages 64/256 (session 20261123-000607-h200-0dccb32c0e). The page-group loader (one page
// id and offset per 16-key group, the same for the whole block; 537 instructions): 0.95-0.99x at B*L >=
// 8 x 16k for pages 64/256, 0.84 at page 16, 0.94-0.97x in CUDA graphs at every probed size
// (outputs/driver_logs/20261123-h200-paged-host-probe-5172c812f0.jsonl); the eager public op stays below
// the prediction at small caches, where the Python host path (+5-7 us over the contiguous call) sets the
// time; 78-99 % of copy bandwidth at >= 1 GB (0.78 at page 16).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_masks.cuh"
#include "common/decode_paged_launch.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_tile_step.cuh"
#include "common/decode_util.cuh"
#include "common/launch.h"
#include "common/mma.cuh"
#include "common/paged.cuh"
#include "common/params.h"
#include "common/splitk_combine.cuh"

namespace {

using lab::decode::Elem;
using lab::decode::kFullMask;
using lab::decode::kLog2e;

template <int kHeadDim_, int kStages_>
struct PagedConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;  // v02's ring per head dim (common/decode_head_dim.cuh)
  static constexpr int kRows = 16;          // one m16 tile of query rows per block
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kBlockN = 64;  // keys per tile, 16 per warp; lab/decode/splits.py BLOCK_N
  static constexpr int kVecPerRow = kHeadDim / 8;
  // Threads per row: the power of two that holds a row's 16-byte vectors, so that a thread's rows are a fixed
  // step apart and each stays in one 16-key page group; at D 80, 96 and 192 the threads past kVecPerRow copy
  // nothing (a masked column tail: the cache is read as it is, never padded).
  static constexpr int kVecSlots = kVecPerRow <= 8 ? 8 : (kVecPerRow <= 16 ? 16 : 32);
  static constexpr bool kFullRows = kVecSlots == kVecPerRow;
  static constexpr int kRowStep = kThreads / kVecSlots;  // rows between two of one thread's loads
  static constexpr int kLoadRows = kBlockN / kRowStep;    // rows a thread loads per tile
  static constexpr int kStride = kHeadDim + 8;            // padded smem row: ldmatrix rows in 8 bank quads
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // D > 128: Q's 16 rows in shared memory after the ring, not in registers (common/decode_pv.cuh stage_q_rows)
  static constexpr bool kQInSmem = kHeadDim > 128;
  static constexpr int kSmemBytes = kRingBytes + (kQInSmem ? kRows * kStride * 2 : 0);
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static constexpr int kMergeBytes = kWarps * kRows * (kHeadDim + 2) * 4;  // O, m, l of every warp, fp32
  static_assert(kBlockN / kWarps == 16, "one k16 step of P V per warp and tile");
  static_assert(kVecPerRow <= kVecSlots && kThreads % kVecSlots == 0 && kBlockN % kRowStep == 0,
                "fixed rows per thread");
  static_assert(kMergeBytes <= kRingBytes, "merge scratch reuses the ring");
  static_assert(kSmemBytes <= 163 * 1024, "fits an A100 block (sm_80's opt-in limit)");
};

// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kStages, bool kPaged>
__global__ void __launch_bounds__(PagedConfig<kHeadDim, kStages>::kThreads)
    paged_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                         const int row_groups) {
  using Cfg = PagedConfig<kHeadDim, kStages>;
  constexpr int D = kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  const lab::decode::KVRing<T, Cfg::kStageBytes, Cfg::kTileElems> ring{smem};  // common/decode_util.cuh

  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // mma fragment row and column pair
  const lab::decode::RowBlock blk = lab::decode::row_block<Cfg::kRows>(p, rows_total, row_groups);  // as v02
  const int split = blk.split, b = blk.b, h_kv = blk.h_kv, row0 = blk.row0, rows = blk.rows, rg = blk.rg;

  // Prologue: the sequence's length (clamped to the keys that exist), the split's keys, the cursor.
  // (a window: from its first key on, common/decode_masks.cuh)
  const lab::paged::SplitKeys keys = lab::decode::window_split_keys<kPaged>(p, b, split, chunk);
  int errors = keys.errors, n_keys = keys.n_keys;
  const int len = keys.len, key_begin = keys.key_begin;

  const int j0 = tid / Cfg::kVecSlots;                 // this thread's first row of every tile
  const int col = (tid % Cfg::kVecSlots) * 8;          // and its 16-byte column
  const bool copies = Cfg::kFullRows || col < D;       // false: a thread of the masked column tail
  const T* k_base = static_cast<const T*>(p.k_cache) + col;
  const T* v_base = static_cast<const T*>(p.v_cache) + col;
  if (kPaged) {
    k_base += h_kv * p.k_stride[2];
    v_base += h_kv * p.v_stride[2];
  } else {
    k_base += b * p.k_stride[0] + h_kv * p.k_stride[1] + static_cast<int64_t>(key_begin) * p.k_stride[2];
    v_base += b * p.v_stride[0] + h_kv * p.v_stride[1] + static_cast<int64_t>(key_begin) * p.v_stride[2];
  }
  const int32_t* table_row = kPaged ? p.block_table + b * p.block_table_stride : nullptr;
  lab::paged::PageCursor<Bc> cursor;
  if (kPaged) {
    k_base += j0 * p.k_stride[1];  // the thread's row in its 16-key group; the cursor gives the group's row
    v_base += j0 * p.v_stride[1];
    cursor.start(table_row, p.page_size, p.num_pages, key_begin);
    cursor.fetch(n_keys);
  }

#ifdef LAB_PAGED_LEAN_LOADER  // probe switch (20261126-paged-lean-loader): fewer integer instructions a copy
  // A full tile (every row below n_keys, every page id good) needs no per-row bound test and no zero-fill operand,
  // and where the page and row strides fit 32 bits (page_size x H_kv x D elements: every real cache) a group's
  // offset is one 32 x 32 -> 64-bit multiply-add. Its copies go out from one pointer per 16-key group, a thread's
  // next row a fixed step further. Any other tile takes the general path of load_tile.
  const bool lean = kPaged ? p.k_stride[0] <= INT32_MAX && p.v_stride[0] <= INT32_MAX &&
                                 static_cast<int64_t>(p.page_size) * p.k_stride[1] <= INT32_MAX &&
                                 static_cast<int64_t>(p.page_size) * p.v_stride[1] <= INT32_MAX
                          : 16 * p.k_stride[2] <= INT32_MAX && 16 * p.v_stride[2] <= INT32_MAX;
  const int k_page = static_cast<int>(p.k_stride[0]), v_page = static_cast<int>(p.v_stride[0]);
  const int k_row = static_cast<int>(kPaged ? p.k_stride[1] : p.k_stride[2]);
  const int v_row = static_cast<int>(kPaged ? p.v_stride[1] : p.v_stride[2]);
  auto lean_tile = [&](int t, T* sK, T* sV) {
    if (!copies) return;
    constexpr int kPerGroup = 16 / Cfg::kRowStep;  // a thread's rows in one 16-key group
#pragma unroll
    for (int g = 0; g < Cfg::kLoadRows / kPerGroup; ++g) {
      const T *kg, *vg;
      if (kPaged) {
        const unsigned page = cursor.page[g], row = cursor.row[g];  // both >= 0 here: 32 x 32 -> 64-bit products
        kg = k_base + (static_cast<uint64_t>(page) * static_cast<unsigned>(k_page) + row * static_cast<unsigned>(k_row));
        vg = v_base + (static_cast<uint64_t>(page) * static_cast<unsigned>(v_page) + row * static_cast<unsigned>(v_row));
      } else {
        const int64_t key = t * Bc + 16 * g + j0;
        kg = k_base + key * p.k_stride[2];
        vg = v_base + key * p.v_stride[2];
      }
#pragma unroll
      for (int r = 0; r < kPerGroup; ++r) {
        const int it = g * kPerGroup + r;
#ifdef LAB_PAGED_LEAN_BUG  // the switch's wrong build: V's later rows of a group read its first row again
        const int v_off = 0;
#else
        const int v_off = r * Cfg::kRowStep * v_row;
#endif
        lab::paged::cp_async_16_l2(sK + it * Cfg::kRowStep * Cfg::kStride, kg + r * Cfg::kRowStep * k_row, true);
        lab::paged::cp_async_16_l2(sV + it * Cfg::kRowStep * Cfg::kStride, vg + v_off, true);
      }
    }
  };
#endif

  // Issue tile t's cp.async (paged: the cursor holds tile t's page ids; fetches tile t + 1's).
  // Paged: row it of the thread is in 16-key group it * kRowStep / 16 (j0 < kRowStep <= 16), at row
  // j0 + (it * kRowStep) % 16 of the group: both compile-time but j0, which k_base already holds.
  static_assert(Cfg::kRowStep <= 16 && 16 % Cfg::kRowStep == 0, "a thread's row group is known at compile time");
  auto load_tile = [&](int t, int stage) {
    T* sK = ring.k(stage) + j0 * Cfg::kStride + col;
    T* sV = ring.v(stage) + j0 * Cfg::kStride + col;
#ifdef LAB_PAGED_LEAN_LOADER
    if (lean && (t + 1) * Bc <= n_keys && (!kPaged || cursor.all_pages_ok())) {
      lean_tile(t, sK, sV);
      if (kPaged) {
        cursor.advance();
        cursor.fetch(n_keys - (t + 1) * Bc);
      }
      return;
    }
#endif
    int64_t k_group[lab::paged::PageCursor<Bc>::kGroups], v_group[lab::paged::PageCursor<Bc>::kGroups];
    bool group_ok[lab::paged::PageCursor<Bc>::kGroups];
    if (kPaged) {
#pragma unroll
      for (int g = 0; g < lab::paged::PageCursor<Bc>::kGroups; ++g) {
        group_ok[g] = cursor.offset(g, p.k_stride[0], p.k_stride[1], &k_group[g]);
        cursor.offset(g, p.v_stride[0], p.v_stride[1], &v_group[g]);
      }
    }
#ifdef LAB_PAGED_KV_ORDER  // probe switch (20261126-paged-loader-switches): the tile's V rows after all its K rows
    int64_t v_off[Cfg::kLoadRows];
    bool v_ok[Cfg::kLoadRows];
#endif
#pragma unroll
    for (int it = 0; it < Cfg::kLoadRows; ++it) {
      const int key = t * Bc + j0 + it * Cfg::kRowStep;  // in the split
      int64_t ko, vo;
      bool valid = key < n_keys;
      if (kPaged) {
        const int g = it * Cfg::kRowStep / 16, inner = (it * Cfg::kRowStep) % 16;
        valid &= group_ok[g];
        ko = k_group[g] + inner * p.k_stride[1];
        vo = v_group[g] + inner * p.v_stride[1];
      } else {
        ko = valid ? key * p.k_stride[2] : 0;
        vo = valid ? key * p.v_stride[2] : 0;
      }
      if (copies) {
        lab::paged::cp_async_16_l2(sK + it * Cfg::kRowStep * Cfg::kStride, k_base + ko, valid);
#ifdef LAB_PAGED_KV_ORDER
        v_off[it] = vo;
        v_ok[it] = valid;
#else
        lab::paged::cp_async_16_l2(sV + it * Cfg::kRowStep * Cfg::kStride, v_base + vo, valid);
#endif
      }
    }
#ifdef LAB_PAGED_KV_ORDER
#pragma unroll
    for (int it = 0; it < Cfg::kLoadRows; ++it)
      if (copies) lab::paged::cp_async_16_l2(sV + it * Cfg::kRowStep * Cfg::kStride, v_base + v_off[it], v_ok[it]);
#endif
    if (kPaged) {
      cursor.advance();
      cursor.fetch(n_keys - (t + 1) * Bc);
    }
  };

  int n_tiles = (n_keys + Bc - 1) / Bc;
  lab::decode::ring_prologue<Cfg::kStages>(n_tiles, load_tile);  // common/decode_util.cuh

  // The page-table check, while the first tiles are in flight (common/paged.cuh).
  if (kPaged) {
    lab::paged::check_page_table<Cfg::kThreads>(p, table_row, len, errors, n_keys, n_tiles);
    if (split == 0 && h_kv == 0 && rg == 0 && tid == 0) p.page_errors[b] = errors;
  }

  // Q fragments and each fragment row's causal key limit in the split (common/paged.cuh).
  uint32_t qf[Cfg::kQInSmem ? 1 : Cfg::kKSteps][4];
  int row_keys[2];
  T* const sQ = reinterpret_cast<T*>(smem + Cfg::kRingBytes);  // D > 128 only
  lab::decode::load_q_rows<T, D, Cfg, false>(qf, row_keys, sQ, p, b, h_kv, group, row0, rows, len, key_begin,
                                             n_keys, tid, gid, tig);
  int row_lo[2];  // each fragment row's key range in the split: window and causal (common/decode_masks.cuh)
  lab::decode::block_row_ranges(p, len, row0, gid, key_begin, n_keys, row_lo, row_keys);

  const float qk_scale = p.scale * kLog2e;
  const lab::decode::ScoreMap map = lab::decode::score_map(p, qk_scale);
  float acc[Cfg::kDTiles][4] = {};
  lab::decode::TileRowState st;  // common/decode_tile_step.cuh
  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);  // as v02

  // Main loop
  // [lab:paged-loop] one key tile per iteration: the ring as in v02, a per-row key limit for the causal mask
  for (int t = 0; t < n_tiles; ++t) {
    lab::decode::ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_util.cuh
    const T* sK = ring.k(t % Cfg::kStages);
    const T* sV = ring.v(t % Cfg::kStages);

    float s[2][4] = {};
    if constexpr (Cfg::kQInSmem)
      lab::decode::warp_qk_smem<T, Cfg::kKSteps>(s, sQ + (lane % 16) * Cfg::kStride + (lane / 16) * 8,
                                                 sK + kvl.k_key * Cfg::kStride + kvl.k_col);
    else
      lab::decode::warp_qk<T, Cfg::kKSteps>(s, qf, sK + kvl.k_key * Cfg::kStride + kvl.k_col);
    // Mask: the row's first key <= key (in the tile) < the row's limit; the limit of a row is n_keys without causal
    // or window, its first key <= 0 without a window. Softcap first (a warp-uniform branch).
    const int first[2] = {row_lo[0] - t * Bc, row_lo[1] - t * Bc};
    const int limit[2] = {row_keys[0] - t * Bc, row_keys[1] - t * Bc};
    lab::decode::softcap_scores(s, map);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int nt = e / 4, half = (e / 2) % 2;
      const int key = warp * 16 + nt * 8 + 2 * tig + (e % 2);
      float& x = s[nt][e % 4];
      x = key >= first[half] && key < limit[half] ? x * map.mul : -INFINITY;
      tile_max[half] = fmaxf(tile_max[half], x);
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 2));
      const float m_new = fmaxf(st.m[h], tile_max[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp2(-inf - 0) = 0, never NaN
      alpha[h] = exp2f(st.m[h] - m_use[h]);
      st.m[h] = m_new;
      st.l[h] *= alpha[h];
    }
    uint32_t pa[4];  // P as the A fragment: a0 (gid, keys 0-7), a1 (gid+8, 0-7), a2 (gid, 8-15), a3 (gid+8, 8-15)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int nt = i / 2, h = i % 2;
      pa[i] = Elem<T>::from_float2(exp2f(s[nt][2 * h] - m_use[h]), exp2f(s[nt][2 * h + 1] - m_use[h]));
      const float2 rounded = Elem<T>::to_float2(pa[i]);
      st.l[h] += rounded.x + rounded.y;
    }
    lab::decode::rescale_pv<T, Cfg::kDTiles>(acc, alpha, pa, sV + kvl.v_key * Cfg::kStride + kvl.v_col);  // as v02
  }
  // [/lab:paged-loop]

  // Epilogue: the 4 warps' (m, l, O) through the freed ring, then O (one split) or the fp32 partials.
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
using Partial =
    lab::decode::PartialTraits<paged_partial_kernel<T, kHeadDim, kStages, kPaged>, PagedConfig<kHeadDim, kStages>>;

constexpr int kKeyBlock = 64;  // PagedConfig::kBlockN, lab/decode/splits.py BLOCK_N: chunks are whole tiles

}  // namespace

extern "C" int decode_paged_v03(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == PagedConfig<128, 3>::kBlockN && kKeyBlock == PagedConfig<64, 4>::kBlockN,
                "chunk rounding must match the kernel's key block");
  lab::DecodeLaunch l;  // rows in 16-row groups, chunk, device, PDL, stream (common/launch.h)
  if (const int rc = lab::decode::paged_entry(p, kKeyBlock, stream_ptr, &l)) return rc < 0 ? rc : 0;
  return lab::decode::launch_paged_family<Partial>(p, l);
}
