// The staggered backward loop of bwd/v05 and the versions built on it: each step's dQ GEMM deferred by one step
// behind a producer/consumer pair of named barriers per dS^T buffer, and non-causal warpgroups started half a
// step apart. bwd/v05_stagger.cu has the design and its measurements. A version says where each dQ partial goes
// through a Sink, one per consumer thread (it may carry state from step to step):
//   sink.add<C>(dq, smem, work, j, p)  step j's partial in accumulator order, its GEMM complete (every consumer
//                                      thread, after the dS^T buffer is released);
//   sink.finish<C>(work, p)            once, after the last step's add;
//   Sink::prologue<C>()                thread 0, before the CTA's first barrier (its own mbarriers' init);
//   Sink::producer_warp<C>(w, work, p) lane 0 of warps w = 1..3 of the producer warpgroup (24 registers)
//                                      (bwd/v18 counts the consumers' dQ adds there).
// and what a CTA does through Steps (DenseSteps by default: the dense kernels' parameters, tile range and masks):
//   Steps::Params                      the kernel's parameter block (AttnBwdParams or a struct derived from it);
//   Steps::work<C>(p)                  the CTA's key block and query-block range;
//   Steps::p_ds<C>(s, dp, rows, c, kw0, m0, p)   P^T and dS^T of a step, masked where the tile needs it.
#pragma once
#include <utility>

#include "common/hopper/attn_bwd_sm90.cuh"

// 0: no stagger; 1: always; 2: non-causal calls only (first H100 run, D = 128: the stagger gained 2-3 % without a
// mask and lost 1-1.5 % with the causal one).
// The packed backward's causal calls with 1 (H200, D 128): 2.3-3.0 % slower at 8 x 2048 and twelve documents
// (predicted -1.5 to +2 %; outputs/experiments/20261129-masks-packed-bwd-causal-stagger.json).
#ifndef LAB_BWD_STAGGER
#define LAB_BWD_STAGGER 2
#endif

// 1: dQ partials added by each thread's red.global.add.v4.f32 straight from the accumulators, in the same
// accumulator order; 0: through shared memory and the copy engine's bulk reduction (v02's reduce_dq). The red
// path moves no dQ bytes through shared memory (32 KB stored and 32 KB read per CTA step), which the
// per-instruction profile (ncu's SourceCounters, lab.profile) and the count of shared-memory bytes per step suggest
// is the bound: the m64n64 SS GEMMs alone need about the full shared-memory bandwidth while they run.
// Measured (H100, GPU time, in rounds with v02 and the 0 build): +3 to +9 % at D = 128 (0.93-1.02x SDPA-cuDNN's
// backward), +1 to +6 % at D = 64; the default.
#ifndef LAB_BWD_STAGGER_DQ_RED
#define LAB_BWD_STAGGER_DQ_RED 1
#endif

namespace lab::sm90::bwd {

// Named barriers of the dS^T hand-off (after the shared header's 1..4): per buffer b and writer warpgroup w,
// "w's half of buffer b is written" and "w may write its half of buffer b again"; and the start stagger.
constexpr int kBarReady = 5, kBarFree = 9, kBarStagger = 13;
__device__ __forceinline__ int ready_bar(int buf, int writer) { return kBarReady + 2 * buf + writer; }
__device__ __forceinline__ int free_bar(int buf, int writer) { return kBarFree + 2 * buf + writer; }

// bwd/v13's tile configuration, which v14 and the versions built on it keep (v15-v18, v20): D = 64 with 128 queries a
// step, D = 128 with two dS^T buffers; both stage dK and dV through shared memory.
template <int D>
using StagedCfg = std::conditional_t<D == 64, Cfg<64, 2, false, false, true, 128>, Cfg<128, 2, true, false, true>>;

// The dQ partial of step j added into dq_accum by this thread's 16-byte reductions, in reduce_dq's order.
template <class C>
__device__ __forceinline__ void red_dq(const float (&dq)[C::kDqRegs], int hq, int m0, int b, const AttnBwdParams& p) {
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  float* dst = p.dq_accum + (((int64_t)b * p.heads_q + hq) * sq_pad + m0) * C::D + (C::kSplitDq ? wg * 64 * C::kDqCols : 0);
#pragma unroll
  for (int r4 = 0; r4 < C::kDqCols / 8; ++r4)
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + (r4 * 128 + wt) * 4),
                 "f"(dq[4 * r4]), "f"(dq[4 * r4 + 1]), "f"(dq[4 * r4 + 2]), "f"(dq[4 * r4 + 3])
                 : "memory");
}

// red_dq with one base address and each 16-byte reduction at a constant offset from it (the offset in the
// instruction), so the reductions cost no address arithmetic of their own (bwd/v22; the bf16 kernels keep red_dq).
template <class C, int R4>
__device__ __forceinline__ void red4_at(float* dst, const float (&dq)[C::kDqRegs]) {
  asm volatile("red.global.add.v4.f32 [%0+%5], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(dq[4 * R4]), "f"(dq[4 * R4 + 1]),
               "f"(dq[4 * R4 + 2]), "f"(dq[4 * R4 + 3]), "n"(R4 * 128 * 16)
               : "memory");
}
template <class C, int... R4>
__device__ __forceinline__ void red_all_at(float* dst, const float (&dq)[C::kDqRegs],
                                           std::integer_sequence<int, R4...>) {
  (red4_at<C, R4>(dst, dq), ...);
}
template <class C>
__device__ __forceinline__ void red_dq_offsets(const float (&dq)[C::kDqRegs], int hq, int m0, int b,
                                               const AttnBwdParams& p) {
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  float* dst = p.dq_accum + (((int64_t)b * p.heads_q + hq) * sq_pad + m0) * C::D +
               (C::kSplitDq ? wg * 64 * C::kDqCols : 0) + wt * 4;
  red_all_at<C>(dst, dq, std::make_integer_sequence<int, C::kDqCols / 8>{});
}

// dQ of step j (issued during step j + 1, or after the loop): wait for the other warpgroup's half of dS^T_j,
// the GEMM over both halves, release the buffer to the other warpgroup (when it writes it again), hand the
// partial to the sink. Every GEMM in flight (this step's dV / dK too) is complete on return.
template <class C, class T, class Sink>
__device__ __forceinline__ void dq_step(Sink& sink, uint8_t* smem, const Work& work, int j, const AttnBwdParams& p,
                                        uint32_t k_off = C::kOffK) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const int wg = threadIdx.x / 128, other = wg ^ 1, buf = j & 1;
  const uint32_t base = smem_u32(smem);
  if constexpr (C::kSplitDq) named_barrier_sync(ready_bar(buf, other), 256);
  float dq[C::kDqRegs];
  wgmma_fence();
  issue_dq<C, kBf16>(dq, base + C::kOffDs + buf * C::kDsBytes, base + k_off);
  wgmma_wait<0>();
  reg_fence(dq);
  if (C::kSplitDq && j + 2 < work.n_iters) named_barrier_arrive(free_bar(buf, other), 256);
  sink.template add<C>(dq, smem, work, j, p);
}

// v05's sink: each thread's reductions straight from the accumulators (LAB_BWD_STAGGER_DQ_RED), or the copy engine's.
struct AddPartial {
  template <class C>
  __device__ __forceinline__ void add(const float (&dq)[C::kDqRegs], uint8_t* smem, const Work& work, int j,
                                             const AttnBwdParams& p) {
    if constexpr (LAB_BWD_STAGGER_DQ_RED)
      red_dq<C>(dq, work.head(j), work.m0(j, C::BR), work.b, p);
    else
      reduce_dq<C>(dq, smem, j, work.head(j), work.m0(j, C::BR), work.b, p);
  }
  template <class C>
  __device__ __forceinline__ void finish(const Work&, const AttnBwdParams&) {}
  template <class C>
  __device__ __forceinline__ static void prologue() {}
  template <class C>
  __device__ __forceinline__ static void producer_warp(int, const Work&, const AttnBwdParams&) {}
};

// The dense kernels' steps: causal (top-left) or none, cta_work's tile range, p_ds_step's masks.
struct DenseSteps {
  using Params = AttnBwdParams;
  template <class C>
  __device__ __forceinline__ static Work work(const AttnBwdParams& p) { return cta_work<C>(p); }
  template <class C>
  __device__ __forceinline__ static void p_ds(float (&s)[C::BR / 2], float (&dp)[C::BR / 2], const float* rows, float c,
                                              int kw0, int m0, const AttnBwdParams& p) {
    p_ds_step<C>(s, dp, rows, c, kw0, m0, p);
  }
};

// One key-block tile of a consumer warpgroup: wait for its K and V (barrier `kv`, parity `kv_phase`, at k_off /
// v_off), run its steps on the ring from the CTA's step count `step0`, and leave dK_w, dV_w in dk, dv with every
// GEMM complete (so K and V are free on return). A one-tile CTA calls it once with step0 = 0 and buffer 0.
template <class C, class T, class Sink, class Steps>
__device__ __forceinline__ void stagger_tile(float (&dk)[C::D / 2], float (&dv)[C::D / 2], Sink& sink, uint8_t* smem,
                                             Bars<C::kStages>& bars, uint64_t& kv, int kv_phase, uint32_t k_off,
                                             uint32_t v_off, const Work& work, int step0, bool stagger,
                                             const typename Steps::Params& p) {
  constexpr int D = C::D, BR = C::BR, kStages = C::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t base = smem_u32(smem);
  const int wg = threadIdx.x / 128;
  const int kw0 = work.n0 + 64 * wg;
  const uint32_t k_w = base + k_off + wg * 64 * 128, v_w = base + v_off + wg * 64 * 128;
  const float c = p.scale * kLog2e;
  zero_acc(dk);
  zero_acc(dv);
  mbar_wait(smem_u32(&kv), kv_phase);
  constexpr int kFrags = C::kKvInRegs ? D / 16 : 1;
  uint32_t kf[kFrags][4], vf[kFrags][4];  // K_w, V_w as A fragments (Cfg::kKvInRegs)
  if constexpr (C::kKvInRegs) {
    load_a_frags<C>(kf, smem + k_off);
    load_a_frags<C>(vf, smem + v_off);
  }

  // Main loop: step it's S^T, dP^T, P^T, dS^T, dV and dK, then step it - 1's dQ.
  for (int it = 0; it < work.n_iters; ++it) {
    const int step = step0 + it, s = step % kStages, m0 = work.m0(it, BR), buf = it & 1;
    const uint32_t q_s = base + C::kOffQ + s * C::kQBytes, do_s = base + C::kOffDo + s * C::kQBytes;
    const float* rows = reinterpret_cast<const float*>(smem + C::kOffRows + s * 2 * C::kRowBytes);
    mbar_wait(smem_u32(&bars.full[s]), (step / kStages) & 1);
    if (stagger && it == 0 && wg == 1) named_barrier_sync(kBarStagger, 256);

    float sacc[BR / 2], dpacc[BR / 2];
    wgmma_fence();
    if constexpr (C::kKvInRegs)
      issue_s_dp_rs<C, kBf16>(sacc, dpacc, kf, vf, q_s, do_s);
    else
      issue_s_dp<C, kBf16>(sacc, dpacc, k_w, v_w, q_s, do_s);
    wgmma_wait<0>();
    reg_fence(sacc);
    reg_fence(dpacc);
    Steps::template p_ds<C>(sacc, dpacc, rows, c, kw0, m0, p);
    if (stagger && it == 0 && wg == 0) named_barrier_arrive(kBarStagger, 256);

    uint32_t pa[BR / 16][4], dsa[BR / 16][4];
    pack_p<BR, T>(sacc, pa);
    pack_p<BR, T>(dpacc, dsa);
    wgmma_fence();
    issue_dv_dk<C, kBf16>(dv, dk, pa, dsa, q_s, do_s);

    if (C::kSplitDq && it >= 2) named_barrier_sync(free_bar(buf, wg), 256);  // the other has read dS^T_{it-2}
    store_ds<C>(smem + C::kOffDs + buf * C::kDsBytes, dsa);
    if constexpr (C::kSplitDq) named_barrier_arrive(ready_bar(buf, wg), 256);
    if (it >= 1) {
      dq_step<C, T, Sink>(sink, smem, work, it - 1, p, k_off);  // its bulk hand-off's barrier also orders this step's own stores
      if constexpr (LAB_BWD_STAGGER_DQ_RED) named_barrier_sync(kBarWg + wg, 128);  // (no hand-off barrier: order them)
    } else {
      wgmma_wait<0>();
      named_barrier_sync(kBarWg + wg, 128);  // this warpgroup's half of dS^T_0, before its dQ GEMM reads it
    }
    reg_fence(dk);
    reg_fence(dv);
    mbar_arrive(smem_u32(&bars.empty[s]));  // this thread's reads of Q_i, dO_i and the rows are over
  }
  if (work.n_iters > 0) dq_step<C, T, Sink>(sink, smem, work, work.n_iters - 1, p, k_off);
}

template <class C, class T, class Sink, class Steps = DenseSteps>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_stagger(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                 const typename Steps::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D;
  static_assert(C::kDsBufs == 2, "v05 alternates two dS^T buffers");
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<C::kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const Work work = Steps::template work<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const bool stagger = LAB_BWD_STAGGER == 1 || (LAB_BWD_STAGGER == 2 && !p.causal);

  // Prologue
  if (threadIdx.x == 0) {
    init_bars(bars);
    Sink::template prologue<C>();
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt == 0)
      produce<C>(&tq, &tk, &tv, &tdo, bars, base, work, p);
    else if (wt % 32 == 0)
      Sink::template producer_warp<C>(wt / 32, work, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  float dk[D / 2], dv[D / 2];
  Sink sink{};
  stagger_tile<C, T, Sink, Steps>(dk, dv, sink, smem, bars, bars.kv, 0, C::kOffK, C::kOffV, work, 0, stagger, p);
  sink.template finish<C>(work, p);
  if (wt == 0) bulk_wait<0>();

  // Epilogue
  if constexpr (C::kStageDkDv)
    store_dk_dv_staged<C, T>(dk, dv, work.n0 + 64 * wg, work, p, smem + C::kOffDq);
  else
    store_dk_dv<C, T>(dk, dv, work.n0 + 64 * wg, work, p);
#endif
}

}  // namespace lab::sm90::bwd
