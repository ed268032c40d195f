// v10_wide: the Hopper forward for head dims 192 and 256 (sm_90a): v06's warp-specialised kernel with
// tiles sized for wide heads. lab.ops.attention pads every D_qk, D_v from 129 to 256 up to one of these.
//
// What is new against v06 (producer warpgroup + 2 consumer warpgroups of 64 rows, serial S / softmax / P V
// per warpgroup, the two warpgroups taking turns on the tensor core):
// - Tile sizes for D = 192 and 256. Per consumer thread the O accumulator is D/2 fp32 registers (96 / 128),
//   the scores B_c/2 and the P fragments B_c/4, inside the 240 registers two consumers get (setmaxnreg
//   24 / 240). Shared memory: Q (B_r = 128 rows) + 2 stages of K and V, within 227 KiB:
//     D = 256: B_c = 80, 2 stages: Q 64 KiB + 2 x (40 + 40) KiB = 224 KiB; O 128 + S 40 + P 20 registers.
//     D = 192: B_c = 112, 2 stages: Q 48 KiB + 2 x (42 + 42) KiB = 216 KiB; O 96 + S 56 + P 28 registers.
//   Rejected on paper: B_c = 96 at D = 256 (2 stages: 64 + 4 x 48 = 256 KiB, over the limit); B_c = 128 at
//   D = 192 (240 KiB); 3 stages at either D (a third of B_c, 2x the per-key barrier and shuffle cost);
//   B_r = 192 (3 consumers at 160 registers cannot hold a 128-register O). B_c = 64 at D = 256 (192 KiB) and
//   96 at D = 192 are the knobs' alternatives (LAB_FWD_WIDE_D{192,256}_BC). m64n80k16 and m64n112k16 are
//   generated beside the other widths (tools/codegen/hopper_gen_wgmma.py).
// - v07's FOLD (scale > 0: the max on raw scores, exp2(s c - m) by one FFMA) and CHAINS = 2 (two row max /
//   row sum chains) in the serial tile (common/hopper/attn_fwd_sm90.cuh's serial_tile).
// - Its own entry: head dims 192 and 256 (common/launch.h's check_fwd_call for the rest of the checks).
// - K and V released apart (v07's split `empty` barriers), and OVERLAP (on; LAB_FWD_WIDE_OVERLAP=0 gives v06's serial
//   tile): v07's intra-warpgroup overlap, S_j issued with P_{j-1} V_{j-1} and the softmax of S_j under that P V
//   (+B_c/4 live registers for the previous P: 128 + 40 + 20 at D = 256; no spills either way).
// Not taken from v07: the ping-pong token, the persistent and L2-ordered grids.
//
// Prediction (H100 bf16, public op, B·S = 16k, H·D = 2048-4096): the wider head doubles the GEMM work per
// score against D = 128 while the softmax's work per score stays, so the serial schedule loses less than v06
// did at D = 128 (469-519 TFLOP/s there on the H200): ~450-520 TFLOP/s non-causal at S >= 2048, causal
// ~80 % of that; against SDPA-flash (FA2 code on Hopper) 1.3-1.6x; against SDPA-cuDNN (where it takes D = 256)
// 0.8-1.0x.
// Outcome (H100 run 1, outputs/driver_logs/20261126-h100-head-dims-wide/run1-27a2774/, bf16, kernel-only rows
// timed in rounds beside SDPA; TFLOP/s at S = 512 / 2048 / 8192, non-causal | causal):
//   serial (OVERLAP = 0):  D = 192 415 / 558 / 631 | 256 / 474 / 579;  D = 256 440 / 591 / 637 | 295 / 491 / 582
//     0.89-1.10x SDPA-cuDNN, 1.46-2.21x SDPA-flash: above the prediction (450-520 at S >= 2048 and 0.8-1.0x cuDNN).
//   OVERLAP:               D = 192 427 / 616 / 720 | 260 / 510 / 660;  D = 256 451 / 659 / 723 | 299 / 533 / 663
//     +3 to +14 % over serial (most at S = 8192: the softmax hides under the P V), 0.91-1.13x SDPA-cuDNN (below 1.0
//     at D = 256 S = 512 non-causal, 0.908, and D = 192 S = 2048 causal, 0.979), 1.48-2.50x SDPA-flash; Gemma-2's
//     GQA 16/8 at S = 4096 causal 625 TFLOP/s, 1.10x cuDNN. On since then.
// H100 run 2 (run2-f5f4f93/, OVERLAP the default): the same kernel 430 / 629 / 706 | 264 / 520 / 662 (D = 192) and
//   461 / 643 / 732 | 303 / 529 / 652 (D = 256), within 2.5 % of run 1's; SDPA-cuDNN moved more between the runs
//   (its S = 512 cells 4-22 % faster, D = 192 S = 2048 11 %), so the public op is 0.88-1.08x cuDNN (geomean
//   0.98; >= 1.0 at S = 8192 and at D = 256 S = 2048), 1.35-2.50x SDPA-flash. The cells behind cuDNN are the short ones (S = 512: 4-7 key tiles per
//   CTA, one CTA per SM, nothing hides the Q load, the fill and the epilogue) and causal 2048: v07's persistent
//   grid and ping-pong are the next steps there.
//   The rejected tiles, measured (same process): B_c = 64 at D = 256 +2 / +3 % at S = 512 (8 full tiles instead of
//   6 and a 40 %-full one), -6 to -9 % from S = 2048; B_c = 96 at D = 192 -1 to -3 % except S = 512 causal (+3 %).
//   A per-call B_c for short keys would gain about as much as the runs differ: not taken.
//   Again on the persistent grid (lab.fwd.narrow_gpu.candidate; prediction +1-4 % at D = 256 S = 512, -5 to -9 % at
//   2048): B_c = 64 +1.5 / +2.0 % at S = 512 (0.989 -> 1.00x SDPA-cuDNN non-causal), -4.1 / -2.9 % at 2048, D = 200
//   level; 20/20 checks (H100, outputs/driver_logs/20261126-h100-wide-short-bc-18ca9d7/). Still within what two runs
//   of one S = 512 cell differ (0.957 and 0.989x cuDNN): no per-call B_c.
//   Padding: D = 200 (padded to 256 by lab.fwd.head_dims) takes 1.47 ms where the D = 256 kernel takes 0.85 ms on
//   the same shape: the copies of F.pad and the output slice, not the kernel. Now narrow head dims (136-184 at
//   width 192, 200-248 at 256, D_qk = D_v, no gradient wanted) run unpadded: Narrow<Cfg> (common attn_fwd_sm90.cuh),
//   maps over the true D whose out-of-bounds fill gives the zero columns, O stored to its own D. Prediction
//   (before a GPU run): D = 200 at the D = 256 kernel's time on that shape (0.87 ms in n14 session
//   20261126-093330-h100-80gb-hbm3-b1ce206), 0.95-1.0x SDPA-cuDNN where the padded call was 0.57x. Outcome
//   (H100, outputs/driver_logs/20261126-h100-narrow-wide-755343a/): 0.917x at S = 2048, 0.89-0.96x over six D = 200
//   cells, 1.05-3.80x the padded call's speed; slower than the prediction: at S = 8192 3.39 ms where the D = 256
//   kernel took 3.01 ms in that n14 session (D = 160 at width 192 shows no such gap). outputs/experiments/
//   20261126-head-dims-d200-aligned.json has the candidates.
// - Causal, each consumer's own tile count (LAB_FWD_WIDE_WG_TILES, on; consumer_tiles below): a 128-row CTA on the
//   diagonal loads the key tiles its lower 64 rows see, and the upper consumer stopped only there, running S and
//   P V on a last tile its rows mask whole. It now stops at its own last tile: the same sums bit for bit, less
//   tensor work. Prediction: it removes 14 % (D = 192) / 11 % (D = 256) of the consumer tiles at S = 512 causal,
//   3 % at 2048, under 1 % at 8192 (lab.fwd.work_order.consumer_tile_saving); with the Q load, fill and epilogue
//   unchanged, +6-10 % / +5-8 % at S = 512 causal, +1-2.5 % at 2048, within noise at 8192 and non-causal.
//   Measure: lab.fwd.narrow_gpu.candidate (LAB_FWD_WIDE_WG_TILES=0 against the default, kernel-level in rounds).
//   Outcome (H100, outputs/driver_logs/20261126-h100-wide-tiles-258abfc/): equal to the old count bit for bit (42
//   outputs), +5.1 % / +3.3 % at S = 512 causal (D 192 / 256), +2.4 / +2.1 % at 2048 causal, within 1 % elsewhere.
//   Below the prediction at S = 512: the lower consumer still runs the last tile, now alone, with no second
//   warpgroup's GEMM to hide its softmax under. There the kernel is 0.87 / 0.93x SDPA-cuDNN, the old count 0.83 /
//   0.90, in the same process.
// - A candidate, off (LAB_FWD_WIDE_EPILOGUE_DIRECT=1): O stored from the accumulators with 8-byte stores (v07's
//   epilogue_direct) in place of the staging through the consumer's Q tile (two named barriers, a shared-memory
//   round trip, 16-byte stores). At S = 512 a CTA runs 5-7 key tiles, so its fixed cost shows: prediction +0-3 %
//   there, level from S = 2048. Outcome (H100, same folder): +1.2-2.0 % at S = 512, +0.2-0.7 % at 2048, 42/42
//   checks, memcheck / racecheck / synccheck clean; to be the default with the next n14 session.
// - The default (LAB_FWD_WIDE_PERSIST=1; 0 builds the per-tile grid): one CTA per SM walking work tiles in snake order (snake_tile), the ring's
//   stages counted across them, the next work tile's Q loaded as soon as both consumers' last S GEMM has read the
//   buffer (`empty_q`), under the last P V and the epilogue (from registers, so Q's buffer stays free); a consumer
//   that skipped a causal tail tile releases it once it has landed, since the next work tile's loads reuse the
//   stage. What it targets: at S = 512 a CTA runs 5-7 key tiles in about 18 us (16 waves), and the Q load, the
//   pipeline fill and the epilogue (a few us) run with nothing beside them; the cells behind cuDNN are those.
//   Prediction: +5-10 % at S = 512 (with the direct epilogue's +1-2 %), +1-3 % at 2048, level at 8192; causal
//   cells gain less (a static order where the hardware balanced CTAs before). Measure: lab.fwd.narrow_gpu.candidate.
//   Outcome (H100, outputs/driver_logs/20261126-h100-wide-persist-f556db2/): 48/48 checks (CTAs walking 2-5 work
//   tiles among them), equal bit for bit to the direct-epilogue build, memcheck / racecheck / synccheck clean;
//   +4.5-11.9 % at S = 512 and +2.9-7.6 % at 2048, causal as much as not (the snake balances the diagonal better
//   than the hardware's dispatch did): kernel-level 0.95-1.06x SDPA-cuDNN where the default is 0.89-1.03x. The
//   default since (chapter n14 measures it as users call it).
//
// Limits: sm_90 only (cudaErrorNoKernelImageForDevice elsewhere; the body compiles empty for sm_80); D 192
// and 256; fp16 and bf16; any S_q, S_k >= 0; GQA; 16-byte-aligned bases, strides multiples of 8 elements.
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v10_wide.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"

#ifndef LAB_FWD_WIDE_D192_BC
#define LAB_FWD_WIDE_D192_BC 112
#endif
#ifndef LAB_FWD_WIDE_D256_BC
#define LAB_FWD_WIDE_D256_BC 80
#endif
#ifndef LAB_FWD_WIDE_STAGES
#define LAB_FWD_WIDE_STAGES 2
#endif
#ifndef LAB_FWD_WIDE_FOLD
#define LAB_FWD_WIDE_FOLD 1
#endif
#ifndef LAB_FWD_WIDE_CHAINS
#define LAB_FWD_WIDE_CHAINS 2
#endif
#ifndef LAB_FWD_WIDE_OVERLAP
#define LAB_FWD_WIDE_OVERLAP 1  // v07's intra-warpgroup overlap (S_j with P_{j-1} V_{j-1}, softmax under the P V); 0: serial
#endif
#ifndef LAB_FWD_WIDE_EPILOGUE_DIRECT
#define LAB_FWD_WIDE_EPILOGUE_DIRECT 0  // 1: O stored from registers (common epilogue_direct), no shared-memory staging
#endif
#ifndef LAB_FWD_WIDE_PERSIST
#define LAB_FWD_WIDE_PERSIST 1  // 1: one CTA per SM looping over work tiles, the next Q loaded under the last P V; 0: a CTA per tile
#endif
#ifndef LAB_FWD_WIDE_WG_TILES
#define LAB_FWD_WIDE_WG_TILES 1  // causal: each consumer stops at the last key tile its own 64 rows see; 0: the CTA's count
#endif

namespace {
using namespace lab::sm90;

template <int D_, int BC_, int STAGES_>
struct Cfg10 {
  static constexpr int D = D_;
  static constexpr bool kNarrow = false;  // Narrow<Cfg10>: a head dim below D (common attn_fwd_sm90.cuh)
  static constexpr int kConsumers = 2;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = 24;
  static constexpr int kRegsConsumer = 240;
  static constexpr int kQBytesWG = 64 * D * 2;  // one consumer's Q rows
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
  static_assert((BC * 128) % 1024 == 0, "each 64-column block of a K/V tile starts 1024-byte aligned");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
  // consumer_tiles: the upper consumer skips at most ceil(64 / B_c) tail tiles, which it never releases; that is
  // safe only while no later load waits on their stage (one skipped tile, kStages >= 1).
  static_assert(BC >= 64, "a causal consumer skips at most one tail tile");
};

// Causal: consumer warpgroup rows wm0 .. wm0 + 63 see keys below wm0 + 64 only, so the upper one (wm0 = m0) stops a
// tile before the CTA's last whenever that tile starts at or past wm0 + 64 (every 128-row CTA on the diagonal at
// B_c = 80 / 112): S and P V of a tile whose scores its rows would all mask to zero probability. Skipping it leaves
// every sum as it was (exact: zero terms dropped, bit for bit) and frees the tensor core for the other consumer. The skipped
// tile is the CTA's last, so no later load waits for its release: the consumer never arrives on its `empty`
// barriers (arriving early could complete an earlier phase of the same stage before the other consumer's reads).
template <class Cfg>
__device__ __forceinline__ int consumer_tiles(const AttnFwdParams& p, int wm0, int n_tiles) {
  if (!LAB_FWD_WIDE_WG_TILES || !p.causal) return n_tiles;
  const int kv_end = min(p.seqlen_k, min(p.seqlen_q, wm0 + 64));
  return min(n_tiles, (kv_end + Cfg::BC - 1) / Cfg::BC);
}
// A persistent CTA's i-th work tile (LAB_FWD_WIDE_PERSIST): round i of gridDim.x tiles, CTA x taking tile x of it in
// even rounds and gridDim.x - 1 - x in odd ones. A head's causal query blocks run longest first (work_tile_at), so
// where gridDim.x is a multiple of the blocks per head a plain round robin would hand a CTA the same block in
// every round (at S = 512: 132 CTAs, 4 blocks, one CTA four times another's keys); the snake pairs long with short.
// n_work (or more) once this CTA has none left. lab.fwd.work_order.v10_snake mirrors it.
[[maybe_unused]] __device__ __forceinline__ int snake_tile(int i, int n_work) {
  const int g = gridDim.x, x = blockIdx.x, w = i * g + ((i & 1) ? g - 1 - x : x);
  return w < n_work ? w : n_work;
}
// The work tiles a CTA runs, each as fn(work tile, its first K / V tile's count on the ring, its index): snake_tile's
// order when persistent, else work0 alone. The producer and the consumers walk it alike, so their ring counts agree.
template <class Cfg, bool kPersist, class Fn>
__device__ __forceinline__ void walk_work_tiles(const AttnFwdParams& p, int n_work, const WorkTile& work0, Fn&& fn) {
  if constexpr (kPersist) {
    for (int w = snake_tile(0, n_work), i = 0, it = 0; w < n_work; w = snake_tile(++i, n_work)) {
      const WorkTile work = work_tile_at<Cfg>(p, w);
      fn(work, it, i);
      it += work.n_tiles;
    }
  } else {
    fn(work0, 0, 0);
  }
}
using Cfg192 = Cfg10<192, LAB_FWD_WIDE_D192_BC, LAB_FWD_WIDE_STAGES>;
using Cfg256 = Cfg10<256, LAB_FWD_WIDE_D256_BC, LAB_FWD_WIDE_STAGES>;

template <class Cfg, class T, bool kFold, bool kPersist>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v10_kernel(const __grid_constant__ CUtensorMap tq,
                                                                        const __grid_constant__ CUtensorMap tk,
                                                                        const __grid_constant__ CUtensorMap tv,
                                                                        const AttnFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  static_assert(!kPersist || LAB_FWD_WIDE_OVERLAP, "the persistent loop counts ring tiles in the overlapped loop only");
  extern __shared__ uint8_t smem_raw[];
  // K and V stages are released apart (v07's split barriers): with OVERLAP, K_j is free once S_j is done, a
  // whole P V earlier than V_j, so the next K load is not held behind it (one arrival per consumer warp).
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], empty_k[kStages], empty_v[kStages], empty_q;
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);

  const WorkTile work0 = cta_work_tile<Cfg>(p);  // (kPersist: unused)
  const int wg = threadIdx.x / 128;
  // kPersist: one CTA per SM, its work tiles in snake_tile's order, the ring's stage and phase counted over every
  // K / V tile this CTA loads (`it`); Q's buffer is refilled once both consumers' last S GEMM of a work tile has
  // read it (`empty_q`), under the P V and epilogue that end the tile. Else one work tile, blockIdx.x's, `it` 0.
  const int n_work = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR * p.batch * p.heads_q;  // (kPersist only)

  if (threadIdx.x == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&empty_k[s]), 4 * Cfg::kConsumers);
      mbar_init(smem_u32(&empty_v[s]), 4 * Cfg::kConsumers);
    }
    if constexpr (kPersist) mbar_init(smem_u32(&empty_q), 4 * Cfg::kConsumers);
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: Q, then K_j, V_j into the ring, each stage reused once every consumer warp released it.
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      auto produce = [&](const WorkTile& work, int it, int i) {
        if (kPersist && i > 0) mbar_wait(smem_u32(&empty_q), (i - 1) & 1);
        load_q_consumers<Cfg>(ring.q, &tq, smem_u32(&bar_q), work.m0, work.h, work.b);
        for (int j = 0; j < work.n_tiles; ++j) {
          const int t = it + j, s = t % kStages;
          const uint32_t free_phase = ((t / kStages) & 1) ^ 1;
          if (t >= kStages) mbar_wait(smem_u32(&empty_k[s]), free_phase);
          mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, j * BC, work.hkv, work.b);
          if (t >= kStages) mbar_wait(smem_u32(&empty_v[s]), free_phase);
          mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, j * BC, work.hkv, work.b);
        }
      };
      walk_work_tiles<Cfg, kPersist>(p, n_work, work0, produce);
    }
  } else {
    // Consumers: 64 rows each, v05's serial tile with the folded scale and two chains.
    setmaxnreg_inc<Cfg::kRegsConsumer>();
    const int ct = threadIdx.x - 128 * wg;
    auto consume = [&](const WorkTile& work, int it, int i) {
      const int b = work.b, h = work.h, n_tiles = work.n_tiles;
      const int wm0 = work.m0 + 64 * (wg - 1);
      const uint32_t sQw = ring.q + (wg - 1) * Cfg::kQBytesWG;
      const float c = p.scale * kLog2e;
      const int row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
      const int n_wg = consumer_tiles<Cfg>(p, wm0, n_tiles);  // this consumer's key tiles (the CTA loads n_tiles)
      float o[D / 2];
      zero_acc(o);
      RowState st;
      mbar_wait(smem_u32(&bar_q), i & 1);
      auto release = [&](uint64_t* empty, int t) {
        if (ct % 32 == 0) mbar_arrive(smem_u32(&empty[t % kStages]));
      };
      if constexpr (!LAB_FWD_WIDE_OVERLAP) {
        for (int j = 0; j < n_wg; ++j) {
          serial_tile<Cfg, T, LAB_FWD_WIDE_CHAINS, kFold>(o, st, ring, sQw, bar_k, bar_v, j, wm0, row0, c, p);
          release(empty_k, j);
          release(empty_v, j);
        }
      } else {
        // v07's loop: S_j and P_{j-1} V_{j-1} issued together, the softmax of S_j under the P V. Key tile j of
        // this work tile is the ring's tile it + j.
        constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
        constexpr int CH = LAB_FWD_WIDE_CHAINS;
        float sacc[BC / 2];
        uint32_t pa[BC / 16][4];
        float alpha[2];
        auto wait_full = [&](uint64_t* full, int t) { mbar_wait(smem_u32(&full[t % kStages]), (t / kStages) & 1); };
        auto softmax = [&](int j) {
          if (lab::tile_needs_mask(j * BC, BC, wm0, p.seqlen_k, p.causal))
            softmax_scores<BC, true, 0, CH, kFold>(sacc, st, alpha, c, row0, j * BC, p.seqlen_k, p.causal);
          else
            softmax_scores<BC, false, 0, CH, kFold>(sacc, st, alpha, c, row0, j * BC, p.seqlen_k, p.causal);
        };
        if (n_wg > 0) {
          wait_full(bar_k, it);
          wgmma_fence();
          issue_qk<D, BC, kBf16, qk_steps<Cfg>::value>(sacc, sQw, ring.k(it % kStages));
          wgmma_wait<0>();
          reg_fence(sacc);
          release(empty_k, it);
          softmax(0);  // O is still 0: no rescale
          pack_p<BC, T>(sacc, pa);
        }
        for (int j = 1; j < n_wg; ++j) {
          const int t = it + j;
          wait_full(bar_k, t);
          wait_full(bar_v, t - 1);
          wgmma_fence();  // the P fragments and the rescaled O written before the wgmmas read them
          issue_qk<D, BC, kBf16, qk_steps<Cfg>::value>(sacc, sQw, ring.k(t % kStages));
          issue_pv<D, BC, kBf16>(o, pa, ring.v((t - 1) % kStages));
          wgmma_wait<1>();  // S_j (committed first)
          reg_fence(sacc);
          release(empty_k, t);
          softmax(j);  // touches neither O nor the P fragments the P V still reads
          wgmma_wait<0>();
          reg_fence(o);
          release(empty_v, t - 1);
          rescale_o<D>(o, alpha);
          pack_p<BC, T>(sacc, pa);
        }
        if (kPersist) release(&empty_q, 0);  // every S GEMM of this work tile has read Q (waited above)
        if (n_wg > 0) {
          const int t = it + n_wg - 1;
          wait_full(bar_v, t);
          wgmma_fence();
          issue_pv<D, BC, kBf16>(o, pa, ring.v(t % kStages));
          wgmma_wait<0>();
          reg_fence(o);
          release(empty_v, t);
        }
        if (kPersist)  // the tile this consumer skipped: later loads reuse its stage. Waiting for it to land first
          for (int t = it + n_wg; t < it + n_tiles; ++t) {  // keeps the arrivals out of the stage's previous phase
            wait_full(bar_k, t);
            release(empty_k, t);
            wait_full(bar_v, t);
            release(empty_v, t);
          }
      }
      if constexpr (kPersist || LAB_FWD_WIDE_EPILOGUE_DIRECT)  // Q's buffer is the next work tile's: no staging there
        epilogue_direct<D, T, Cfg::kNarrow>(o, st, p, b, h, wm0);
      else
        epilogue<D, T, Cfg::kNarrow>(o, st, p, smem + (wg - 1) * Cfg::kQBytesWG, b, h, wm0, wg);
    };
    walk_work_tiles<Cfg, kPersist>(p, n_work, work0, consume);
  }
#endif
}

template <class Cfg, class T>
int launch(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  constexpr bool kPersist = LAB_FWD_WIDE_PERSIST != 0;
  return launch_fwd_sm90_fold<Cfg, attn_fwd_v10_kernel<Cfg, T, true, kPersist>,
                              attn_fwd_v10_kernel<Cfg, T, false, kPersist>, LAB_FWD_WIDE_FOLD != 0, kPersist>(p, stream, dev);
}

}  // namespace

// Head dims 192 and 256, and the narrow ones between them (136-184 on Narrow<Cfg192>, 200-248 on Narrow<Cfg256>:
// tensor maps over the true D, no padded copies).
extern "C" int attn_fwd_v10(const AttnFwdParams* p, void* stream) {
  const int d = p->head_dim;
  const bool narrow = narrow_head_dim(d) && narrow_width(d) >= 192;
  if (d != 192 && d != 256 && !narrow) return LAB_E_HEAD_DIM;
  if (const int rc = lab::check_fwd_call(p)) return rc < 0 ? rc : 0;
  if (p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30)) return LAB_E_SHAPE;  // TMA's int32 coordinates
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
#if LAB_FWD_NARROW_QK_STEPS >= 3
  // S over the 10 k16 steps that hold data at D = 160, not the width's 12 (common attn_fwd_sm90.cuh's Narrow; its
  // level 3 has the outcome, and why D = 200 is not among them).
  if (d == 160)
    return bf16 ? launch<NarrowSteps<Cfg192, 160>, __nv_bfloat16>(*p, st, dev)
                : launch<NarrowSteps<Cfg192, 160>, __half>(*p, st, dev);
#endif
  if (narrow && narrow_width(d) == 192)
    return bf16 ? launch<Narrow<Cfg192>, __nv_bfloat16>(*p, st, dev) : launch<Narrow<Cfg192>, __half>(*p, st, dev);
  if (narrow)
    return bf16 ? launch<Narrow<Cfg256>, __nv_bfloat16>(*p, st, dev) : launch<Narrow<Cfg256>, __half>(*p, st, dev);
  if (d == 192)
    return bf16 ? launch<Cfg192, __nv_bfloat16>(*p, st, dev) : launch<Cfg192, __half>(*p, st, dev);
  return bf16 ? launch<Cfg256, __nv_bfloat16>(*p, st, dev) : launch<Cfg256, __half>(*p, st, dev);
}
