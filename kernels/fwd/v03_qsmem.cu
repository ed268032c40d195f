// Changes: vs v02: Q re-read from smem each k-step (4 warps x 32 rows at both D), head-major causal order.
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a -DFWD_FN=attn_fwd_v03 tools/gpu/fwd_mma_main.cu kernels/fwd/v03_qsmem.cu -o /tmp/v03 && /tmp/v03
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-fwd-v03-qsmem.json.
//
// v03_qsmem: v02 with Q re-read from shared memory, which buys FA2's tile
// shapes, plus a head-major causal CTA order and two optional loop variants.
// Measured on an H100 against v02 and PyTorch SDPA's flash backend
// (2026-11-21; outputs/experiments/20261121-fwd-v03-qsmem.json).
//
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
// 5. kLaunder (LAB_FWD_QSMEM_LAUNDER, on): the K/V base pointers pass through an
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
//       x 32 rows), B_c = 64, 2 stages, 96 KiB, 255 regs + 68 B spills
//       (the ptxas of nvcc 13.0 reports 100 B at sm_90a, 104 B at sm_80),
//       2 CTAs / SM; Q re-read from smem in both.
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
// pipeline. Measured effect: outputs/experiments/20261121-fwd-v03-qsmem.json.

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

// 5. (see kLaunder) on by default; -DLAB_FWD_QSMEM_LAUNDER=0 turns it off.
#ifndef LAB_FWD_QSMEM_LAUNDER
#define LAB_FWD_QSMEM_LAUNDER 1
#endif

// v02's tile arithmetic (common/mma_fwd_tiles.cuh) plus the switches v03 adds.
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, int kStages_, int kMinBlocks_,
          bool kQInSmem_, bool kPingPong_, bool kPackEarly_>
struct FwdConfig : lab::MmaFwdTiles<kHeadDim_, kWarps_, kMTiles_, kBlockN_, kStages_, kMinBlocks_> {
  static constexpr bool kQInSmem = kQInSmem_;    // Q fragments re-read from smem every k-step
  static constexpr bool kPingPong = kPingPong_;  // S_{j+1} issued before the softmax of S_j
  static constexpr bool kPackEarly = kPackEarly_;  // all of P packed to 16 bits before P V
  static constexpr bool kLaunder = LAB_FWD_QSMEM_LAUNDER != 0;  // K/V source pointers recomputed per tile
};

// Tile configs: <D, warps, m16 tiles per warp, B_c, stages, min CTAs per SM,
// Q in smem, ping-pong, pack P early>. Override any field at build time to
// sweep (nvcc splits -D values at commas, hence one macro per field), e.g.
//   -DLAB_FWD_QSMEM_D128_WARPS=8 -DLAB_FWD_QSMEM_D128_MTILES=1 -DLAB_FWD_QSMEM_D128_QSMEM=0
// Fields: WARPS MTILES BC STAGES MINB QSMEM PP PACK, for D64 and D128.
// Defaults chosen by the H100 sweep of 2026-11-21 (outputs/experiments/20261121-fwd-v03-qsmem.json):
//
// D = 64: 4 warps x 32 rows, B_c = 64, 4 stages (80 KiB), Q re-read from
// smem: 251 regs, no spills, 2 CTAs (8 warps) per SM. Against v02's
// B_c = 32 with Q in registers: +8-11 % non-causal, +6-11 % causal, and at
// or above SDPA-flash in every D = 64 cell.
#ifndef LAB_FWD_QSMEM_D64_WARPS
#define LAB_FWD_QSMEM_D64_WARPS 4
#endif
#ifndef LAB_FWD_QSMEM_D64_MTILES
#define LAB_FWD_QSMEM_D64_MTILES 2
#endif
#ifndef LAB_FWD_QSMEM_D64_BC
#define LAB_FWD_QSMEM_D64_BC 64
#endif
#ifndef LAB_FWD_QSMEM_D64_STAGES
#define LAB_FWD_QSMEM_D64_STAGES 4
#endif
#ifndef LAB_FWD_QSMEM_D64_MINB
#define LAB_FWD_QSMEM_D64_MINB 2
#endif
#ifndef LAB_FWD_QSMEM_D64_QSMEM
#define LAB_FWD_QSMEM_D64_QSMEM 1
#endif
// D = 128: FA2's own tile, 4 warps x 32 rows, B_c = 64, 2 stages (96 KiB),
// Q re-read from smem, 2 CTAs per SM: 255 regs with 68 B of spills (168 B
// without kLaunder). Against v02 (8 warps x 16 rows, Q in registers): +1-5 %
// non-causal, causal within noise; still 7-12 % under SDPA-flash
// non-causal (outputs/experiments/20261121-fwd-v03-qsmem.json). B_c = 48 (60-80 B spills) and B_c = 32
// (no spills, 3-4 stages) measured 2-7 % slower.
#ifndef LAB_FWD_QSMEM_D128_WARPS
#define LAB_FWD_QSMEM_D128_WARPS 4
#endif
#ifndef LAB_FWD_QSMEM_D128_MTILES
#define LAB_FWD_QSMEM_D128_MTILES 2
#endif
#ifndef LAB_FWD_QSMEM_D128_BC
#define LAB_FWD_QSMEM_D128_BC 64
#endif
#ifndef LAB_FWD_QSMEM_D128_STAGES
#define LAB_FWD_QSMEM_D128_STAGES 2
#endif
#ifndef LAB_FWD_QSMEM_D128_MINB
#define LAB_FWD_QSMEM_D128_MINB 2
#endif
#ifndef LAB_FWD_QSMEM_D128_QSMEM
#define LAB_FWD_QSMEM_D128_QSMEM 1
#endif
// Ping-pong and early packing: options, off (measured no gain, outputs/experiments/20261121-fwd-v03-qsmem.json).
#ifndef LAB_FWD_QSMEM_D64_PACK
#define LAB_FWD_QSMEM_D64_PACK 0
#endif
#ifndef LAB_FWD_QSMEM_D128_PACK
#define LAB_FWD_QSMEM_D128_PACK 0
#endif
#ifndef LAB_FWD_QSMEM_D64_PP
#define LAB_FWD_QSMEM_D64_PP 0
#endif
#ifndef LAB_FWD_QSMEM_D128_PP
#define LAB_FWD_QSMEM_D128_PP 0
#endif
using Cfg64 = FwdConfig<64, LAB_FWD_QSMEM_D64_WARPS, LAB_FWD_QSMEM_D64_MTILES, LAB_FWD_QSMEM_D64_BC,
                        LAB_FWD_QSMEM_D64_STAGES, LAB_FWD_QSMEM_D64_MINB, LAB_FWD_QSMEM_D64_QSMEM != 0,
                        LAB_FWD_QSMEM_D64_PP != 0, LAB_FWD_QSMEM_D64_PACK != 0>;
using Cfg128 = FwdConfig<128, LAB_FWD_QSMEM_D128_WARPS, LAB_FWD_QSMEM_D128_MTILES, LAB_FWD_QSMEM_D128_BC,
                         LAB_FWD_QSMEM_D128_STAGES, LAB_FWD_QSMEM_D128_MINB, LAB_FWD_QSMEM_D128_QSMEM != 0,
                         LAB_FWD_QSMEM_D128_PP != 0, LAB_FWD_QSMEM_D128_PACK != 0>;

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    attn_fwd_v03_kernel(const AttnFwdParams p) {
  constexpr int D = Cfg::kHeadDim;
  constexpr int Bc = Cfg::kBlockN;
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  const lab::MmaThread th = lab::mma_thread();  // common/mma_fwd_tiles.cuh
  const int tid = th.tid, warp = th.warp, lane = th.lane, g = th.g, t = th.t;

  // ---- which (b, h, query block) this CTA owns; causal: one head's blocks together (L2 reuse of its K/V), heaviest first
  const lab::FwdBlock blk = lab::fwd_block<Cfg::kBlockM, true>(p);
  const int b = blk.b, h = blk.h, m0 = blk.m0;
  const lab::FwdHeads<T> heads = lab::fwd_heads<T>(p, blk);
  const T *q = heads.q, *k = heads.k, *v = heads.v;
  T* o = heads.o;
  const int n_tiles = lab::fwd_kv_tiles<Cfg::kBlockM, Bc>(p, m0);

  const uint32_t sQ = lab::smem_u32(smem);
  const lab::KVStages<Cfg> kvs{sQ + Cfg::kSmemQ};  // K and V of each pipeline stage

  // ================================================================ Prologue
  lab::load_q_first_kv<Cfg, Bc, kStages - 1>(sQ, kvs.base, smem, q, k, v, p, m0, n_tiles, tid);  // common/smem_tile.cuh

  // Q fragments (A operand), one x4 per m16 x k16 block. Lane l addresses
  // row l % 16 and chunk 2*kk + l / 16 of the block.
  const int warp_row0 = warp * Cfg::kRowsPerWarp;
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

  // ================================================================ One tile
  // The three steps of one K_j/V_j tile, used by both main loops below.
  using SAcc = float[kMT][Cfg::kNTilesS][4];

  // acc = Q_i K^T for the K tile at k_tile (fp32; common/smem_tile.cuh).
  auto qk_tile = [&](SAcc& acc_s, uint32_t k_tile) {
    auto reload_q = [&](int kk) {  // kQInSmem: k-step kk's fragments
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) load_q(mt, kk, qf[mt][0]);
    };
    auto load_k = [&](uint32_t (&bk)[4], int np, int kk) { lab::load_k_frag<D>(bk, k_tile, np, kk, kvl); };
    lab::qk_tile<T, Cfg::kKStepsQK>(acc_s, qf, reload_q, load_k);
  };

  // Mask of tile j: only the tile that crosses S_k and the causal diagonal tiles.
  auto mask_tile = [&](SAcc& acc_s, int j) {
    const int n0 = j * Bc;
    if (lab::tile_needs_mask(n0, Bc, m0, p.seqlen_k, p.causal))
      lab::mask_scores(acc_s, m0 + warp_row0, n0, p.seqlen_k, p.causal, g, t);
  };

  // Online softmax of a masked S tile (in place, S becomes P), O rescale,
  // then O += P V for the V tile at v_tile.
  auto softmax_pv = [&](SAcc& acc_s, uint32_t v_tile) {
    lab::online_softmax(acc_s, row_max, row_sum, acc_o, scale_log2);
    // O_i += P_ij V_j (common/smem_tile.cuh; kPackEarly: all of P packed first, less spilling at 32 rows per warp).
    auto load_v = [&](uint32_t (&bv)[4], int np, int kk) { lab::load_v_frag<D>(bv, v_tile, np, kk, kvl); };
    lab::pv_tile<T, Cfg::kPackEarly>(acc_o, acc_s, load_v);
  };

  // Refill at iteration j: the buffer tile j-1 used gets tile j + kStages - 1.
  auto refill = [&](int j) {
    const int jn = j + kStages - 1;
    if (jn < n_tiles) {
      const int st = jn % kStages;
      // kLaunder: opaque copies (2 x kPerThread x 2 registers held across the loop otherwise).
      const T* kb = Cfg::kLaunder ? lab::launder(k) : k;
      const T* vb = Cfg::kLaunder ? lab::launder(v) : v;
      lab::load_tile<Cfg, Bc>(kvs.k(st), kb, p.k_stride[2], jn * Bc, p.seqlen_k, tid);
      lab::load_tile<Cfg, Bc>(kvs.v(st), vb, p.v_stride[2], jn * Bc, p.seqlen_k, tid);
    }
    lab::cp_async_commit();  // always: keeps the group count uniform
  };

  // ================================================================ Main loop
  if constexpr (!Cfg::kPingPong) {
    // v02's loop: S_j = Q K_j^T, mask, softmax, O += P_j V_j, in that order.
    for (int j = 0; j < n_tiles; ++j) {
      lab::cp_async_wait<kStages - 2>();  // this thread's copies of tile j are done
      __syncthreads();  // everyone's are; and everyone has finished tile j-1's buffer
      refill(j);
      float acc_s[kMT][Cfg::kNTilesS][4];
      qk_tile(acc_s, kvs.k(j % kStages));
      mask_tile(acc_s, j);
      softmax_pv(acc_s, kvs.v(j % kStages));
    }
  } else {
    // Ping-pong: S_{j+1} = Q K_{j+1}^T before the softmax of S_j (lab::pingpong_loop, common/smem_tile.cuh).
    lab::pingpong_loop<SAcc, kStages>(n_tiles, kvs, qk_tile, mask_tile, softmax_pv, refill);
  }

  // ================================================================ Epilogue
  // Drain the cp.async groups, O / l and LSE, O out through this warp's own rows of sQ after every lane's last
  // ldmatrix of them (kQInSmem; common/smem_tile.cuh).
  lab::fwd_epilogue<Cfg, true>(acc_o, row_max, row_sum, sQ, o, p, b, h, m0, warp_row0, lane, g, t);
}

template <class Cfg, class T>
struct Kernel {
  static constexpr auto kernel = attn_fwd_v03_kernel<Cfg, T>;
};

}  // namespace

// Scale, checks, then Cfg64 or Cfg128 by head dim (common/mma_fwd_tiles.cuh).
extern "C" int attn_fwd_v03(const AttnFwdParams* p, void* stream) {
  return lab::fwd_entry_by_head_dim<Cfg64, Cfg128, Kernel>(p, stream);
}
