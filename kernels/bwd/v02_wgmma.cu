// Backward attention v02: the first Hopper backward (sm_90a): wgmma for all five GEMMs, TMA loads on an
// mbarrier ring, a producer warp and two consumer warpgroups (setmaxnreg), dQ reduced by the copy engine.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: kernels/bwd/README.md (correctness, sanitizers, the race against SDPA's backward).
//
// The algorithm is v01's (FA2's backward; the header of bwd/v01_mma.cu has the equations), with keys as the
// wgmma M dimension so that P^T and dS^T come out of the accumulators already in the A-operand layout:
//   per CTA: one key block K_j, V_j of B_c = 128 keys of one KV head; consumer warpgroup w owns keys 64w..+63
//   for every query head of the GQA group, every query block Q_i of B_r = 64 rows (causal: i >= j only):
//     S^T  = K_w Q_i^T           SS  m64n64,  k = D      (K-major K and Q tiles, as TMA wrote them)
//     dP^T = V_w dO_i^T          SS  m64n64,  k = D
//     P^T  = exp2(S^T * scale * log2 e - LSE_i * log2 e)          (LSE from the forward: no running max)
//     dV_w += P^T dO_i           RS  m64nD,   k = B_r  (P^T from registers, dO read MN-major)
//     dS^T = P^T * (dP^T - Delta_i)
//     dK_w += dS^T Q_i           RS  m64nD,   k = B_r
//     dS^T -> shared memory (bf16/fp16, 128B swizzle), then dQ_i partial = dS_i K:
//       D = 128: warpgroup w computes columns 64w..64w+63 over all 128 keys (both halves of dS^T, the K
//                column block w): SS m64n64, k = 128, A read M-major (transposed) from the dS^T tile;
//       D = 64:  warpgroup w computes all 64 columns over its own 64 keys: SS m64n64, k = 64.
//     The 64 x 64 fp32 partial goes to shared memory in accumulator order (each thread's 4 consecutive
//     registers as one 16-byte store, threads consecutive: no bank conflict) and one thread of the warpgroup
//     hands it to the copy engine (cp.reduce.async.bulk .add.f32, 16 KB) into dq_accum, double-buffered.
//   dK (times scale) and dV stay in registers for the whole CTA and are stored once: the GQA sum is a loop.
// dq_accum therefore holds each 64-row block of dQ in the accumulator order of the warpgroup that wrote it
// (FA3's trick; no transposition on the critical path), and bwd_convert_v02 puts it back in (B, H, S, D)
// order, times scale, cast. Rows are padded to 64 (AttnBwdParams' workspace rule).
//
// Launches: bwd_pre (common/bwd_prepass.cuh), a memset of dq_accum, bwd_dkdv_v02, bwd_convert_v02.
// Launch shape of bwd_dkdv_v02: grid ceil(S_k / 128) * H_kv * B (the key block fastest: the CTAs of one head
// run together and share its Q and dO in L2; causal: key block 0, the longest, first), 384 threads (warpgroup
// 0 and 1 consumers, 240 registers each; warpgroup 2 the producer, 24 registers, one thread issuing TMA).
// Shared memory: K and V (2 x 128 x D x 2 B), kStages x (Q_i, dO_i, LSE_i, Delta_i), dS^T (128 x 64 x 2 B),
// 2 x 2 dQ buffers of 16 KB: D = 128: 210 KB, D = 64: 146 KB.
//
// Limits: sm_90 only; D 64 and 128; fp16 and bf16; any S_q, S_k >= 0 (TMA's zero fill gives the ragged tails,
// masked where a tile needs it: causal diagonal, keys >= S_k, queries >= S_q); GQA; any finite scale;
// 16-byte-aligned bases, strides multiples of 8 elements. Deterministic mode is not this kernel's: the
// reduction order of the copy engine's adds is not fixed, so lab.ops runs v01's separate dQ pass then.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v02_wgmma.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/bwd_prepass.cuh"
#include "common/hopper/attn_fwd_sm90.cuh"

namespace {
using namespace lab::sm90;

// One place for the tile choice, with what was rejected and why.
//   B_c = 128 keys per CTA as two consumer warpgroups of m64: a CTA reads each Q_i / dO_i once for 128 keys
//     (B_c = 64, one consumer: twice the Q/dO traffic and half the tensor work per barrier).
//   B_r = 64 queries per step: the smallest wgmma N that keeps S^T and dP^T at 32 registers each; with dK and
//     dV (2 x D/2) resident, D = 128 needs 64 + 64 + 32 + 32 + P/dS fragments: inside 240 registers only at 64.
//   kStages = 2: two Q/dO steps in flight cover the TMA latency at one CTA per SM; a third does not fit
//     beside the dQ buffers at D = 128 (227 KB).
template <int D_>
struct Cfg02 {
  static constexpr int D = D_;
  static constexpr int BR = 64;
  static constexpr int BC = 128;
  static constexpr int kStages = 2;
  static constexpr bool kSplitDq = D == 128;  // dQ split by columns (both halves of dS) or by keys (own half)
  static constexpr int kThreads = 384;
  static constexpr int kRegsConsumer = 240, kRegsProducer = 24;
  static constexpr int kKVBytes = BC * D * 2;   // one of K, V
  static constexpr int kQBytes = BR * D * 2;    // one of Q_i, dO_i
  static constexpr int kDsBytes = BC * BR * 2;  // dS^T
  static constexpr int kDqBytes = 64 * 64 * 4;  // one warpgroup's dQ partial
  static constexpr int kRowBytes = BR * 4;      // LSE_i or Delta_i
  // offsets from the 1024-aligned base
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffQ = 2 * kKVBytes;
  static constexpr int kOffDo = kOffQ + kStages * kQBytes;
  static constexpr int kOffDs = kOffDo + kStages * kQBytes;
  static constexpr int kOffDq = kOffDs + kDsBytes;  // [warpgroup][buffer]
  static constexpr int kOffRows = kOffDq + 4 * kDqBytes;  // [stage] LSE then Delta
  static constexpr int kSmem = kOffRows + kStages * 2 * kRowBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
  static_assert(D == 64 || D == 128, "dQ is one m64n64 GEMM per warpgroup: D / 2 (split) or D (own keys) = 64");
};

constexpr int kBarDsFree = 1, kBarDsReady = 2, kBarWg = 3;  // named barriers (0 is __syncthreads)

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The work of one CTA: key block nb of KV head hkv, batch b; query blocks mb0 .. n_mb - 1 of each query head
// of the group (causal: the first query block that reaches key n0).
struct BwdWork {
  int b, hkv, n0, mb0, n_mb, group, n_iters;
};
template <class Cfg>
__device__ __forceinline__ BwdWork bwd_work(const AttnBwdParams& p) {
  const int n_kb = (p.seqlen_k + Cfg::BC - 1) / Cfg::BC;
  const int nb = blockIdx.x % n_kb;
  const int bh = blockIdx.x / n_kb;
  BwdWork w;
  w.b = bh / p.heads_kv;
  w.hkv = bh % p.heads_kv;
  w.n0 = nb * Cfg::BC;
  w.n_mb = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  w.mb0 = p.causal ? min(w.n0 / Cfg::BR, w.n_mb) : 0;
  w.group = p.heads_q / p.heads_kv;
  w.n_iters = w.group * (w.n_mb - w.mb0);
  return w;
}

// P^T and dS^T of one step for one thread's accumulator share (keys: rows, queries: columns), masked where
// the tile needs it. s holds S^T and becomes P^T; dp holds dP^T and becomes dS^T.
template <bool kMask>
__device__ __forceinline__ void p_ds(float (&s)[32], float (&dp)[32], const float* lse2, const float* delta,
                                     float c, int key0, int q0, int t, const AttnBwdParams& p) {
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
      dp[4 * i + e] = pv * (dp[4 * i + e] - delta[col]);
    }
}

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    bwd_dkdv_v02(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                 const AttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BR = Cfg::BR, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_kv, bar_full[kStages], bar_empty[kStages];
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const BwdWork work = bwd_work<Cfg>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);

  // Prologue
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&bar_kv), 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bar_full[s]), 1);
      mbar_init(smem_u32(&bar_empty[s]), 8);  // lane 0 of each consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 2) {
    // Producer: K and V once, then Q_i, dO_i, LSE_i, Delta_i per step into the ring.
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (wt == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      tma_prefetch_map(&tdo);
      mbar_arrive_expect_tx(smem_u32(&bar_kv), 2 * Cfg::kKVBytes);
      for (int cb = 0; cb < D / 64; ++cb) {
        tma_load_4d(base + Cfg::kOffK + cb * BC * 128, &tk, smem_u32(&bar_kv), cb * 64, work.n0, work.hkv, work.b);
        tma_load_4d(base + Cfg::kOffV + cb * BC * 128, &tv, smem_u32(&bar_kv), cb * 64, work.n0, work.hkv, work.b);
      }
      const int per_head = work.n_mb - work.mb0;
      for (int it = 0; it < work.n_iters; ++it) {
        const int s = it % kStages;
        const int hq = work.hkv * work.group + it / per_head, m0 = (work.mb0 + it % per_head) * BR;
        mbar_wait(smem_u32(&bar_empty[s]), ((it / kStages) & 1) ^ 1);
        const uint32_t full = smem_u32(&bar_full[s]);
        mbar_arrive_expect_tx(full, 2 * Cfg::kQBytes + 2 * Cfg::kRowBytes);
        for (int cb = 0; cb < D / 64; ++cb) {
          tma_load_4d(base + Cfg::kOffQ + s * Cfg::kQBytes + cb * BR * 128, &tq, full, cb * 64, m0, hq, work.b);
          tma_load_4d(base + Cfg::kOffDo + s * Cfg::kQBytes + cb * BR * 128, &tdo, full, cb * 64, m0, hq, work.b);
        }
        const int64_t row = ((int64_t)work.b * p.heads_q + hq) * sq_pad + m0;
        const uint32_t rows = base + Cfg::kOffRows + s * 2 * Cfg::kRowBytes;
        bulk_load_1d(rows, p.lse_log2 + row, Cfg::kRowBytes, full);
        bulk_load_1d(rows + Cfg::kRowBytes, p.delta + row, Cfg::kRowBytes, full);
      }
    }
    return;
  }

  // Consumers
  setmaxnreg_inc<Cfg::kRegsConsumer>();
  const int warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  const int kw0 = work.n0 + 64 * wg;  // this warpgroup's first key
  const uint32_t k_w = base + Cfg::kOffK + wg * 64 * 128, v_w = base + Cfg::kOffV + wg * 64 * 128;
  const uint32_t ds = base + Cfg::kOffDs;
  const float c = p.scale * kLog2e;
  float dk[D / 2], dv[D / 2];
  zero_acc(dk);
  zero_acc(dv);
  mbar_wait(smem_u32(&bar_kv), 0);

  // Main loop
  const int per_head = work.n_mb - work.mb0;
  for (int it = 0; it < work.n_iters; ++it) {
    const int s = it % kStages;
    const int hq = work.hkv * work.group + it / per_head, m0 = (work.mb0 + it % per_head) * BR;
    const uint32_t q_s = base + Cfg::kOffQ + s * Cfg::kQBytes, do_s = base + Cfg::kOffDo + s * Cfg::kQBytes;
    const float* rows = reinterpret_cast<const float*>(smem + Cfg::kOffRows + s * 2 * Cfg::kRowBytes);
    mbar_wait(smem_u32(&bar_full[s]), (it / kStages) & 1);

    float sacc[32], dpacc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaOp<64>::ss<kBf16, 0>(sacc, desc_kmajor(k_w, BC, kk), desc_kmajor(q_s, BR, kk), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      WgmmaOp<64>::ss<kBf16, 0>(dpacc, desc_kmajor(v_w, BC, kk), desc_kmajor(do_s, BR, kk), kk > 0);
    wgmma_commit();

    // The tile needs masks on the causal diagonal and at the ragged ends only.
    const bool mask = (p.causal && kw0 + 63 > m0) || m0 + BR > p.seqlen_q || kw0 + 64 > p.seqlen_k;
    const int key0 = kw0 + warp * 16 + g;
    wgmma_wait<0>();
    reg_fence(sacc);
    reg_fence(dpacc);
    if (mask)
      p_ds<true>(sacc, dpacc, rows, rows + BR, c, key0, m0, t, p);
    else
      p_ds<false>(sacc, dpacc, rows, rows + BR, c, key0, m0, t, p);

    uint32_t pa[BR / 16][4], dsa[BR / 16][4];
    pack_p<BR, T>(sacc, pa);
    pack_p<BR, T>(dpacc, dsa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) WgmmaOp<D>::template rs<kBf16, 1>(dv, pa[kk], desc_v(do_s, BR, kk), 1);
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) WgmmaOp<D>::template rs<kBf16, 1>(dk, dsa[kk], desc_v(q_s, BR, kk), 1);
    wgmma_commit();

    // dS^T to shared memory: every read of the last step's dS^T (the other warpgroup's too) is over first.
    if constexpr (Cfg::kSplitDq) named_barrier_sync(kBarDsFree, 256);
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 64 * wg + warp * 16 + hh * 8 + g;
        *reinterpret_cast<uint32_t*>(smem + Cfg::kOffDs + swz_offset(BC, r, 8 * i + 2 * t)) = dsa[i / 2][2 * (i % 2) + hh];
      }
    fence_proxy_async();
    if constexpr (Cfg::kSplitDq)
      named_barrier_sync(kBarDsReady, 256);
    else
      named_barrier_sync(kBarWg + wg, 128);

    float dq[32];
    wgmma_fence();
    if constexpr (Cfg::kSplitDq) {
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk)
        WgmmaOp<64>::ss<kBf16, 1, 1>(dq, desc_v(ds, BC, kk), desc_v(base + Cfg::kOffK + wg * BC * 128, BC, kk), kk > 0);
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        WgmmaOp<64>::ss<kBf16, 1, 1>(dq, desc_v(ds + wg * 64 * 128, BC, kk), desc_v(k_w, BC, kk), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(dk);
    reg_fence(dv);
    __syncwarp();  // every lane's reads of LSE_i / Delta_i happen before lane 0's release of the stage
    if (lane == 0) mbar_arrive(smem_u32(&bar_empty[s]));  // Q_i, dO_i and the rows are read

    // dQ partial: accumulator order into buffer (it & 1), then the copy engine adds it into dq_accum.
    uint8_t* buf = smem + Cfg::kOffDq + (2 * wg + (it & 1)) * Cfg::kDqBytes;
#pragma unroll
    for (int r4 = 0; r4 < 8; ++r4)
      *reinterpret_cast<float4*>(buf + (r4 * 128 + wt) * 16) =
          make_float4(dq[4 * r4], dq[4 * r4 + 1], dq[4 * r4 + 2], dq[4 * r4 + 3]);
    fence_proxy_async();
    named_barrier_sync(kBarWg + wg, 128);
    if (wt == 0) {
      float* dst = p.dq_accum + (((int64_t)work.b * p.heads_q + hq) * sq_pad + m0) * D +
                   (Cfg::kSplitDq ? wg * 64 * 64 : 0);
      bulk_reduce_add_f32(dst, smem_u32(buf), Cfg::kDqBytes);
      bulk_commit();
      bulk_wait_read<1>();  // the buffer of the step before is free again before the next step's barriers
    }
  }
  if (wt == 0) bulk_wait<0>();

  // Epilogue: dK (times scale) and dV, rows < S_k, 4-byte stores straight from the accumulators.
  T* dkg = static_cast<T*>(p.dk) + (int64_t)work.b * p.dk_stride[0] + (int64_t)work.hkv * p.dk_stride[1];
  T* dvg = static_cast<T*>(p.dv) + (int64_t)work.b * p.dv_stride[0] + (int64_t)work.hkv * p.dv_stride[1];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = kw0 + warp * 16 + hh * 8 + g;
    if (key >= p.seqlen_k) continue;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int col = 8 * i + 2 * t;
      *reinterpret_cast<uint32_t*>(dkg + (int64_t)key * p.dk_stride[2] + col) =
          lab::pack2<T>(dk[4 * i + 2 * hh] * p.scale, dk[4 * i + 2 * hh + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dvg + (int64_t)key * p.dv_stride[2] + col) =
          lab::pack2<T>(dv[4 * i + 2 * hh], dv[4 * i + 2 * hh + 1]);
    }
  }
#endif
}

// dQ = scale * dq_accum, from the accumulator order back to (B, H, S, D): one thread per float4 of a block
// (index (r4 * 128 + wt) * 4 of part `part`), which holds rows g and g + 8 of warp wt / 32 at two columns.
template <class Cfg, class T>
__global__ void __launch_bounds__(256) bwd_convert_v02(const AttnBwdParams p) {
  constexpr int D = Cfg::D;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  const int64_t quads = (int64_t)p.batch * p.heads_q * sq_pad * D / 4;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < quads;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t block = idx / (64 * D / 4);  // (b, h, 64-row block)
    const int in = (int)(idx % (64 * D / 4));
    const int part = in / 1024, r4 = (in % 1024) / 128, wt = in % 128;
    const int warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
    const int row = (int)(block % (sq_pad / 64)) * 64 + warp * 16 + g;
    const int col = (Cfg::kSplitDq ? part * 64 : 0) + 8 * r4 + 2 * t;
    const int64_t bh = block / (sq_pad / 64);
    const int b = (int)(bh / p.heads_q), h = (int)(bh % p.heads_q);
    const float4 a = reinterpret_cast<const float4*>(p.dq_accum)[idx];
    T* dst = static_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[1] + col;
    if (row < p.seqlen_q)
      *reinterpret_cast<uint32_t*>(dst + row * p.dq_stride[2]) = lab::pack2<T>(a.x * p.scale, a.y * p.scale);
    if (row + 8 < p.seqlen_q)
      *reinterpret_cast<uint32_t*>(dst + (row + 8) * p.dq_stride[2]) = lab::pack2<T>(a.z * p.scale, a.w * p.scale);
  }
}

// ---------------------------------------------------------------- host
template <class Cfg, class T>
int launch(const AttnBwdParams& p, cudaStream_t st, int dev) {
  constexpr int D = Cfg::D;
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  const int64_t pre_threads = lab::bwd::bwd_pre_threads(p, D);
  cudaError_t err = cudaSuccess;
  if (pre_threads > 0) {
    lab::bwd::bwd_pre<T, D><<<(unsigned)((pre_threads + 127) / 128), 128, 0, st>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  const size_t accum = (size_t)p.batch * p.heads_q * sq_pad * D;
  if (accum > 0 && (err = cudaMemsetAsync(p.dq_accum, 0, accum * sizeof(float), st)) != cudaSuccess) return err;
  CUtensorMap tq, tk, tv, tdo;
  const int Sq = p.seqlen_q > 0 ? p.seqlen_q : 1;  // S_q = 0: the maps are never read, but must be legal
  if (!make_bhsd_map(&tq, p.q, bf16, D, Sq, p.heads_q, p.batch, p.q_stride, Cfg::BR) ||
      !make_bhsd_map(&tdo, p.dout, bf16, D, Sq, p.heads_q, p.batch, p.do_stride, Cfg::BR) ||
      !make_bhsd_map(&tk, p.k, bf16, D, p.seqlen_k, p.heads_kv, p.batch, p.k_stride, Cfg::BC) ||
      !make_bhsd_map(&tv, p.v, bf16, D, p.seqlen_k, p.heads_kv, p.batch, p.v_stride, Cfg::BC))
    return LAB_E_SHAPE;
  constexpr auto kernel = bwd_dkdv_v02<Cfg, T>;
  if ((err = lab::allow_smem_once<kernel>(Cfg::kSmem, dev)) != cudaSuccess) return err;
  const int64_t blocks = (int64_t)((p.seqlen_k + Cfg::BC - 1) / Cfg::BC) * p.heads_kv * p.batch;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  kernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmem, st>>>(tq, tk, tv, tdo, p);
  if ((err = cudaGetLastError()) != cudaSuccess || accum == 0) return err;
  const int64_t quads = (int64_t)accum / 4, grid = (quads + 255) / 256;
  bwd_convert_v02<Cfg, T><<<(unsigned)(grid < 65536 ? grid : 65536), 256, 0, st>>>(p);
  return cudaGetLastError();
}

}  // namespace

extern "C" int attn_bwd_v02(const AttnBwdParams* p, void* stream) {
  if (p->head_dim != 64 && p->head_dim != 128) return LAB_E_HEAD_DIM;
  if (p->dtype != LAB_FP16 && p->dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_k < 0 || p->heads_q <= 0 || p->heads_kv <= 0 ||
      p->heads_q % p->heads_kv != 0 || p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30))
    return LAB_E_SHAPE;
  if (p->batch == 0 || p->seqlen_k == 0) return 0;  // nothing to write
  if (p->deterministic) return LAB_E_MODE;  // the copy engine's reduction order is not fixed: v01's dQ pass
  if (p->lse == nullptr || p->delta == nullptr || p->lse_log2 == nullptr || p->dq_accum == nullptr)
    return LAB_E_WORKSPACE;
  using lab::aligned16;
  using lab::strides_ok;
  if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->o) || !aligned16(p->dout) ||
      !aligned16(p->dq) || !aligned16(p->dk) || !aligned16(p->dv) || !aligned16(p->delta) ||
      !aligned16(p->lse_log2) || !aligned16(p->dq_accum) || !strides_ok(p->q_stride) || !strides_ok(p->k_stride) ||
      !strides_ok(p->v_stride) || !strides_ok(p->o_stride) || !strides_ok(p->do_stride) ||
      !strides_ok(p->dq_stride) || !strides_ok(p->dk_stride) || !strides_ok(p->dv_stride))
    return LAB_E_SHAPE;
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim == 64)
    return bf16 ? launch<Cfg02<64>, __nv_bfloat16>(*p, st, dev) : launch<Cfg02<64>, __half>(*p, st, dev);
  return bf16 ? launch<Cfg02<128>, __nv_bfloat16>(*p, st, dev) : launch<Cfg02<128>, __half>(*p, st, dev);
}
