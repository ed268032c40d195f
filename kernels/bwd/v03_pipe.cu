// Backward attention v03: v02 with the next step's S^T and dP^T GEMMs issued before this step's dQ hand-off,
// and two dS^T buffers instead of one.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261125-bwd-v03-pipe.json.
//
// What changes against v02 (bwd/v02_wgmma.cu has the design; common/hopper/attn_bwd_sm90.cuh the parts):
// - Software pipelining across steps inside a consumer warpgroup. v02 waits for every GEMM of step i (dV, dK,
//   dQ) before it stores the dQ partial, releases the stage and only then issues step i + 1's S^T and dP^T:
//   the tensor core idles for that warpgroup through the dQ store, its barrier and the bulk-reduce issue.
//   v03 waits for dV / dK only (their P^T and dS^T fragments are then free), issues S^T_{i+1} (and at D = 64
//   dP^T_{i+1}; at D = 128 the registers allow only S^T, see LAB_BWD_PIPE_D128_EARLY) and does the dQ hand-off of
//   step i while they run.
// - kDsBufs = 2 (LAB_BWD_PIPE_DS_BUFS): with a dS^T buffer per step parity a warpgroup writes step i + 1's dS^T while
//   the other may still read step i's, so the "dS^T free" barrier of v02's split-dQ path goes: one
//   256-thread barrier per step instead of two. Fits at D = 128: 226 KB of the 227.
// Prediction (H100, bench-bwd at S = 4096, where v02 measured 0.80-0.90x SDPA-cuDNN): the dQ hand-off is
// ~5 % of a step and the second barrier ~2 %; +4-7 % over v02, not yet cuDNN's level. The elementwise phase
// (one ex2 per score, both warpgroups in step through the dQ barrier) stays exposed.
// Outcome (H100, in rounds with v02; outputs/experiments/20261125-bwd-v03-pipe.json): D = 128 11-13 % slower than v02 in GPU time
// (S = 4096: 447 vs 511 TFLOP/s, causal 384 vs 436), D = 64 within 2 %. ptxas says why: at D = 128 it serializes
// the wgmma instructions for want of registers (C7512) and injects warpgroup waits (C7517), so the early GEMM
// never overlaps anything. v02 stays the default.
//
// Limits: v02's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no
// deterministic mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v03_pipe.cu
#include "common/hopper/attn_bwd_sm90.cuh"

#ifndef LAB_BWD_PIPE_DS_BUFS
#define LAB_BWD_PIPE_DS_BUFS 2
#endif
// How many of the next step's GEMMs go early: 2 (S^T and dP^T) or 1 (S^T; dP^T at the top of the step). D = 128
// takes 1: with both, dK 64 + dV 64 + dQ 32 + S^T 32 + dP^T 32 accumulators spill (512 bytes of stack).
#ifndef LAB_BWD_PIPE_D128_EARLY
#define LAB_BWD_PIPE_D128_EARLY 1
#endif
#ifndef LAB_BWD_PIPE_D64_EARLY
#define LAB_BWD_PIPE_D64_EARLY 2
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_v03(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                 const AttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D, BR = C::BR, kStages = C::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const Work work = cta_work<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;

  // Prologue
  if (threadIdx.x == 0) init_bars(bars);
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt == 0) produce<C>(&tq, &tk, &tv, &tdo, bars, base, work, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  const int kw0 = work.n0 + 64 * wg;
  const uint32_t k_w = base + C::kOffK + wg * 64 * 128, v_w = base + C::kOffV + wg * 64 * 128;
  const float c = p.scale * kLog2e;
  auto q_s = [&](int it) { return base + C::kOffQ + (it % kStages) * C::kQBytes; };
  auto do_s = [&](int it) { return base + C::kOffDo + (it % kStages) * C::kQBytes; };
  float dk[D / 2], dv[D / 2], sacc[32], dpacc[32];
  zero_acc(dk);
  zero_acc(dv);
  mbar_wait(smem_u32(&bars.kv), 0);
  constexpr int kEarly = D == 128 ? LAB_BWD_PIPE_D128_EARLY : LAB_BWD_PIPE_D64_EARLY;
  auto issue_early = [&](int it) {
    wgmma_fence();
    if constexpr (kEarly == 2)
      issue_s_dp<C, kBf16>(sacc, dpacc, k_w, v_w, q_s(it), do_s(it));
    else
      issue_s<C, kBf16>(sacc, k_w, q_s(it));
  };
  if (work.n_iters > 0) {
    mbar_wait(smem_u32(&bars.full[0]), 0);
    issue_early(0);
  }

  // Main loop: on entry, step it's early GEMMs are in flight.
  for (int it = 0; it < work.n_iters; ++it) {
    const int s = it % kStages, hq = work.head(it), m0 = work.m0(it, BR);
    const float* rows = reinterpret_cast<const float*>(smem + C::kOffRows + s * 2 * C::kRowBytes);
    if constexpr (kEarly == 1) {
      wgmma_fence();
      issue_s<C, kBf16>(dpacc, v_w, do_s(it));
    }
    wgmma_wait<0>();
    reg_fence(sacc);
    reg_fence(dpacc);
    p_ds_step<C>(sacc, dpacc, rows, c, kw0, m0, p);

    uint32_t pa[BR / 16][4], dsa[BR / 16][4];
    pack_p<BR, T>(sacc, pa);
    pack_p<BR, T>(dpacc, dsa);
    wgmma_fence();
    issue_dv_dk<C, kBf16>(dv, dk, pa, dsa, q_s(it), do_s(it));

    if constexpr (C::kSplitDq && C::kDsBufs == 1) named_barrier_sync(kBarDsFree, 256);
    const int ds_off = C::kOffDs + (it % C::kDsBufs) * C::kDsBytes;
    store_ds<C>(smem + ds_off, dsa);
    named_barrier_sync(C::kSplitDq ? kBarDsReady : kBarWg + wg, C::kSplitDq ? 256 : 128);

    float dq[32];
    wgmma_fence();
    issue_dq<C, kBf16>(dq, base + ds_off, base + C::kOffK);
    wgmma_wait<1>();  // dV and dK: P^T, dS^T fragments free, Q_i and dO_i read
    reg_fence(dk);
    reg_fence(dv);
    mbar_arrive(smem_u32(&bars.empty[s]));
    if (it + 1 < work.n_iters) {
      mbar_wait(smem_u32(&bars.full[(it + 1) % kStages]), ((it + 1) / kStages) & 1);
      issue_early(it + 1);
      wgmma_wait<kEarly>();  // dQ of step it (the early GEMMs of step it + 1 may still run)
    } else {
      wgmma_wait<0>();
    }
    reg_fence(dq);
    reduce_dq<C>(dq, smem, it, hq, m0, work.b, p);
  }
  if (wt == 0) bulk_wait<0>();

  // Epilogue
  store_dk_dv<C, T>(dk, dv, kw0, work, p);
#endif
}

template <int D, class T>
struct Launch {
  using C = Cfg<D, LAB_BWD_PIPE_DS_BUFS>;
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<C, T, bwd_dkdv_v03<C, T>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v03(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
