// Backward attention v12: v10 with dK and dV stored through shared memory as 16-byte coalesced rows.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v12-stage.json.
//
// Why. ncu of one launch at D = 128, S = 512 (H100, 2048 CTAs of 8 steps): v10's kernel 436 us against cuDNN's
// 399, both L2-bound (79-80 % L2 throughput), and ours alone stalls on lg_throttle (1.27 cycles per issued
// instruction, third after long scoreboard and wait): the queue of global memory instructions is full. A CTA
// issues 8 x 16 B dQ reductions per thread and step (2048 per step, 16 K over 8 steps) and, in its epilogue,
// store_dk_dv's 4-byte stores: 64 per thread, another 16 K, as many as all its reductions at S = 512, in
// 4-byte pieces scattered over 8 rows per warp instruction. At S = 4096 the epilogue is an eighth of that share
// and the stall is absent.
//
// What changes (Cfg's kStageDkDv, common/hopper/attn_bwd_sm90.cuh's store_dk_dv_staged): each warpgroup packs
// its dK_w (times scale) and dV_w into its half of the dQ staging area (unused since v05 reduces dQ from
// registers; 64 KB at D = 128 holds both warpgroups' dK and dV), 16-byte chunks XOR-swizzled by row so the
// 4-byte writes are conflict-free, then stores whole 16-byte chunks, consecutive threads on consecutive chunks
// of a row: 16 store instructions per thread instead of 64, each warp covering two whole 256-byte rows.
// Unaligned dK / dV (a row not a multiple of 16 bytes) fall back to the 4-byte stores.
//
// Prediction (H100, GPU time): the epilogue's share of a CTA is largest at short S: +3-6 % at S = 512, +2-3 % at
// 1024, ~1 % at 2048, nothing measurable at S >= 4096; D = 64 (32 stores per thread, 8 steps of half the
// reductions) about the same fractions.
//
// Outcome (H100, GPU time, in rounds with v10 and SDPA-cuDNN, 21 bench-bwd cells; outputs/driver_logs/
// 20261126-h100-bwd-v12-run1/): far above the prediction and at every length. D = 128: S = 512 +13 % (1.06x
// cuDNN), 1024 +9 %, 2048 +5 %, 4096 +2-3 %, 16384 +1 %; D = 64: S = 512 +8-9 %, 1024 +6-7 %, 2048 +3-5 %, 4096
// +2-3 %, 16384 +0-1 %. 19 of 21 cells >= 1.0x cuDNN (v10: 5). What the prediction missed: the 4-byte stores
// were not only many but partial: each warp instruction wrote 4 bytes into each of 8 rows, 16 bytes per
// 32-byte sector per instruction, so every sector of dK and dV was written in pieces by several instructions
// (L2 merges them, but each piece is a separate request through the L2-bound memory system the profile showed);
// whole 16-byte chunks in whole rows write each sector once. Correct: driver 53/53 (the no-Δ build fails 52),
// 14/14 gradient checks, memcheck (38 configs), racecheck, synccheck, initcheck (4 each) clean.
//
// Limits: v10's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v12_stage.cu
#include "common/hopper/attn_bwd_stagger.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

static_assert(LAB_BWD_STAGGER_DQ_RED, "the dQ staging area must be free (dQ reduced from registers)");

template <int D>
using Cfg12 = Cfg<D, 2, true, D == 64, true>;

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg12<D>, T, bwd_dkdv_stagger<Cfg12<D>, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v12(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
