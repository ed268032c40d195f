// Backward attention v01: FlashAttention-2's backward on mma.sync (m16n8k16, fp32 accumulate).
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...).backward(),
//   tests: .venv/bin/python -m pytest -q tests/bwd/test_backward.py tests/bwd/test_backward_gpu.py
// Measured: outputs/experiments/20261122-bwd-v01-mma.json.
//
// Given Q, K, V, the forward's O and natural-log LSE, and dO (all (B, H, S, D) through strides):
//   P   = exp(scale * Q K^T - LSE)            recomputed tile by tile, never stored
//   dV  = P^T dO                               summed over the query heads of a GQA group
//   dP  = dO V^T
//   dS  = P * (dP - Delta),  Delta = rowsum(dO * O) - dLSE   (the "D term"; dLSE is usually 0)
//   dQ  = scale * dS K,   dK = scale * dS^T Q
//
// Three launches per call:
// 1. bwd_pre: Delta and LSE * log2(e) per query row, into padded float workspaces (rows up to a
//    multiple of 64, zero-filled, so every 16-byte copy of a row block is in bounds).
// 2. bwd_dkdv: one CTA per (K/V block of 64 keys, KV head, batch), 4 warps x 16 keys. K and V stay in
//    shared memory; the CTA walks every (query head of its group, query block) pair, double-buffering
//    Q, dO, LSE and Delta with cp.async. Each warp computes S^T = K_w Q^T and dP^T = V_w dO^T for its
//    16 keys (keys as mma rows: P^T and dS^T land in registers already in the A-operand layout of
//    dV += P^T dO and dK += dS^T Q, as P does for PV in the forward). dK and dV stay in registers for
//    the whole CTA, so the GQA sum over the group is a plain loop, with no reduction and no atomics.
// 3. dQ, by one of two designs (AttnBwdParams.deterministic):
//    - atomic (default, FA2's): bwd_dkdv also writes dS^T to shared memory, the 4 warps compute the
//      block's dQ_i = dS K and add it with fp32 atomics into dq_accum; bwd_convert scales and casts.
//      5 matmuls per tile pair (the minimum), but the order of the fp32 adds into dQ depends on which
//      K/V CTA arrives first: dQ differs run to run in its last bits ("the race").
//    - deterministic: bwd_dkdv skips dQ; bwd_dq, one CTA per (64-query block, query head, batch),
//      recomputes S and dP per key block (a forward-shaped loop) and accumulates dQ in registers in a
//      fixed order: bit-identical across runs, 7 matmuls per tile pair instead of 5 (+40 % FLOPs).
//    Why atomics by default: they keep the FLOPs at FA2's 2.5x the forward; the separate pass trades
//    ~40 % more tensor work for determinism, which torch.use_deterministic_algorithms(True) asks for.
//    Outcome (H200, outputs/driver_logs/20261122-h200-bwd-run1-f42cefddfa.log): on one shape (B2 Hq8/2 S2048
//    D128 causal) the separate pass was the faster one (0.69 vs 0.84 ms with the forward): the atomics cost more
//    than the extra matmuls there.
//
// Any finite scale: the backward has LSE, so it never tracks a running max; P = exp2(s * scale *
// log2(e) - LSE * log2(e)) is right for scale < 0 and scale == 0 as written (the forward's FLT_MIN for
// 0 only moves LSE by ~1e-38). Masked elements (causal, rows >= Sq, keys >= Sk) are selected to 0.
//
// Build flags: LAB_BWD_BUG_NO_DELTA (self-test: Delta = 0, a wrong dQ/dK that the check must fail);
// LAB_BWD_D128_BR / LAB_BWD_D64_BR (query rows per dkdv tile, default 32 / 64);
// LAB_BWD_WARPS (default 4: 64-key K/V blocks, 64-row dq blocks; 8: 128 / 128, FA2's block and half the dQ
// atomics); LAB_BWD_RED (default 1: scalar atomicAdd; 4: red.global.add.v4.f32, a quarter of the atomic
// instructions, sm_90 only). The defaults are what ran on the H200 (outputs/experiments/20261122-bwd-v01-mma.json:
// 0.51-0.68x SDPA-flash); WARPS=8 and RED=4 compile without spills but no GPU has timed them (the record keeps
// their predictions open); tools/gpu/bwd_main.cu checks any of the four builds (-DBWD_FN=bwd_v01 plus the switches).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/launch.h"
#include "common/bwd_mma.cuh"
#include "common/bwd_prepass.cuh"
#include "common/mma.cuh"
#include "common/params.h"

#ifndef LAB_BWD_D128_BR
#define LAB_BWD_D128_BR 32
#endif
#ifndef LAB_BWD_D64_BR
#define LAB_BWD_D64_BR 64
#endif
#ifndef LAB_BWD_WARPS  // warps per CTA; each owns 16 keys (dkdv) or 16 query rows (dq)
#define LAB_BWD_WARPS 4
#endif
#ifndef LAB_BWD_RED  // dQ atomics: 1 = scalar atomicAdd, 4 = red.global.add.v4.f32 after a pair shuffle (sm_90)
#define LAB_BWD_RED 1
#endif

namespace {

using namespace lab;

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = LAB_BWD_WARPS;
constexpr int kThreads = kWarps * 32;
constexpr int kBc = 16 * kWarps;    // keys per dkdv CTA (16 per warp)
constexpr int kBrDq = 16 * kWarps;  // queries per dq CTA (16 per warp)
constexpr int kBcDq = 64;           // keys per dq step

template <int D>
struct Cfg {
  static constexpr int BR = D == 128 ? LAB_BWD_D128_BR : LAB_BWD_D64_BR;  // queries per dkdv step
  static constexpr int LD = D + 8;  // smem row pitch in elements: +16 B keeps ldmatrix rows conflict-free
};

// The operand addressing, the two-product k-step, S / dP of a warp, the tile load and store2: common/bwd_mma.cuh.
using namespace lab::bwd;

// rows x D tile of a (B, H, S, D) tensor into smem (pitch LD), rows >= seqlen zero-filled.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t row_stride, int row0, int seqlen, int tid) {
  bwd::load_tile<T, D, ROWS, Cfg<D>::LD, kThreads>(dst, src, row_stride, row0, seqlen, tid);
}

using bwd::padded_rows;

// ---------------------------------------------------------------- 1. Delta and LSE * log2(e): common/bwd_prepass.cuh
using bwd::bwd_pre;

// ---------------------------------------------------------------- 2. dK, dV (and dQ by atomics)
// dQ partials go out through add_dq<LAB_BWD_RED> (common/bwd_mma.cuh).
template <class T, int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads) bwd_dkdv(const AttnBwdParams p) {
  constexpr int BR = Cfg<D>::BR, LD = Cfg<D>::LD, LDS = BR + 8;
  constexpr int NQ = BR / 8;  // n8 tiles of queries per warp row block
  constexpr int ND = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kBc * LD;
  T* sQ = sV + kBc * LD;      // 2 buffers
  T* sdO = sQ + 2 * BR * LD;  // 2 buffers
  T* sdS = sdO + 2 * BR * LD; // [key][query], atomic mode only
  float* sL = reinterpret_cast<float*>(sdS + (kAtomicDq ? kBc * LDS : 0));  // 2 x BR
  float* sDel = sL + 2 * BR;                                                 // 2 x BR

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int k0 = blockIdx.x * kBc, hkv = blockIdx.y, b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv, sq_pad = padded_rows(p.seqlen_q);
  const int nqb = (p.seqlen_q + BR - 1) / BR;
  const int qb_begin = p.causal ? min(k0 / BR, nqb) : 0;  // causal: no query before k0 sees this block
  const int per_head = nqb - qb_begin;
  const int n_iter = group * per_head;
  const float c = p.scale * kLog2e;

  const T* kg = static_cast<const T*>(p.k) + b * p.k_stride[0] + hkv * p.k_stride[1];
  const T* vg = static_cast<const T*>(p.v) + b * p.v_stride[0] + hkv * p.v_stride[1];
  load_tile<T, D, kBc>(sK, kg, p.k_stride[2], k0, p.seqlen_k, tid);
  load_tile<T, D, kBc>(sV, vg, p.v_stride[2], k0, p.seqlen_k, tid);

  auto load_q = [&](int it, int buf) {
    const int hq = hkv * group + it / per_head, q0 = (qb_begin + it % per_head) * BR;
    const T* qg = static_cast<const T*>(p.q) + b * p.q_stride[0] + hq * p.q_stride[1];
    const T* dg = static_cast<const T*>(p.dout) + b * p.do_stride[0] + hq * p.do_stride[1];
    load_tile<T, D, BR>(sQ + buf * BR * LD, qg, p.q_stride[2], q0, p.seqlen_q, tid);
    load_tile<T, D, BR>(sdO + buf * BR * LD, dg, p.do_stride[2], q0, p.seqlen_q, tid);
    const int64_t r0 = ((int64_t)b * p.heads_q + hq) * sq_pad + q0;  // in bounds: rows padded to 64
    for (int ch = tid; ch < BR / 4; ch += kThreads) {
      cp_async_16(smem_u32(sL + buf * BR + ch * 4), p.lse_log2 + r0 + ch * 4, true);
      cp_async_16(smem_u32(sDel + buf * BR + ch * 4), p.delta + r0 + ch * 4, true);
    }
  };

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  if (n_iter > 0) load_q(0, 0);
  cp_async_commit();
  const int kw = warp * 16;  // this warp's first key row in the block

  for (int it = 0; it < n_iter; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_iter) load_q(it + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int hq = hkv * group + it / per_head, q0 = (qb_begin + it % per_head) * BR;
    (void)hq;
    const T* tq = sQ + buf * BR * LD;
    const T* tdo = sdO + buf * BR * LD;

    // [lab:dkdv-tile] one (query head, query block) step of a K/V CTA: recompute P^T, dS^T; dV, dK, dQ
    // S^T = K_w Q^T and dP^T = V_w dO^T: 16 keys x BR queries per warp.
    float s[NQ][4], dp[NQ][4];
    s_dp_tile<T, D>(s, dp, sK, sV, kw, tq, tdo, LD, lane);

    // P^T (into s) and dS^T (into dp). Mask only where a tile can hold a masked element.
    const bool need_mask = q0 + BR > p.seqlen_q || k0 + kBc > p.seqlen_k || (p.causal && q0 < k0 + kBc - 1);
    const float* l2 = sL + buf * BR;
    const float* del = sDel + buf * BR;
    p_ds_keys_as_rows<NQ>(s, dp, c, l2, del, 0, need_mask, k0 + kw, q0, g, t, p);

    // dV += P^T dO, dK += dS^T Q (queries are the k dimension; operands from registers).
#pragma unroll
    for (int jk = 0; jk < NQ / 2; ++jk) {
      uint32_t ap[4] = {pack2<T>(s[2 * jk][0], s[2 * jk][1]), pack2<T>(s[2 * jk][2], s[2 * jk][3]),
                        pack2<T>(s[2 * jk + 1][0], s[2 * jk + 1][1]), pack2<T>(s[2 * jk + 1][2], s[2 * jk + 1][3])};
      uint32_t as[4] = {pack2<T>(dp[2 * jk][0], dp[2 * jk][1]), pack2<T>(dp[2 * jk][2], dp[2 * jk][3]),
                        pack2<T>(dp[2 * jk + 1][0], dp[2 * jk + 1][1]),
                        pack2<T>(dp[2 * jk + 1][2], dp[2 * jk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn)
        mma_pair_x2<T, true>(dv, dk, 2 * dn, ap, as, addr_b_kn_trans(tdo, LD, dn * 16, jk * 16, lane),
                             addr_b_kn_trans(tq, LD, dn * 16, jk * 16, lane));
      if constexpr (kAtomicDq) {  // dS^T rows of this warp into smem [key][query] for the block's dQ
        T* row = sdS + (kw + g) * LDS + jk * 16 + 2 * t;
        *reinterpret_cast<uint32_t*>(row) = as[0];
        *reinterpret_cast<uint32_t*>(row + 8 * LDS) = as[1];
        *reinterpret_cast<uint32_t*>(row + 8) = as[2];
        *reinterpret_cast<uint32_t*>(row + 8 * LDS + 8) = as[3];
      }
    }

    if constexpr (kAtomicDq) {
      // dQ_i (BR x D) += dS (BR x 64 keys) K: warps split BR into m16 tiles and D into column groups.
      constexpr int MT = BR / 16, DG = kWarps / MT, DC = D / DG;
      static_assert(kWarps % MT == 0, "BR/16 must divide the warp count");
      __syncthreads();
      const int wm = warp % MT, wd = warp / MT;
      float acc[DC / 8][4];
#pragma unroll
      for (int n = 0; n < DC / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, addr_a_trans(sdS, LDS, wm * 16, kk * 16, lane));
#pragma unroll
        for (int dn = 0; dn < DC / 16; ++dn) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, addr_b_kn_trans(sK, LD, wd * DC + dn * 16, kk * 16, lane));
          mma_16816_x2<T>(acc, 2 * dn, a, bk);
        }
      }
      float* dqa = p.dq_accum + ((int64_t)b * p.heads_q + hq) * p.seqlen_q * D;
      const int r0 = q0 + wm * 16 + g;
#pragma unroll
      for (int n = 0; n < DC / 8; ++n) add_dq<LAB_BWD_RED>(dqa, r0, wd * DC + n * 8, t, p.seqlen_q, D, acc[n]);
    }
    __syncthreads();  // this buffer (and sdS) is refilled next iteration
    // [/lab:dkdv-tile]
  }
  cp_async_wait<0>();

  // Epilogue: dK * scale and dV, rows >= Sk not written.
  store_dk_dv<T, ND>(p, b, hkv, k0 + kw + g, 0, t, dk, dv);
}

// ---------------------------------------------------------------- 3a. dQ = scale * dq_accum: bwd_convert (common/bwd_mma.cuh)

// ---------------------------------------------------------------- 3b. dQ by its own pass (deterministic)
// One CTA per (64 queries, query head, batch), 4 warps x 16 query rows, K/V blocks double-buffered.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) bwd_dq(const AttnBwdParams p) {
  constexpr int LD = Cfg<D>::LD, ND = D / 8, NK = kBcDq / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kBrDq * LD;
  T* sK = sdO + kBrDq * LD;    // 2 buffers
  T* sV = sK + 2 * kBcDq * LD;   // 2 buffers

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int qb = p.causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // causal: heaviest blocks first
  const int q0 = qb * kBrDq, hq = blockIdx.y, b = blockIdx.z;
  const int hkv = hq / (p.heads_q / p.heads_kv), sq_pad = padded_rows(p.seqlen_q);
  const int key_end = p.causal ? min(p.seqlen_k, q0 + kBrDq) : p.seqlen_k;
  const int n_kb = (key_end + kBcDq - 1) / kBcDq;
  const float c = p.scale * kLog2e;

  const T* kg = static_cast<const T*>(p.k) + b * p.k_stride[0] + hkv * p.k_stride[1];
  const T* vg = static_cast<const T*>(p.v) + b * p.v_stride[0] + hkv * p.v_stride[1];
  load_tile<T, D, kBrDq>(sQ, static_cast<const T*>(p.q) + b * p.q_stride[0] + hq * p.q_stride[1], p.q_stride[2], q0,
                         p.seqlen_q, tid);
  load_tile<T, D, kBrDq>(sdO, static_cast<const T*>(p.dout) + b * p.do_stride[0] + hq * p.do_stride[1],
                         p.do_stride[2], q0, p.seqlen_q, tid);
  const int row = q0 + warp * 16 + g;  // this lane's rows: row and row + 8
  const int64_t r0 = ((int64_t)b * p.heads_q + hq) * sq_pad + row;
  // Rows past S_q are masked below (P = 0); their workspace entries may lie past the 64-row padding.
  const float l2a = row < p.seqlen_q ? p.lse_log2[r0] : 0.f, l2b = row + 8 < p.seqlen_q ? p.lse_log2[r0 + 8] : 0.f;
  const float da = row < p.seqlen_q ? p.delta[r0] : 0.f, db = row + 8 < p.seqlen_q ? p.delta[r0 + 8] : 0.f;

  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[n][e] = 0.f;

  if (n_kb > 0) {
    load_tile<T, D, kBcDq>(sK, kg, p.k_stride[2], 0, p.seqlen_k, tid);
    load_tile<T, D, kBcDq>(sV, vg, p.v_stride[2], 0, p.seqlen_k, tid);
  }
  cp_async_commit();
  for (int j = 0; j < n_kb; ++j) {
    const int buf = j & 1, k0 = j * kBcDq;
    if (j + 1 < n_kb) {
      load_tile<T, D, kBcDq>(sK + (buf ^ 1) * kBcDq * LD, kg, p.k_stride[2], k0 + kBcDq, p.seqlen_k, tid);
      load_tile<T, D, kBcDq>(sV + (buf ^ 1) * kBcDq * LD, vg, p.v_stride[2], k0 + kBcDq, p.seqlen_k, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const T* tk = sK + buf * kBcDq * LD;
    const T* tv = sV + buf * kBcDq * LD;

    float s[NK][4], dp[NK][4];
    s_dp_tile<T, D>(s, dp, sQ, sdO, warp * 16, tk, tv, LD, lane);
    const bool need_mask = q0 + kBrDq > p.seqlen_q || k0 + kBcDq > p.seqlen_k || (p.causal && k0 + kBcDq - 1 > q0);
#pragma unroll
    for (int n = 0; n < NK; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool hi = e >= 2;
        float pv = fast_exp2(fmaf(s[n][e], c, -(hi ? l2b : l2a)));
        if (need_mask) {
          const int key = k0 + n * 8 + 2 * t + (e & 1), qi = row + (hi ? 8 : 0);
          if (!(qi < p.seqlen_q && key < p.seqlen_k && (!p.causal || key <= qi))) pv = 0.f;
        }
        dp[n][e] = pv * (dp[n][e] - (hi ? db : da));
      }
    // dQ += dS K (keys are the k dimension).
#pragma unroll
    for (int jk = 0; jk < NK / 2; ++jk) {
      uint32_t as[4] = {pack2<T>(dp[2 * jk][0], dp[2 * jk][1]), pack2<T>(dp[2 * jk][2], dp[2 * jk][3]),
                        pack2<T>(dp[2 * jk + 1][0], dp[2 * jk + 1][1]),
                        pack2<T>(dp[2 * jk + 1][2], dp[2 * jk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, addr_b_kn_trans(tk, LD, dn * 16, jk * 16, lane));
        mma_16816_x2<T>(dq, 2 * dn, as, bk);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  T* dqg = static_cast<T*>(p.dq) + b * p.dq_stride[0] + hq * p.dq_stride[1];
#pragma unroll
  for (int n = 0; n < ND; ++n) {
    const int col = n * 8 + 2 * t;
    if (row < p.seqlen_q) store2<T>(dqg + row * p.dq_stride[2] + col, dq[n][0] * p.scale, dq[n][1] * p.scale);
    if (row + 8 < p.seqlen_q)
      store2<T>(dqg + (row + 8) * p.dq_stride[2] + col, dq[n][2] * p.scale, dq[n][3] * p.scale);
  }
}

// ---------------------------------------------------------------- host

template <class T, int D>
int launch(const AttnBwdParams& p, cudaStream_t st) {
  constexpr int BR = Cfg<D>::BR, LD = Cfg<D>::LD;
  const int64_t pre_threads = bwd::bwd_pre_threads(p, D);
  cudaError_t err = cudaSuccess;
  if (pre_threads > 0) {  // S_q == 0: no rows, dK = dV = 0 below
    err = launch_kernel<bwd_pre<T, D>>(dim3((unsigned)((pre_threads + 127) / 128)), 128, 0, st, p);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid_kv((p.seqlen_k + kBc - 1) / kBc, p.heads_kv, p.batch);
  const int smem_kv = (2 * kBc * LD + 4 * BR * LD) * (int)sizeof(T) + 4 * BR * (int)sizeof(float);
  if (p.deterministic) {
    err = launch_kernel<bwd_dkdv<T, D, false>>(grid_kv, kThreads, smem_kv, st, p);
    if (err != cudaSuccess || p.seqlen_q == 0) return err;
    const int smem_q = (2 * kBrDq * LD + 4 * kBcDq * LD) * (int)sizeof(T);
    return launch_kernel<bwd_dq<T, D>>(dim3((p.seqlen_q + kBrDq - 1) / kBrDq, p.heads_q, p.batch), kThreads, smem_q,
                                       st, p);
  }
  err = cudaMemsetAsync(p.dq_accum, 0, (size_t)p.batch * p.heads_q * p.seqlen_q * D * sizeof(float), st);
  if (err != cudaSuccess) return err;
  err = launch_kernel<bwd_dkdv<T, D, true>>(grid_kv, kThreads, smem_kv + kBc * (BR + 8) * (int)sizeof(T), st, p);
  if (err != cudaSuccess || p.seqlen_q == 0) return err;
  return launch_kernel<bwd_convert<T, D>>(dim3(convert_blocks(p, D)), 256, 0, st, p);
}

}  // namespace

extern "C" int attn_bwd_v01(const AttnBwdParams* p, void* stream) {
  if (const int rc = lab::check_bwd_params(p)) return rc < 0 ? rc : 0;
  if (p->heads_q > 65535 || p->batch > 65535) return LAB_E_SHAPE;  // gridDim.y and .z
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim == 64) return bf16 ? launch<__nv_bfloat16, 64>(*p, st) : launch<__half, 64>(*p, st);
  return bf16 ? launch<__nv_bfloat16, 128>(*p, st) : launch<__half, 128>(*p, st);
}
