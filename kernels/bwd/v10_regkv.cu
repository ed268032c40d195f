// Backward attention v10: v07 with D = 64's per-step shared-memory reads cut: K_w and V_w held in registers as
// wgmma A fragments, so S^T and dP^T become RS GEMMs. A second change, P^T computed while the dP^T GEMM still
// runs, measured slower and was removed (below).
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v10-regkv.json.
//
// Why. Counting a CTA step's shared-memory bytes at D = 64 (B_r = 64, two warpgroups of 64 keys): S^T and dP^T
// as SS GEMMs read 2 x 16 KB per warpgroup (A and B, 4 KB per k16 instruction, which is the whole 128 B/clock
// of shared memory at the tensor core's m64n64 rate), dV and dK 2 x 8 KB (B only), dQ 24 KB (dS^T and K's
// columns), dS^T stores 8 KB: 160 KB per CTA step, plus 16 KB of TMA writes of Q_i and dO_i. At 128 B/clock
// that is ~1370 clocks against 1280 for the step's 5.2 MFLOP at the tensor core's peak: D = 64 is bound by
// shared memory as much as by the tensor core, which is where v07 still trails cuDNN (0.93-0.95x, GPU time,
// at every length). K_w and V_w do not change within a CTA, so as register fragments (16 registers each at
// D = 64) they take 32 KB off the step: 144 KB, 11 % fewer clocks of shared memory. D = 128 would need 64
// registers for them beside 128 of dK and dV: it keeps SS.
//   Second, v07 waits for both S^T and dP^T before computing P^T; P^T needs only S^T, so the ex2 of 4096
//   scores per warpgroup (256 MUFU clocks, the same at D = 64 and 128) can run while the tensor core finishes
//   dP^T (256 clocks at D = 64). The other warpgroup's GEMMs already cover part of it (v05's stagger).
//
// Registers (D = 64): dK, dV 64 + S^T, dP^T 64 + K_w, V_w 32 = 160 at the GEMM issue, inside the consumers' 240.
//
// Prediction (H100, GPU time): D = 64 +3-7 % (if shared memory is the bound, up to +11 %; the dQ reductions and
// the barrier waits are unchanged); D = 128 +0-2 % from P under dP^T alone.
// Outcome (H100, GPU time, in rounds with v07, 13 bench-bwd cells; outputs/experiments/20261126-bwd-v10-regkv.json):
// - K_w, V_w in registers alone: D = 64 +0.5 to +3 % (0.937-1.02x SDPA-cuDNN where v07 is 0.929-1.01x), the
//   most at S >= 4096; short of the prediction, so shared memory is not the only bound left at D = 64.
// - P^T under dP^T: 5-12 % *slower* at D = 128 (0.89-0.95x where v07 is 0.93-1.03x) and ~1 % at D = 64. The
//   stagger already runs one warpgroup's softmax under the other's GEMMs; splitting the wait gives the
//   warpgroup a second wgmma wait per step and moves its MUFU work into the window where the other warpgroup's
//   S^T / dP^T would issue. Removed after the measurement; the switch is in the history (git show fa69363:
//   kernels/common/hopper/attn_bwd_stagger.cuh, Cfg::kPUnderDp).
//
// Limits: v07's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v10_regkv.cu
#include "common/hopper/attn_bwd_stagger.cuh"

// Switches for the ablation (n10's version table): 0 turns each change off.
#ifndef LAB_BWD_REGKV_KV_REGS
#define LAB_BWD_REGKV_KV_REGS 1
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg10 = Cfg<D, 2, true, LAB_BWD_REGKV_KV_REGS && D == 64>;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg10<D>, T, bwd_dkdv_stagger<Cfg10<D>, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v10(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
