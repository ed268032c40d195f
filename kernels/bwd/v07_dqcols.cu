// Backward attention v07: v05 with D = 64's dQ split by columns, as D = 128's already is, so each dQ element
// gets one reduction per CTA step instead of two. D = 128 is v05 unchanged.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v07-dqcols.json.
//
// Why. In v05 at D = 64 each consumer warpgroup computes dQ_i over its own 64 keys for all 64 columns (an m64n64
// GEMM), and both add their 64 x 64 fp32 partial into the same dq_accum rows: 32 KB of global reductions per
// CTA step of 5.2 MFLOP, twice D = 128's bytes per FLOP (32 KB per 10.5 MFLOP). At cuDNN's rate that is ~2.8
// TB/s of fp32 reductions into L2 over the GPU. v06's publish (bwd/v06_convert.cu) found a warp's reductions
// still unacknowledged a whole step after it issued them, so they queue; and D = 64 is where v05 trails
// cuDNN's backward most (0.82-0.92x against 0.93-1.03x at D = 128, H100, GPU time).
//
// What changes (Cfg's kDqByColumns, common/hopper/attn_bwd_sm90.cuh): warpgroup w computes columns 32w..32w+31
// of dQ_i over all 128 keys (m64n32, k = 128: B is K read 64 bytes into each 128-byte swizzled row), so it
// needs the other warpgroup's half of dS^T too: D = 64 takes D = 128's producer/consumer named-barrier pair per
// dS^T buffer (common/hopper/attn_bwd_stagger.cuh). Each warpgroup then reduces 64 x 32 (16 registers) per step:
// 16 KB per CTA step, half of v05's. The tensor work of dQ is unchanged (the same 64 x 64 x 128 MACs, in two
// n32 GEMMs instead of two k64 halves), and the two warpgroups now meet at dS^T as at D = 128.
//
// Prediction (H100, D = 64, GPU time): if the reductions are the limit, up to v05's D = 128 efficiency (0.93-1.03x
// cuDNN, from 0.82-0.92x): +5-10 %; the cross-warpgroup wait on dS^T costs back ~1-2 % (it did at D = 128 before
// the deferral of the dQ GEMM, which hides it here too).
//
// Limits: v05's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v07_dqcols.cu
#include "common/hopper/attn_bwd_stagger.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg7 = Cfg<D, 2, true>;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg7<D>, T, bwd_dkdv_stagger<Cfg7<D>, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v07(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
