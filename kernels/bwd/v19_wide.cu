// Backward attention v19: head dims 192 and 256 on Hopper (sm_90a): wgmma, TMA and a producer warpgroup, as v14 at D
// 64 / 128, in place of v09's mma.sync kernel.
// Compile check: python -m lab compile; GPU checks and the race: lab.fwd.head_dims_gpu (wide_checks, wide_bwd_race:
//   the public op and "bwd v19"); measured rows and the sanitizers' logs: outputs/experiments/20261126-bwd-v19-wide.json.
//
// Why. v09 (FA2's wide-head tiling on mma.sync) runs the public op's backward at 0.74x SDPA-flash's at D 192 / 256
// (H100, chapter n14), and v14's layout does not take these head dims: each of its consumer warpgroups holds dK and
// dV over all D columns for its 64 keys, 2 x D / 2 registers a thread, 256 at D = 256.
//
// What it does (common/hopper/attn_bwd_wide.cuh, whose Cfg has the tile choice and the options it rejected):
//   a CTA owns B_c = 64 keys of one KV head and walks B_r = 64 queries a step, in v14's grid order, from v14's
//   producer (K, V once; Q_i, dO_i, LSE_i, Delta_i through a two-stage ring). The two consumer warpgroups split the
//   step by role, not by keys:
//     warpgroup 0: S^T = K Q_i^T (SS m64n64, k = D), P^T = exp2(S^T c - LSE_i) masked, P^T to shared memory (fp32),
//                  dV += P^T dO_i (RS m64nD: P^T from registers);
//     warpgroup 1: dP^T = V dO_i^T, dS^T = P^T (dP^T - Delta_i) with warpgroup 0's P^T, dS^T to shared memory (16-bit,
//                  swizzled), dK += dS^T Q_i (RS m64nD);
//     both, one step later: dQ_{i} = dS_i K by 64-column chunks (SS m64n64, dS read from the dS^T tile), chunk c on
//                  warpgroup c % 2, added from registers into dq_accum in the order v14's convert pass reads.
//   Each warpgroup holds one D-wide accumulator (D / 2 registers) and does the same tensor work per step at D = 256
//   (8 of 15 units against 7 at D = 192). dK and dV leave as v12's staged 16-byte rows. The pre-pass (zeroing
//   dq_accum, LAB_BWD_ZERO_IN_PRE) and the convert pass are the D = 64 / 128 family's.
// Launch: grid ceil(S_k / 64) x H_kv x B CTAs (one per SM: 226 KB of shared memory at D = 256, 177 KB at 192), 384
//   threads (setmaxnreg 240 / 24).
//
// Prediction (H100, bf16, the public op's backward; v09 at 0.74x SDPA-flash): the step's tensor work is 20 m64n64k64
// units at D = 256 of which warpgroup 0's exp2 (64 x 64 scores) and the P^T hand-off are not overlapped within a
// step (about 12-15 % of a step), so 70-80 % of the D = 128 family's tensor rate before the grid's tail: 350-450
// TFLOP/s, 1.3-1.7x SDPA-flash and 1.7-2.2x v09 at S >= 2048, less at S = 512 (8 steps a CTA to amortise K, V and
// the epilogue over).
//
// Outcome (H100, n14 session 20261126-184004-h100-80gb-hbm3-242dae3, public op, 14 wide cells): backward 1.31 / 1.55 /
// 1.82x SDPA-flash (min / geomean / max), 0.92 / 1.09 / 1.30x SDPA-cuDNN; 274-433 TFLOP/s at S >= 2048; kernel-level
// GPU time 1.67-2.21x v09's. outputs/experiments/20261126-bwd-v19-wide.json has the rest, the sanitizer runs and what was rejected.
//
// Limits: sm_90 only; D_qk = D_v in {192, 256} (lab.ops pads the others); fp16, bf16; any lengths (partial tiles
// masked); GQA; any finite scale; top-left causal; strided views; no deterministic mode (LAB_E_MODE).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v19_wide.cu
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_wide.cuh"

// 1: warpgroup 1's dQ chunks issued behind dP^T at D = 192 (Cfg's kDqUnderDp, a candidate; at D = 256 ptxas spills
// 284 bytes a thread with it); 0: after dK.
#ifndef LAB_BWD_WIDE_SM90_DQ_UNDER_DP
#define LAB_BWD_WIDE_SM90_DQ_UNDER_DP 0
#endif

namespace {
using namespace lab::sm90::bwd;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    using C = wide::Cfg<D, LAB_BWD_WIDE_SM90_DQ_UNDER_DP && D == 192>;
    return launch<C, T, wide::bwd_wide<C, T>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v19(const AttnBwdParams* p, void* stream) { return wide::entry<Launch>(p, stream); }
