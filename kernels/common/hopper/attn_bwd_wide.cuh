// The Hopper backward for head dims above 128 (bwd/v19, sm_90a): the config, the two consumer roles and the
// epilogue. bwd/v19_wide.cu has the design, the prediction and the measurements; what it shares with the D = 64 /
// 128 family (the producer, the tile work and grid order, the pre-pass, the dQ convert pass and the host launch)
// comes from common/hopper/attn_bwd_sm90.cuh and attn_bwd_tail.cuh unchanged.
//
// Notation (bwd/v02_wgmma.cu): a CTA owns B_c keys of one KV head and walks the query blocks Q_i, dO_i of B_r rows
// of every query head of its group. S^T = K Q_i^T, P^T = exp2(S^T c - LSE_i), dP^T = V dO_i^T,
// dS^T = P^T * (dP^T - Delta_i), dV += P^T dO_i, dK += dS^T Q_i, dQ_i += dS_i K (scale applied later).
#pragma once
#include "common/hopper/attn_bwd_tail.cuh"

namespace lab::sm90::bwd::wide {

// One place for the tile choice, with what was rejected and why.
//   Why the D = 64 / 128 layout does not carry over: there each consumer warpgroup owns 64 keys and holds dK_w and
//     dV_w over all D columns, D registers a thread: 256 at D = 256, more than the 240 a consumer gets.
//   Roles instead of key halves: both consumer warpgroups work on the same B_c = 64 keys. Warpgroup 0 computes
//     S^T (m64n64, k = D), P^T and dV (m64nD, A = P^T from its registers); warpgroup 1 computes dP^T, dS^T (P^T
//     handed over in fp32 through shared memory) and dK (A = dS^T from its registers). Each holds one D-wide
//     accumulator (D / 2 registers: 128 at D = 256) and does half the step's tensor work (S + dV against dP + dK,
//     equal FLOPs), and every A operand of the big GEMMs comes from registers, so a k16 wgmma reads only its B
//     from shared memory (m64n256k16: 8 KB per 128 clocks, 64 B/clock).
//   Rejected: FA3's hdim-256 tiling (S = Q K^T split by keys over the two warpgroups, m64n40 each at B_c = 80,
//     dK / dV transposed and split by columns): each warpgroup reads the whole of Q for its S half, an SS m64n40k16
//     reads 3.25 KB per 20 clocks (166 B/clock, over the 128 B/clock of shared memory), and P, dS go through shared
//     memory for every GEMM that uses them. Also rejected: S^T and dP^T each split by queries over the warpgroups
//     (m64n32, both read all of K or V: 192 B/clock).
//   B_c = 64: one m64 accumulator row block; B_c = 128 (v14's) needs 2 x D registers a thread at either role.
//   B_r = 64: S^T and dP^T at 32 registers beside the 128 of dV or dK, P^T / dS^T fragments (16), dQ (64).
//   dQ_i = dS_i K by 64-column chunks (m64n64, k = 64 keys), chunk c on warpgroup c % 2: D = 256 two each, D = 192
//     two and one (the second warpgroup's step is then 7 of 15 units of tensor work against 8). Chunks of 64 keep
//     B = K's columns inside one 128-byte swizzled column block; a 96-column half at D = 192 would start inside one.
//     Each chunk's partial is added from registers (red.global.add.v4.f32) in the accumulator order v14's convert
//     pass reads (kDqCols = 64, part = chunk); deferred by one step as in bwd/v05, so the dS^T tile is long written.
//   kStages = 2 Q_i / dO_i stages: at D = 256 K, V and two stages are 192 KB, with two P^T buffers (16 KB), two dS^T
//     buffers (16 KB) and the rows 226 KB of the 227 (a third stage does not fit; one stage leaves the TMA latency
//     of 64 KB per step uncovered).
//   P^T handed over in fp16, two buffers, one full barrier of both warpgroups per step (written / read): a buffer is
//     written again two steps later, after the next step's barrier, which every read of it precedes. fp16 (whatever
//     the inputs' type) rounds P^T to 2^-11, a quarter of the bf16 rounding that dS^T then gets for its GEMMs.
//     Rejected: one fp32 buffer (dS^T from the unrounded P^T) with a barrier arrived at by warpgroup 1 after its
//     reads and waited on by warpgroup 0 before its next write: correct by the PTX memory model (an arrive
//     synchronizes with the barrier's completion), but compute-sanitizer's racecheck does not model bar.arrive and
//     flags every such hand-off; two fp32 buffers do not fit at D = 256.
//   kDqUnderDp (off; bwd/v19's LAB_BWD_WIDE_SM90_DQ_UNDER_DP): warpgroup 1 issues the last step's dQ chunks right behind dP^T
//     and computes dS^T while they run, so the tensor core has work during warpgroup 0's exp2; it holds dQ's
//     registers beside dP^T's and dK's (224 at D = 256, where ptxas spills; D = 192 has 192). Measured at D = 192
//     (H100, kernel-level GPU time, S = 2048, the fp32 P^T hand-off): 348 / 303 TFLOP/s against 380 / 328 without
//     (non-causal / causal), -8 % (not profiled; likely the early dQ GEMMs delay warpgroup 1's dS^T, which
//     warpgroup 0's dQ waits for).
template <int D_, bool kDqUnderDp_ = false>
struct Cfg {
  static constexpr int D = D_;
  static constexpr bool kDqUnderDp = kDqUnderDp_;
  static constexpr int BR = 64;
  static constexpr int BC = 64;
  static constexpr int kStages = 2;
  static constexpr int kThreads = 384;  // two consumer warpgroups (roles above) and a producer warpgroup
  static constexpr int kRegsConsumer = 240, kRegsProducer = 24;
  static constexpr int kDqCols = 64;     // a dQ chunk: 64 rows x 64 columns, part `chunk` of a 64-row block
  static constexpr bool kSplitDq = true;  // (convert_quad's reading of the parts)
  static constexpr int kChunks = D / 64, kChunksPerWg = (kChunks + 1) / 2;
  static constexpr int kKVBytes = BC * D * 2;
  static constexpr int kQBytes = BR * D * 2;
  static constexpr int kPBytes = BC * BR * 2;  // one P^T buffer, fp16, in the accumulator order
  static constexpr int kDsBytes = BC * BR * 2;
  static constexpr int kRowBytes = BR * 4;
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffP = kOffDo + kStages * kQBytes;
  static constexpr int kOffDs = kOffP + 2 * kPBytes;
  static constexpr int kOffRows = kOffDs + 2 * kDsBytes;
  static constexpr int kSmem = kOffRows + kStages * 2 * kRowBytes + 1024;
  static_assert(kSmem <= 227 * 1024 - 64, "shared memory budget exceeded (the mbarriers take the last bytes)");
  static_assert(D % 64 == 0 && D > 128 && D <= 256, "D / 64 column blocks; D <= 128 has bwd v14");
  static_assert(kStages * kQBytes >= 64 * D * 2, "the epilogue stages a 64 x D tile in the Q (dO) stages");
  static_assert(LAB_BWD_ROW_PAD % BR == 0, "a step's rows and dQ partials stay inside the padded rows");
};

// Named barriers (0 is __syncthreads): P^T written (both warpgroups wait), dS^T buffer b written / free, warpgroup
// 1's own dS^T stores, the end of both loops, each warpgroup's epilogue staging.
constexpr int kBarP = 1, kBarDsReady = 3, kBarDsFree = 5, kBarOwn = 7, kBarEnd = 8, kBarStage = 9;

// P^T of one step in warpgroup 0's S^T accumulators (keys: rows, queries: columns), masked where the tile needs it.
template <bool kMask>
__device__ __forceinline__ void p_of_s(float (&s)[32], const float* lse2, float c, int key0, int q0, int t,
                                       const AttnBwdParams& p) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * i + 2 * t + (e & 1);
      float pv = ex2(fmaf(s[4 * i + e], c, -lse2[col]));
      if constexpr (kMask) {
        const int key = key0 + 8 * (e >> 1), q = q0 + col;
        if (q >= p.seqlen_q || key >= p.seqlen_k || (p.causal && key > q)) pv = 0.f;
      }
      s[4 * i + e] = pv;
    }
}

// P^T handed to warpgroup 1 in fp16 (one 16-byte store of 8 accumulator elements per thread and r8), in the
// accumulator order warpgroup 1 reads back.
__device__ __forceinline__ void store_hand(uint4* pbuf, int r8, int wt, const float* v) {
  pbuf[r8 * 128 + wt] = make_uint4(lab::pack2<__half>(v[0], v[1]), lab::pack2<__half>(v[2], v[3]),
                                   lab::pack2<__half>(v[4], v[5]), lab::pack2<__half>(v[6], v[7]));
}

// What a CTA does, as a policy (bwd/v21 gives the masks' own):
//   Steps::Params                 the kernel's parameter block (AttnBwdParams or a struct derived from it);
//   Steps::work<C>(p)             the CTA's key block and query-block range;
//   Steps::p_hand<C>(s, pbuf, rows, c, key0, t, wt, work, m0, p)   warpgroup 0's step (this thread's first key
//                                 key0 = n0 + 16 warp + g, its quad lane t, wt its index in the warpgroup): P^T in s
//                                 (dV's A operand) and, into pbuf, what warpgroup 1 multiplies (dP^T - Delta) by for
//                                 dS^T: P^T itself here, P^T times the softcap's derivative with one (bwd/v21).
// The dense kernel's: bwd/v14's grid order (TailSteps), top-left causal, the last partial tiles masked.
struct DenseWideSteps : TailSteps {
  template <class C>
  __device__ __forceinline__ static void p_hand(float (&s)[32], uint4* pbuf, const float* rows, float c, int key0,
                                                int t, int wt, const Work& work, int m0, const AttnBwdParams& p) {
    const bool mask = (p.causal && work.n0 + 63 > m0) || m0 + C::BR > p.seqlen_q || work.n0 + 64 > p.seqlen_k;
    if (mask)
      p_of_s<true>(s, rows, c, key0, m0, t, p);
    else
      p_of_s<false>(s, rows, c, key0, m0, t, p);
#pragma unroll
    for (int r8 = 0; r8 < 4; ++r8) store_hand(pbuf, r8, wt, s + 8 * r8);
  }
};

// dQ_i's chunks of this warpgroup (c = wg, wg + 2 < D / 64) from dS^T tile `ds` and K: one commit group.
template <class C, bool kBf16>
__device__ __forceinline__ void dq_issue(float (&dq)[C::kChunksPerWg][32], uint32_t ds, uint32_t k_tile, int wg) {
#pragma unroll
  for (int j = 0; j < C::kChunksPerWg; ++j) {
    const int chunk = 2 * j + wg;
    if (chunk < C::kChunks) {
#pragma unroll
      for (int kk = 0; kk < C::BC / 16; ++kk)
        WgmmaOp<64>::template ss<kBf16, 1, 1>(dq[j], desc_v(ds, C::BC, kk), desc_v(k_tile + chunk * C::BC * 128, C::BC, kk),
                                              kk > 0);
    }
  }
  wgmma_commit();
}

// The same, waited for (with every GEMM issued before it).
template <class C, bool kBf16>
__device__ __forceinline__ void dq_chunks(float (&dq)[C::kChunksPerWg][32], uint32_t ds, uint32_t k_tile, int wg) {
  wgmma_fence();
  dq_issue<C, kBf16>(dq, ds, k_tile, wg);
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < C::kChunksPerWg; ++j) reg_fence(dq[j]);
}

// The chunks' partials added into dq_accum from the registers (red_dq's order, part = chunk).
template <class C>
__device__ __forceinline__ void red_chunks(const float (&dq)[C::kChunksPerWg][32], int wg, const Work& work, int j,
                                           const AttnBwdParams& p) {
  const int wt = threadIdx.x % 128;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  float* rows = p.dq_accum + (((int64_t)work.b * p.heads_q + work.head(j)) * sq_pad + work.m0(j, C::BR)) * C::D;
#pragma unroll
  for (int jj = 0; jj < C::kChunksPerWg; ++jj) {
    const int chunk = 2 * jj + wg;
    if (chunk >= C::kChunks) continue;
    float* dst = rows + chunk * 64 * C::kDqCols;
#pragma unroll
    for (int r4 = 0; r4 < 8; ++r4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + (r4 * 128 + wt) * 4),
                   "f"(dq[jj][4 * r4]), "f"(dq[jj][4 * r4 + 1]), "f"(dq[jj][4 * r4 + 2]), "f"(dq[jj][4 * r4 + 3])
                   : "memory");
  }
}

// Both consumer warpgroups' steps, one loop: warpgroup 0 (wg) computes S^T, P^T (handed to warpgroup 1 in fp16),
// dV += P^T dO_i; warpgroup 1 dP^T, dS^T (to shared memory for both), dK += dS^T Q_i; each then the last step's dQ
// chunks. acc holds dV (0) or dK (1, unscaled) with every GEMM complete on return. The P^T barrier is one bar.sync that
// both warpgroups execute at the same instruction, after their branches have joined (compute-sanitizer's synccheck
// reports a named barrier synced from two places in the code as divergent threads).
template <class C, class T, class Steps>
__device__ __forceinline__ void consume(float (&acc)[C::D / 2], uint8_t* smem, Bars<C::kStages>& bars,
                                        const Work& work, const typename Steps::Params& p, int wg) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t base = smem_u32(smem);
  const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  const float c = p.scale * kLog2e;
  float dq[C::kChunksPerWg][32];
  auto dq_step = [&](int j) {  // dQ_j: dS^T_j (warpgroup 1's, its own ordered by kBarOwn in step j), the adds
    const int buf = j & 1;
    if (wg == 0) {
      named_barrier_sync(kBarDsReady + buf, 256);
      dq_chunks<C, kBf16>(dq, base + C::kOffDs + buf * C::kDsBytes, base + C::kOffK, 0);
      if (j + 2 < work.n_iters) named_barrier_arrive(kBarDsFree + buf, 256);
      red_chunks<C>(dq, 0, work, j, p);
    } else {
      dq_chunks<C, kBf16>(dq, base + C::kOffDs + buf * C::kDsBytes, base + C::kOffK, 1);
      red_chunks<C>(dq, 1, work, j, p);
    }
  };
  // Main loop
  for (int it = 0; it < work.n_iters; ++it) {
    const int s = it % C::kStages, m0 = work.m0(it, C::BR), buf = it & 1;
    const uint32_t q_s = base + C::kOffQ + s * C::kQBytes, do_s = base + C::kOffDo + s * C::kQBytes;
    const float* rows = reinterpret_cast<const float*>(smem + C::kOffRows + s * 2 * C::kRowBytes);  // LSE, Delta
    mbar_wait(smem_u32(&bars.full[s]), (it / C::kStages) & 1);
    float sp[32];  // S^T (warpgroup 0) or dP^T (1): K Q_i^T or V dO_i^T
    wgmma_fence();
    issue_s<C, kBf16>(sp, base + (wg == 0 ? C::kOffK : C::kOffV), wg == 0 ? q_s : do_s);
    const bool dq_early = C::kDqUnderDp && wg == 1 && it >= 1;
    if (dq_early) {  // dQ_{it-1} behind dP^T: one more commit group, waited for after dS^T
      dq_issue<C, kBf16>(dq, base + C::kOffDs + ((it - 1) & 1) * C::kDsBytes, base + C::kOffK, 1);
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    reg_fence(sp);
    if (wg == 0)
      Steps::template p_hand<C>(sp, reinterpret_cast<uint4*>(smem + C::kOffP + buf * C::kPBytes), rows, c,
                                work.n0 + warp * 16 + g, t, wt, work, m0, p);
    named_barrier_sync(kBarP, 256);  // P^T_it written; warpgroup 1's reads of P^T_{it-1} are over
    if (wg == 0) {
      uint32_t pa[4][4];
      pack_p<64, T>(sp, pa);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) WgmmaOp<C::D>::template rs<kBf16, 1>(acc, pa[kk], desc_v(do_s, C::BR, kk), 1);
      wgmma_commit();
      if (it >= 1)
        dq_step(it - 1);  // its wait covers this step's dV too
      else
        wgmma_wait<0>();
    } else {
      const float* delta = rows + C::BR;
      const uint4* pbuf = reinterpret_cast<const uint4*>(smem + C::kOffP + buf * C::kPBytes);
#pragma unroll
      for (int r8 = 0; r8 < 4; ++r8) {
        const uint4 pw = pbuf[r8 * 128 + wt];
        const uint32_t w[4] = {pw.x, pw.y, pw.z, pw.w};
#pragma unroll
        for (int h = 0; h < 4; ++h) {  // accumulator elements 8 r8 + 2 h, + 1: columns 8 (2 r8 + h / 2) + 2 t, + 1
          const float2 pv = __half22float2(*reinterpret_cast<const __half2*>(&w[h]));
          const int i = 8 * r8 + 2 * h, col = 8 * (2 * r8 + h / 2) + 2 * t;
          sp[i] = pv.x * (sp[i] - delta[col]);
          sp[i + 1] = pv.y * (sp[i + 1] - delta[col + 1]);
        }
      }
      uint32_t dsa[4][4];
      pack_p<64, T>(sp, dsa);
      if (it >= 2) named_barrier_sync(kBarDsFree + buf, 256);  // warpgroup 0 has read dS^T_{it-2}
      uint8_t* ds = smem + C::kOffDs + buf * C::kDsBytes;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          *reinterpret_cast<uint32_t*>(ds + swz_offset(C::BC, warp * 16 + hh * 8 + g, 8 * i + 2 * t)) =
              dsa[i / 2][2 * (i % 2) + hh];
      fence_proxy_async();
      named_barrier_arrive(kBarDsReady + buf, 256);
      named_barrier_sync(kBarOwn, 128);  // every warp's dS^T_it stores, before this warpgroup's dQ GEMM reads them
      if (dq_early) {
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < C::kChunksPerWg; ++j) reg_fence(dq[j]);
        red_chunks<C>(dq, 1, work, it - 1, p);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) WgmmaOp<C::D>::template rs<kBf16, 1>(acc, dsa[kk], desc_v(q_s, C::BR, kk), 1);
      wgmma_commit();
      if (it >= 1 && !dq_early)
        dq_step(it - 1);
      else
        wgmma_wait<0>();
    }
    reg_fence(acc);
    mbar_arrive(smem_u32(&bars.empty[s]));  // this thread's reads of Q_i, dO_i and the rows are over
  }
  if (work.n_iters > 0) dq_step(work.n_iters - 1);
}

// Epilogue: one warpgroup's 64 x D accumulator (dV, or dK times `mul`) to rows n0.. of `dst` (row stride `ld`), keys
// < S_k: as bwd/v12, 16-bit rows staged in `stage` (16-byte chunks XOR-swizzled by row), then whole 16-byte chunks;
// 4-byte stores from the registers where the rows are not 16-byte aligned.
template <class C, class T>
__device__ __forceinline__ void store_rows(const float (&acc)[C::D / 2], float mul, T* dst, int64_t ld, int n0,
                                           int seqlen_k, uint8_t* stage, int bar) {
  constexpr int kRowBytes = C::D * 2, kChunks = C::D / 8;
  const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || ld % 8 != 0) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int key = n0 + warp * 16 + hh * 8 + g;
      if (key >= seqlen_k) continue;
#pragma unroll
      for (int i = 0; i < C::D / 8; ++i)
        *reinterpret_cast<uint32_t*>(dst + (int64_t)key * ld + 8 * i + 2 * t) =
            lab::pack2<T>(acc[4 * i + 2 * hh] * mul, acc[4 * i + 2 * hh + 1] * mul);
    }
    return;
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = warp * 16 + hh * 8 + g;
#pragma unroll
    for (int i = 0; i < C::D / 8; ++i)
      *reinterpret_cast<uint32_t*>(stage + r * kRowBytes + ((i ^ (r % 8)) << 4) + 4 * t) =
          lab::pack2<T>(acc[4 * i + 2 * hh] * mul, acc[4 * i + 2 * hh + 1] * mul);
  }
  named_barrier_sync(bar, 128);
#pragma unroll
  for (int j = 0; j < 64 * kChunks / 128; ++j) {
    const int q = j * 128 + wt, r = q / kChunks, cc = q % kChunks, key = n0 + r;
    if (key >= seqlen_k) continue;
    *reinterpret_cast<uint4*>(dst + (int64_t)key * ld + 8 * cc) =
        *reinterpret_cast<const uint4*>(stage + r * kRowBytes + ((cc ^ (r % 8)) << 4));
  }
}

// The kernel: producer warpgroup 2 (common/hopper/attn_bwd_sm90.cuh's produce), consumers in their roles, one CTA per
// key block in Steps' order (the dense kernel's: bwd/v14's, TailSteps).
template <class C, class T, class Steps = DenseWideSteps>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_wide(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
             const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
             const typename Steps::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<C::kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const Work work = Steps::template work<C>(p);
  const int wg = threadIdx.x / 128;

  // Prologue
  if (threadIdx.x == 0) init_bars(bars);
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (threadIdx.x % 128 == 0) produce<C>(&tq, &tk, &tv, &tdo, bars, smem_u32(smem), work, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  float acc[C::D / 2];  // warpgroup 0: dV; 1: dK
  zero_acc(acc);
  mbar_wait(smem_u32(&bars.kv), 0);

  // Main loop
  consume<C, T, Steps>(acc, smem, bars, work, p, wg);

  // Epilogue: both loops over, so no GEMM reads the Q / dO stages any more.
  named_barrier_sync(kBarEnd, 256);
  const int64_t* ld = wg == 0 ? p.dv_stride : p.dk_stride;
  T* dst = static_cast<T*>(wg == 0 ? p.dv : p.dk) + (int64_t)work.b * ld[0] + (int64_t)work.hkv * ld[1];
  store_rows<C, T>(acc, wg == 0 ? 1.f : p.scale, dst, ld[2], work.n0, p.seqlen_k,
                   smem + (wg == 0 ? C::kOffQ : C::kOffDo), kBarStage + wg);
#endif
}

// The extern "C" entry: D 192 and 256 (lab.ops pads every D_qk, D_v from 129 up to one of them, D_v to D_qk's), then
// Launch<D, T>::run(p, stream, dev).
template <template <int, class> class Launch>
int entry(const AttnBwdParams* p, void* stream) {
  if (p->head_dim != 192 && p->head_dim != 256) return LAB_E_HEAD_DIM;
  if (const int rc = lab::check_bwd_call(p)) return rc < 0 ? rc : 0;
  if (p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30)) return LAB_E_SHAPE;  // TMA coordinates are int32
  if (p->deterministic) return LAB_E_MODE;  // dQ's reductions land in any order
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim == 192)
    return bf16 ? Launch<192, __nv_bfloat16>::run(*p, st, dev) : Launch<192, __half>::run(*p, st, dev);
  return bf16 ? Launch<256, __nv_bfloat16>::run(*p, st, dev) : Launch<256, __half>::run(*p, st, dev);
}

}  // namespace lab::sm90::bwd::wide
