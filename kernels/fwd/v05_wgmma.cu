// v05_wgmma: the first Hopper forward kernel (sm_90a): wgmma + TMA, one
// warpgroup per CTA, no warp specialisation. Correct everywhere first.
//
// What is new against v04 (mma.sync, cp.async, ldmatrix):
// - S_ij = Q_i K_j^T by wgmma.mma_async m64n{B_c}k16 in the SS form: both
//   operands are read by the tensor core straight from shared memory through
//   128B-swizzle descriptors (no ldmatrix, no register copies of Q or K).
// - O_i += P_ij V_j by the RS form m64n{D}k16: P stays in the registers the
//   S accumulator occupied (same fragment layout), V is read N-major from
//   shared memory (imm-trans-b = 1), so no ldmatrix.trans either.
// - Q_i, K_j, V_j arrive by TMA (cp.async.bulk.tensor, 4-D tensor maps over
//   (D, S, H, B) through the caller's strides) into a kStages ring, each
//   load completing on an mbarrier with its byte count; TMA's out-of-bounds
//   zero fill gives the ragged tails, masked to -inf for keys >= S_k.
// - One thread (thread 0) is the producer: after the warpgroup has finished
//   tile j (a named barrier), it refills the stage with tile j + kStages.
//
// Algorithm (FA2 order, Dao 2023, per CTA = one Q_i of B_r = 64 rows):
//   for j: S = Q_i K_j^T; S *= scale*log2e; mask; m_new = max(m, rowmax S);
//          P = exp2(S - m_new); l = l*exp2(m - m_new) + rowsum P;
//          O = O*exp2(m - m_new) + P V_j
//   O /= l; LSE = (m + log2 l) * ln 2.
// The scale is applied to the scores before the running max, so any finite
// scale works (0 and negative included).
//
// Launch: grid ceil(S_q/64) * B * H_q (query block fastest; causal: the
// heaviest block of each head first), 128 threads, smem 64*D*2 + 2*kStages*
// B_c*D*2 (+1 KiB alignment): D = 64: B_c = 64, 2 stages, 41 KiB (B_c = 128,
// 72 KiB for non-causal calls and long causal ones since run 15); D = 128:
// B_c = 64, 2 stages, 81 KiB (two CTAs per SM so that one CTA's softmax
// hides behind the other's GEMMs).
//
// Limits: sm_90 only (cudaErrorNoKernelImageForDevice elsewhere); D 64 and
// 128; fp16 and bf16; any S_q, S_k >= 0; GQA (h -> h / (H_q / H_kv));
// 16-byte-aligned bases and strides that are multiples of 8 elements
// (LAB_E_SHAPE otherwise; lab.ops copies such inputs first).
//
// Prediction (H200, bf16 bench-fwd): the GEMMs run at wgmma rate but nothing
// overlaps within a CTA (issue, wait, softmax, issue, wait), so with two CTAs
// per SM about 60-70 % of the tensor pipe: roughly v04's level (330-380
// TFLOP/s at D = 128), not yet cuDNN's.
// Outcome (H200, bf16 bench-fwd through lab.ops.attention(version="v05"), one
// process; outputs/driver_logs/20261122-h200-hopper-run3-2ca041541f.log),
// TFLOP/s at S = 512/2048/8192/16384, non-causal | causal:
//   D = 64:  347/399/391/379 | 222/353/399/381   (0.81-0.93x SDPA-cuDNN)
//   D = 128: 367/429/440/443 | 249/358/429/430   (0.67-0.77x SDPA-cuDNN)
// Better than predicted: +20-58 % over v04 in the same run (v04: D = 128
// 307-359 non-causal). All 50 checks pass (tests cases, strided, scale 0 /
// negative / 2, LSE); memcheck clean. At D = 64 up to S = 4096 it is the
// fastest of v05-v07 (several 128-thread CTAs per SM hide each other's
// prologue and epilogue), so lab.ops picks it there.
// 2026-11-23 (outputs/driver_logs/20261123-h200-v05-fold-run1-*): v07's FOLD (scale > 0: max on raw
// scores, exp2 by one FFMA) +3.7 % at D = 64 and +1.7 % at D = 128 over the old softmax in one process,
// 54/54 checks: on. With v07's two max / sum chains as well only +1.0 / +0.8 % (one warpgroup, nothing
// to overlap the chains with): one chain kept.
// 2026-11-23 (H200 run 15, outputs/driver_logs/20261123-h200-v05-tiles-run15-8b78b61/): lab.ops
// runs v05 in four cells of bench-fwd (D = 64 at 512, D = 64 causal up to 2k, D = 128 causal 512), three of
// them under SDPA-cuDNN. Prediction: B_c = 128 at D = 64 halves the per-key barrier and shuffle cost, +5 %
// where the tiles are full. Outcome (kernel-only rows, rounds): 512 +5.6 % (378 vs 358), causal 2048 +3.4 %
// (376 vs 363), causal 512 -4.9 % (255 vs 268): a second D = 64 config, picked per call (Cfg64Wide below).
// 3 stages: -10 % at D = 64 and -39 % at D = 128 (fewer CTAs per SM). v07's CHAINS = 4: +-1 %.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v05_wgmma.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"

#ifndef LAB_FWD_WGMMA_FOLD
#define LAB_FWD_WGMMA_FOLD 1  // a scale > 0 runs the kernel with the scale folded into exp2's FFMA (v07's FOLD)
#endif

namespace {
using namespace lab::sm90;

template <int D_, int BC_, int STAGES_>
struct Cfg05 {
  static constexpr int D = D_;
  static constexpr bool kNarrow = false;  // Narrow<Cfg05>: a head dim below D (common attn_fwd_sm90.cuh)
  static constexpr int BR = 64;  // one warpgroup, one m64 row block
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128;
  static constexpr int kQBytes = BR * D * 2;
  static constexpr int kTileBytes = BC * D * 2;  // one K_j or one V_j
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
};
// Tile knobs (compile-time, for sweeps): B_c and the ring depth per head dim.
#ifndef LAB_FWD_WGMMA_D64_BC
#define LAB_FWD_WGMMA_D64_BC 64
#endif
#ifndef LAB_FWD_WGMMA_D64_STAGES
#define LAB_FWD_WGMMA_D64_STAGES 2
#endif
#ifndef LAB_FWD_WGMMA_D128_BC
#define LAB_FWD_WGMMA_D128_BC 64
#endif
#ifndef LAB_FWD_WGMMA_D128_STAGES
#define LAB_FWD_WGMMA_D128_STAGES 2
#endif
// D = 64, a second config per call (Launch below): B_c = 128 for non-causal calls and for causal calls with
// more than WIDE_MIN_SK_CAUSAL keys (H200 run 15, kernel-only rows in rounds: 512 378 vs 358, causal 2048 376
// vs 363, causal 512 255 vs 268 TFLOP/s). Half the barrier round trips and row max / sum shuffles per key;
// at causal 512 the diagonal tiles' masked half costs more than that saves. 72 KiB and 129 registers: three
// CTAs per SM instead of four. (3 stages at D = 64, or at D = 128, lose 10-40 %: fewer CTAs per SM.)
#ifndef LAB_FWD_WGMMA_D64_WIDE_BC
#define LAB_FWD_WGMMA_D64_WIDE_BC 128
#endif
#ifndef LAB_FWD_WGMMA_D64_WIDE_MIN_SK_CAUSAL
#define LAB_FWD_WGMMA_D64_WIDE_MIN_SK_CAUSAL 1024  // between 512 (narrow wins) and 2048 (wide wins): not measured
#endif
using Cfg64 = Cfg05<64, LAB_FWD_WGMMA_D64_BC, LAB_FWD_WGMMA_D64_STAGES>;
using Cfg64Wide = Cfg05<64, LAB_FWD_WGMMA_D64_WIDE_BC, LAB_FWD_WGMMA_D64_STAGES>;
using Cfg128 = Cfg05<128, LAB_FWD_WGMMA_D128_BC, LAB_FWD_WGMMA_D128_STAGES>;

template <class Cfg, class T, bool kFold>
__global__ void __launch_bounds__(128) attn_fwd_v05_kernel(const __grid_constant__ CUtensorMap tq,
                                                           const __grid_constant__ CUtensorMap tk,
                                                           const __grid_constant__ CUtensorMap tv,
                                                           const AttnFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);

  // Prologue: which (b, h, Q_i) this CTA computes.
  const WorkTile work = cta_work_tile<Cfg>(p);
  const int b = work.b, h = work.h, hkv = work.hkv, m0 = work.m0, n_tiles = work.n_tiles;
  const int tid = threadIdx.x;

  if (tid == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    fence_barrier_init();
  }
  __syncthreads();

  auto issue = [&](int j) {  // thread 0: tile j of K and V into stage j % kStages
    const int s = j % kStages;
    mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, j * BC, hkv, b);
    mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, j * BC, hkv, b);
  };
  if (tid == 0) {
    tma_prefetch_maps(&tq, &tk, &tv);
    mbar_arrive_expect_tx(smem_u32(&bar_q), Cfg::kQBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.q + cb * 64 * 128, &tq, smem_u32(&bar_q), cb * 64, m0, h, b);
    for (int j = 0; j < kStages && j < n_tiles; ++j) issue(j);
  }

  const float c = p.scale * kLog2e;
  const int row0 = m0 + (tid / 32) * 16 + (tid % 32) / 4;
  float o[D / 2];
  zero_acc(o);
  RowState st;
  mbar_wait(smem_u32(&bar_q), 0);

  // Main loop
  for (int j = 0; j < n_tiles; ++j) {
    serial_tile<Cfg, T, /*kChains=*/1, kFold>(o, st, ring, ring.q, bar_k, bar_v, j, m0, row0, c, p);
    if (j + kStages < n_tiles) {
      named_barrier_sync(1, 128);  // every warp is done with stage s
      if (tid == 0) issue(j + kStages);
    }
  }

  // Epilogue
  epilogue<D, T, Cfg::kNarrow>(o, st, p, smem, b, h, m0, 1);
#endif
}

template <class C, class T>
int launch_cfg(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  return launch_fwd_sm90_fold<C, attn_fwd_v05_kernel<C, T, true>, attn_fwd_v05_kernel<C, T, false>,
                              LAB_FWD_WGMMA_FOLD != 0>(p, stream, dev);
}

template <class Cfg, class T>
struct Launch {
  static int run(const AttnFwdParams& p, cudaStream_t stream, int dev) {
    if constexpr (Cfg::D == 64)
      if (!p.causal || p.seqlen_k > LAB_FWD_WGMMA_D64_WIDE_MIN_SK_CAUSAL)
        return launch_cfg<NarrowLike<Cfg, Cfg64Wide>, T>(p, stream, dev);
    return launch_cfg<Cfg, T>(p, stream, dev);
  }
};

}  // namespace

extern "C" int attn_fwd_v05(const AttnFwdParams* p, void* stream) {
  return fwd_sm90_entry<Cfg64, Cfg128, Launch, /*kNarrowToo=*/true>(p, stream);
}
