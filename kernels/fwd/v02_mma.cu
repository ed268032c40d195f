// Changes: vs v01: tensor cores (mma.sync, ldmatrix), cp.async pipeline, FA2 loop order, P in registers.
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a tools/gpu/fwd_mma_main.cu kernels/fwd/v02_mma.cu -o /tmp/v02 && /tmp/v02
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-fwd-v02-mma.json.
//
// v02_mma: FlashAttention-2 forward on tensor cores (mma.sync m16n8k16).
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
//     D = 64 : B_r = 128 (4 warps x 32 rows), B_c = 64, 3 stages,  64 KiB,
//              255 regs + 48 B spills (sm_90a), 2 CTAs / SM; since the shared
//              epilogue (common/softmax.cuh, smem_tile.cuh) nvcc 13.0 reports
//              0 B at sm_90a and 8 B at sm_80 (52 B and 24 B before)
//     D = 128: B_r = 128 (8 warps x 16 rows), B_c = 64, 3 stages, 128 KiB,
//              241 regs (sm_90a), 1 CTA / SM
//   Non-causal: the query block index runs fastest, so the CTAs resident at
//   one time share one head's K/V in L2. Causal: the block index runs slowest
//   and in reverse (heaviest query blocks, with the most KV tiles, first), so
//   the short blocks fill the tail of the last wave.
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
// pipeline. Measured (H100, 2026-11-21, bf16 bench grid): 245-330 TFLOP/s
// non-causal, 165-315 causal, 20-27x v01; per cell vs SDPA-flash in
// outputs/experiments/20261121-fwd-v02-mma.json.

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

// The tile arithmetic and its checks: common/mma_fwd_tiles.cuh.
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, int kStages_, int kMinBlocks_>
using FwdConfig = lab::MmaFwdTiles<kHeadDim_, kWarps_, kMTiles_, kBlockN_, kStages_, kMinBlocks_>;

// Tile configs: <D, warps, m16 tiles per warp, B_c, stages, min CTAs per SM>.
// Override any field at build time to sweep (nvcc splits -D values at
// commas, hence one macro per field), e.g.
//   -DLAB_FWD_MMA_D64_WARPS=8 -DLAB_FWD_MMA_D64_MTILES=1 -DLAB_FWD_MMA_D64_BC=64
//
// D = 64: 32 rows per warp (two m16 tiles), so each K/V fragment read from
// shared memory feeds two mma: 128 B of ldmatrix traffic per mma instead of
// 256, below the ~1 mma/clk/SM tensor rate. B_c = 64, 3 stages (64 KiB),
// 2 CTAs (8 warps) per SM. B_c = 64 costs 48 B of spills at the 255-register
// cap (ptxas hoists the V fragments above the softmax); B_c = 32 (4 stages)
// fits in 229 registers without spills but measured 5-9 % slower non-causal
// on an H100 (2026-11-21, outputs/experiments/20261121-fwd-v02-mma.json), the per-tile barrier, max/sum
// shuffles and rescale being paid every 32 keys instead of 64.
#ifndef LAB_FWD_MMA_D64_WARPS
#define LAB_FWD_MMA_D64_WARPS 4
#endif
#ifndef LAB_FWD_MMA_D64_MTILES
#define LAB_FWD_MMA_D64_MTILES 2
#endif
#ifndef LAB_FWD_MMA_D64_BC
#define LAB_FWD_MMA_D64_BC 64
#endif
#ifndef LAB_FWD_MMA_D64_STAGES
#define LAB_FWD_MMA_D64_STAGES 3
#endif
#ifndef LAB_FWD_MMA_D64_MINB
#define LAB_FWD_MMA_D64_MINB 2
#endif
// D = 128: 16 rows per warp keeps O (64 regs), Q (32) and S (32) in registers
// without spills (241 regs, 1 CTA of 8 warps per SM); 8 warps share each
// 16 KiB K/V tile. 32 rows per warp would need 128 regs for O alone and
// spills with Q in registers.
#ifndef LAB_FWD_MMA_D128_WARPS
#define LAB_FWD_MMA_D128_WARPS 8
#endif
#ifndef LAB_FWD_MMA_D128_MTILES
#define LAB_FWD_MMA_D128_MTILES 1
#endif
#ifndef LAB_FWD_MMA_D128_BC
#define LAB_FWD_MMA_D128_BC 64
#endif
#ifndef LAB_FWD_MMA_D128_STAGES
#define LAB_FWD_MMA_D128_STAGES 3
#endif
#ifndef LAB_FWD_MMA_D128_MINB
#define LAB_FWD_MMA_D128_MINB 1
#endif
using Cfg64 = FwdConfig<64, LAB_FWD_MMA_D64_WARPS, LAB_FWD_MMA_D64_MTILES, LAB_FWD_MMA_D64_BC,
                        LAB_FWD_MMA_D64_STAGES, LAB_FWD_MMA_D64_MINB>;
using Cfg128 = FwdConfig<128, LAB_FWD_MMA_D128_WARPS, LAB_FWD_MMA_D128_MTILES, LAB_FWD_MMA_D128_BC,
                         LAB_FWD_MMA_D128_STAGES, LAB_FWD_MMA_D128_MINB>;

template <class Cfg, class T>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    attn_fwd_v02_kernel(const AttnFwdParams p) {
  constexpr int D = Cfg::kHeadDim;
  constexpr int Br = Cfg::kBlockM;
  constexpr int Bc = Cfg::kBlockN;
  constexpr int kMT = Cfg::kMTiles;
  constexpr int kStages = Cfg::kStages;

  extern __shared__ __align__(128) uint8_t smem[];
  // tid, warp, lane; g: the lane's row within an 8-row half of a fragment (mma group), t: its column pair
  const lab::MmaThread th = lab::mma_thread();  // common/mma_fwd_tiles.cuh
  const int tid = th.tid, warp = th.warp, lane = th.lane, g = th.g, t = th.t;

  // ---- which (b, h, query block) this CTA owns; causal: heaviest first over all heads
  const lab::FwdBlock blk = lab::fwd_block<Br, false>(p);
  const int b = blk.b, h = blk.h, m0 = blk.m0;

  const lab::FwdHeads<T> heads = lab::fwd_heads<T>(p, blk);
  const T *q = heads.q, *k = heads.k, *v = heads.v;
  T* o = heads.o;
  const int n_tiles = lab::fwd_kv_tiles<Br, Bc>(p, m0);

  const uint32_t sQ = lab::smem_u32(smem);
  const lab::KVStages<Cfg> kvs{sQ + Cfg::kSmemQ};  // the K and V tiles of each pipeline stage

  // ================================================================ Prologue
  lab::load_q_first_kv<Cfg, Bc, kStages - 1>(sQ, kvs.base, smem, q, k, v, p, m0, n_tiles, tid);  // common/smem_tile.cuh

  // Q fragments (A operand), one x4 per m16 x k16 block. Lane l addresses
  // row l % 16 and chunk 2*kk + l / 16 of the block.
  const int warp_row0 = warp * Cfg::kRowsPerWarp;
  uint32_t qf[kMT][Cfg::kKStepsQK][4];
  lab::load_q_frags<D>(qf, sQ, warp_row0, lane);  // common/smem_tile.cuh

  // Per-thread rows: (mt, half) -> row warp_row0 + mt*16 + half*8 + g.
  float acc_o[kMT][Cfg::kNTilesO][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];  // partial: this thread's columns only, reduced at the end
  lab::init_softmax_state(acc_o, row_max, row_sum);

  const float scale_log2 = fabsf(p.scale) * kLog2e;  // > 0: the launcher made 0 FLT_MIN, the sign is in Q

  const lab::KVLanes kvl = lab::kv_lanes(lane);  // lane parts of the K/V ldmatrix addresses

  // ================================================================ Main loop
  for (int j = 0; j < n_tiles; ++j) {
    lab::cp_async_wait<kStages - 2>();  // this thread's copies of tile j are done
    __syncthreads();  // everyone's are; and everyone has finished tile j-1's buffer

    // Refill the buffer tile j-1 used with tile j + kStages - 1.
    {
      const int jn = j + kStages - 1;
      if (jn < n_tiles) {
        const int st = jn % kStages;
        lab::load_tile<Cfg, Bc>(kvs.k(st), k, p.k_stride[2], jn * Bc, p.seqlen_k, tid);
        lab::load_tile<Cfg, Bc>(kvs.v(st), v, p.v_stride[2], jn * Bc, p.seqlen_k, tid);
      }
      lab::cp_async_commit();
    }

    const int st = j % kStages;
    const uint32_t k_tile = kvs.k(st);
    const uint32_t v_tile = kvs.v(st);

    // ---- S_ij = Q_i K_j^T (fp32; common/smem_tile.cuh), Q from the fragments loaded above
    float acc_s[kMT][Cfg::kNTilesS][4];
    auto load_k = [&](uint32_t (&bk)[4], int np, int kk) { lab::load_k_frag<D>(bk, k_tile, np, kk, kvl); };
    lab::qk_tile<T, Cfg::kKStepsQK>(acc_s, qf, [](int) {}, load_k);

    // ---- mask: only the tile that crosses S_k and the causal diagonal tiles
    const int n0 = j * Bc;
    if (lab::tile_needs_mask(n0, Bc, m0, p.seqlen_k, p.causal))
      lab::mask_scores(acc_s, m0 + warp_row0, n0, p.seqlen_k, p.causal, g, t);

    // ---- online softmax, in registers (common/softmax.cuh)
    lab::online_softmax(acc_s, row_max, row_sum, acc_o, scale_log2);

    // ---- O_i += P_ij V_j. The S accumulators of n tiles 2kk, 2kk+1 are
    // exactly the A fragment of k-step kk once packed to 16 bits. The k-steps written out, not lab::pv_tile:
    // through it (P of all k-steps in one array, or one k-step's) ptxas allocates v02's registers differently
    // (sass_guard, 2026-11-23: sm_80 +48 instructions, more spill code; sm_90a registers renamed).
#pragma unroll
    for (int kk = 0; kk < Cfg::kKStepsPV; ++kk) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) lab::pack_p<T>(acc_s, mt, kk, pa[mt]);
      // d 16np.. of the V tile (common/smem_tile.cuh)
      lab::mma_kstep<T>(acc_o, [&](int mt) -> const uint32_t(&)[4] { return pa[mt]; },
                        [&](uint32_t (&bv)[4], int np) { lab::load_v_frag<D>(bv, v_tile, np, kk, kvl); });
    }
  }

  // ================================================================ Epilogue
  // Drain the cp.async groups, O / l and LSE, O out through this warp's own rows of sQ (common/smem_tile.cuh).
  lab::fwd_epilogue<Cfg, false>(acc_o, row_max, row_sum, sQ, o, p, b, h, m0, warp_row0, lane, g, t);
}

template <class Cfg, class T>
struct Kernel {
  static constexpr auto kernel = attn_fwd_v02_kernel<Cfg, T>;
};

}  // namespace

// Scale, checks, then Cfg64 or Cfg128 by head dim (common/mma_fwd_tiles.cuh).
extern "C" int attn_fwd_v02(const AttnFwdParams* p, void* stream) {
  return lab::fwd_entry_by_head_dim<Cfg64, Cfg128, Kernel>(p, stream);
}
