// Backward attention v14: v13 with causal grids that end on short key blocks (the last two waves' heads taken key
// block by key block), and the pre-pass zeroing dQ's accumulator in place of a memset launch.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured (H100, GPU time beside v13 in one process, the tail uncapped and the memset kept;
// outputs/driver_logs/20261126-h100-bwd-v14-run1/versions.log): causal D = 128 +1.1 % at S = 512, +2.4 % at 1024,
// +3.5 % at 2048, +4.3 % at 4096, +4.2 % at 8192, 0.0 % at 16384, the odd length +3.6 %; causal D = 64 +0.0 to
// +2.3 %; the GQA cell -1.7 %. The schedule model's shape held (S <= 8192 gains, 16384 none) at 1-2 points under
// its size; the GQA cell is the miss the L2 cap below answers. The capped form is measured by chapter n10.
//
// Why. The dense kernels launch one CTA per (key block, KV head, batch), key block fastest, at one CTA per SM,
// and the GPU hands CTAs out in that order. With the causal mask a head's key blocks shrink from the first to
// the last (block j starts at the query block of its first key), so the grid ends with the last heads' blocks in
// head order: a long block 0 of the last head can start when most SMs have nothing left to take. lab.backward.
// schedule plays that dispatch on the CPU: at D = 128 (2048 CTAs of 64-query steps, 132 SMs) the in-order causal
// grid ends 5.6-7.0 % after the balanced time at S = 512-8192 (non-causal: 3.1 %, the last wave's quantisation,
// which no order changes), the GQA cell 13.9 % (1024 CTAs of four heads' work each).
//
// What changes (Steps::work only, TailSteps in common/hopper/attn_bwd_tail.cuh; the loop, the config and every store
// are v13's): causal calls keep the
// head-major order except for the last heads whose tiles make up about two waves (264 CTAs, two per SM of an
// H100 / H200); those go key block by key block, every one of those heads' longest block first, so the grid ends
// on the shortest blocks. Only those heads leave head-major order, so the Q and dO that a head's CTAs share in L2
// are still shared everywhere else (the reordered heads' Q and dO, e.g. 33 heads x 512 KB at S = 1024, D = 128,
// fit in L2 together).
//
// Prediction (lab.backward.schedule, 1.5 steps of prologue and epilogue per CTA; GPU time): causal D = 128
// +3.4 % at S = 512, +5.4-5.5 % at 1024-4096, +4.7 % at 8192, +0.3 % at 16384, the GQA cell +10.6 %, the odd
// length +4.6 %; causal D = 64 +1.6-2.7 %; non-causal unchanged. Doubt: the measured causal cells are not behind
// the non-causal ones against SDPA-cuDNN by the 3-4 % the model's in-order loss implies (v13, H100: D = 128
// S = 4096 1.03x causal, 1.02x not), so either cuDNN's persistent schedule is as unbalanced or the model
// overstates the tail (CTAs do not all run at the same speed, the diagonal blocks' steps are cheaper). The GPU
// run decides. With the L2 cap (only the GQA cell changes in bench-bwd: 9 reordered heads become 3) the model
// gives the GQA cell +5.7 %; whether those heads' Q and dO then stay in L2 only a GPU run says.
//
// Limits: v13's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v14_tail.cu
// The pre-pass zeroes dq_accum in place of the memset launch (common/hopper/attn_bwd_sm90.cuh says why); measured
// on v13 (H100, GPU time, D = 128 and D = 64 at S = 512-2048): +0.1 to +1.1 %, never behind, sanitizers clean.
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_tail.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<StagedCfg<D>, T, bwd_dkdv_stagger<StagedCfg<D>, T, AddPartial, TailSteps>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v14(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
