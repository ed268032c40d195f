// Backward attention v13: v12 with D = 64 stepping over 128 queries at a time (B_r = 128), dQ split by rows.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v13-q128.json.
//
// Why. After v12, D = 64 without a mask is the one family of cells still under SDPA-cuDNN's backward (0.97x in
// GPU time at S = 2048..16384, H100), where D = 128 and causal D = 64 are at or above it. At D = 64 a CTA step
// of 64 queries is small: each warpgroup's S^T, dP^T, dV and dK are four k16 instructions each, and the step
// still pays its full set of fixed costs (the stage's mbarrier wait and release, two named barriers on the dS^T
// hand-off, the wgmma waits that serialise the dQ GEMM behind dK / dV, the LSE / Delta loads). v10's count also
// found D = 64 bound by shared-memory bytes as much as by the tensor core.
//
// What changes (Cfg's BR = 128):
// - 128 queries a step: S^T and dP^T become m64n128 (64 registers each; v12 keeps K_w and V_w in registers at
//   D = 64, which with dK and dV makes 224 at the GEMM issue: LAB_BWD_Q128_KV_REGS picks, ptxas decides), half as many
//   steps, so half the fixed costs per query.
// - dQ split by rows instead of columns: warpgroup w multiplies its 64 queries of dS (column block w of the
//   dS^T tile) by all of K (m64n64, k = 128 keys). Per 64 queries the dQ GEMMs read 32 KB of shared memory
//   where v12's m64n32 split reads 48 KB (each warpgroup read all of dS and half of K): a step of 64 queries
//   drops from ~144 KB to ~128 KB (-11 %). The partial is still a 64-row block in accumulator order, so
//   red_dq and the convert pass are unchanged (its offset is the next 64-row block).
// - Shared memory (D = 64): K, V 32 KB, Q / dO two stages 64 KB, dS^T two buffers 64 KB, the dK / dV staging
//   32 KB (the copy engine's dQ buffers, unused since v05, are dropped): ~195 KB.
// - The backward workspaces pad rows to 128 (LAB_BWD_ROW_PAD) so the last step's LSE / Delta loads and dQ
//   reductions stay inside them.
// D = 128 keeps v12's configuration (B_r = 128 would need 128 more registers).
//
// Prediction (H100, GPU time, D = 64): +3-6 % without a mask (0.97x -> 1.00-1.03x cuDNN), less with the causal
// mask (the diagonal tiles are twice as large, so more of each is masked work: +0-3 %). Short S gains least
// (fewer steps per CTA to amortise the prologue over: S = 512 has 4 steps instead of 8).
//
// Outcome (H100, GPU time, in rounds with v12 and SDPA-cuDNN, 17 bench-bwd cells; outputs/driver_logs/
// 20261126-h100-bwd-v13-run1/versions.log): far above the prediction, and causal as much as not. D = 64 over v12:
// S = 512 +7 % (+1 % causal), 1024 +10 % (+5 %), 2048 +13 % (+8 %), 4096 +14 % (+11 %), 8192 +15 % (+14 %), 16384
// +16 % (+15 %): 1.09-1.19x cuDNN's backward in every D = 64 cell, where v12 was 0.97-1.08x. D = 128 (v12's
// kernel) unchanged. K_w, V_w in registers (LAB_BWD_Q128_KV_REGS=1): ptxas spills 48 bytes a thread and the kernel
// runs at 0.76-0.94x cuDNN, 20-30 % under the SS form: off. ncu (n10, D = 64, S = 4096, H100): 2566 us against
// v10's 2969 and cuDNN's 2860; tensor pipe 57 % (v10 48 %, cuDNN 51 %), issue slots 39 % (v10 42 %): fewer
// instructions per FLOP; shared-store bank conflicts 0.25 M against v10's 2.4 M (not explained yet: both store
// dS^T through the same swizzle, which the CPU walk finds conflict-free). What the prediction missed: it counted shared-memory bytes and barrier waits
// but not the instructions that issue them, and the gain grows with S (so it is per step, not the prologue):
// at D = 64 the step was as much issue-bound (address math, barrier and fence instructions, MUFU, the packing)
// as bandwidth-bound, and m64n128 halves those per FLOP. Correct: driver 53/53 (the no-D build fails 52), 14/14
// gradient checks, memcheck (38 configs), racecheck, synccheck, initcheck (4 each) clean, with either K/V form.
//
// Limits: v12's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v13_q128.cu
#include "common/hopper/attn_bwd_stagger.cuh"

// 1: K_w and V_w as register A fragments at D = 64 (v10's RS GEMMs); 0: SS GEMMs from shared memory.
#ifndef LAB_BWD_Q128_KV_REGS
#define LAB_BWD_Q128_KV_REGS 0
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

static_assert(LAB_BWD_STAGGER_DQ_RED, "dQ is reduced from registers: the copy engine's staging buffers are gone");

template <int D>
using Cfg13 = std::conditional_t<D == 64, Cfg<64, 2, false, LAB_BWD_Q128_KV_REGS, true, 128>, Cfg<128, 2, true, false, true>>;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg13<D>, T, bwd_dkdv_stagger<Cfg13<D>, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v13(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
