// Parts of the Hopper backward kernels (bwd/v02.., sm_90a) that every version shares: the tile config, the
// per-CTA work, the producer, the five GEMMs as issue steps, P^T / dS^T, the dS^T and dQ hand-offs through
// shared memory, the dK / dV epilogue, the dQ convert pass and the host launch. A version file composes them.
// The design and its notation are in bwd/v02_wgmma.cu's header.
//
// Tile layout in shared memory: as the forward's (common/hopper/attn_fwd_sm90.cuh): D/64 column blocks of
// R rows x 128 bytes, 128-byte swizzle, every block 1024-byte aligned.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/bwd_prepass.cuh"
#include "common/hopper/attn_fwd_sm90.cuh"

namespace lab::sm90::bwd {

// One place for the tile choice, with what was rejected and why.
//   B_c = 128 keys per CTA as two consumer warpgroups of m64: a CTA reads each Q_i / dO_i once for 128 keys
//     (B_c = 64, one consumer: twice the Q/dO traffic and half the tensor work per barrier).
//   B_r = 64 queries per step: the smallest wgmma N that keeps S^T and dP^T at 32 registers each; with dK and
//     dV (2 x D/2) resident, D = 128 needs 64 + 64 + 32 + 32 + P/dS fragments: inside 240 registers only at 64.
//   kStages = 2: two Q/dO steps in flight cover the TMA latency at one CTA per SM; a third does not fit
//     beside the dQ buffers at D = 128 (227 KB).
//   kDsBufs: 1 (v02) or 2 dS^T buffers (a second lets a warpgroup write step i + 1's dS^T while the other
//     still reads step i's: 16 KB, which D = 128 has room for only without a third stage).
//     Measured (bwd/v04): 2 buffers are 2-4 % slower than 1 at D = 128 with one CTA per tile.
//   One CTA per tile, not persistent: v04's persistent loop (one CTA per SM, static round-robin) measured 2-4 %
//     slower at D = 128 and 38 % slower on long causal problems.
//   kDqByColumns: D = 64 splits dQ by columns as D = 128 does (each warpgroup 32 columns over all 128 keys, an
//     m64n32 GEMM) instead of by keys (64 columns over its own keys): half the dQ reductions per step (bwd/v07).
//   kKvInRegs: D = 64 only (D = 128 would need 64 more registers beside dK and dV's 128): bwd/v10.
//   BR_ = 128 (D = 64 only, bwd/v13): 128 queries per step, S^T and dP^T as m64n128 (64 registers each beside
//     dK and dV's 64), dQ split by rows (warpgroup w: queries 64w.., all 64 columns, over all 128 keys).
template <int D_, int kDsBufs_ = 1, bool kDqByColumns = false, bool kKvInRegs_ = false, bool kStageDkDv_ = false,
          int BR_ = 64>
struct Cfg {
  static constexpr int D = D_;
  static constexpr int BR = BR_;
  static constexpr int BC = 128;
  static constexpr int kStages = 2;
  static constexpr int kDsBufs = kDsBufs_;
  // bwd/v13: a warpgroup's dQ partial is its 64 queries of the step, all D columns (BR = 128).
  static constexpr bool kDqByRows = BR == 128;
  // dQ split over both warpgroups' halves of dS^T (by columns or by query rows), or by keys (own half).
  static constexpr bool kSplitDq = D == 128 || kDqByColumns || kDqByRows;
  // bwd/v10: K_w and V_w held as wgmma A fragments in registers (S^T and dP^T as RS GEMMs); the loop reads it
  // with if constexpr.
  static constexpr bool kKvInRegs = kKvInRegs_;
  // bwd/v12: dK and dV leave through shared memory (the dQ staging area) as 16-byte coalesced stores.
  static constexpr bool kStageDkDv = kStageDkDv_;
  static constexpr int kDqCols = kSplitDq && !kDqByRows ? D / 2 : D;  // a warpgroup's dQ partial: 64 rows x kDqCols
  static constexpr int kDqRegs = kDqCols / 2;
  static constexpr int kThreads = 384;
  static constexpr int kRegsConsumer = 240, kRegsProducer = 24;
  static constexpr int kKVBytes = BC * D * 2;   // one of K, V
  static constexpr int kQBytes = BR * D * 2;    // one of Q_i, dO_i
  static constexpr int kDsBytes = BC * BR * 2;  // dS^T
  static constexpr int kDqBytes = 64 * kDqCols * 4;  // one warpgroup's dQ partial
  static constexpr int kRowBytes = BR * 4;      // LSE_i or Delta_i
  // offsets from the 1024-aligned base
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffDo + kStages * kQBytes;
  static constexpr int kOffDq = kOffDs + kDsBufs * kDsBytes;  // [warpgroup][buffer]
  // The dQ staging area: 2 buffers per warpgroup for the copy engine's reduction (v02); with dQ reduced from
  // registers it holds v12's staged dK and dV, all that BR = 128 keeps of it (227 KB would not hold all four).
  static constexpr int kDqAreaBytes = kDqByRows ? 2 * 2 * 64 * D * 2 : 4 * kDqBytes;
  static constexpr int kOffRows = kOffDq + kDqAreaBytes;      // [stage] LSE then Delta
  static constexpr int kSmem = kOffRows + kStages * 2 * kRowBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
  static_assert(D == 64 || D == 128, "dQ is one m64n64 GEMM per warpgroup (D / 2 split, or D own keys), or m64n32");
  static_assert(BR == 64 || (BR == 128 && D == 64 && kStageDkDv && kDsBufs == 2),
                "128 queries per step: D = 64, two dS^T buffers, dK / dV staged (the copy engine's dQ buffers dropped)");
  static_assert(LAB_BWD_ROW_PAD % BR == 0, "a step's LSE / Delta rows and dQ partials stay inside the padded rows");
};

constexpr int kBarDsFree = 1, kBarDsReady = 2, kBarWg = 3;  // named barriers (0 is __syncthreads)

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The work of one CTA: key block nb of KV head hkv, batch b; query blocks mb0 .. n_mb - 1 of each query head
// of the group (causal: the first query block that reaches key n0). The key block is the fastest index of
// blockIdx.x: a head's CTAs run together and share its Q and dO in L2; causal: block 0, the longest, first.
struct Work {
  int b, hkv, n0, mb0, n_mb, group, n_iters;
  __device__ __forceinline__ int per_head() const { return n_mb - mb0; }
  __device__ __forceinline__ int head(int it) const { return hkv * group + it / per_head(); }
  __device__ __forceinline__ int m0(int it, int br) const { return (mb0 + it % per_head()) * br; }
};
template <class C>
__device__ __forceinline__ int num_tiles(const AttnBwdParams& p) {
  return (p.seqlen_k + C::BC - 1) / C::BC * p.heads_kv * p.batch;
}
template <class C>
__device__ __forceinline__ Work tile_work(const AttnBwdParams& p, int tile) {
  const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC;
  const int nb = tile % n_kb;
  const int bh = tile / n_kb;
  Work w;
  w.b = bh / p.heads_kv;
  w.hkv = bh % p.heads_kv;
  w.n0 = nb * C::BC;
  w.n_mb = (p.seqlen_q + C::BR - 1) / C::BR;
  w.mb0 = p.causal ? min(w.n0 / C::BR, w.n_mb) : 0;
  w.group = p.heads_q / p.heads_kv;
  w.n_iters = w.group * (w.n_mb - w.mb0);
  return w;
}
template <class C>
__device__ __forceinline__ Work cta_work(const AttnBwdParams& p) {
  return tile_work<C>(p, blockIdx.x);
}

// The CTA's mbarriers: K and V (once), and the full / empty pair of each Q_i / dO_i / LSE_i / Delta_i stage.
template <int kStages>
struct Bars {
  uint64_t kv, full[kStages], empty[kStages];
};
template <int kStages>
__device__ __forceinline__ void init_bars(Bars<kStages>& bars) {
  mbar_init(smem_u32(&bars.kv), 1);
  for (int s = 0; s < kStages; ++s) {
    mbar_init(smem_u32(&bars.full[s]), 1);
    mbar_init(smem_u32(&bars.empty[s]), 256);  // every consumer thread releases its own reads
  }
  fence_barrier_init();
}

// The producer's K and V of a tile (one thread), on the kv barrier, into K/V buffer k_dst / v_dst (bwd/v11's
// persistent CTAs alternate two).
template <class C>
__device__ __forceinline__ void load_kv_at(const CUtensorMap* tk, const CUtensorMap* tv, uint64_t& kv, uint32_t k_dst,
                                           uint32_t v_dst, const Work& work) {
  mbar_arrive_expect_tx(smem_u32(&kv), 2 * C::kKVBytes);
  for (int cb = 0; cb < C::D / 64; ++cb) {
    tma_load_4d(k_dst + cb * C::BC * 128, tk, smem_u32(&kv), cb * 64, work.n0, work.hkv, work.b);
    tma_load_4d(v_dst + cb * C::BC * 128, tv, smem_u32(&kv), cb * 64, work.n0, work.hkv, work.b);
  }
}
// Into Cfg's one K/V buffer.
template <class C>
__device__ __forceinline__ void load_kv(const CUtensorMap* tk, const CUtensorMap* tv, uint64_t& kv, uint32_t base,
                                        const Work& work) {
  load_kv_at<C>(tk, tv, kv, base + C::kOffK, base + C::kOffV, work);
}

// The producer's steps of a tile (one thread): Q_i, dO_i (TMA) and LSE_i, Delta_i (1-D bulk copies) into the
// ring; `step0` is the CTA's count of steps before this tile (the ring's stage and phase run on across tiles).
template <class C>
__device__ __forceinline__ void produce_steps(const CUtensorMap* tq, const CUtensorMap* tdo, Bars<C::kStages>& bars,
                                              uint32_t base, const Work& work, const AttnBwdParams& p, int step0) {
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  for (int it = 0; it < work.n_iters; ++it) {
    const int step = step0 + it, s = step % C::kStages, hq = work.head(it), m0 = work.m0(it, C::BR);
    mbar_wait(smem_u32(&bars.empty[s]), ((step / C::kStages) & 1) ^ 1);
    const uint32_t full = smem_u32(&bars.full[s]);
    mbar_arrive_expect_tx(full, 2 * C::kQBytes + 2 * C::kRowBytes);
    for (int cb = 0; cb < C::D / 64; ++cb) {
      tma_load_4d(base + C::kOffQ + s * C::kQBytes + cb * C::BR * 128, tq, full, cb * 64, m0, hq, work.b);
      tma_load_4d(base + C::kOffDo + s * C::kQBytes + cb * C::BR * 128, tdo, full, cb * 64, m0, hq, work.b);
    }
    const int64_t row = ((int64_t)work.b * p.heads_q + hq) * sq_pad + m0;
    const uint32_t rows = base + C::kOffRows + s * 2 * C::kRowBytes;
    bulk_load_1d(rows, p.lse_log2 + row, C::kRowBytes, full);
    bulk_load_1d(rows + C::kRowBytes, p.delta + row, C::kRowBytes, full);
  }
}

// The producer of a one-tile CTA (one thread): K and V once, then every step.
template <class C>
__device__ __forceinline__ void produce(const CUtensorMap* tq, const CUtensorMap* tk, const CUtensorMap* tv,
                                        const CUtensorMap* tdo, Bars<C::kStages>& bars, uint32_t base,
                                        const Work& work, const AttnBwdParams& p) {
  tma_prefetch_maps(tq, tk, tv);
  tma_prefetch_map(tdo);
  load_kv<C>(tk, tv, bars.kv, base, work);
  produce_steps<C>(tq, tdo, bars, base, work, p, 0);
}

// S^T = K_w Q_i^T (SS, m64nB_r, k = D): one commit group. A Narrow<C, n> issues its first n k16 steps only (qk_steps,
// common/hopper/attn_fwd_sm90.cuh): the rest would multiply TMA's zero columns.
template <class C, bool kBf16>
__device__ __forceinline__ void issue_s(float (&sacc)[C::BR / 2], uint32_t k_w, uint32_t q_s) {
#pragma unroll
  for (int kk = 0; kk < qk_steps<C>::value; ++kk)
    WgmmaOp<C::BR>::template ss<kBf16, 0>(sacc, desc_kmajor(k_w, C::BC, kk), desc_kmajor(q_s, C::BR, kk), kk > 0);
  wgmma_commit();
}

// S^T, then dP^T = V_w dO_i^T (the same GEMM shape): two commit groups.
template <class C, bool kBf16>
__device__ __forceinline__ void issue_s_dp(float (&sacc)[C::BR / 2], float (&dpacc)[C::BR / 2], uint32_t k_w, uint32_t v_w,
                                           uint32_t q_s, uint32_t do_s) {
  issue_s<C, kBf16>(sacc, k_w, q_s);
  issue_s<C, kBf16>(dpacc, v_w, do_s);
}

// P^T and dS^T of one step for one thread's accumulator share (keys: rows, queries: columns), masked where
// the tile needs it: s holds S^T and becomes P^T, dp holds dP^T and becomes dS^T.
template <bool kMask, int N>
__device__ __forceinline__ void p_ds(float (&s)[N], float (&dp)[N], const float* lse2, const float* delta,
                                     float c, int key0, int q0, int t, const AttnBwdParams& p) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * i + 2 * t + (e & 1);
      float pv = ex2(fmaf(s[4 * i + e], c, -lse2[col]));
      if constexpr (kMask) {
        const int key = key0 + 8 * (e >> 1), q = q0 + col;
        if (q >= p.seqlen_q || key >= p.seqlen_k || (p.causal && key > q)) pv = 0.f;
      }
      s[4 * i + e] = pv;
      dp[4 * i + e] = pv * (dp[4 * i + e] - delta[col]);
    }
}

// The same, masked only where the step's tile needs it: the causal diagonal and the ragged ends.
template <class C>
__device__ __forceinline__ void p_ds_step(float (&s)[C::BR / 2], float (&dp)[C::BR / 2], const float* rows, float c, int kw0,
                                          int m0, const AttnBwdParams& p) {
  const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  const bool mask = (p.causal && kw0 + 63 > m0) || m0 + C::BR > p.seqlen_q || kw0 + 64 > p.seqlen_k;
  if (mask)
    p_ds<true>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p);
  else
    p_ds<false>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p);
}

// This warpgroup's 64 rows of a K-major tile (K or V, `rows` rows per 64-column block, 128B swizzle) as the
// wgmma A fragments of its D / 16 k-steps: a[kk] = rows g and g + 8 of the warp's 16, columns 16kk + 2t and
// 16kk + 8 + 2t (the mma.sync m16n8k16 A layout, which RS wgmma takes per warp). Read once per CTA.
template <class C>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[C::D / 16][4], const uint8_t* tile) {
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  const int r = 64 * wg + 16 * warp + g;
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      a[kk][j] = *reinterpret_cast<const uint32_t*>(tile + swz_offset(C::BC, r + 8 * (j & 1), 16 * kk + 8 * (j >> 1) + 2 * t));
}

// S^T = K_w Q_i^T and dP^T = V_w dO_i^T with K_w, V_w from registers (RS, m64nB_r, k = D): two commit groups.
// Each k-step reads 2 KB of shared memory (Q_i or dO_i at B_r = 64) instead of the SS form's 4 KB.
template <class C, bool kBf16>
__device__ __forceinline__ void issue_s_dp_rs(float (&sacc)[C::BR / 2], float (&dpacc)[C::BR / 2],
                                              const uint32_t (&kf)[C::D / 16][4], const uint32_t (&vf)[C::D / 16][4],
                                              uint32_t q_s, uint32_t do_s) {
#pragma unroll
  for (int kk = 0; kk < qk_steps<C>::value; ++kk)
    WgmmaOp<C::BR>::template rs<kBf16, 0>(sacc, kf[kk], desc_kmajor(q_s, C::BR, kk), kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < qk_steps<C>::value; ++kk)
    WgmmaOp<C::BR>::template rs<kBf16, 0>(dpacc, vf[kk], desc_kmajor(do_s, C::BR, kk), kk > 0);
  wgmma_commit();
}

// dV_w += P^T dO_i and dK_w += dS^T Q_i (RS, m64nD, k = B_r; dO and Q read MN-major): one commit group.
template <class C, bool kBf16>
__device__ __forceinline__ void issue_dv_dk(float (&dv)[C::D / 2], float (&dk)[C::D / 2],
                                            const uint32_t (&pa)[C::BR / 16][4], const uint32_t (&dsa)[C::BR / 16][4],
                                            uint32_t q_s, uint32_t do_s) {
#pragma unroll
  for (int kk = 0; kk < C::BR / 16; ++kk)
    WgmmaOp<C::D>::template rs<kBf16, 1>(dv, pa[kk], desc_v(do_s, C::BR, kk), 1);
#pragma unroll
  for (int kk = 0; kk < C::BR / 16; ++kk)
    WgmmaOp<C::D>::template rs<kBf16, 1>(dk, dsa[kk], desc_v(q_s, C::BR, kk), 1);
  wgmma_commit();
}

// This warpgroup's rows of dS^T (bf16 / fp16 A fragments, as packed for the dK GEMM) into the 128-key x
// B_r-query dS^T tile at `ds` (128B swizzle, B_r / 64 column blocks: conflict-free 4-byte stores), then the
// fence that lets the tensor core read it.
template <class C>
__device__ __forceinline__ void store_ds(uint8_t* ds, const uint32_t (&dsa)[C::BR / 16][4]) {
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
#pragma unroll
  for (int i = 0; i < C::BR / 8; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = 64 * wg + warp * 16 + hh * 8 + g;
      *reinterpret_cast<uint32_t*>(ds + swz_offset(C::BC, r, 8 * i + 2 * t)) = dsa[i / 2][2 * (i % 2) + hh];
    }
  fence_proxy_async();
}

// This warpgroup's dQ partial (SS m64n64, A = dS read M-major from the dS^T tile): D = 128, columns 64 wg..
// over all 128 keys; D = 64, all columns over its own 64 keys. One commit group.
template <class C, bool kBf16>
__device__ __forceinline__ void issue_dq(float (&dq)[C::kDqRegs], uint32_t ds, uint32_t k_tile) {
  const int wg = threadIdx.x / 128;
  if constexpr (C::kDqByRows) {
    // B_r = 128: the warpgroup's 64 queries are column block wg of the dS^T tile; all of K's columns.
#pragma unroll
    for (int kk = 0; kk < C::BC / 16; ++kk)
      WgmmaOp<C::D>::template ss<kBf16, 1, 1>(dq, desc_v(ds + wg * C::BC * 128, C::BC, kk), desc_v(k_tile, C::BC, kk),
                                              kk > 0);
  } else if constexpr (C::kSplitDq) {
    // D = 128: the warpgroup's 64-column block of K; D = 64: its 32 columns, 64 bytes into each swizzled row.
    const uint32_t k_cols = k_tile + (C::D == 128 ? wg * C::BC * 128 : wg * C::kDqCols * 2);
#pragma unroll
    for (int kk = 0; kk < C::BC / 16; ++kk)
      WgmmaOp<C::kDqCols>::template ss<kBf16, 1, 1>(dq, desc_v(ds, C::BC, kk), desc_v(k_cols, C::BC, kk), kk > 0);
  } else {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      WgmmaOp<64>::ss<kBf16, 1, 1>(dq, desc_v(ds + wg * 64 * 128, C::BC, kk), desc_v(k_tile + wg * 64 * 128, C::BC, kk),
                                   kk > 0);
  }
  wgmma_commit();
}

// The dQ partial of step `it` in accumulator order (16-byte stores, threads consecutive: no bank conflict) into
// this warpgroup's buffer it & 1, then one thread hands it to the copy engine, which adds it into dq_accum.
// The buffer's previous reduction was waited for (read) one step ago by the same thread, and a barrier of
// this warpgroup has passed since.
template <class C>
__device__ __forceinline__ void reduce_dq(const float (&dq)[C::kDqRegs], uint8_t* smem, int it, int hq, int m0, int b,
                                          const AttnBwdParams& p) {
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  uint8_t* buf = smem + C::kOffDq + (2 * wg + (it & 1)) * C::kDqBytes;
#pragma unroll
  for (int r4 = 0; r4 < C::kDqCols / 8; ++r4)
    *reinterpret_cast<float4*>(buf + (r4 * 128 + wt) * 16) =
        make_float4(dq[4 * r4], dq[4 * r4 + 1], dq[4 * r4 + 2], dq[4 * r4 + 3]);
  fence_proxy_async();
  named_barrier_sync(kBarWg + wg, 128);
  if (wt == 0) {
    const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
    float* dst = p.dq_accum + (((int64_t)b * p.heads_q + hq) * sq_pad + m0) * C::D + (C::kSplitDq ? wg * 64 * C::kDqCols : 0);
    bulk_reduce_add_f32(dst, smem_u32(buf), C::kDqBytes);
    bulk_commit();
    bulk_wait_read<1>();
  }
}

// One step of a consumer warpgroup: query block `it` of the tile `work`, the CTA's step `step` (stage, phase,
// dS^T and dQ buffers). Each GEMM it issues is waited for before the step returns. With one dS^T buffer the
// split-dQ path first waits until both warpgroups have read the last step's; with two, the parity does it.
template <class C, class T>
__device__ __forceinline__ void consume_step(float (&dk)[C::D / 2], float (&dv)[C::D / 2], uint8_t* smem,
                                             Bars<C::kStages>& bars, const Work& work, int it, int step, float c,
                                             const AttnBwdParams& p) {
  constexpr int BR = C::BR, kStages = C::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const int wg = threadIdx.x / 128;
  const uint32_t base = smem_u32(smem);
  const int kw0 = work.n0 + 64 * wg;  // this warpgroup's first key
  const uint32_t k_w = base + C::kOffK + wg * 64 * 128, v_w = base + C::kOffV + wg * 64 * 128;
  const int s = step % kStages, hq = work.head(it), m0 = work.m0(it, BR);
  const uint32_t q_s = base + C::kOffQ + s * C::kQBytes, do_s = base + C::kOffDo + s * C::kQBytes;
  const float* rows = reinterpret_cast<const float*>(smem + C::kOffRows + s * 2 * C::kRowBytes);
  mbar_wait(smem_u32(&bars.full[s]), (step / kStages) & 1);

  float sacc[32], dpacc[32];
  wgmma_fence();
  issue_s_dp<C, kBf16>(sacc, dpacc, k_w, v_w, q_s, do_s);
  wgmma_wait<0>();
  reg_fence(sacc);
  reg_fence(dpacc);
  p_ds_step<C>(sacc, dpacc, rows, c, kw0, m0, p);

  uint32_t pa[BR / 16][4], dsa[BR / 16][4];
  pack_p<BR, T>(sacc, pa);
  pack_p<BR, T>(dpacc, dsa);
  wgmma_fence();
  issue_dv_dk<C, kBf16>(dv, dk, pa, dsa, q_s, do_s);

  // dS^T to shared memory: every read of this buffer's last dS^T (the other warpgroup's too) is over first.
  if constexpr (C::kSplitDq && C::kDsBufs == 1) named_barrier_sync(kBarDsFree, 256);
  const int ds_off = C::kOffDs + (step % C::kDsBufs) * C::kDsBytes;
  store_ds<C>(smem + ds_off, dsa);
  named_barrier_sync(C::kSplitDq ? kBarDsReady : kBarWg + wg, C::kSplitDq ? 256 : 128);

  float dq[C::kDqRegs];
  wgmma_fence();
  issue_dq<C, kBf16>(dq, base + ds_off, base + C::kOffK);
  wgmma_wait<0>();
  reg_fence(dq);
  reg_fence(dk);
  reg_fence(dv);
  mbar_arrive(smem_u32(&bars.empty[s]));  // this thread's reads of Q_i, dO_i and the rows are over
  reduce_dq<C>(dq, smem, step, hq, m0, work.b, p);
}

// Epilogue: dK (times scale) and dV of this warpgroup's keys < S_k, 4-byte stores from the accumulators.
template <class C, class T>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[C::D / 2], const float (&dv)[C::D / 2], int kw0,
                                            const Work& work, const AttnBwdParams& p) {
  const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  T* dkg = static_cast<T*>(p.dk) + (int64_t)work.b * p.dk_stride[0] + (int64_t)work.hkv * p.dk_stride[1];
  T* dvg = static_cast<T*>(p.dv) + (int64_t)work.b * p.dv_stride[0] + (int64_t)work.hkv * p.dv_stride[1];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = kw0 + warp * 16 + hh * 8 + g;
    if (key >= p.seqlen_k) continue;
#pragma unroll
    for (int i = 0; i < C::D / 8; ++i) {
      const int col = 8 * i + 2 * t;
      if (narrow_cfg<C>::value && !narrow_stores(8 * i, p.head_dim)) continue;  // the caller's tensors end at head_dim
      *reinterpret_cast<uint32_t*>(dkg + (int64_t)key * p.dk_stride[2] + col) =
          lab::pack2<T>(dk[4 * i + 2 * hh] * p.scale, dk[4 * i + 2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + (int64_t)key * p.dv_stride[2] + col) =
          lab::pack2<T>(dv[4 * i + 2 * hh], dv[4 * i + 2 * hh + 1]);
    }
  }
}

// The same through shared memory (bwd/v12): this warpgroup's dK_w (times scale) and dV_w as 16-bit rows in its half
// of `stage` (64 rows x D, 16-byte chunks XOR-swizzled by row: conflict-free 4-byte writes), then 16-byte stores
// of whole chunks, consecutive threads on consecutive chunks of a row: 4x fewer store instructions than
// store_dk_dv's 4-byte ones, each warp writing whole rows. `stage` must be free (the dQ staging area, unused with
// dQ reduced from registers). Falls back to store_dk_dv where dK or dV rows are not 16-byte aligned.
template <class C, class T>
__device__ __forceinline__ void store_dk_dv_staged(const float (&dk)[C::D / 2], const float (&dv)[C::D / 2], int kw0,
                                                   const Work& work, const AttnBwdParams& p, uint8_t* stage) {
  constexpr int D = C::D, kRowBytes = D * 2, kChunks = D / 8;
  static_assert(C::kDqAreaBytes >= 2 * 2 * 64 * D * 2, "dK and dV of both warpgroups fit in the dQ staging area");
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  T* dkg = static_cast<T*>(p.dk) + (int64_t)work.b * p.dk_stride[0] + (int64_t)work.hkv * p.dk_stride[1];
  T* dvg = static_cast<T*>(p.dv) + (int64_t)work.b * p.dv_stride[0] + (int64_t)work.hkv * p.dv_stride[1];
  const bool aligned = ((reinterpret_cast<uintptr_t>(dkg) | reinterpret_cast<uintptr_t>(dvg)) % 16 == 0) &&
                       (p.dk_stride[2] % 8 == 0) && (p.dv_stride[2] % 8 == 0);
  if (!aligned) {
    store_dk_dv<C, T>(dk, dv, kw0, work, p);
    return;
  }
  uint8_t* sk = stage + wg * 2 * 64 * kRowBytes;
  uint8_t* sv = sk + 64 * kRowBytes;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + hh * 8 + g;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int off = r * kRowBytes + ((i ^ (r % 8)) << 4) + 4 * t;
      *reinterpret_cast<uint32_t*>(sk + off) = lab::pack2<T>(dk[4 * i + 2 * hh] * p.scale, dk[4 * i + 2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(sv + off) = lab::pack2<T>(dv[4 * i + 2 * hh], dv[4 * i + 2 * hh + 1]);
    }
  }
  named_barrier_sync(kBarWg + wg, 128);
#pragma unroll
  for (int j = 0; j < 64 * kChunks / 128; ++j) {
    const int q = j * 128 + wt, r = q / kChunks, c = q % kChunks, key = kw0 + r;
    if (key >= p.seqlen_k || (narrow_cfg<C>::value && !narrow_stores(8 * c, p.head_dim))) continue;
    const int off = r * kRowBytes + ((c ^ (r % 8)) << 4);
    *reinterpret_cast<uint4*>(dkg + (int64_t)key * p.dk_stride[2] + 8 * c) = *reinterpret_cast<const uint4*>(sk + off);
    *reinterpret_cast<uint4*>(dvg + (int64_t)key * p.dv_stride[2] + 8 * c) = *reinterpret_cast<const uint4*>(sv + off);
  }
}

// dQ = scale * dq_accum, from the accumulator order back to (B, H, S, D): float4 `idx` of dq_accum (index
// (r4 * 128 + wt) * 4 of part `part` of a 64-row block) holds rows g and g + 8 of warp wt / 32 at two columns.
// load(idx) gives that float4 (the convert pass reads it here; bwd/v15 hands in what it loaded earlier).
template <class C, class T, class Load>
__device__ __forceinline__ void convert_quad(const AttnBwdParams& p, int64_t idx, int sq_pad, Load load) {
  constexpr int D = C::D;
  const int64_t block = idx / (64 * D / 4);  // (b, h, 64-row block)
  const int in = (int)(idx % (64 * D / 4));
  constexpr int kPartQuads = 16 * C::kDqCols;  // a warpgroup's 64 x kDqCols part
  const int part = in / kPartQuads, r4 = (in % kPartQuads) / 128, wt = in % 128;
  const int warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  const int row = (int)(block % (sq_pad / 64)) * 64 + warp * 16 + g;
  const int col = (C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4 + 2 * t;
  const int64_t bh = block / (sq_pad / 64);
  const int b = (int)(bh / p.heads_q), h = (int)(bh % p.heads_q);
  const float4 a = load(idx);
  if (narrow_cfg<C>::value && !narrow_stores(col & ~7, p.head_dim)) return;  // the zero columns past a narrow head dim
  T* dst = static_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[1] + col;
  if (row < p.seqlen_q)
    *reinterpret_cast<uint32_t*>(dst + row * p.dq_stride[2]) = lab::pack2<T>(a.x * p.scale, a.y * p.scale);
  if (row + 8 < p.seqlen_q)
    *reinterpret_cast<uint32_t*>(dst + (row + 8) * p.dq_stride[2]) = lab::pack2<T>(a.z * p.scale, a.w * p.scale);
}

// The convert pass: one thread per float4 of dq_accum.
template <class C, class T>
__global__ void __launch_bounds__(256) convert_dq(const AttnBwdParams p) {
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  const int64_t quads = (int64_t)p.batch * p.heads_q * sq_pad * C::D / 4;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < quads;
       idx += (int64_t)gridDim.x * blockDim.x)
    convert_quad<C, T>(p, idx, sq_pad, [&](int64_t i) { return reinterpret_cast<const float4*>(p.dq_accum)[i]; });
}

// ---------------------------------------------------------------- host

// 1: the pre-pass zeroes dq_accum as it goes (bwd_pre's kZeroAccum), instead of a cudaMemsetAsync before the main
// kernel; 0: the memset (v02-v13). Why: torch.profiler of one D = 128, S = 512 call (H100) shows the passes around
// the main kernel level with cuDNN's (pre-pass 52 + memset 41 us against cuDNN's dot(dO, O) 97; convert 78 against
// 79), but ours are four launches with three boundaries between them where cuDNN's are three. The same bytes move
// either way (the zeros are written once). Predicted (GPU time): +0.5-1 % at S = 512-1024, nothing from S = 4096.
// Measured on v13 (H100, GPU time, one process; outputs/driver_logs/20261126-h100-bwd-v14-run1/zero_in_pre/):
// +1.1 % at D = 128 S = 512 causal, +0.3 % non-causal, +0.6-0.7 % at D = 64 S = 512, +0.0-0.3 % at D = 128
// S = 1024-2048; never behind; driver 53/53 (dq_accum poisoned with NaN) and four sanitizers clean. A version
// turns it on by defining it before this header (bwd/v14).
#ifndef LAB_BWD_ZERO_IN_PRE
#define LAB_BWD_ZERO_IN_PRE 0
#endif

using KernelFn = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, AttnBwdParams);

// The four launches of a call: pre-pass, dq_accum zeroed, the dK/dV kernel kKernel, the dQ convert pass.
// kMaxCtas > 0: kKernel loops over the tiles itself (persistent), so its grid is at most one CTA per SM and at
// most kMaxCtas (a small cap makes small test problems run several tiles per CTA); 0: one CTA per tile.
// kInKernelConvert: kKernel writes dQ itself (its tile counters, which follow dq_accum, are zeroed with it), so
// the convert pass runs only when there is no key block to do it. P: kKernel's parameter block, AttnBwdParams or
// a struct derived from it (the pre-pass and the convert pass read its AttnBwdParams part).
template <class C, class T, auto kKernel, int kMaxCtas = 0, bool kInKernelConvert = false, class P = AttnBwdParams>
int launch(const P& p, cudaStream_t st, int dev) {
  constexpr int D = C::D;
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const int64_t pre_threads = lab::bwd::bwd_pre_threads(p, D);
  // dq_accum zeroed by the pre-pass (LAB_BWD_ZERO_IN_PRE), except where a version keeps counters after it
  constexpr bool kZeroInPre = LAB_BWD_ZERO_IN_PRE && !kInKernelConvert;
  cudaError_t err = cudaSuccess;
  if (pre_threads > 0) {
    lab::bwd::bwd_pre<T, D, kZeroInPre, narrow_cfg<C>::value><<<(unsigned)((pre_threads + 127) / 128), 128, 0, st>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  const size_t accum = (size_t)p.batch * p.heads_q * sq_pad * D;
  const size_t cleared = accum + (kInKernelConvert ? (size_t)p.batch * p.heads_q * sq_pad : 0);
  if (!kZeroInPre && accum > 0 && (err = cudaMemsetAsync(p.dq_accum, 0, cleared * sizeof(float), st)) != cudaSuccess)
    return err;
  CUtensorMap tq, tk, tv, tdo;
  const int Sq = p.seqlen_q > 0 ? p.seqlen_q : 1;  // S_q = 0: the maps are never read, but must be legal
  // A narrow config's maps run over the true head dim: TMA fills the columns past it with the zeros a padded
  // copy would hold (common/hopper/attn_fwd_sm90.cuh, Narrow).
  const int Dm = narrow_cfg<C>::value ? p.head_dim : D;
  if (!make_bhsd_map(&tq, p.q, bf16, Dm, Sq, p.heads_q, p.batch, p.q_stride, C::BR) ||
      !make_bhsd_map(&tdo, p.dout, bf16, Dm, Sq, p.heads_q, p.batch, p.do_stride, C::BR) ||
      !make_bhsd_map(&tk, p.k, bf16, Dm, p.seqlen_k, p.heads_kv, p.batch, p.k_stride, C::BC) ||
      !make_bhsd_map(&tv, p.v, bf16, Dm, p.seqlen_k, p.heads_kv, p.batch, p.v_stride, C::BC))
    return LAB_E_SHAPE;
  if ((err = lab::allow_smem_once<kKernel>(C::kSmem, dev)) != cudaSuccess) return err;
  const int64_t blocks = (int64_t)((p.seqlen_k + C::BC - 1) / C::BC) * p.heads_kv * p.batch;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  int64_t ctas = blocks;
  if constexpr (kMaxCtas > 0) {
    static int sms[64] = {};  // per device: the attribute query is not free on every call
    if (dev < 0 || dev >= 64) return LAB_E_SHAPE;
    if (!sms[dev] && (err = cudaDeviceGetAttribute(&sms[dev], cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess)
      return err;
    const int64_t cap = sms[dev] < kMaxCtas ? sms[dev] : kMaxCtas;
    ctas = blocks < cap ? blocks : cap;
  }
  kKernel<<<(unsigned)ctas, C::kThreads, C::kSmem, st>>>(tq, tk, tv, tdo, p);
  if ((err = cudaGetLastError()) != cudaSuccess || accum == 0 || (kInKernelConvert && blocks > 0)) return err;
  const int64_t quads = (int64_t)accum / 4, grid = (quads + 255) / 256;
  convert_dq<C, T><<<(unsigned)(grid < 65536 ? grid : 65536), 256, 0, st>>>(p);
  return cudaGetLastError();
}

// The extern "C" entry of a Hopper backward: check the call, then Launch<D, T>::run(p, stream, dev). kOrderedDq: the
// version adds dQ in a fixed order (bwd/v17), so it takes the deterministic mode too. kNarrowToo: the version also
// takes the narrow head dims below 128 (narrow_head_dim), on Launch of the next width (bwd/v20), which tells them
// apart by p.head_dim.
template <template <int, class> class Launch, bool kOrderedDq = false, bool kNarrowToo = false>
int entry(const AttnBwdParams* p, void* stream) {
  const bool narrow = kNarrowToo && p != nullptr && narrow_head_dim(p->head_dim) && narrow_width(p->head_dim) <= 128;
  if (const int rc = narrow ? lab::check_bwd_call(p) : lab::check_bwd_params(p)) return rc < 0 ? rc : 0;
  if (p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30)) return LAB_E_SHAPE;  // TMA coordinates are int32
  if (p->deterministic && !kOrderedDq) return LAB_E_MODE;  // reductions land in any order: v01's dQ pass or v17
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim <= 64)
    return bf16 ? Launch<64, __nv_bfloat16>::run(*p, st, dev) : Launch<64, __half>::run(*p, st, dev);
  return bf16 ? Launch<128, __nv_bfloat16>::run(*p, st, dev) : Launch<128, __half>::run(*p, st, dev);
}

}  // namespace lab::sm90::bwd
