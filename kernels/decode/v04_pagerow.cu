// Changes: vs decode v03: one block reads the K/V rows of 8 KV heads at once (one warp per head), so in the
// page-major cache a 16-key tile is 16 runs of 8 heads x D x 2 bytes (2 KiB at D 128, contiguous in the page)
// instead of 64 runs of 256 bytes strided by H_kv x D x 2; tiles of 16 keys, so a tile lies in one page and
// the block walks the table one page id per tile (common/paged.cuh PageWalk), read only when the page changes,
// one tile ahead; each thread's K/V addresses are one per-tile offset plus constants; no cross-warp merge
// (a warp owns its head's rows over the whole split); the split plan counts blocks of 8 heads.
// Compile check: python -m lab compile (sm_80 and sm_90a); GPU checks: tests/decode/test_paged_gpu.py; the race
// (lab.decode.paged.serving_race), the profile and the sanitizers: outputs/experiments/20261126-paged-v04-pagerow.json.
//
// decode_pagerow_v04: split-K decoding over a paged (or contiguous) KV cache, tensor cores for Q K^T and P V.
//
// Algorithm (v02/v03's pass 1 with another tiling; read v02's header): one block of 8 warps per (b, head
// chunk of 8 KV heads, split s, row group of 16); warp w takes KV head 8 c + w and its R = G * q_len query
// rows (one m16 tile, Q_i in registers as mma A fragments) and runs one online softmax over every key of the
// split: per 16-key tile K_j, V_j (all 8 heads, by 16-byte cp.async in a kStages ring),
//     S = Q K_j^T (mma m16n8k16, B by ldmatrix), scores * scale * log2 e in fp32, exp2, P rounded to the
//     input dtype (l_i summed from the rounded P), O_i += P V_j (B by ldmatrix.trans), lazy O rescale;
// at the end each warp writes its rows: O (one split) or the fp32 partial O^(s), LSE^(s); pass 2 is the
// shared LSE combine (common/splitk_combine.cuh). Bottom-right causal and the page-table check are v03's.
//
// Why (prediction, written before the first GPU run). In the page-major layout (num_pages, page_size, H_kv,
// D) v03's block (one KV head) reads 256-byte runs 2 KiB apart, and the 8 heads' blocks read the rest of each
// 2 KiB row at other times: every DRAM page is opened by 8 blocks, which the profile should show as lower
// DRAM throughput than the contiguous decode at the same bytes, at every page size alike (the page size does
// not change the run length). Reading whole 2 KiB head rows makes a tile as contiguous as the contiguous
// cache's (a page-16 tile is 32 KiB in one piece): expected within 3 % of the contiguous decode, and >= 90 %
// of copy bandwidth on >= 1 GB caches. Fewer loader instructions (no per-group cursor) matter less: at
// ~13 bytes/clock/SM a tile has ~5000 cycles of budget and issues ~1/5 of them.
// Outcome (H100, 2026-11-26, outputs/experiments/20261126-paged-v04-pagerow.json): the prediction was wrong, v03 already read DRAM like the
// contiguous decode (ncu 80-86 % of peak against v02's 81-87 %), so v04 gained nothing there: 1.5-2.5 % faster
// than v03 at 128 x 2048 (one split), 1 % faster to 5 % slower at 2-16 splits, 10 % slower at 127 splits (the
// combine walks 127 partials a row). lab.ops.decode runs it only where its blocks fill a wave unsplit.
//
// Launch: grid num_splits * B * (H_kv / 8) * ceil(G * q_len / 16), 256 threads; shared memory: kStages x
// (K + V) x 128 rows x (D + 8) x 2 bytes: D 128, 3 stages 204 KiB (2 stages, 136 KiB, where the device has
// less); D 64, 4 stages, 144 KiB. One block per SM. Limits: H_kv a multiple of 8 (LAB_E_SHAPE otherwise:
// lab.ops runs v03 there); D in {64, 128}; fp16, bf16; q_len >= 1; page_size a positive multiple of 16;
// strides multiples of 8 elements, 16-byte aligned bases; a paged call needs page_errors (LAB_E_WORKSPACE).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_masks.cuh"
#include "common/decode_pv.cuh"
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

constexpr int kHeadsPerBlock = 8;  // KV heads of a block, one warp each: a 2 KiB run per key at D 128, H_kv 8
constexpr int kTileKeys = 16;      // one k16 step of P V; a tile never crosses a page

template <int kHeadDim_, int kStages_>
struct RowTileConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarps = kHeadsPerBlock;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kVecPerRow = kHeadDim / 8;                    // 16-byte vectors per K/V row
  static constexpr int kRowsPerTile = kTileKeys * kHeadsPerBlock;    // smem rows per K (or V) tile: [head][key]
  static constexpr int kKeyStep = kThreads / (kHeadsPerBlock * kVecPerRow);  // keys between a thread's copies
  static constexpr int kLoadIters = kTileKeys / kKeyStep;           // copies per thread per tile, K and V each
  static constexpr int kStride = kHeadDim + 8;  // padded smem row: ldmatrix's 8 rows land in 8 bank quads
  static constexpr int kTileElems = kRowsPerTile * kStride;
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kDTiles = kHeadDim / 8;
  static_assert(kThreads % (kHeadsPerBlock * kVecPerRow) == 0 && kTileKeys % kKeyStep == 0, "whole copies");
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM on sm_90");
};

// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kStages, bool kPaged>
__global__ void __launch_bounds__(RowTileConfig<kHeadDim, kStages>::kThreads, 1)
    pagerow_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                           const int row_groups) {
  using Cfg = RowTileConfig<kHeadDim, kStages>;
  constexpr int D = kHeadDim;
  extern __shared__ __align__(16) unsigned char smem[];
  const lab::decode::KVRing<T, Cfg::kStageBytes, Cfg::kTileElems> ring{smem};  // common/decode_util.cuh

  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // mma fragment row and column pair
  // Block x = ((b * chunks + c) * num_splits + split) * row_groups + rg: the 8 heads' blocks of a split are
  // one block now, and the splits of a sequence are adjacent.
  const int chunks = p.heads_kv / kHeadsPerBlock;
  const int rg = blockIdx.x % row_groups;
  const int split = (blockIdx.x / row_groups) % p.num_splits;
  const int bc = blockIdx.x / (row_groups * p.num_splits);
  const int b = bc / chunks, c = bc % chunks;
  const int h_kv = c * kHeadsPerBlock + warp;  // this warp's KV head
  const int row0 = rg * 16, rows = min(16, rows_total - row0);

  // Prologue: the sequence's length (clamped to the keys that exist), the split's keys, the walk.
  const lab::paged::SplitKeys keys = lab::paged::split_keys<kPaged>(p, b, split, chunk);  // common/paged.cuh
  int errors = keys.errors, n_keys = keys.n_keys;
  const int len = keys.len, key_begin = keys.key_begin;

  // The thread's copies: head hc of the block, vector col of the row, keys key0 + it * kKeyStep of a tile.
  const int col = (tid % Cfg::kVecPerRow) * 8;
  const int hc = (tid / Cfg::kVecPerRow) % kHeadsPerBlock;
  const int key0 = tid / (Cfg::kVecPerRow * kHeadsPerBlock);
  // Paged strides: (page, key in page, head); contiguous: (b, head, key).
  const int64_t k_key_stride = kPaged ? p.k_stride[1] : p.k_stride[2];
  const int64_t v_key_stride = kPaged ? p.v_stride[1] : p.v_stride[2];
  const int64_t k_head_stride = kPaged ? p.k_stride[2] : p.k_stride[1];
  const int64_t v_head_stride = kPaged ? p.v_stride[2] : p.v_stride[1];
  const T* k_thread = static_cast<const T*>(p.k_cache) + (c * kHeadsPerBlock + hc) * k_head_stride +
                      key0 * k_key_stride + col;
  const T* v_thread = static_cast<const T*>(p.v_cache) + (c * kHeadsPerBlock + hc) * v_head_stride +
                      key0 * v_key_stride + col;
  if (!kPaged) {
    k_thread += b * p.k_stride[0] + static_cast<int64_t>(key_begin) * k_key_stride;
    v_thread += b * p.v_stride[0] + static_cast<int64_t>(key_begin) * v_key_stride;
  }
  const int smem_thread = (hc * kTileKeys + key0) * Cfg::kStride + col;  // smem rows are [head][key]

  const int32_t* table_row = kPaged ? p.block_table + b * p.block_table_stride : nullptr;
  lab::paged::PageWalk walk;
  if (kPaged) walk.start(table_row, p.page_size, p.num_pages, key_begin, n_keys);

  // Issue tile t's cp.async (called once per tile, in order: the walk holds tile t's page id).
  auto load_tile = [&](int t, int stage) {
    int64_t ko, vo;
    bool ok = true;
    if (kPaged) {
      ok = walk.offset(p.k_stride[0], k_key_stride, &ko);
      walk.offset(p.v_stride[0], v_key_stride, &vo);
    } else {
      ko = static_cast<int64_t>(t) * kTileKeys * k_key_stride;
      vo = static_cast<int64_t>(t) * kTileKeys * v_key_stride;
    }
    T* sK = ring.k(stage) + smem_thread;
    T* sV = ring.v(stage) + smem_thread;
#pragma unroll
    for (int it = 0; it < Cfg::kLoadIters; ++it) {
      const int key = t * kTileKeys + key0 + it * Cfg::kKeyStep;  // in the split
      const bool valid = ok && key < n_keys;
      const int64_t step_k = valid ? ko + it * Cfg::kKeyStep * k_key_stride : 0;
      const int64_t step_v = valid ? vo + it * Cfg::kKeyStep * v_key_stride : 0;
      lab::paged::cp_async_16_l2(sK + it * Cfg::kKeyStep * Cfg::kStride, k_thread + step_k, valid);
      lab::paged::cp_async_16_l2(sV + it * Cfg::kKeyStep * Cfg::kStride, v_thread + step_v, valid);
    }
    if (kPaged) walk.advance(n_keys - (t + 1) * kTileKeys);
  };

  int n_tiles = (n_keys + kTileKeys - 1) / kTileKeys;
  lab::decode::ring_prologue<Cfg::kStages>(n_tiles, load_tile);  // common/decode_util.cuh

  // The page-table check, while the first tiles are in flight (common/paged.cuh).
  if (kPaged) {
    lab::paged::check_page_table<Cfg::kThreads>(p, table_row, len, errors, n_keys, n_tiles);
    if (split == 0 && c == 0 && rg == 0 && tid == 0) p.page_errors[b] = errors;
  }

  // Q fragments and each fragment row's causal key limit in the split (common/paged.cuh).
  uint32_t qf[Cfg::kKSteps][4];
  int row_keys[2];
  lab::paged::load_q_frags<T, Cfg::kKSteps>(qf, row_keys, p, b, h_kv, group, row0, rows, len, key_begin, n_keys, gid,
                                            tig);

  const float qk_scale = p.scale * kLog2e;
  float acc[Cfg::kDTiles][4] = {};
  float m_run[2] = {-INFINITY, -INFINITY};  // log2 units, quad-uniform
  float l_run[2] = {0.f, 0.f};              // this lane's share of the row sum
  // The warp's 16 rows of each tile start at row 16 * warp (head-major smem); v02/v03's ldmatrix lanes.
  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);

  // Main loop
  // [lab:pagerow-loop] one 16-key tile of the 8 heads per iteration; each warp: its head's S, softmax, P V
  for (int t = 0; t < n_tiles; ++t) {
    lab::decode::ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_util.cuh
    const T* sK = ring.k(t % Cfg::kStages);
    const T* sV = ring.v(t % Cfg::kStages);

    float s[2][4] = {};
    lab::decode::warp_qk<T, Cfg::kKSteps>(s, qf, sK + kvl.k_key * Cfg::kStride + kvl.k_col);
    const int limit[2] = {row_keys[0] - t * kTileKeys, row_keys[1] - t * kTileKeys};
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int nt = e / 4, half = (e / 2) % 2;
      const int key = nt * 8 + 2 * tig + (e % 2);
      float& x = s[nt][e % 4];
      x = key < limit[half] ? x * qk_scale : -INFINITY;
      tile_max[half] = fmaxf(tile_max[half], x);
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(kFullMask, tile_max[h], 2));
      const float m_new = fmaxf(m_run[h], tile_max[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp2(-inf - 0) = 0, never NaN
      alpha[h] = exp2f(m_run[h] - m_use[h]);
      m_run[h] = m_new;
      l_run[h] *= alpha[h];
    }
    uint32_t pa[4];  // P as the A fragment: a0 (gid, keys 0-7), a1 (gid+8, 0-7), a2 (gid, 8-15), a3 (gid+8, 8-15)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int nt = i / 2, h = i % 2;
      pa[i] = Elem<T>::from_float2(exp2f(s[nt][2 * h] - m_use[h]), exp2f(s[nt][2 * h + 1] - m_use[h]));
      const float2 rounded = Elem<T>::to_float2(pa[i]);
      l_run[h] += rounded.x + rounded.y;
    }
    lab::decode::rescale_pv<T, Cfg::kDTiles>(acc, alpha, pa, sV + kvl.v_key * Cfg::kStride + kvl.v_col);
  }
  // [/lab:pagerow-loop]
  lab::decode::cp_async_wait<0>();

  // Epilogue: the warp owns its rows over the whole split: O (one split) or the fp32 partials, from registers.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(kFullMask, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(kFullMask, l_run[h], 2);
    const int r = gid + 8 * h;
    if (r >= rows) continue;
    const float l = l_run[h];
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l == 0: no key seen (empty split, bad table, causal)
    const int rr = row0 + r;
    const int head = h_kv * group + rr / p.q_len;
    const int tok = rr % p.q_len;
    const int64_t out_row = (static_cast<int64_t>(b) * p.heads_q + head) * p.q_len + tok;
    const float lse = l > 0.f ? (m_run[h] + log2f(l)) * lab::decode::kLn2 : -INFINITY;
    if (p.num_splits == 1) {
      T* dst = static_cast<T*>(p.o) + b * p.o_stride[0] + head * p.o_stride[1] + tok * p.o_stride[2] + 2 * tig;
#pragma unroll
      for (int i = 0; i < Cfg::kDTiles; ++i)
        *reinterpret_cast<uint32_t*>(dst + i * 8) =
            Elem<T>::from_float2(acc[i][2 * h] * inv_l, acc[i][2 * h + 1] * inv_l);
      if (p.lse != nullptr && tig == 0) p.lse[out_row] = lse;
    } else {
      const int64_t part = out_row * p.num_splits + split;
      float* dst = p.partial_o + part * D + 2 * tig;
#pragma unroll
      for (int i = 0; i < Cfg::kDTiles; ++i)
        *reinterpret_cast<float2*>(dst + i * 8) = make_float2(acc[i][2 * h] * inv_l, acc[i][2 * h + 1] * inv_l);
      if (tig == 0) p.partial_lse[part] = lse;
    }
  }
}

template <typename T, int kHeadDim, int kStages, bool kPaged>
int launch_typed(const DecodeParams* p, const lab::DecodeLaunch& l) {
  using Cfg = RowTileConfig<kHeadDim, kStages>;
  constexpr auto kernel = pagerow_partial_kernel<T, kHeadDim, kStages, kPaged>;
  cudaError_t err = lab::allow_smem_once<kernel>(Cfg::kSmemBytes, l.device);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p->num_splits) * p->batch * (p->heads_kv / kHeadsPerBlock) * l.row_groups);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, l.stream>>>(*p, l.chunk, l.group, l.rows, l.row_groups);
  err = cudaGetLastError();
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return lab::decode::launch_splitk_combine<T, kHeadDim>(p, l.stream, l.use_pdl);
}

// D 128 takes 3 stages where a block may have 204 KiB of shared memory (sm_90), else 2 (sm_80: 163 KiB).
template <typename T, bool kPaged>
int dispatch(const DecodeParams* p, const lab::DecodeLaunch& l) {
  if (p->head_dim == 64) return launch_typed<T, 64, 4, kPaged>(p, l);
  int optin = 0;
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, l.device);
  return optin >= RowTileConfig<128, 3>::kSmemBytes ? launch_typed<T, 128, 3, kPaged>(p, l)
                                                    : launch_typed<T, 128, 2, kPaged>(p, l);
}

}  // namespace

extern "C" int decode_pagerow_v04(const DecodeParams* p, void* stream_ptr) {
  // D 64 and 128 only: 8 heads' 16-key tiles of D 256 need 270 KiB for two stages, and the copy mapping wants
  // 8 x D / 8 to divide the 256 threads
  if (p != nullptr && p->head_dim != 64 && p->head_dim != 128) return LAB_E_HEAD_DIM;
  if (lab::decode::decode_masks_set(p)) return LAB_E_MODE;  // no mask steps (common/decode_masks.cuh)
  const int rc = lab::check_decode_params(p);  // common/launch.h
  if (rc < 0) return rc;
  if (const int bad = lab::paged::check_paged_params(p)) return bad;  // common/paged.cuh
  if (p->heads_kv % kHeadsPerBlock != 0) return LAB_E_SHAPE;
  if (rc > 0) return 0;  // nothing to compute
  lab::DecodeLaunch l;   // rows in 16-row groups, chunk of whole 16-key tiles, device, PDL, stream
  if (const int bad = lab::decode_launch(p, kTileKeys, 16, stream_ptr, &l)) return bad;
  const bool paged = p->block_table != nullptr;
  if (p->dtype == LAB_FP16) return paged ? dispatch<__half, true>(p, l) : dispatch<__half, false>(p, l);
  return paged ? dispatch<__nv_bfloat16, true>(p, l) : dispatch<__nv_bfloat16, false>(p, l);
}
