// Changes: vs decode v01: Q K^T and P V on mma.sync, one block per SM split plan, L2::128B hint.
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a -DDECODE_FN=decode_splitk_v02 tools/gpu/decode_main.cu kernels/decode/v02_mma.cu -o /tmp/dec2 && /tmp/dec2
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-decode-v02-mma.json.
//
// decode_splitk_v02: split-K (flash-decoding) attention over a KV cache, tensor cores for Q K^T and P V.
//
// Same contract, chunking rule, partial-workspace layout and combine as decode_splitk_v01 (read its header
// for the algebra; lab/decode/splits.py emulates both). What changes is pass 1.
//
// Why. v01 does Q K^T and P V with scalar FP32 FMAs. With one query row per KV head (Hkv = Hq) that is
// cheap and v01 runs at ~4.4 TB/s on an H200; with 4 rows (GQA group 4) the FMAs, bf16 unpacks, broadcast
// Q loads and three block barriers per tile make it latency/issue bound at ~3.3 TB/s.
//
// Pass 1, one block (4 warps) per (split s, b, h_kv, row group of 16). The R = G * q_len query rows of the
// KV head are padded to one m16 MMA tile (rows past R are zero and never written); R > 16 is cut into
// row groups of 16 whose blocks are adjacent in the grid, so they read the same chunk at about the same
// time (through L2). A 64-key K/V tile arrives by 16-byte cp.async in a kStages ring, exactly as in v01.
// Warp w owns keys [16w, 16w + 16) of every tile and runs its own online softmax over them
// (FlashAttention-2 register layout):
//     S   = Q K_w^T        mma.sync m16n8k16, A = Q fragments kept in registers for the whole kernel,
//                          B = K rows by ldmatrix (2 n-tiles x D/16 k-steps = 16 MMAs at D = 128)
//     m, l, O update       scores scaled by scale * log2 e in fp32, exp2; P rounded to the input dtype
//                          and l summed from the rounded P, so O / l is an exact convex combination
//     O  += P V_w          mma.sync, A = P straight from the S accumulators, B = V by ldmatrix.trans
//                          (D/8 n-tiles = 16 MMAs at D = 128)
// No block barrier inside a tile except the ring's one. At the end the 4 warps' (m, l, O) are merged
// through shared memory (the freed K/V ring) and the block writes O (num_splits == 1) or the fp32
// partial O^(s), LSE^(s).
//
// Pass 2 (combine) is v01's: one warp per output row, launched with programmatic dependent launch.
//
// Shared memory (D = 128): 3 stages x 64 keys x (K + V) x 272 bytes (rows padded by 16 bytes: ldmatrix
// reads 8 rows at one 16-byte column, a 272-byte stride puts them in 8 different bank quads) = 102 KiB,
// two can share an H100/H200 SM (the split heuristic plans one, see below). D = 64: 4 stages, 72 KiB. The other
// head dims (80, 96, 192, 256) take their ring depth from common/decode_head_dim.cuh; at D > 128 Q's 16 rows wait
// in shared memory after the ring (ldmatrix per k-step) instead of registers: O alone is D / 2 registers a thread,
// and with Q's D / 4 beside it D 256 spilled 228 bytes (now none on sm_90a; 12-16 bytes on sm_80).
// The K/V cp.async carry an L2::128B prefetch-size hint (V02_L2_PREFETCH; +2-3 % on the large cells).
//
// Limits: D in {64, 80, 96, 128, 192, 256} (any multiple of 16 tiles exactly: common/decode_head_dim.cuh, which
// also picks the ring depth per D); fp16 and bf16; any q_len >= 1 (row groups of 16); Hq multiple of Hkv; any
// cache length, per-sequence lengths clamped to [0, S_cache]. Strides multiples of 8 elements, 16-byte
// aligned bases (LAB_E_SHAPE otherwise).
//
// Split count: lab/decode/splits.py choose_num_splits_v02 (= choose_num_splits with blocks_per_sm = 1): half of
// v01's splits for batch 1 and 8; measured 5-11 % faster than planning two blocks per SM on the batch-1
// GQA cells, within +-3 % elsewhere (Hkv 8, batch 8, 16k keys is bimodal with 2 splits: 138 or 153 us).
//
// Measured (H200, 2026-11-21, outputs/driver_logs/20261121-h200-decode-v02-final-*.log): GQA group 4
// (Hkv 8) cells 1.11-1.28x faster than v01, 4.1-4.4 TB/s (98-104 % of copy bandwidth) on cells with
// >= 256 MB of K+V; MHA (Hkv 32, one row padded to 16) 0.90-1.03x v01. Tried and dropped: a 6-stage ring
// with one block per SM (no gain), per-row cp.async.bulk copies on an mbarrier (equal at two blocks per SM,
// 1.4-1.6x slower at one), L2::256B (below L2::128B).
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_masks.cuh"
#include "common/decode_pv.cuh"
#include "common/decode_util.cuh"
#include "common/mma.cuh"
#include "common/splitk_combine.cuh"
#include "common/params.h"

namespace {

using lab::decode::Elem;
using lab::decode::kLog2e;

// Ring depth per head dim: lab::decode::HeadDimPlan (common/decode_head_dim.cuh), with the options it rejected.
// Rescale the O accumulators only when a row max of the warp moved (~0.3 % on the H200).
#ifndef V02_LAZY_RESCALE
#define V02_LAZY_RESCALE 1
#endif

template <int kHeadDim_, int kStages_>
struct MmaConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kRows = 16;  // one m16 tile of query rows per block
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kBlockN = 64;               // keys per tile; 16 per warp
  static constexpr int kWarpKeys = kBlockN / kWarps;
  static constexpr int kStages = kStages_;
  static constexpr int kVecElems = 8;
  static constexpr int kVecPerRow = kHeadDim / kVecElems;
  static constexpr int kStride = kHeadDim + kVecElems;  // padded row (elements) for K and V
  static constexpr int kTileElems = kBlockN * kStride;
  static constexpr int kStageBytes = 2 * kTileElems * 2;
  static constexpr int kRingBytes = kStages * kStageBytes;
  // D > 128: Q's 16 rows in shared memory after the ring, not in registers (common/decode_pv.cuh stage_q_rows)
  static constexpr bool kQInSmem = kHeadDim > 128;
  static constexpr int kSmemBytes = kRingBytes + (kQInSmem ? kRows * kStride * 2 : 0);
  static constexpr int kLoadIters = kBlockN * kVecPerRow / kThreads;
  static constexpr int kKSteps = kHeadDim / 16;  // k-steps of Q K^T
  static constexpr int kDTiles = kHeadDim / 8;   // n-tiles of P V
  // Epilogue scratch: O [warps][16][D] fp32 + m, l [warps][16].
  static constexpr int kMergeBytes = kWarps * kRows * kHeadDim * 4 + 2 * kWarps * kRows * 4;
  static_assert(kWarpKeys == 16, "one k16 step of P V per warp and tile");
  static_assert(kMergeBytes <= kRingBytes, "merge scratch reuses the ring");
  static_assert(kSmemBytes <= 163 * 1024, "fits an A100 block (sm_80's opt-in limit)");
  static_assert((kBlockN * kVecPerRow) % kThreads == 0, "whole vectors per thread");
};

// L2 prefetch-size hint of the K/V cp.async: 128 (default) asks L2 to fetch the whole 128-byte line
// per request; measured +2-3 % on the large bench-decode cells (H200). 0: no hint, 256: 256 bytes.
#ifndef V02_L2_PREFETCH
#define V02_L2_PREFETCH 128
#endif
// 16-byte cp.async, optionally with an L2 prefetch-size hint (more DRAM bytes per request).
__device__ __forceinline__ void cp_async_16_pf(void* smem_dst, const void* gmem_src, bool valid) {
#if V02_L2_PREFETCH == 0
  lab::decode::cp_async_16(smem_dst, gmem_src, valid);
#else
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
#if V02_L2_PREFETCH == 256
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
#else
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
#endif
#endif
}


// Pass 1. See the header comment.
template <typename T, int kHeadDim, int kStages>
__global__ void __launch_bounds__(MmaConfig<kHeadDim, kStages>::kThreads)
    mma_partial_kernel(const DecodeParams p, const int chunk, const int group, const int rows_total,
                       const int row_groups) {
  using Cfg = MmaConfig<kHeadDim, kStages>;
  constexpr int D = kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  extern __shared__ __align__(16) unsigned char smem[];
  const lab::decode::KVRing<T, Cfg::kStageBytes, Cfg::kTileElems> ring{smem};  // common/decode_util.cuh

  lab::decode::pdl_launch_dependents();

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int gid = lane / 4, tig = lane % 4;  // MMA row (and row + 8) and column pair of this lane
  const lab::decode::RowBlock blk = lab::decode::row_block<Cfg::kRows>(p, rows_total, row_groups);  // decode_pv.cuh
  const int split = blk.split, b = blk.b, h_kv = blk.h_kv, row0 = blk.row0, rows = blk.rows;

  const auto kv = lab::decode::split_kv<T>(p, b, h_kv, split, chunk);  // common/decode_util.cuh
  const int n_keys = kv.n_keys;
  const int n_tiles = (n_keys + Bc - 1) / Bc;

  const int64_t k_row_stride = p.k_stride[2];
  const int64_t v_row_stride = p.v_stride[2];

  auto load_tile = [&](int tile, int stage) {  // common/decode_util.cuh, with the L2 hint
    lab::decode::load_split_tile<Cfg::kThreads, Cfg::kLoadIters, Cfg::kVecPerRow, Cfg::kVecElems, Bc>(
        ring.k(stage), Cfg::kStride, ring.v(stage), Cfg::kStride, kv, k_row_stride, v_row_stride, tile, tid,
        cp_async_16_pf);
  };

  // Prologue: start the stream, then fetch Q fragments from global memory (unscaled, input dtype: the
  // scale is applied to the fp32 scores so Q keeps its exact values).
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    lab::decode::cp_async_commit();
  }

  uint32_t qf[Cfg::kQInSmem ? 1 : Cfg::kKSteps][4];
  T* const sQ = reinterpret_cast<T*>(smem + Cfg::kRingBytes);  // D > 128 only
  if constexpr (Cfg::kQInSmem) {
    lab::decode::stage_q_rows<T, D, Cfg::kThreads, Cfg::kStride>(sQ, p, b, h_kv, group, row0, rows, tid);
  } else {
    const T* qrow[2] = {nullptr, nullptr};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = gid + 8 * half;
      if (r < rows) {
        const int rr = row0 + r;
        const int h = h_kv * group + rr / p.q_len;
        const int tok = rr % p.q_len;
        qrow[half] = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + tok * p.q_stride[2];
      }
    }
#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const int half = reg & 1;         // a0, a2: row gid; a1, a3: row gid + 8
        const int col = kk * 16 + 2 * tig + (reg >> 1) * 8;
        qf[kk][reg] = qrow[half] ? __ldg(reinterpret_cast<const unsigned int*>(qrow[half] + col)) : 0u;
      }
    }
  }

  const float qk_scale = p.scale * kLog2e;
  float acc[Cfg::kDTiles][4];
#pragma unroll
  for (int i = 0; i < Cfg::kDTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // rows gid, gid + 8; log2 units; quad-uniform
  float l_run[2] = {0.f, 0.f};              // this lane's partial row sums

  const lab::decode::WarpKVLanes kvl = lab::decode::warp_kv_lanes(warp, lane);  // ldmatrix lanes, decode_pv.cuh

  // [lab:inner-loop] one key tile per iteration: S = Q K^T on tensor cores, online softmax, O += P V
  for (int t = 0; t < n_tiles; ++t) {
    lab::decode::ring_step<Cfg::kStages>(t, n_tiles, load_tile);  // common/decode_util.cuh
    const T* sK = ring.k(t % Cfg::kStages);
    const T* sV = ring.v(t % Cfg::kStages);

    // S = Q K^T for this warp's 16 keys: s[nt] covers keys 8 nt .. 8 nt + 7.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (Cfg::kQInSmem)
      lab::decode::warp_qk_smem<T, Cfg::kKSteps>(s, sQ + (lane % 16) * Cfg::kStride + (lane / 16) * 8,
                                                 sK + kvl.k_key * Cfg::kStride + kvl.k_col);
    else
      lab::decode::warp_qk<T, Cfg::kKSteps>(s, qf, sK + kvl.k_key * Cfg::kStride + kvl.k_col);

    // Online softmax over the warp's keys; keys past the chunk end are -inf.
    const int n_valid = n_keys - t * Bc;  // >= 1
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = warp * Cfg::kWarpKeys + nt * 8 + 2 * tig + (e & 1);
        const float v = key < n_valid ? s[nt][e] * qk_scale : -INFINITY;
        s[nt][e] = v;
        tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
      }
    float alpha[2], m_use[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(lab::decode::kFullMask, tmax[h], 1));
      tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(lab::decode::kFullMask, tmax[h], 2));
      const float m_new = fmaxf(m_run[h], tmax[h]);
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // a warp whose keys are all masked so far
      alpha[h] = exp2f(m_run[h] - m_use[h]);        // -inf -> 0
      m_run[h] = m_new;
    }
    uint32_t pa[4];  // A fragment of P (16 rows x 16 keys)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t packed =
            Elem<T>::from_float2(exp2f(s[nt][2 * h] - m_use[h]), exp2f(s[nt][2 * h + 1] - m_use[h]));
        const float2 rounded = Elem<T>::to_float2(packed);
        l_run[h] = l_run[h] * (nt == 0 ? alpha[h] : 1.f) + rounded.x + rounded.y;
        pa[nt * 2 + h] = packed;  // a0: (gid, keys 0-7), a1: (gid+8, 0-7), a2: (gid, 8-15), a3: (gid+8, 8-15)
      }
    // Rescale O only when some row max moved, then O += P V for this warp's 16 keys (common/decode_pv.cuh).
    lab::decode::rescale_pv<T, Cfg::kDTiles, V02_LAZY_RESCALE != 0>(acc, alpha, pa,
                                                                    sV + kvl.v_key * Cfg::kStride + kvl.v_col);
  }
  // [/lab:inner-loop]

  // Epilogue: merge the 4 warps' (m, l, O) through the freed ring.
  lab::decode::cp_async_wait<0>();
  __syncthreads();
  float* sO = reinterpret_cast<float*>(smem);              // [warp][16][D]
  float* sM = sO + Cfg::kWarps * Cfg::kRows * D;           // [warp][16]
  float* sL = sM + Cfg::kWarps * Cfg::kRows;               // [warp][16]
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(lab::decode::kFullMask, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(lab::decode::kFullMask, l_run[h], 2);
  }
  {
    float* o_w = sO + warp * Cfg::kRows * D;
#pragma unroll
    for (int i = 0; i < Cfg::kDTiles; ++i) {
      const int col = i * 8 + 2 * tig;
      *reinterpret_cast<float2*>(o_w + gid * D + col) = make_float2(acc[i][0], acc[i][1]);
      *reinterpret_cast<float2*>(o_w + (gid + 8) * D + col) = make_float2(acc[i][2], acc[i][3]);
    }
    if (tig == 0) {
      sM[warp * Cfg::kRows + gid] = m_run[0];
      sM[warp * Cfg::kRows + gid + 8] = m_run[1];
      sL[warp * Cfg::kRows + gid] = l_run[0];
      sL[warp * Cfg::kRows + gid + 8] = l_run[1];
    }
  }
  __syncthreads();

  lab::decode::merge_warps_store<T, Cfg::kWarps, Cfg::kRows, D, Cfg::kThreads>(sO, sM, sL, p, rows, row0, b, h_kv,
                                                                                group, split, tid);  // decode_pv.cuh
}

template <typename T, int kHeadDim, int kStages>
int launch_typed(const DecodeParams* p, cudaStream_t stream, int chunk, int group, int rows_total, int row_groups,
                 int device, bool use_pdl) {
  using Cfg = MmaConfig<kHeadDim, kStages>;
  cudaError_t err = lab::allow_smem_once<mma_partial_kernel<T, kHeadDim, kStages>>(Cfg::kSmemBytes, device);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p->num_splits) * p->batch * p->heads_kv * row_groups);
  mma_partial_kernel<T, kHeadDim, kStages><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      *p, chunk, group, rows_total, row_groups);
  err = cudaGetLastError();
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return lab::decode::launch_splitk_combine<T, kHeadDim>(p, stream, use_pdl);
}

constexpr int kKeyBlock = 64;  // must equal MmaConfig::kBlockN and lab/decode/splits.py's BLOCK_N

}  // namespace

extern "C" int decode_splitk_v02(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == MmaConfig<128, 3>::kBlockN, "chunk rounding must match the kernel's key block");
  if (lab::decode::decode_masks_set(p)) return LAB_E_MODE;  // no mask steps (common/decode_masks.cuh)
  if (const int rc = lab::check_decode_params(p)) return rc < 0 ? rc : 0;  // common/launch.h
  lab::DecodeLaunch l;  // rows in 16-row groups, chunk, device, PDL, stream (common/launch.h)
  if (const int bad = lab::decode_launch(p, kKeyBlock, 16, stream_ptr, &l)) return bad;
  // The head dim and its ring depth: common/decode_head_dim.cuh.
  return lab::decode::with_head_dim(p->head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value;
    constexpr int kStages = lab::decode::HeadDimPlan<D>::kStages;
    return p->dtype == LAB_FP16
               ? launch_typed<__half, D, kStages>(p, l.stream, l.chunk, l.group, l.rows, l.row_groups, l.device,
                                                  l.use_pdl)
               : launch_typed<__nv_bfloat16, D, kStages>(p, l.stream, l.chunk, l.group, l.rows, l.row_groups, l.device,
                                                         l.use_pdl);
  });
}
