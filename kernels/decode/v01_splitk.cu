// Changes: first decode version (split-K, scalar fp32, LSE combine).
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a tools/gpu/decode_main.cu kernels/decode/v01_splitk.cu -o /tmp/dec && /tmp/dec
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-decode-v01-splitk.json.
//
// decode_splitk_v01: split-K (flash-decoding) attention over a KV cache.
//
// Algorithm, paper notation. A query group Q_g holds every query row that
// reads KV head h_kv: the G = Hq/Hkv query heads of the group times q_len
// tokens, R = G * q_len rows (R <= kRows, see below). The cache of sequence b
// holds N_b = cache_seqlens[b] keys. It is cut into num_splits chunks of
//     chunk = roundup(ceil(S_cache / num_splits), B_c)   keys,
// split s covering keys [s*chunk, min((s+1)*chunk, N_b)), possibly empty.
//
// Pass 1, one block per (split s, b, h_kv): stream the chunk's K_j, V_j tiles
// (B_c = 64 keys) once, for all R rows at the same time:
//     S_ij   = (scale * log2 e) * Q_i K_j^T          (scores in log2 units)
//     m_i'   = max(m_i, rowmax(S_ij))
//     P_ij   = exp2(S_ij - m_i')
//     l_i    = exp2(m_i - m_i') * l_i + rowsum(P_ij)
//     O_i    = exp2(m_i - m_i') * O_i + P_ij V_j
// and finish with O_i / l_i and LSE_i = ln 2 * (m_i + log2 l_i) (natural
// log). With num_splits == 1 that is the answer: write O (input dtype) and
// LSE. Otherwise write the fp32 partial O^(s) and LSE^(s) to the workspaces
// partial_o [B, Hq, q_len, num_splits, D] and partial_lse [B, Hq, q_len,
// num_splits]. An empty split writes O^(s) = 0 and LSE^(s) = -inf.
//
// Pass 2 (combine), one warp per output row:
//     M = max_s LSE^(s),  w_s = exp(LSE^(s) - M),
//     O = sum_s w_s O^(s) / sum_s w_s,   LSE = M + ln sum_s w_s
// If every split is empty (N_b == 0) M = -inf: O = 0 and LSE = -inf, by
// definition (the softmax over zero keys is empty; no NaN is produced).
//
// Launch shape.
//   pass 1: grid (num_splits * B * Hkv, ceil(R / kRows)), 128 threads.
//     kRows in {1, 4, 16, 64} is the smallest that holds R; when R > 64
//     (e.g. G = 8 and q_len = 16) the rows are cut into groups of 64 on
//     grid.y and each group re-reads the chunk (the only case where K/V is
//     read more than once).
//     Shared memory: kStages x (K tile 64 x (D+8) + V tile 64 x D) 16-bit
//     + Q (kRows x D fp32) + scores (2 x kRows x 64 fp32) + row state.
//     D=128: kRows 1: 100.0 KiB, 4: 103.0 KiB (2 blocks/SM on H100), 16:
//     115.2 KiB, 64: 130.8 KiB (2 stages). D=64: 4 stages, 68.8-82.8 KiB.
//   pass 2: grid ceil(B * Hq * q_len / 4), 128 threads, no shared memory;
//     launched with programmatic dependent launch on sm_90 so its launch
//     latency hides under pass 1.
//
// Memory pipeline. K and V tiles arrive by 16-byte cp.async in a kStages
// ring: while tile t is being used, tiles t+1 .. t+kStages-1 are in flight,
// 2 x 32 KB = 64 KB per block for D = 128 (HBM3 wants > ~40 KB per SM).
// Each thread issues 16 cp.async per tile, 8 for K and 8 for V.
//
// Work split inside a block (128 threads).
//   Q K^T: thread = (key j = tid % 64, half of D = tid / 64); it keeps 16 rows
//     of scores in registers and walks its 64 (or 32) dims in 16-byte steps.
//     The two halves add up in the softmax step through shared memory.
//   softmax: warp w owns rows w, w+4, ...; lane owns keys lane and lane+32.
//   P V: thread = (column pair, row group, key group); with one row the 64
//     keys are split between the groups and reduced once in the epilogue.
//   Scalar FP32 FMAs throughout: at q_len = 1 the block does 2 FMAs per 4
//   bytes loaded, far below what the SM can issue, so the kernel is bound
//   by HBM. With R = 64 (q_len 16, G 4) it becomes FMA bound (~3x the
//   memory time); a tensor-core version is the obvious v02.
//
// Limits: D in {64, 128}; fp16 and bf16; any q_len >= 1 (tuned for 1..16);
// any Hq multiple of Hkv; any cache length, per-sequence lengths clamped to
// [0, S_cache]. Strides must be multiples of 8 elements and base pointers
// 16-byte aligned (Python guarantees it; checked, LAB_E_SHAPE otherwise).
//
// Measured effect: outputs/experiments/20261121-decode-v01-splitk.json (H100; H200 in 20261121-decode-v02-mma.json).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_masks.cuh"
#include "common/decode_util.cuh"
#include "common/splitk_combine.cuh"
#include "common/params.h"

namespace {

using lab::decode::Elem;
using lab::decode::kLn2;
using lab::decode::kLog2e;

constexpr int kSmemLimitSm80 = 163 * 1024;  // largest opt-in block smem on A100; H100 allows 227 KB

template <int kHeadDim_, int kRows_>
struct SplitKConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = kRows_;  // query rows (heads x tokens) per block
  static constexpr int kThreads = 128;  // 4 warps: enough for 16 cp.async each per tile, few enough that
                                        // two blocks fit per SM at D = 128
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kBlockN = 64;  // B_c, keys per tile: 32 KB of K+V at D = 128
  // Stages: 3 keeps 2 tiles (64 KB at D = 128) in flight; D = 64 tiles are half as big so one more
  // stage; kRows = 64 needs the smem for Q and scores and is FMA bound anyway.
  static constexpr int kStages = kRows >= 64 ? 2 : (kHeadDim == 64 ? 4 : 3);
  static constexpr int kVecElems = 8;  // 16-byte vectors of 16-bit elements
  static constexpr int kVecPerRow = kHeadDim / kVecElems;
  // K rows padded by 16 bytes: in Q K^T each lane reads its own key row, so consecutive keys must
  // start 16 bytes apart in bank space (row stride = 16 mod 128 bytes) to be conflict free.
  static constexpr int kKStride = kHeadDim + kVecElems;
  // V rows are read along the row (one row per warp access), no padding needed.
  static constexpr int kVStride = kHeadDim;
  static constexpr int kKTileElems = kBlockN * kKStride;
  static constexpr int kVTileElems = kBlockN * kVStride;
  static constexpr int kStageBytes = (kKTileElems + kVTileElems) * 2;
  static constexpr int kQBytes = kRows * kHeadDim * 4;
  static constexpr int kScoreBytes = 2 * kRows * kBlockN * 4;
  static constexpr int kRowStateBytes = 3 * kRows * 4;  // m_i, l_i, alpha_i
  static constexpr int kSmemBytes = kStages * kStageBytes + kQBytes + kScoreBytes + kRowStateBytes;
  static constexpr int kLoadIters = kBlockN * kVecPerRow / kThreads;  // 16-byte vectors of K (and of V) per thread
  static constexpr int kQLoadIters = (kRows * kVecPerRow + kThreads - 1) / kThreads;

  // Q K^T mapping.
  static constexpr int kQKSplits = kThreads / kBlockN;      // threads per key, each takes a slice of D
  static constexpr int kQKDims = kHeadDim / kQKSplits;      // dims per thread
  // Score registers per thread. The compiler hoists the Q loads of a whole row tile, so a tile
  // costs ~9 registers per row; with kRows = 64 the 64 P V accumulators are live too, and 8 rows
  // is what fits without spilling.
  static constexpr int kQKRowTile = kRows < 16 ? kRows : (kRows >= 64 ? 8 : 16);

  // P V mapping.
  static constexpr int kColPairs = kHeadDim / 2;
  static constexpr int kPVGroups = kThreads / kColPairs;
  static constexpr int kPVRowGroups = kRows < kPVGroups ? kRows : kPVGroups;
  static constexpr int kPVKeyGroups = kPVGroups / kPVRowGroups;
  static constexpr int kPVRowsPerThread = kRows / kPVRowGroups;
  static constexpr int kPVKeysPerGroup = kBlockN / kPVKeyGroups;
  static constexpr int kPVKeyUnroll = 4;  // one float4 of P per row per step
  // Key steps unrolled in P V: two steps give more loads in flight; with many rows per thread the
  // row loop already has plenty and unrolling only costs registers (and spills on sm_80).
  static constexpr int kPVUnroll = kPVRowsPerThread > 8 ? 1 : 2;

  static_assert(kThreads % kBlockN == 0 && kHeadDim % (kQKSplits * kVecElems) == 0, "Q K^T mapping");
  static_assert(kRows % kQKRowTile == 0, "row tiles");
  static_assert(kThreads % kColPairs == 0 && kColPairs % 32 == 0, "a warp must sit inside one P V group");
  static_assert(kRows % kPVRowGroups == 0 && kPVKeysPerGroup % kPVKeyUnroll == 0, "P V mapping");
  static_assert(kBlockN % 32 == 0, "softmax: a lane owns kBlockN / 32 keys");
  static_assert((kBlockN * kVecPerRow) % kThreads == 0, "tile load: whole vectors per thread");
  static_assert((kPVKeyGroups - 1) * kRows * kHeadDim * 4 <= kStageBytes, "epilogue reduction reuses stage 0");
  static_assert(kSmemBytes <= kSmemLimitSm80, "shared memory must fit an A100 block (and so an H100 block)");
};

// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kRows>
__global__ void __launch_bounds__(SplitKConfig<kHeadDim, kRows>::kThreads)
    splitk_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total) {
  using Cfg = SplitKConfig<kHeadDim, kRows>;
  constexpr int D = kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  float* sQ = reinterpret_cast<float*>(smem + Cfg::kStages * Cfg::kStageBytes);  // [kRows][D], pre-scaled
  float* sS = sQ + kRows * D;                  // [2][kRows][Bc]: half-D partial scores, then P in half 0
  float* sM = sS + 2 * kRows * Bc;             // m_i, log2 units
  float* sL = sM + kRows;                      // l_i
  float* sAlpha = sL + kRows;                  // exp2(m_old - m_new) of the current tile
  auto stage_k = [&](int s) { return reinterpret_cast<T*>(smem + s * Cfg::kStageBytes); };
  auto stage_v = [&](int s) { return reinterpret_cast<T*>(smem + s * Cfg::kStageBytes) + Cfg::kKTileElems; };

  // Let the combine grid launch now: it only starts running once every block of this grid has
  // started, so it never takes a slot from pass 1, and it waits for our writes before reading.
  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x;
  const int num_splits = p.num_splits;
  const int split = blockIdx.x % num_splits;
  const int bh = blockIdx.x / num_splits;
  const int b = bh / p.heads_kv;
  const int h_kv = bh % p.heads_kv;
  const int row0 = blockIdx.y * kRows;
  const int rows = min(kRows, rows_total - row0);

  const auto kv = lab::decode::split_kv<T>(p, b, h_kv, split, chunk);  // common/decode_util.cuh
  const int n_keys = kv.n_keys;
  const int n_tiles = (n_keys + Bc - 1) / Bc;

  const int64_t k_row_stride = p.k_stride[2];
  const int64_t v_row_stride = p.v_stride[2];

  // One tile = Bc rows of K and V, kVecPerRow 16-byte vectors each (common/decode_util.cuh).
  auto load_tile = [&](int tile, int stage) {
    lab::decode::load_split_tile<Cfg::kThreads, Cfg::kLoadIters, Cfg::kVecPerRow, Cfg::kVecElems, Bc>(
        stage_k(stage), Cfg::kKStride, stage_v(stage), Cfg::kVStride, kv, k_row_stride, v_row_stride, tile, tid,
        lab::decode::cp_async_16);
  };

  // Prologue
  // Start the K/V stream first so the Q load and the smem initialisation hide under it. Every
  // stage commits a group, even an empty one, so the wait count below stays a constant.
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    lab::decode::cp_async_commit();
  }

  // Q rows r = (query head within the group) * q_len + token, scaled by scale * log2 e so the
  // scores come out in log2 units and the softmax uses exp2 directly. Rows past R are zero.
  const float q_scale = p.scale * kLog2e;
#pragma unroll
  for (int it = 0; it < Cfg::kQLoadIters; ++it) {
    const int i = tid + it * Cfg::kThreads;
    if (i >= kRows * Cfg::kVecPerRow) break;
    const int r = i / Cfg::kVecPerRow;
    const int c = (i % Cfg::kVecPerRow) * Cfg::kVecElems;
    float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (r < rows) {
      const int rr = row0 + r;
      const int h = h_kv * group + rr / p.q_len;
      const int tok = rr % p.q_len;
      const T* src = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + tok * p.q_stride[2] + c;
      lab::decode::unpack8<T>(__ldg(reinterpret_cast<const uint4*>(src)), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] *= q_scale;
    }
    float4* dst = reinterpret_cast<float4*>(sQ + r * D + c);
    dst[0] = make_float4(f[0], f[1], f[2], f[3]);
    dst[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
  // Scores start at zero so rows past R (never touched by the softmax) give P = 0, not garbage.
  for (int i = tid; i < 2 * kRows * Bc; i += Cfg::kThreads) sS[i] = 0.f;
  for (int r = tid; r < kRows; r += Cfg::kThreads) {
    sM[r] = -INFINITY;
    sL[r] = 0.f;
    sAlpha[r] = 0.f;
  }

  // P V ownership (fixed for the whole kernel).
  const int pv_col = 2 * (tid % Cfg::kColPairs);
  const int pv_group = tid / Cfg::kColPairs;
  const int pv_row_group = pv_group % Cfg::kPVRowGroups;
  const int pv_key_group = pv_group / Cfg::kPVRowGroups;
  float acc[Cfg::kPVRowsPerThread][2];
#pragma unroll
  for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) acc[i][0] = acc[i][1] = 0.f;

  // Q K^T ownership.
  const int qk_key = tid % Bc;
  const int qk_part = tid / Bc;

  const int warp = tid / 32;
  const int lane = tid % 32;

  // Main loop
  for (int t = 0; t < n_tiles; ++t) {
    // Tile t is complete once at most kStages-2 younger groups are pending. The barrier also
    // tells everyone that the stage refilled below was fully consumed in iteration t-1.
    lab::decode::ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_util.cuh
    const T* sK = stage_k(t % Cfg::kStages);
    const T* sV = stage_v(t % Cfg::kStages);

    // S = Q K^T over this thread's slice of D, kQKRowTile rows at a time.
    {
      const T* k_row = sK + qk_key * Cfg::kKStride + qk_part * Cfg::kQKDims;
      const float* q_part = sQ + qk_part * Cfg::kQKDims;
      for (int rt = 0; rt < rows; rt += Cfg::kQKRowTile) {
        float s[Cfg::kQKRowTile];
#pragma unroll
        for (int r = 0; r < Cfg::kQKRowTile; ++r) s[r] = 0.f;
#pragma unroll
        for (int c = 0; c < Cfg::kQKDims; c += Cfg::kVecElems) {
          float kf[8];
          lab::decode::unpack8<T>(*reinterpret_cast<const uint4*>(k_row + c), kf);
#pragma unroll
          for (int r = 0; r < Cfg::kQKRowTile; ++r) {
            // Same address across the warp: a broadcast, one smem wavefront per float4.
            const float4 q0 = *reinterpret_cast<const float4*>(q_part + (rt + r) * D + c);
            const float4 q1 = *reinterpret_cast<const float4*>(q_part + (rt + r) * D + c + 4);
            s[r] = fmaf(q0.x, kf[0], s[r]);
            s[r] = fmaf(q0.y, kf[1], s[r]);
            s[r] = fmaf(q0.z, kf[2], s[r]);
            s[r] = fmaf(q0.w, kf[3], s[r]);
            s[r] = fmaf(q1.x, kf[4], s[r]);
            s[r] = fmaf(q1.y, kf[5], s[r]);
            s[r] = fmaf(q1.z, kf[6], s[r]);
            s[r] = fmaf(q1.w, kf[7], s[r]);
          }
        }
#pragma unroll
        for (int r = 0; r < Cfg::kQKRowTile; ++r) sS[(qk_part * kRows + rt + r) * Bc + qk_key] = s[r];
      }
    }
    __syncthreads();

    // Online softmax, one warp per row; keys past the end of the chunk are masked to -inf.
    {
      const int n_valid = min(Bc, n_keys - t * Bc);  // >= 1: a tile is only visited if it has keys
      for (int r = warp; r < rows; r += Cfg::kWarps) {
        float sv[Bc / 32];
        float tile_max = -INFINITY;
#pragma unroll
        for (int u = 0; u < Bc / 32; ++u) {
          const int j = lane + 32 * u;
          float v = sS[r * Bc + j];
#pragma unroll
          for (int part = 1; part < Cfg::kQKSplits; ++part) v += sS[(part * kRows + r) * Bc + j];
          v = j < n_valid ? v : -INFINITY;
          sv[u] = v;
          tile_max = fmaxf(tile_max, v);
        }
        tile_max = lab::decode::warp_max(tile_max);
        const float m_old = sM[r];
        const float m_new = fmaxf(m_old, tile_max);  // finite: at least one valid key
        float row_sum = 0.f;
#pragma unroll
        for (int u = 0; u < Bc / 32; ++u) {
          const float pr = exp2f(sv[u] - m_new);  // masked keys: exp2(-inf) = 0
          sS[r * Bc + lane + 32 * u] = pr;
          row_sum += pr;
        }
        row_sum = lab::decode::warp_sum(row_sum);
        __syncwarp();  // every lane has read sM[r] before lane 0 overwrites it
        if (lane == 0) {
          const float alpha = exp2f(m_old - m_new);  // first tile: exp2(-inf) = 0
          sAlpha[r] = alpha;
          sL[r] = sL[r] * alpha + row_sum;
          sM[r] = m_new;
        }
      }
    }
    __syncthreads();

    // O = alpha * O + P V over this thread's column pair, rows and keys.
    {
#pragma unroll
      for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) {
        const float alpha = sAlpha[pv_row_group + i * Cfg::kPVRowGroups];
        acc[i][0] *= alpha;
        acc[i][1] *= alpha;
      }
      const int j_begin = pv_key_group * Cfg::kPVKeysPerGroup;
#pragma unroll Cfg::kPVUnroll
      for (int jj = 0; jj < Cfg::kPVKeysPerGroup; jj += Cfg::kPVKeyUnroll) {
        const int j0 = j_begin + jj;
        float2 v[Cfg::kPVKeyUnroll];
#pragma unroll
        for (int u = 0; u < Cfg::kPVKeyUnroll; ++u)
          v[u] = Elem<T>::to_float2(*reinterpret_cast<const uint32_t*>(sV + (j0 + u) * Cfg::kVStride + pv_col));
#pragma unroll
        for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) {
          const int r = pv_row_group + i * Cfg::kPVRowGroups;
          const float4 pr = *reinterpret_cast<const float4*>(sS + r * Bc + j0);
          acc[i][0] = fmaf(pr.x, v[0].x, acc[i][0]);
          acc[i][1] = fmaf(pr.x, v[0].y, acc[i][1]);
          acc[i][0] = fmaf(pr.y, v[1].x, acc[i][0]);
          acc[i][1] = fmaf(pr.y, v[1].y, acc[i][1]);
          acc[i][0] = fmaf(pr.z, v[2].x, acc[i][0]);
          acc[i][1] = fmaf(pr.z, v[2].y, acc[i][1]);
          acc[i][0] = fmaf(pr.w, v[3].x, acc[i][0]);
          acc[i][1] = fmaf(pr.w, v[3].y, acc[i][1]);
        }
      }
    }
  }

  // Epilogue
  lab::decode::cp_async_wait<0>();  // only empty groups can remain, but stage 0 is reused below
  __syncthreads();

  if constexpr (Cfg::kPVKeyGroups > 1) {
    // Key groups hold partial sums under the same m_i: a plain add merges them.
    float* red = reinterpret_cast<float*>(smem);  // [kPVKeyGroups-1][kRows][D]
    if (pv_key_group > 0) {
#pragma unroll
      for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) {
        const int r = pv_row_group + i * Cfg::kPVRowGroups;
        *reinterpret_cast<float2*>(red + ((pv_key_group - 1) * kRows + r) * D + pv_col) =
            make_float2(acc[i][0], acc[i][1]);
      }
    }
    __syncthreads();
    if (pv_key_group == 0) {
#pragma unroll
      for (int g = 1; g < Cfg::kPVKeyGroups; ++g) {
#pragma unroll
        for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) {
          const int r = pv_row_group + i * Cfg::kPVRowGroups;
          const float2 o = *reinterpret_cast<const float2*>(red + ((g - 1) * kRows + r) * D + pv_col);
          acc[i][0] += o.x;
          acc[i][1] += o.y;
        }
      }
    }
  }

  if (pv_key_group == 0) {
#pragma unroll
    for (int i = 0; i < Cfg::kPVRowsPerThread; ++i) {
      const int r = pv_row_group + i * Cfg::kPVRowGroups;
      if (r >= rows) continue;
      const int rr = row0 + r;
      const int h = h_kv * group + rr / p.q_len;
      const int tok = rr % p.q_len;
      const float l = sL[r];
      // l >= 1 whenever the chunk had a key (the row max contributes exp2(0)); l == 0 means an
      // empty chunk: O = 0, LSE = -inf, which the combine weights by exp(-inf) = 0.
      const float inv_l = l > 0.f ? 1.f / l : 0.f;
      const float lse = l > 0.f ? (sM[r] + log2f(l)) * kLn2 : -INFINITY;
      const int64_t out_row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_len + tok;
      if (num_splits == 1) {
        T* dst = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + tok * p.o_stride[2] + pv_col;
        *reinterpret_cast<uint32_t*>(dst) = Elem<T>::from_float2(acc[i][0] * inv_l, acc[i][1] * inv_l);
        if (p.lse != nullptr && pv_col == 0) p.lse[out_row] = lse;
      } else {
        const int64_t part = out_row * num_splits + split;
        *reinterpret_cast<float2*>(p.partial_o + part * D + pv_col) =
            make_float2(acc[i][0] * inv_l, acc[i][1] * inv_l);
        if (pv_col == 0) p.partial_lse[part] = lse;
      }
    }
  }
}

template <typename T, int kHeadDim, int kRows>
int launch_typed(const DecodeParams* p, cudaStream_t stream, int chunk, int group, int rows_total, int device,
                 bool use_pdl) {
  using Cfg = SplitKConfig<kHeadDim, kRows>;
  auto partial = splitk_partial_kernel<T, kHeadDim, kRows>;
  cudaError_t err = lab::allow_smem_once<splitk_partial_kernel<T, kHeadDim, kRows>>(Cfg::kSmemBytes, device);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p->num_splits) * p->batch * p->heads_kv,
                  (rows_total + kRows - 1) / kRows);
  partial<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(*p, chunk, group, rows_total);
  err = cudaGetLastError();
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return lab::decode::launch_splitk_combine<T, kHeadDim>(p, stream, use_pdl);
}

template <typename T, int kHeadDim>
int dispatch_rows(const DecodeParams* p, cudaStream_t stream, int chunk, int group, int rows_total, int device,
                  bool use_pdl) {
  // Smallest row capacity that holds the whole group: registers and smem scale with kRows.
  if (rows_total <= 1) return launch_typed<T, kHeadDim, 1>(p, stream, chunk, group, rows_total, device, use_pdl);
  if (rows_total <= 4) return launch_typed<T, kHeadDim, 4>(p, stream, chunk, group, rows_total, device, use_pdl);
  if (rows_total <= 16) return launch_typed<T, kHeadDim, 16>(p, stream, chunk, group, rows_total, device, use_pdl);
  return launch_typed<T, kHeadDim, 64>(p, stream, chunk, group, rows_total, device, use_pdl);
}

constexpr int kKeyBlock = 64;  // must equal SplitKConfig::kBlockN and lab/decode/splits.py's block_n

}  // namespace

extern "C" int decode_splitk_v01(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == SplitKConfig<128, 1>::kBlockN && kKeyBlock == SplitKConfig<64, 1>::kBlockN,
                "chunk rounding must match the kernel's key block");
  if (p != nullptr && p->head_dim != 64 && p->head_dim != 128) return LAB_E_HEAD_DIM;  // the scalar tiles' two
  if (lab::decode::decode_masks_set(p)) return LAB_E_MODE;  // no mask steps (common/decode_masks.cuh)
  if (const int rc = lab::check_decode_params(p)) return rc < 0 ? rc : 0;  // common/launch.h
  lab::DecodeLaunch l;  // rows, chunk, device, PDL, stream (common/launch.h); rows in the grid's y
  if (const int bad = lab::decode_launch(p, kKeyBlock, 0, stream_ptr, &l)) return bad;
  const auto [group, rows, row_groups, chunk, device, use_pdl, stream] = l;
  if (p->dtype == LAB_FP16) {
    return p->head_dim == 128 ? dispatch_rows<__half, 128>(p, stream, chunk, group, rows, device, use_pdl)
                              : dispatch_rows<__half, 64>(p, stream, chunk, group, rows, device, use_pdl);
  }
  return p->head_dim == 128 ? dispatch_rows<__nv_bfloat16, 128>(p, stream, chunk, group, rows, device, use_pdl)
                            : dispatch_rows<__nv_bfloat16, 64>(p, stream, chunk, group, rows, device, use_pdl);
}
