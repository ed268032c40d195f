// Backward attention v20: v14 for the narrow head dims below 128 (32, 80, 96 and every multiple of 8 that is no
// kernel width), read and written unpadded, so a call that trains at those head dims makes no padded copies.
// Compile check: python -m lab compile; GPU checks and race: lab.backward.narrow_gpu (narrow_bwd_checks,
//   narrow_bwd_race); measured rows and the sanitizers' logs: outputs/experiments/20261127-bwd-v20-narrow.json.
//
// Why. lab.ops.attention ran a gradient call at D = 80 as F.pad of Q, K and V to 128, the forward and v14's
// backward at 128, and autograd's slices and pads around them (dO padded, dQ, dK and dV cut back). Split with the
// committed n14 records, those copies are 11-24 % of the padded backward's time (outputs/experiments/
// 20261127-bwd-v20-narrow.json); they are bytes per token, so they weigh most at S = 512, where the padded call was 0.79x SDPA-flash.
//
// What it does: v14's kernel, loop and config (StagedCfg, common/hopper/attn_bwd_stagger.cuh) as Narrow<StagedCfg<W>>, W the
// next width (64 for D < 64, 128 for 64 < D < 128). The forward's narrow path reads the same way (fwd v05 / v07):
//   - the tensor maps of Q, K, V and dO run over the true D, so TMA's out-of-bounds fill writes the zero columns a
//     padded copy would hold (exact as the padding is: zero columns add 0 to every score and every dP, and make
//     zero columns of dQ, dK and dV);
//   - the pre-pass reads O and dO's D columns (Delta = rowsum(dO O) over them);
//   - dK and dV (from the staged rows) and dQ (in the convert pass) store only their first D columns, whole
//     8-column blocks, into the caller's unpadded tensors; dq_accum keeps the width W (a workspace).
// At D = 64 and 128 it is v14 (the same instantiations); lab.registry.NARROW_BWD makes it the narrow calls' backward.
//
// Prediction (public op backward, against the padded call in the same process): the copies gone, so 1.12-1.3x the
// padded call at S = 512 and 1.03-1.1x at 8192; against SDPA-flash from the padded 0.79 (worst cell, D = 32) to about
// 0.95 at D = 32 and 1.1-1.3 at D 80 / 96 (the kernel's FLOPs stay the width's: 2x at D = 32, 1.6x at 80, 1.33x at 96).
//
// Limits: v14's (sm_90 only; fp16, bf16; any lengths; GQA; any finite scale; no deterministic mode); D_qk = D_v.
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v20_narrow.cu
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_tail.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

// LAB_BWD_NARROW_QK_STEPS (1; 0: off): D = 32, 80 and 96, the model head dims among the narrow ones, run Sᵀ = K Qᵀ
// and dPᵀ = V dOᵀ over the k16 steps that hold their columns (NarrowSteps: 2 of 4, 5 and 6 of 8), the rest being
// products of TMA's zero columns, so the gradients stay bit for bit the padded call's. A step count per instantiation,
// as the forward's (a bound read at run time makes ptxas serialize the wgmmas). Prediction: those two of the step's
// five GEMMs lose 3/8 (D 80), 1/4 (96), 1/2 (32) of their work, 15 / 10 / 20 % of the tensor work; the loop is not
// tensor-bound alone (the exp2 and the dQ reductions), so +5-10 % at D = 80, +3-6 % at 96, +6-12 % at 32 where
// S >= 2048, less at 512. Measured by lab.backward.narrow_gpu.steps_ab
// (outputs/experiments/20261127-bwd-v20-qk-steps.json).
#ifndef LAB_BWD_NARROW_QK_STEPS
#define LAB_BWD_NARROW_QK_STEPS 1
#endif

// Width W's kernel: v14's at D = W, Narrow below it (entry sends D < 64 to W = 64, 64 < D < 128 to W = 128).
template <int W, class T>
struct Launch {
  template <class C>
  static int go(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<C, T, bwd_dkdv_stagger<C, T, AddPartial, TailSteps>>(p, st, dev);
  }
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    if (p.head_dim == W) return go<StagedCfg<W>>(p, st, dev);
    if constexpr (LAB_BWD_NARROW_QK_STEPS != 0 && W == 128) {
      if (p.head_dim == 80) return go<NarrowSteps<StagedCfg<W>, 80>>(p, st, dev);
      if (p.head_dim == 96) return go<NarrowSteps<StagedCfg<W>, 96>>(p, st, dev);
    }
    if constexpr (LAB_BWD_NARROW_QK_STEPS != 0 && W == 64)
      if (p.head_dim == 32) return go<NarrowSteps<StagedCfg<W>, 32>>(p, st, dev);
    return go<Narrow<StagedCfg<W>>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v20(const AttnBwdParams* p, void* stream) {
  return entry<Launch, /*kOrderedDq=*/false, /*kNarrowToo=*/true>(p, stream);
}
