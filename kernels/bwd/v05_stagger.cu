// Backward attention v05: v02 with each step's dQ GEMM deferred by one step, so the two consumer warpgroups no
// longer meet at a full barrier every step and can run half a step apart.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v05-stagger.json.
//
// What changes against v02 (bwd/v02_wgmma.cu has the design; common/hopper/attn_bwd_sm90.cuh the parts):
// - The lockstep. At D = 128 a warpgroup's dQ_i reads both halves of dS^T_i, so v02 puts a 256-thread barrier
//   between the dS^T store and the dQ GEMM of every step. Both warpgroups therefore compute P^T and dS^T (one
//   ex2 per score, ~20 % of a step's tensor time by the MUFU rate) at the same moment, and the tensor core
//   idles through it: the profile's first stall reason is the barrier (2.0 cycles per issued instruction on
//   the H200, against cuDNN's 1.5) and the tensor pipe is 58 % busy (cuDNN 66 %).
// - v05 issues step i's dQ GEMM in step i + 1, after that step's dV/dK GEMMs (the last one after the loop).
//   By then the other warpgroup's half of dS^T_i has long been stored, so the wait is a producer/consumer
//   pair of named barriers per buffer and writer (ready: arrive after the store, sync before the dQ GEMM;
//   free: arrive after the dQ GEMM, sync before the buffer is written again two steps later) instead of a
//   full barrier, and nothing pulls the warpgroups back into step. Two dS^T buffers (Cfg kDsBufs = 2).
// - LAB_BWD_STAGGER (2, common/hopper/attn_bwd_stagger.cuh): warpgroup 1 starts its first step once warpgroup 0 has finished its first
//   softmax, so the two start half a step apart: one's softmax runs under the other's GEMMs.
// - Registers: the deferred dQ accumulator (32) is live only with dK, dV and the P^T / dS^T fragments (192 in
//   all), never beside the S^T / dP^T accumulators: no more than v02 holds (v03's early S^T spilled).
// Prediction (H200, D = 128, S = 4096: v02 0.91x cuDNN in GPU time): if the stagger holds, up to the ~20 %
// softmax share comes off the critical path; the barrier and issue overheads stay: +5-10 % over v02.
// Outcome (H100, GPU time, in rounds; outputs/experiments/20261126-bwd-v05-stagger.json): the deferral and the stagger bought +2 to +4 % at
// D = 128 and nothing at D = 64, short of the prediction. The per-instruction profile then showed the consumers
// waiting on their own GEMMs (warpgroup.depbar, 25 % of the samples) rather than on named barriers (2 %), and
// counting the bytes explained it: the m64n64 SS GEMMs read ~4 KB of shared memory per 32-clock instruction,
// about the full shared-memory bandwidth, and the dQ hand-off added 64 KB of a step's ~370 KB. With the dQ
// partials added straight from the registers (LAB_BWD_STAGGER_DQ_RED, common/hopper/attn_bwd_stagger.cuh) the kernel takes 2323-2349 us against
// cuDNN's 2310-2339 at D = 128, S = 4096 (ncu, H100 and H200), from v02's 2496-2519.
//
// - D = 64: each warpgroup's dQ reads only its own half of dS^T, so there is no barrier between the two to
//   remove; but they start together with the same work and so do their softmax together. The deferred dQ
//   and the start stagger apply there as well, without the cross-warpgroup barriers.
//
// Limits: v02's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v05_stagger.cu
#include "common/hopper/attn_bwd_stagger.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg5 = Cfg<D, 2>;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg5<D>, T, bwd_dkdv_stagger<Cfg5<D>, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v05(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
