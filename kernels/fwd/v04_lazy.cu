// Changes: vs v03: lazy O rescale, XOR ldmatrix addressing, one K/V row pointer (no spills), small-grid config.
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a -DFWD_FN=attn_fwd_v04 tools/gpu/fwd_mma_main.cu kernels/fwd/v04_lazy.cu -o /tmp/v04 && /tmp/v04
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-fwd-v04-lazy.json and 20261121-fwd-v04-small-grid.json.
//
// v04_lazy: v03 with a lazily rescaled online softmax and the D = 128
// spills removed; >= PyTorch SDPA-flash (FlashAttention-2) in every cell of
// the bf16 bench grid, at both head dims (H200, 2026-11-21; per-cell numbers
// in outputs/experiments/20261121-fwd-v04-lazy.json, logs outputs/driver_logs/20261121-h200-v04-*.log).
// Tiles, pipeline, swizzle, masking, limits and error codes are v03's.
//
// v04 changes (each a FwdConfig switch below; a sweep builds other values with
// the one switch -DLAB_FWD_LAZY_TILE, see "tile configs"):
// A. LAZY (on): the running max that a row uses as its exp2 offset moves
//    only when some row of the warp grew by more than 2^8 (a warp vote, so
//    the branch is uniform). Otherwise P = exp2(s*c - m_old*c) <= 256, which
//    16-bit P and fp32 l and O hold without loss, and the O / l rescale
//    (128 FMUL per thread per tile at D = 128) and the alpha exp2 are
//    skipped. O / l and LSE = m*scale + ln(l) are exact for any offset that
//    O and l share, so the output is the same function (FA4's trick). The
//    softmax is also reordered (all row maxes, then the rescale, then the
//    exp2); with SPLIT on, D = 128 spills went 172 -> 68 B. Measured with
//    SPLIT and v03's addressing (68 B spills): +5-6 % at D = 128
//    (S = 512 causal -6 %).
// B. ADDR (on): the ldmatrix addresses of Q, K and V written as a lane base
//    plus (lane chunk bits XOR a k-step immediate): chunk 2s + c of a row
//    with row % 8 == l % 8 sits at byte (s << 5) ^ (((c ^ l) & 7) << 4).
//    ptxas then keeps one LOP3 per ldmatrix instead of a register per
//    (k-step, operand): D = 128 spills 68 -> 32 B.
// C. KVPTR (on): the K/V cp.async copies from one row pointer per thread
//    plus a 64-bit step (each thread's 16-byte chunk is fixed and its rows
//    are 8 apart) instead of one 64-bit multiply-add per copy: D = 128
//    spills 32 -> 0 B (255 registers, no LDL/STL in the SASS; v03 had 19
//    LDL + 17 STL). B, C, D without A (ptxas then spills 128 B): +1-2 %.
//    A + B + C (+ D): +13-14 % at D = 128 over v03 (S = 512 causal +2 %),
//    1.01-1.09x SDPA-flash.
// D. SPLIT (on at D = 128, off at D = 64): the tiles that need no mask
//    (below the causal diagonal and inside S_k) run in a loop of their own,
//    without the mask code; only the last tiles run the masked loop. At
//    D = 64 it measured +1 % on the long cells but -1.5 % at S = 512 causal,
//    so it is off there (D = 64 then within 0.3 % of v03 at S = 512 and
//    +1-2 % above it at S >= 2048).
// E. PRO (off): the prologue also issues tile kStages - 1 into the buffer no
//    tile has used yet. Predicted +1-3 % at S = 512; measured 0 to -1 % at D = 128,
//    -1 to -2 % at D = 64.
// F. SMALL (launch-time choice, on): when the 128-row grid would put at most
//    one CTA on each SM (ceil(S_q/128) * B * H_q <= #SMs), attn_fwd_v04
//    launches 64-row CTAs instead (4 warps x 16 rows, B_c = 64, 4 stages at
//    D = 64 (72 KiB, 150 regs), 2 stages at D = 128 (80 KiB, 185 regs)):
//    twice the CTAs, all resident, half of each warp's serial chain per
//    tile. The bench grid never takes it. H200, fp16 B=4 H=8 (seed shapes),
//    D = 64: -1.1 to -2.1 us (S = 32..512, 7-19 %); D = 128: -4 to -7 us.
//    The choice is pick_tile (host); LAB_FWD_LAZY_SMALL = 0 never, 2 always (tests).
// G. The opt-in shared-memory attribute is set once per device and kernel
//    instantiation instead of on every launch (host time, which the event
//    timing of small calls sees only when it is not hidden; measured 0).
// H. KVSPLIT (option, off; LAB_FWD_LAZY_TILE='FwdConfig<64\,8\,1\,64\,4\,2\,true\,false\,false\,2>'):
//    small config with two warp groups on the same 64 rows, each taking one
//    half of every 2*B_c-key tile, merged through shared memory at the end
//    (128 regs at 2 CTAs of 256 threads, no spills at D = 64). Predicted:
//    4 warps per scheduler instead of 2, ~-2 us at S = 512; measured -0.4 us
//    at S = 512 (3 stages), -0.3 us at S = 256, +0.7 us at S <= 64. Off.
//
// ---- v03 notes (still apply): v02 with Q re-read from shared memory, FA2's
// tile shapes, a head-major causal CTA order and two optional loop variants.
// 1. Q fragments re-read from shared memory every k-step (kQInSmem, FA2's
//    own choice) instead of held in registers for the whole CTA. That frees
//    8 * D/16 registers per m16 tile, which pays for B_c = 64 at D = 64
//    without spills (+8-11 % non-causal over v02's B_c = 32) and for 32 rows
//    per warp at D = 128 (two m16 tiles: each K/V fragment read by ldmatrix
//    feeds two mma, 160 B of shared-memory traffic per mma instead of 256;
//    measured +1-3 %, with 168 B of spills at the 255-register cap, 68 B
//    with item 5).
// 2. Causal CTA order. v02 ran causal grids heaviest-first across all heads
//    (query block slowest), so the CTAs resident at one time each read a
//    different head's K/V. v03 keeps one head's query blocks together
//    (heaviest first inside each head) so they share K/V in L2. Predicted:
//    a clear causal gain (the K/V stream without reuse is ~2.9 ms of HBM
//    time in a ~3.7 ms kernel at S = 8192); measured: no change beyond the
//    +-3 % run-to-run noise, i.e. that stream was already hidden. Kept, as
//    it is FA2's order and no worse.
// 3. kPingPong (option, off): S_{j+1} = Q K_{j+1}^T issued before the
//    softmax of S_j, so a warp has its own tensor-core work to overlap its
//    exp2/max/sum. Predicted +5-10 %; measured -5 to +4 % at v02's tiles and
//    a loss elsewhere (more registers): with 2 warps per scheduler the
//    other warp already fills the tensor pipe during a softmax.
// 4. kPackEarly (option, off): pack all of P to 16 bits before P V. Same
//    spills and registers as without (ptxas already does it); timed equal.
// 5. kLaunder (on): the K/V base pointers pass through an
//    empty asm each tile, so the compiler cannot hoist one 64-bit source
//    pointer per cp.async out of the tile loop. D = 128 spills drop from
//    168 B to 68 B (255 registers either way); measured +1-2 % at D = 128,
//    D = 64 unchanged.
// Everything else (algorithm, pipeline, swizzle, masking, limits,
// preconditions, error codes) is v02's; the v02 notes below still apply.
//
// (v02 notes) FlashAttention-2 forward on tensor cores (mma.sync m16n8k16).
//
// Algorithm (FlashAttention-2, Dao 2023, Alg. 1), per (batch b, query head h):
//   Q is cut into row blocks Q_i of B_r rows, K and V into column blocks
//   K_j, V_j of B_c keys. For one Q_i (one CTA):
//     m_i = -inf, l_i = 0, O_i = 0
//     for j = 0 .. T_c - 1:                       (causal: only j with
//       S_ij   = Q_i K_j^T                          j*B_c <= last row of Q_i)
//       m_new  = max(m_i, rowmax(S_ij))
//       P_ij   = exp2(S_ij * c - m_new * c)        c = scale * log2(e)
//       l_i    = exp2((m_i - m_new) c) l_i + rowsum(P_ij)
//       O_i    = exp2((m_i - m_new) c) O_i + P_ij V_j
//       m_i    = m_new
//     O_i /= l_i;  LSE_i = m_i * scale + ln(l_i)
//   The softmax scale is folded into the exp2 argument (one FFMA per score),
//   and O is normalised once, at the end.
//
// Work split (the FA2 partitioning): the B_r rows of Q_i are split across
// warps, kRowsPerWarp each, so every warp owns complete rows of S, P and O:
// row max / row sum need only a 4-lane shuffle (the lanes of one mma quad)
// and no cross-warp reduction is ever needed. Q_i fragments stay in registers
// for the whole CTA; K_j and V_j are streamed through shared memory and read
// by every warp with ldmatrix (V with .trans, since it is stored [key][d] but
// used as the B operand with k = key).
//
// Pipeline: kStages shared-memory buffers, each holding one (K_j, V_j) pair.
// Tile j+kStages-1 is requested with cp.async (16-byte, zero-fill past the
// sequence end) before the math of tile j starts, so global loads overlap
// kStages-1 tiles of math. One __syncthreads per tile both publishes tile j
// and frees the buffer tile j-1 used.
//
// Shared memory layout: every tile is [rows][D] 16-bit elements, rows of
// D*2 = 128 or 256 bytes. The 16-byte chunk c of row r is stored at chunk
// c ^ (r % 8). ldmatrix reads 8 rows at the same logical chunk; the XOR puts
// them in 8 different 16-byte bank groups, so reads (and the cp.async writes)
// are free of bank conflicts without padding.
//
// Masking: key columns >= S_k get -inf; with causal (SDPA is_causal, top-left
// aligned: query i sees key j iff j <= i, also when S_q != S_k) columns j > i
// get -inf too. Only tiles that cross S_k or the diagonal pay for the mask;
// fully masked causal tiles are never loaded. Rows >= S_q are computed on
// zero-filled Q and never stored.
//
// Launch: 1-D grid of ceil(S_q/B_r) * B * H_q CTAs, kWarps*32 threads,
//   smem = (B_r + 2 * kStages * B_c) * D * 2 bytes:
//     (v03 defaults) D = 64 : B_r = 128 (4 warps x 32 rows), B_c = 64,
//       4 stages, 80 KiB, 251 regs, 2 CTAs / SM; D = 128: B_r = 128 (4 warps
//       x 32 rows), B_c = 64, 2 stages, 96 KiB, 255 regs + 68 B spills,
//       2 CTAs / SM; Q re-read from smem in both. v04: same tiles and
//       smem; sm_90a D = 64 236 regs, D = 128 255 regs, no spills.
//   Query block index fastest in both grids (v03); causal: heaviest block
//   of each head first.
//
// Limits: D in {64, 128}; fp16 and bf16 (fp32 accumulate, P rounded to the
// input type before P V, as in FA2); any S_q, S_k >= 0; H_q % H_kv == 0;
// any finite scale (common/softmax.cuh: Q negated for scale < 0, FLT_MIN for
// 0, since the running max is taken on unscaled scores); S_k == 0 gives
// O = 0 and LSE = -inf (what P V over no keys is). Preconditions
// (checked, LAB_E_SHAPE otherwise): base pointers 16-byte aligned and batch /
// head / seq strides multiples of 8 elements, so every row start is 16-byte
// aligned for cp.async and the vector stores.
//
// Changes from v01_scalar (fp32 CUDA cores, FA1 order, P through smem):
// tensor cores, exp2 with the scale folded in, O normalised once, P kept in
// registers (S accumulators reused as the A operand), a cp.async
// pipeline. Measured effect: outputs/experiments/20261121-fwd-v04-lazy.json.

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/mma.cuh"
#include "common/mma_fwd_tiles.cuh"
#include "common/launch.h"
#include "common/params.h"
#include "common/mask.cuh"
#include "common/smem_tile.cuh"
#include "common/softmax.cuh"

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;

constexpr float kLazyLog2 = 8.0f;  // LAZY: offset lag allowed, in exp2 units (2^8 = 256)

// One tile config: every field a sweep may change is a template parameter (defaults: v04's own switches;
// SPLIT is off at D = 64, where it measured -1.5 % at S = 512 causal and +1 % elsewhere, H200).
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, int kStages_, int kMinBlocks_,
          bool kQInSmem_ = true, bool kPingPong_ = false, bool kPackEarly_ = false, int kKVSplit_ = 1,
          bool kLazy_ = true, bool kSplit_ = (kHeadDim_ != 64), bool kAddrXor_ = true, bool kKVPtr_ = true,
          bool kPro_ = false, bool kLaunder_ = true>
struct FwdConfig
    : lab::MmaFwdSplitTiles<kHeadDim_, kWarps_, kMTiles_, kBlockN_, kStages_, kMinBlocks_, kKVSplit_> {
  // The tile arithmetic, with H's K/V split (kKVSplit, kRowWarps, kBlockNLoad): common/mma_fwd_tiles.cuh.
  using Tiles = lab::MmaFwdSplitTiles<kHeadDim_, kWarps_, kMTiles_, kBlockN_, kStages_, kMinBlocks_, kKVSplit_>;
  static constexpr bool kQInSmem = kQInSmem_;    // Q fragments re-read from smem every k-step
  static constexpr bool kPingPong = kPingPong_;  // S_{j+1} issued before the softmax of S_j
  static constexpr bool kPackEarly = kPackEarly_;  // all of P packed to 16 bits before P V
  static constexpr bool kLaunder = kLaunder_;    // 5. K/V source pointers recomputed per tile
  static constexpr bool kLazy = kLazy_;          // A. rescale O only when a row max grew by > 2^kLazyLog2
  static constexpr bool kSplit = kSplit_;        // D. unmasked tiles in a loop of their own
  static constexpr bool kAddrXor = kAddrXor_;    // B. ldmatrix chunk offsets as lane base XOR immediate
  static constexpr bool kPro = kPro_;            // E. prologue issues kStages tiles, not kStages - 1
  static_assert(!(kPro && kPingPong_), "kPro is written for the plain loop only");
  static constexpr bool kKVPtr = kKVPtr_;        // C. K/V copies from one row pointer per thread
  // H. kKVSplit == 2: the groups' (m, l, O) are merged through shared memory at the end; group 1's O, m, l
  // per lane go to the K/V buffers after the loop.
  static constexpr int kMergeFloats = kMTiles_ * (kHeadDim_ / 8) * 4 + 4 * kMTiles_;
  static_assert(kKVSplit_ == 1 || !kPingPong_, "kKVSplit is written for the plain loop only");
  static_assert(kKVSplit_ == 1 ||
                    Tiles::kRowWarps * 32 * kMergeFloats * 4 <= 2 * kStages_ * Tiles::kSmemTile,
                "merge buffer must fit in the K/V buffers");
};

// ---------------------------------------------------------------- tile configs (chosen in one place)
// <D, warps, m16 tiles per warp, B_c, stages, min CTAs per SM, then the switches above>. Chosen by the
// H100 sweep of 2026-11-21 and the H200 runs since (outputs/experiments/20261121-fwd-v04-lazy.json); beside each, what lost and why.
//
// D = 64: 4 warps x 32 rows, B_c = 64, 4 stages (80 KiB), Q re-read from smem: 251 regs, no spills,
// 2 CTAs (8 warps) per SM. Rejected: v02's B_c = 32 with Q in registers (8-11 % slower non-causal,
// 6-11 % causal); SPLIT (see FwdConfig).
using Cfg64 = FwdConfig<64, 4, 2, 64, 4, 2>;
// D = 128: FA2's own tile, 4 warps x 32 rows, B_c = 64, 2 stages (96 KiB), Q re-read from smem, 2 CTAs
// per SM. In v03 this tile had 255 regs with 68 B of spills; v04's B and C remove them: 255 regs, 0 spills
// (sm_90a). Rejected (v03 measurements): B_c = 48 (60-80 B spills) and B_c = 32 (no spills, 3-4 stages),
// 2-7 % slower; ping-pong and early packing of P (no gain measured).
using Cfg128 = FwdConfig<128, 4, 2, 64, 2, 2>;
// F. Small grids: B_r = 64, 4 warps x 16 rows (one m16 tile per warp), same B_c and stages. When the
// 128-row grid would put at most one CTA on each SM, the latency is one CTA's serial walk over the keys
// with one warp per scheduler; half the rows per CTA doubles the CTAs (still <= 2 per SM, all resident)
// and halves each warp's mma/exp2 chain per tile. Rejected: KVSPLIT = 2 (H, 8 warps over two key halves,
// merged at the end; slower than 64-row CTAs in every small-grid cell measured).
using Cfg64s = FwdConfig<64, 4, 1, 64, 4, 2>;
using Cfg128s = FwdConfig<128, 4, 1, 64, 2, 2>;

// The one sweep switch: -DLAB_FWD_LAZY_TILE='FwdConfig<128\,8\,1\,64\,2\,1>' (nvcc takes commas in -D
// values only escaped) makes every launch of that head dim use the tile given, in place of the pick
// below; the tile sweep of outputs/experiments/20261121-fwd-v04-lazy.json built its variants this way. LAB_FWD_LAZY_SMALL forces the pick's small-grid
// rule for tests: 1 (default) by the rule, 0 never, 2 always.
#ifndef LAB_FWD_LAZY_SMALL
#define LAB_FWD_LAZY_SMALL 1
#endif

using lab::swizzle;

// kKVPtr: the same copy as load_tile<Cfg, B_c>, written as one row pointer
// per thread advanced by 8 rows per copy (each thread's chunk c is fixed and
// its rows are r0 + i * kRowStep), and one smem base plus an immediate.
template <class Cfg, class T>
__device__ __forceinline__ void load_kv_tile(uint32_t smem_tile, const T* gbase, int64_t row_stride,
                                             int row0, int seqlen, int tid) {
  constexpr int kRowStep = Cfg::kThreads / Cfg::kChunksPerRow;
  constexpr int kPerThread = Cfg::kBlockNLoad / kRowStep;
  static_assert(Cfg::kThreads % Cfg::kChunksPerRow == 0 && Cfg::kBlockNLoad % kRowStep == 0, "");
  static_assert(kRowStep % 8 == 0, "row % 8 must be the same for all of a thread's rows");
  const int r0 = tid / Cfg::kChunksPerRow;
  const int c = tid % Cfg::kChunksPerRow;
  const T* src = gbase + (int64_t)(row0 + r0) * row_stride + c * 8;
  const int64_t step = (int64_t)kRowStep * row_stride;
  const uint32_t dst = smem_tile + swizzle<Cfg::kHeadDim>(r0, c) * 2;
  const int left = seqlen - row0 - r0;  // this thread's rows i with i * kRowStep < left are real
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool valid = i * kRowStep < left;
    // Invalid rows read nothing (src-size 0); gbase keeps the address legal.
    lab::cp_async_16(dst + i * kRowStep * Cfg::kHeadDim * 2, valid ? src + i * step : gbase, valid);
  }
}

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    attn_fwd_v04_kernel(const AttnFwdParams p) {
  constexpr int D = Cfg::kHeadDim;
  constexpr int Br = Cfg::kBlockM;
  constexpr int Bc = Cfg::kBlockN;       // keys per warp group and tile
  constexpr int BcL = Cfg::kBlockNLoad;  // keys per pipeline tile (kKVSplit * Bc)
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kStages = Cfg::kStages;

  extern __shared__ __align__(128) uint8_t smem[];
  // The ids written out, not lab::mma_thread() (v02, v03): through it nvcc orders the prologue's integer code
  // of the KVSPLIT build differently (sass_guard, 2026-11-23; the default tiles were identical either way).
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;  // mma group: row within an 8-row half
  const int t = lane % 4;  // thread in group: column pair

  // ---- which (b, h, query block) this CTA owns: v03's head-major order
  const lab::FwdBlock blk = lab::fwd_block<Br, true>(p);
  const int b = blk.b, h = blk.h, m0 = blk.m0;

  const lab::FwdHeads<T> heads = lab::fwd_heads<T>(p, blk);
  const T *q = heads.q, *k = heads.k, *v = heads.v;
  // O's head pointer written out here, not taken from heads.o: nvcc then keeps its offset from the prologue
  // and the kernel's SASS is unchanged (from heads.o it sinks it to the epilogue and reorders the integer code).
  T* o = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
  const int n_tiles = lab::fwd_kv_tiles<Br, BcL>(p, m0);

  const uint32_t sQ = lab::smem_u32(smem);
  const lab::KVStages<Cfg> kvs{sQ + Cfg::kSmemQ};  // K and V of each pipeline stage

  // ================================================================ Prologue
  lab::load_q_first_kv<Cfg, BcL, kStages - 1 + (Cfg::kPro ? 1 : 0)>(sQ, kvs.base, smem, q, k, v, p, m0, n_tiles, tid);  // common/smem_tile.cuh

  // Q fragments (A operand), one x4 per m16 x k16 block. Lane l addresses
  // row l % 16 and chunk 2*kk + l / 16 of the block.
  const int grp = Cfg::kKVSplit == 1 ? 0 : warp / Cfg::kRowWarps;  // kKVSplit group
  const int warp_row0 = (Cfg::kKVSplit == 1 ? warp : warp % Cfg::kRowWarps) * Cfg::kRowsPerWarp;
  const uint32_t sub = grp * Bc * D * 2;  // this group's keys inside a K/V tile
  // kQInSmem: only one k-step of fragments lives at a time (reloaded in the
  // Q K^T loop); otherwise all of them, loaded once here.
  constexpr int kQF = Cfg::kQInSmem ? 1 : Cfg::kKStepsQK;
  uint32_t qf[kMT][kQF][4];
  auto load_q = [&](int mt, int kk, uint32_t (&dst)[4]) { lab::load_q_frag<D>(dst, sQ, warp_row0, mt, kk, lane); };
  if constexpr (!Cfg::kQInSmem) lab::load_q_frags<D>(qf, sQ, warp_row0, lane);  // common/smem_tile.cuh

  // Per-thread rows: (mt, half) -> row warp_row0 + mt*16 + half*8 + g.
  float acc_o[kMT][Cfg::kNTilesO][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];  // partial: this thread's columns only, reduced at the end
  lab::init_softmax_state(acc_o, row_max, row_sum);

  const float scale_log2 = fabsf(p.scale) * kLog2e;  // > 0: the launcher made 0 FLT_MIN, the sign is in Q

  const lab::KVLanes kvl = lab::kv_lanes(lane);  // lane parts of the K/V ldmatrix addresses
  const int k_row = kvl.k_row, k_chunk = kvl.k_chunk, v_row = kvl.v_row, v_chunk = kvl.v_chunk;
  // kAddrXor: the same addresses written as lane base + (lane chunk bits XOR
  // a k-step immediate). Chunk 2s + c (c in {0, 1}) of a row with row % 8 ==
  // l % 8 sits at byte ((2s + c) ^ (l % 8)) * 16 = (s << 5) ^ (((c ^ l) & 7) << 4),
  // so one LOP3 with an immediate per ldmatrix instead of a held register.
  const uint32_t q_base = sQ + (warp_row0 + (lane % 16)) * D * 2;
  const uint32_t q_x = (((lane / 16) ^ lane) & 7) << 4;
  const uint32_t k_lane = k_row * D * 2;
  const uint32_t k_x = ((k_chunk ^ lane) & 7) << 4;
  const uint32_t v_lane = v_row * D * 2;
  const uint32_t v_x = ((v_chunk ^ lane) & 7) << 4;

  // ================================================================ One tile
  // The three steps of one K_j/V_j tile, used by both main loops below.
  using SAcc = float[kMT][Cfg::kNTilesS][4];

  // acc = Q_i K^T for the K tile at k_tile (fp32; common/smem_tile.cuh), with B's addressing (kAddrXor).
  auto qk_tile = [&](SAcc& acc_s, uint32_t k_tile) {
    auto reload_q = [&](int kk) {  // kQInSmem: k-step kk's fragments
      if constexpr (Cfg::kAddrXor) {
        const uint32_t qa = q_base + (q_x ^ (kk << 5));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) lab::ldmatrix_x4(qf[mt][0], qa + mt * 16 * D * 2);
      } else {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) load_q(mt, kk, qf[mt][0]);
      }
    };
    auto load_k = [&](uint32_t (&bk)[4], int np, int kk) {
      if constexpr (Cfg::kAddrXor)
        lab::ldmatrix_x4(bk, k_tile + k_lane + (k_x ^ (kk << 5)) + np * 16 * D * 2);
      else
        lab::load_k_frag<D>(bk, k_tile, np, kk, kvl);
    };
    lab::qk_tile<T, Cfg::kKStepsQK>(acc_s, qf, reload_q, load_k);
  };

  // Mask of tile j: only the tile that crosses S_k and the causal diagonal tiles.
  auto mask_tile = [&](SAcc& acc_s, int j) {
    const int n0 = j * BcL + grp * Bc;
    if (lab::tile_needs_mask(n0, Bc, m0, p.seqlen_k, p.causal))
      lab::mask_scores(acc_s, m0 + warp_row0, n0, p.seqlen_k, p.causal, g, t);
  };

  // Online softmax of a masked S tile (in place, S becomes P), O rescale,
  // then O += P V for the V tile at v_tile.
  auto softmax_pv = [&](SAcc& acc_s, uint32_t v_tile) {
    // Tile row max (after the quad shuffles) of every row this thread holds.
    float mx[kMT][2];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float m = row_max[mt][hh];
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTilesS; ++nt)
          m = fmaxf(m, fmaxf(acc_s[mt][nt][2 * hh], acc_s[mt][nt][2 * hh + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        mx[mt][hh] = m;
      }
    // Lazy rescale (kLazy): the running max a row uses as its exp2 offset is
    // only moved when some row of the warp grew by more than kLazyLog2 (in
    // exp2 units); otherwise P = exp2(s*c - m_old*c) <= 2^kLazyLog2, which
    // 16-bit P and fp32 l, O hold without loss, and O, l need no rescale.
    // O / l and LSE = m*scale + ln(l) are exact for any offset m that O and
    // l share. Warp-uniform (vote), so the branch never diverges.
    bool rescale = true;
    if constexpr (Cfg::kLazy) {
      bool grow = false;
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          // -inf old max with a finite new one: +inf > k (rescale);
          // both -inf: NaN > k is false (nothing to rescale).
          grow |= (mx[mt][hh] - row_max[mt][hh]) * scale_log2 > kLazyLog2;
      rescale = __any_sync(0xffffffffu, grow);
    }
    if (rescale) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          // A row with nothing visible yet keeps max -inf; subtracting 0
          // instead of -inf keeps exp2 at 0 rather than NaN.
          const float mx_scaled = (mx[mt][hh] == kNegInf) ? 0.f : mx[mt][hh] * scale_log2;
          const float alpha = lab::fast_exp2(row_max[mt][hh] * scale_log2 - mx_scaled);
          row_max[mt][hh] = mx[mt][hh];
          row_sum[mt][hh] *= alpha;
#pragma unroll
          for (int nt = 0; nt < Cfg::kNTilesO; ++nt) {
            acc_o[mt][nt][2 * hh] *= alpha;
            acc_o[mt][nt][2 * hh + 1] *= alpha;
          }
        }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float m = row_max[mt][hh];
        const float m_scaled = (m == kNegInf) ? 0.f : m * scale_log2;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTilesS; ++nt) {
#pragma unroll
          for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
            const float pe = lab::fast_exp2(fmaf(acc_s[mt][nt][e], scale_log2, -m_scaled));
            acc_s[mt][nt][e] = pe;
            sum += pe;
          }
        }
        row_sum[mt][hh] += sum;
      }
    }

    // O_i += P_ij V_j (common/smem_tile.cuh; kPackEarly: all of P packed first), with B's addressing (kAddrXor).
    auto load_v = [&](uint32_t (&bv)[4], int np, int kk) {
      if constexpr (Cfg::kAddrXor)
        lab::ldmatrix_x4_trans(bv, v_tile + v_lane + kk * 16 * D * 2 + (v_x ^ (np << 5)));
      else
        lab::load_v_frag<D>(bv, v_tile, np, kk, kvl);
    };
    lab::pv_tile<T, Cfg::kPackEarly>(acc_o, acc_s, load_v);
  };

  // Refill at iteration j: the buffer tile j-1 used gets tile j + kStages - 1.
  // kPro: the prologue already issued tile kStages - 1 (into the buffer no
  // tile has used yet), so iteration 0 issues nothing, and its wait leaves
  // one more group in flight than the later ones.
  auto wait_tile = [&](int j) {
    if constexpr (Cfg::kPro) {
      if (j == 0) {
        lab::cp_async_wait<kStages - 1>();
        return;
      }
    }
    lab::cp_async_wait<kStages - 2>();
  };
  auto refill = [&](int j) {
    if constexpr (Cfg::kPro) {
      if (j == 0) return;  // no commit: tile kStages - 1 came with the prologue
    }
    const int jn = j + kStages - 1;
    if (jn < n_tiles) {
      const int st = jn % kStages;
      // kLaunder: opaque copies (2 x kPerThread x 2 registers held across the loop otherwise).
      const T* kb = Cfg::kLaunder ? lab::launder(k) : k;
      const T* vb = Cfg::kLaunder ? lab::launder(v) : v;
      if constexpr (Cfg::kKVPtr) {
        load_kv_tile<Cfg>(kvs.k(st), kb, p.k_stride[2], jn * BcL, p.seqlen_k, tid);
        load_kv_tile<Cfg>(kvs.v(st), vb, p.v_stride[2], jn * BcL, p.seqlen_k, tid);
      } else {
        lab::load_tile<Cfg, BcL>(kvs.k(st), kb, p.k_stride[2], jn * BcL, p.seqlen_k, tid);
        lab::load_tile<Cfg, BcL>(kvs.v(st), vb, p.v_stride[2], jn * BcL, p.seqlen_k, tid);
      }
    }
    lab::cp_async_commit();  // always: keeps the group count uniform
  };

  // ================================================================ Main loop
  if constexpr (!Cfg::kPingPong) {
    // [lab:inner-loop] the main loop: S_j = Q K_j^T, mask only where needed, online softmax, O += P_j V_j
    // v02's loop: S_j = Q K_j^T, mask, softmax, O += P_j V_j, in that order.
    // kSplit: tiles [0, n_full) need no mask and run in a loop without the
    // mask code (and without the row/column indices it keeps live); only the
    // trailing tiles that cross S_k or the causal diagonal run the masked loop.
    int n_full = n_tiles;
    if constexpr (Cfg::kSplit) {
      n_full = min(n_full, p.seqlen_k / BcL);
      if (p.causal) n_full = min(n_full, (m0 + 1) / BcL);
    }
    int j = 0;
#pragma unroll 1
    for (; j < n_full; ++j) {
      wait_tile(j);  // this thread's copies of tile j are done
      __syncthreads();  // everyone's are; and everyone has finished tile j-1's buffer
      refill(j);
      float acc_s[kMT][Cfg::kNTilesS][4];
      qk_tile(acc_s, kvs.k(j % kStages) + sub);
      if constexpr (!Cfg::kSplit) mask_tile(acc_s, j);
      softmax_pv(acc_s, kvs.v(j % kStages) + sub);
    }
#pragma unroll 1
    for (; j < n_tiles; ++j) {
      wait_tile(j);
      __syncthreads();
      refill(j);
      float acc_s[kMT][Cfg::kNTilesS][4];
      qk_tile(acc_s, kvs.k(j % kStages) + sub);
      mask_tile(acc_s, j);
      softmax_pv(acc_s, kvs.v(j % kStages) + sub);
    }
    // [/lab:inner-loop]
  } else {
    // Ping-pong: S_{j+1} = Q K_{j+1}^T before the softmax of S_j (lab::pingpong_loop, common/smem_tile.cuh).
    lab::pingpong_loop<SAcc, kStages>(n_tiles, kvs, qk_tile, mask_tile, softmax_pv, refill);
  }

  // ================================================================ Epilogue
  // Drain the (empty) trailing cp.async groups before sQ is reused.
  lab::cp_async_wait<0>();

  if constexpr (Cfg::kKVSplit == 2) {
    // H. Merge the two groups' partial softmax states, row by row: both hold
    // the same rows in the same fragment layout, so lane i of group 1's warp
    // r pairs with lane i of group 0's warp r. Each (O, l) is relative to its
    // own offset m (possibly lazy): O = a0 O0 + a1 O1, l = a0 l0 + a1 l1 with
    // a_g = exp2((m_g - m) c), m = max(m0, m1).
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        float l = row_sum[mt][hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        row_sum[mt][hh] = l;
      }
    __syncthreads();  // every warp is done with the K/V buffers
    float* buf = reinterpret_cast<float*>(smem + Cfg::kSmemQ) +
                 (warp % Cfg::kRowWarps) * 32 * Cfg::kMergeFloats + lane;
    constexpr int kOF = kMT * Cfg::kNTilesO * 4;
    if (grp == 1) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTilesO; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) buf[32 * ((mt * Cfg::kNTilesO + nt) * 4 + e)] = acc_o[mt][nt][e];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          buf[32 * (kOF + mt * 4 + hh)] = row_max[mt][hh];
          buf[32 * (kOF + mt * 4 + 2 + hh)] = row_sum[mt][hh];
        }
      }
    }
    __syncthreads();
    if (grp == 1) return;  // no block barrier below this point
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float m0v = row_max[mt][hh];
        const float m1v = buf[32 * (kOF + mt * 4 + hh)];
        const float l1 = buf[32 * (kOF + mt * 4 + 2 + hh)];
        const float m = fmaxf(m0v, m1v);
        // m = -inf: neither group saw a key; l stays 0 and O 0.
        const float a0 = m == kNegInf ? 0.f : lab::fast_exp2((m0v - m) * scale_log2);
        const float a1 = m == kNegInf ? 0.f : lab::fast_exp2((m1v - m) * scale_log2);
        row_max[mt][hh] = m;
        row_sum[mt][hh] = a0 * row_sum[mt][hh] + a1 * l1;
#pragma unroll
        for (int nt = 0; nt < Cfg::kNTilesO; ++nt)
#pragma unroll
          for (int e = 2 * hh; e < 2 * hh + 2; ++e)
            acc_o[mt][nt][e] = a0 * acc_o[mt][nt][e] + a1 * buf[32 * ((mt * Cfg::kNTilesO + nt) * 4 + e)];
      }
  }

  lab::normalise_rows<Cfg::kKVSplit == 1>(acc_o, row_max, row_sum, fabsf(p.scale), p.lse,
                                          ((int64_t)b * p.heads_q + h) * p.seqlen_q, m0 + warp_row0, p.seqlen_q, g, t);
  // O goes out through this warp's own rows of sQ (lab::stage_o, common/smem_tile.cuh), then 16-byte row
  // stores. The row stores are lab::store_o's second half, kept inline: through the function (its T* o, or
  // a lambda for the address) nvcc forms the 64-bit row address in another order or sinks the head offset
  // out of the prologue, and the whole kernel's integer code changes (sass_guard, 2026-11-23: +208
  // instructions at sm_90a, or the same count reordered); the staging step shares with identical SASS.
  const uint32_t sO = sQ;
  __syncwarp();  // every lane's last ldmatrix of these Q rows is done (kQInSmem)
  lab::stage_o<Cfg, T>(acc_o, sO, warp_row0, g, t);
  __syncwarp();

  constexpr int kStorePerLane = Cfg::kRowsPerWarp * Cfg::kChunksPerRow / 32;
#pragma unroll
  for (int i = 0; i < kStorePerLane; ++i) {
    const int idx = lane + i * 32;
    const int r = warp_row0 + idx / Cfg::kChunksPerRow;
    const int c = idx % Cfg::kChunksPerRow;
    const int grow = m0 + r;
    if (grow < p.seqlen_q) {
      uint4 val;
      const uint32_t addr = sO + swizzle<D>(r, c) * 2;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(addr)
                   : "memory");
      *reinterpret_cast<uint4*>(o + (int64_t)grow * p.o_stride[2] + c * 8) = val;
    }
  }
}

using lab::current_device;
using lab::num_sms;

template <class Cfg, class T>
int launch(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  // The shared-memory opt-in once per device and instantiation (G: it was set on every call).
  return lab::launch_fwd<attn_fwd_v04_kernel<Cfg, T>, Cfg>(p, stream, dev);  // common/mma_fwd_tiles.cuh
}

enum class Tile { k64, k64Small, k128, k128Small };

// The tile for a call: by head dim, then the small-grid rule (F): the 64-row tile when the 128-row grid
// (ctas_128 CTAs) would leave at most one CTA per SM.
Tile pick_tile(int head_dim, int64_t ctas_128, int dev) {
  const bool small = LAB_FWD_LAZY_SMALL == 2 || (LAB_FWD_LAZY_SMALL == 1 && ctas_128 <= num_sms(dev));
  if (head_dim == 64) return small ? Tile::k64Small : Tile::k64;
  return small ? Tile::k128Small : Tile::k128;
}


}  // namespace

// Scale and checks (common/mma_fwd_tiles.cuh), then the tile: the sweep's, or pick_tile's.
extern "C" int attn_fwd_v04(const AttnFwdParams* p, void* stream) {
  return lab::fwd_entry(p, stream, [](const AttnFwdParams& kp, cudaStream_t st, bool bf16) -> int {
    const int dev = current_device();
#ifdef LAB_FWD_LAZY_TILE
    if (kp.head_dim != LAB_FWD_LAZY_TILE::kHeadDim) return LAB_E_HEAD_DIM;
    return bf16 ? launch<LAB_FWD_LAZY_TILE, __nv_bfloat16>(kp, st, dev) : launch<LAB_FWD_LAZY_TILE, __half>(kp, st, dev);
#else
    switch (pick_tile(kp.head_dim, (int64_t)((kp.seqlen_q + 127) / 128) * kp.batch * kp.heads_q, dev)) {
      case Tile::k64Small:
        return bf16 ? launch<Cfg64s, __nv_bfloat16>(kp, st, dev) : launch<Cfg64s, __half>(kp, st, dev);
      case Tile::k64:
        return bf16 ? launch<Cfg64, __nv_bfloat16>(kp, st, dev) : launch<Cfg64, __half>(kp, st, dev);
      case Tile::k128Small:
        return bf16 ? launch<Cfg128s, __nv_bfloat16>(kp, st, dev) : launch<Cfg128s, __half>(kp, st, dev);
      default:
        return bf16 ? launch<Cfg128, __nv_bfloat16>(kp, st, dev) : launch<Cfg128, __half>(kp, st, dev);
    }
#endif
  });
}
