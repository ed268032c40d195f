// v06_warpspec: v05 with warp specialisation (sm_90a).
//
// What is new against v05:
// - A producer warpgroup (warpgroup 0; one thread of it works) issues every
//   TMA load: Q_i once, then K_j and V_j into a kStages ring. It waits on an
//   `empty` mbarrier per stage (one arrival per consumer warp) before reusing
//   a stage, so loads run ahead of the math by kStages - 1 tiles without any
//   CTA-wide barrier in the loop.
// - kConsumers consumer warpgroups (1..3), each owning 64 rows of
//   B_r = 64 * kConsumers, run v05's loop on the shared K_j / V_j tiles: a
//   K/V tile loaded once feeds 2-3 warpgroups, and while one warpgroup does
//   its softmax the tensor core runs another's GEMM (the overlap v05 only had
//   between CTAs).
// - setmaxnreg: the producer gives its registers back (kRegsProducer) and the
//   consumers take them (kRegsConsumer): 128 * P + 128 * kConsumers * C <=
//   65536. The kernel is compiled with __launch_bounds__(threads, 1), the cap
//   setmaxnreg needs.
//
// Tile sizes (one place; why):
//   D = 64:  3 consumers (B_r = 192), B_c = 128, 3 stages: smem Q 24 KiB +
//            3 x (16 + 16) KiB = 120 KiB; per consumer thread O 32 + S 64 +
//            P 32 registers, under the 160 that 3 consumers can have
//            (24 + 3 x 160 per 128 threads). B_r = 192 halves the K/V smem
//            reads per FLOP against B_r = 64 x 2 CTAs.
//   D = 128: 2 consumers (B_r = 128), B_c = 128, 2 stages: Q 32 KiB +
//            2 x (32 + 32) KiB = 160 KiB (3 stages would be 224 KiB + Q:
//            over the 227 KiB limit); O 64 + S 64 + P 32 registers need
//            more than 160, so 2 consumers at 240 (24 + 2 x 240).
//   Rejected: B_c = 64 at D = 128 (half the work per barrier round trip, 2x
//   the softmax overhead per GEMM issue). D = 128 with 3 consumers was first
//   rejected on paper (O, S and P in 160 registers); it compiles without
//   spills (P reuses S's registers) and was measured on 2026-11-23
//   (LAB_FWD_WARPSPEC_D128_CONSUMERS=3, outputs/driver_logs/20261123-h200-v07-ablate-
//   run1-*): 395/485/540/488 TFLOP/s at S = 512/2048/8192/8192 causal, +4 to
//   +25 % over 2 consumers, still below v07 (392/582/564/501): left off.
//
// Prediction (H200 bf16 bench-fwd): producer/consumer overlap plus 2-3
// warpgroups per SM taking turns on the tensor core: ~480-550 TFLOP/s at
// D = 128 non-causal (S >= 2048), ~400-450 at D = 64; still below cuDNN at
// D = 128 because each warpgroup waits for its own S before its softmax and
// for its own PV before the next S (v07's job).
// Outcome (H200, run 3, outputs/driver_logs/20261122-h200-hopper-run3-2ca041541f.log),
// TFLOP/s at S = 512/2048/8192/16384, non-causal | causal:
//   D = 64:  269/358/400/409 | 159/294/361/388   (0.66-0.88x SDPA-cuDNN)
//   D = 128: 381/469/506/519 | 231/365/459/490   (0.70-0.86x SDPA-cuDNN)
// D = 128 at the low end of the prediction (469-519 at S >= 2048), D = 64
// below it (358-409): D = 64 is bound by exp2 (one MUFU op per score, 16 per
// clock per SM, about as many clocks as the GEMMs) more than by the tensor
// core. S = 512 is slower than v05: one 384-512-thread CTA per SM, 2-4 tiles
// per CTA, nothing hides the prologue. 50/50 checks, memcheck clean.
//
// Limits, algorithm, masking and epilogue: v05's (common/hopper/attn_fwd_sm90.cuh).
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v06_warpspec.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"

#ifndef LAB_FWD_WARPSPEC_D64_STAGES
#define LAB_FWD_WARPSPEC_D64_STAGES 3
#endif
#ifndef LAB_FWD_WARPSPEC_D128_STAGES
#define LAB_FWD_WARPSPEC_D128_STAGES 2
#endif
#ifndef LAB_FWD_WARPSPEC_D128_CONSUMERS
#define LAB_FWD_WARPSPEC_D128_CONSUMERS 2  // 3: 160 registers each (a sweep switch)
#endif

namespace {
using namespace lab::sm90;

template <int D_, int BC_, int CONSUMERS_, int STAGES_, int REGS_P_, int REGS_C_>
struct Cfg06 {
  static constexpr int D = D_;
  static constexpr int kConsumers = CONSUMERS_;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = REGS_P_;
  static constexpr int kRegsConsumer = REGS_C_;
  static constexpr int kQBytesWG = 64 * D * 2;  // one consumer's Q rows
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
};
using Cfg64 = Cfg06<64, 128, 3, LAB_FWD_WARPSPEC_D64_STAGES, 24, 160>;
using Cfg128 = Cfg06<128, 128, LAB_FWD_WARPSPEC_D128_CONSUMERS, LAB_FWD_WARPSPEC_D128_STAGES, 24,
                     LAB_FWD_WARPSPEC_D128_CONSUMERS >= 3 ? 160 : 240>;

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v06_kernel(const __grid_constant__ CUtensorMap tq,
                                                                        const __grid_constant__ CUtensorMap tk,
                                                                        const __grid_constant__ CUtensorMap tv,
                                                                        const AttnFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], bar_empty[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);

  // Prologue: which (b, h, Q_i) this CTA computes (v05's order).
  const WorkTile work = cta_work_tile<Cfg>(p);
  const int b = work.b, h = work.h, hkv = work.hkv, m0 = work.m0, n_tiles = work.n_tiles;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    for (int s = 0; s < kStages; ++s)
      mbar_init(smem_u32(&bar_empty[s]), 4 * Cfg::kConsumers);  // one arrival per consumer warp
    fence_barrier_init();
  }
  __syncthreads();  // the last CTA-wide barrier: roles split below

  if (wg == 0) {
    // Producer
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      load_q_consumers<Cfg>(ring.q, &tq, smem_u32(&bar_q), m0, h, b);
      for (int j = 0; j < n_tiles; ++j) {
        const int s = j % kStages;
        if (j >= kStages) mbar_wait(smem_u32(&bar_empty[s]), ((j / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
        for (int cb = 0; cb < D / 64; ++cb)
          tma_load_4d(ring.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, j * BC, hkv, b);
        mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
        for (int cb = 0; cb < D / 64; ++cb)
          tma_load_4d(ring.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, j * BC, hkv, b);
      }
    }
  } else {
    // Consumers
    setmaxnreg_inc<Cfg::kRegsConsumer>();
    const int ct = threadIdx.x - 128 * wg;  // thread index inside this warpgroup
    const int wm0 = m0 + 64 * (wg - 1);     // this warpgroup's first row
    const uint32_t sQw = ring.q + (wg - 1) * Cfg::kQBytesWG;
    const float c = p.scale * kLog2e;
    const int row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
    float o[D / 2];
    zero_acc(o);
    RowState st;
    mbar_wait(smem_u32(&bar_q), 0);

    // Main loop
    for (int j = 0; j < n_tiles; ++j) {
      serial_tile<Cfg, T>(o, st, ring, sQw, bar_k, bar_v, j, wm0, row0, c, p);
      if (ct % 32 == 0) mbar_arrive(smem_u32(&bar_empty[j % kStages]));  // this warp is done with stage s
    }

    // Epilogue
    epilogue<D, T>(o, st, p, smem + (wg - 1) * Cfg::kQBytesWG, b, h, wm0, wg);
  }
#endif
}

template <class Cfg, class T>
struct Launch {
  static int run(const AttnFwdParams& p, cudaStream_t stream, int dev) {
    return launch_fwd_sm90<Cfg, attn_fwd_v06_kernel<Cfg, T>>(p, stream, dev);
  }
};

}  // namespace

extern "C" int attn_fwd_v06(const AttnFwdParams* p, void* stream) {
  return fwd_sm90_entry<Cfg64, Cfg128, Launch>(p, stream);
}
