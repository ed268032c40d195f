// Changes: vs v05 (wgmma + TMA, one warpgroup per CTA, serial key tiles) and v08 (the masks on mma.sync): v08's
// masks on Hopper's matrix instructions, so that a masked call on an H100/H200 is not left at mma.sync speed.
//   - window: the CTA's key tiles are the window's key range only (common/mask.cuh window_key_range); the TMA
//     coordinates start at its first tile, tiles outside are never loaded. Tiles crossing an edge (or S_k) get
//     the per-element mask (common/hopper/attn_mask_sm90.cuh mask_window_wg) before the softmax.
//   - softcap (kTransform = tanh) and a scale <= 0 (kTransform = multiply): the scores are transformed first, so the
//     softmax always runs v05's folded form with a positive factor (softcap log2 e, or log2 e); scale > 0 without
//     softcap folds the scale into exp2's FFMA as v05 does.
//   - sinks: in the final normaliser (normalise_o_sink).
//   - packed sequences: the TMA maps span the packed (total, H, D) tensors (B = 1); a CTA reads its sequence's
//     first rows from cu_seqlens and offsets the row coordinates; rows a tile reads past its sequence are masked
//     (keys: col >= S_k) or never stored (queries). Grid ceil(max_seqlen_q / 64) x B x H_q; a CTA whose block
//     starts past its sequence returns before any barrier.
// Tiles: v05's, B_r = 64 (one warpgroup), B_c = 64 at D = 128 and 128 at D = 64, 2 stages (80 / 65 KiB, 2-3 CTAs
// per SM). Causal and windowed dense grids take the heaviest query block of each head first (v05's order).
// Compile check: python -m lab compile. Checks and race: lab.masks.gpu (checks("v09"), race).
// Measured: outputs/experiments/20261126-masks-fwd-v09.json. Prediction: about v05's speed on the unmasked work that remains,
//   so a window well ahead of FlexAttention (which pays Triton's masked-block overhead) and of SDPA's dense mask.
//   Outcome (H100, bf16 D=128 H=16; outputs/driver_logs/20261126-h100-masks/, chapter n13): window 1.23-1.39x Flex, 2.0-14.3x SDPA-cuDNN
//   with the boolean mask; packed documents 1.26-1.27x Flex's document mask; sinks +1-3 %; softcap +22-24 % (a MUFU
//   tanh beside each exp2 in a softmax-bound serial loop); the kernel without a mask at 1.43-1.77x v07's time,
//   which is what keeps it short of the 1.5x-over-Flex target: the masks belong in v07's loop next.
// The softcap's softmax (LAB_FWD_MASK_SOFTCAP, common/hopper/attn_mask_sm90.cuh kCapHeadroom): the cap bounds every score
//   by +-softcap, so in bf16 (softcap <= 51.3) the running max can be one fixed offset: no FMNMX chain, quad
//   shuffles, alpha exp2 or O rescale per tile (per thread and 64-key tile at D = 128: 66 of 172 FMUL, 39 of 40 FMNMX
//   and 2 of 38 ex2 gone in the PTX).
//   Prediction (H100, bf16, H 16, causal, GPU time against the same kernel without softcap): +23-24 % -> +8-12 %
//   (v07's ablation without the row max ran 19-24 % faster); the tanh on fp16 pairs another 4-6 % less.
//   Outcome (H100, e6394bf, kernel-only GPU time in rounds; outputs/driver_logs/20261126-h100-masks-softcap/):
//   D = 128: the online max +17-18 % / +22 % (S 4096 / 16384), the fixed offset +0.3 to +1.2 %, far better
//   than predicted: in this serial loop the row max (its chains, shuffles, alpha and O rescale) costs about what the
//   tanh does, so dropping it pays for the tanh (predicted: half of it).
//   D = 64 (B_c = 128, half the tensor work per score): +36-38 % -> +29-31 %, the MUFU (tanh + exp2 per score) bound.
//   The tanh on fp16 pairs was slower (+3-5 % over the fixed offset at D = 128) and failed the LSE checks (0.016-0.033
//   against 0.01): dropped. The first fixed-offset form summed l from the fp32 P while P V used the bf16 P, and failed
//   the two S_q = S_k = 1 softcap checks (O = V off by one bf16 ulp, where SDPA is exact: with a running max the
//   largest P is exactly 1). Now l sums the rounded P (exp_rows_rounded; tests/masks/test_masks.py emulates both forms).
//   Outcome of that form (H100, 50795d4, the same A/B; outputs/driver_logs/20261126-h100-masks-defaults-50795d4/):
//   D = 128 +5.9 / +7.2 % (S 4096, softcap 30 / 50) and +8.7 % (S 16384) over no softcap, where the online max beside
//   it took +18.1 / +18.2 / +21.9 %: 9-11 % less time than the online max; D = 64 +34.8 / +38.1 % (online max
//   +36.5 / +39.6 %). Checks pass: 214/214 in chapter n13 with it the default, and its own grid 26/26 with the rows at
//   the cap's floor, S_q = S_k = 1 included; memcheck, racecheck, synccheck clean. So it is the default (bf16,
//   softcap <= 51.3). Why the rounded l costs 5-7 points over the first form (tools/sass/sass_loops.py, sm_90a, bf16
//   D = 128 main loop per thread and 64-key tile): 676 instructions against the first form's 628, the 48 being a
//   second pack of each P pair (32 F2FP against 16: pack_p does not reuse exp_rows_rounded's pack) and the unpack for
//   l (32 integer). Handing the packed pairs to P V directly was compiled and counted, not run: 666 (16 F2FP out, 6
//   predicate moves in), so about a fifth of those points at best; the unpack stays while l sums the rounded P.
// LAB_FWD_MASK_SOFTCAP=2 (the default since the run below): l = P 1 by the tensor core, an m64n8k16 wgmma per k16 step
//   beside P V from the same P fragments, B a 1 KiB atom of bf16 ones (attn_mask_sm90.cuh issue_rowsum): the sum of
//   the rounded P without unpacking it, so one key still gives O = V. Main loop (same count): 601 instructions at
//   D = 128 (the rounded l 676, the first form 628, the online max 741; tensor clocks 528 against 512), 1065 at D = 64
//   (the rounded l 1214). Prediction (H100, the A/B above): D = 128 +0-2 % over no softcap, about the first form's;
//   D = 64 +30-34 %, still the MUFU's tanh and ex2 per score. Checks: the softcap grid and the rows at the cap's floor
//   pass (S_q = S_k = 1 gives O = V exactly: the tensor core sums the same rounded P that P V uses). The run
//   below times 0 / 1 / 2 by their explicit switches, checks 2 (lab.masks.gpu.softcap_checks), and runs the four
//   sanitizers over the public calls built with it.
//   Outcome (H100, 9cd0dd9, kernel-only GPU time in rounds beside 0 and 1; outputs/driver_logs/20261126-h100-masks-
//   candidates-9cd0dd9/): over no softcap, D = 128 +6.3 / +4.4 % (S 4096, softcap 30 / 50) and +6.6 % (S 16384), where
//   the rounded l beside it took +6.8 / +5.7 / +8.5 % (the online max +17-22 %); D = 64 +26.6 / +27.5 %, against
//   +33.1 / +30.0 %. So 0.5-1.9 % less time than the rounded l at D = 128 and 2-5 % at D = 64: faster in every cell,
//   but at D = 128 well short of the predicted +0-2 % (the first form's +0.3-1.2 %): the 75 loop instructions it
//   saves are not what remains; the tanh and the exp2 per score on the MUFU are. Checks 26/26 (the softcap grid at
//   D 128 and 64, the rows at the cap's floor); memcheck, racecheck, synccheck and initcheck (every kernel, no
//   filter) clean over the public calls. So it is the default for bf16 with softcap <= 51.3. With it the default
//   (52d68b6, outputs/driver_logs/20261126-h100-masks-defaults-52d68b6/): chapter n13's checks 214/214; the public op
//   cold +16.8 / +7.9 % over no softcap (S 4096 / 16384; with the rounded l +15.8 / +12.0 %). memcheck, racecheck,
//   synccheck, initcheck clean as the default too.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"
#include "common/hopper/attn_mask_sm90.cuh"

#ifndef LAB_FWD_MASK_BUG_NO_WINDOW
#define LAB_FWD_MASK_BUG_NO_WINDOW 0  // the deliberately wrong build (drops the window), as v08's
#endif
// The softcap's softmax in bf16 (softcap <= 51.3; see kCapHeadroom): 2 (default) the fixed offset that the cap's
// bound allows (no max, no O rescale) with l = P 1 on the tensor core (issue_rowsum); 1 the same with l summed from
// the rounded P (exp_rows_rounded); 0 the online max. Measured: the header (2 took 0.5-5 % less time than 1).
#ifndef LAB_FWD_MASK_SOFTCAP
#define LAB_FWD_MASK_SOFTCAP 2
#endif

namespace {
using namespace lab::sm90;

template <int D_, int BC_, int STAGES_>
struct Cfg09 {
  static constexpr int D = D_;
  static constexpr int BR = 64;
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128;
  static constexpr int kQBytes = BR * D * 2;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kOnesBytes = LAB_FWD_MASK_SOFTCAP == 2 ? kRowSumOnesBytes : 0;  // after the ring, 1024-aligned
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + kOnesBytes + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
};
using Cfg64 = Cfg09<64, 128, 2>;
using Cfg128 = Cfg09<128, 64, 2>;

template <class Cfg, class T, int kTransform>
__global__ void __launch_bounds__(128) attn_fwd_v09_kernel(const __grid_constant__ CUtensorMap tq,
                                                           const __grid_constant__ CUtensorMap tk,
                                                           const __grid_constant__ CUtensorMap tv,
                                                           const AttnMaskParams mp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kTensorL = kTransform == kTanhBounded && LAB_FWD_MASK_SOFTCAP == 2;  // l = P 1 on the tensor core
  const AttnFwdParams& p = mp.base;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);
  const bool packed = mp.cu_seqlens_q != nullptr;

  // Prologue: which (sequence, head, query block); heaviest block first when the window has a right edge.
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  const int bh = blockIdx.x / num_m;
  const int mb = mp.window_right >= 0 ? num_m - 1 - (int)(blockIdx.x % num_m) : (int)(blockIdx.x % num_m);
  const int b = bh / p.heads_q, h = bh % p.heads_q, hkv = h / (p.heads_q / p.heads_kv);
  int q0 = 0, k0 = 0, seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k, off = mp.diag_offset;
  if (packed) {
    packed_sequence(mp, b, q0, k0, seqlen_q, seqlen_k);
    off = seqlen_k - seqlen_q;
  }
  const int m0 = mb * Cfg::BR;
  if (m0 >= seqlen_q) return;  // the whole CTA, before any barrier or load
  const int left = LAB_FWD_MASK_BUG_NO_WINDOW ? -1 : mp.window_left;
  const int right = LAB_FWD_MASK_BUG_NO_WINDOW ? (mp.window_right == 0 ? 0 : -1) : mp.window_right;
  const int2 tiles = window_tiles<BC>(m0, min(m0 + Cfg::BR, seqlen_q), seqlen_k, off, left, right);
  const int n_tiles = tiles.y, shift = tiles.x * BC;
  const int bq = packed ? 0 : b;  // the maps' batch coordinate
  const int tid = threadIdx.x;

  if (tid == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    fence_barrier_init();
  }
  if constexpr (kTensorL) fill_rowsum_ones(smem + Cfg::kQBytes + 2 * kStages * Cfg::kTileBytes);
  __syncthreads();

  auto issue = [&](int j) {  // thread 0: tile j of the window's K and V into stage j % kStages
    const int s = j % kStages;
    const int row = k0 + shift + j * BC;
    mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, row, hkv, bq);
    mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, row, hkv, bq);
  };
  if (tid == 0) {
    tma_prefetch_maps(&tq, &tk, &tv);
    mbar_arrive_expect_tx(smem_u32(&bar_q), Cfg::kQBytes);
    for (int cb = 0; cb < D / 64; ++cb) tma_load_4d(ring.q + cb * 64 * 128, &tq, smem_u32(&bar_q), cb * 64, q0 + m0, h, bq);
    for (int j = 0; j < kStages && j < n_tiles; ++j) issue(j);
  }

  // The softmax's exp2 factor (> 0) and the transform before it.
  constexpr bool kBounded = kTransform == kTanhBounded, kCap = kTransform == kTanh || kBounded;
  const float c = kCap ? mp.softcap * kLog2e : kTransform == kScale ? kLog2e : p.scale * kLog2e;
  const float tk_factor = kCap ? p.scale / mp.softcap : p.scale;
  const int row0 = m0 + (tid / 32) * 16 + (tid % 32) / 4;
  const int k_end = seqlen_k - shift, k_off = off - shift;  // the window's keys, from its first tile
  float o[D / 2];
  zero_acc(o);
  RowState st;
  float lsum[4] = {0.f, 0.f, 0.f, 0.f};  // kTensorL: the rows' sums of P, whole (issue_rowsum)
  if constexpr (kBounded) st.m[0] = st.m[1] = c - kCapHeadroom;  // the fixed offset (kCapHeadroom)
  mbar_wait(smem_u32(&bar_q), 0);

  // Main loop: S_j = Q K_j^T, transform, the mask where a tile crosses an edge, softmax, O += P_j V_j.
  // [lab:inner-loop] v05's serial key tile with the window's mask and the softcap
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % kStages;
    const uint32_t phase = (j / kStages) & 1;
    float sacc[BC / 2];
    mbar_wait(smem_u32(&bar_k[s]), phase);
    wgmma_fence();
    issue_qk<D, BC, kBf16>(sacc, ring.q, ring.k(s));
    wgmma_wait<0>();
    if constexpr (kTransform != kNone) transform_scores<BC, kCap>(sacc, tk_factor);
    if (lab::window_tile_needs_mask(j * BC, BC, m0, min(m0 + Cfg::BR, seqlen_q), k_end, k_off, left, right))
      mask_window_wg<BC>(sacc, row0, j * BC, k_end, k_off, left, right);
    if constexpr (kTensorL) {  // P = exp2(t c - m) against the fixed m, l = P 1 with P V below
      exp_rows_fixed<BC>(sacc, st.m[0], c);
    } else if constexpr (kBounded) {  // P = exp2(t c - m) against the fixed m, l from the rounded P
      exp_rows_rounded<BC, T>(sacc, st, st.m[0], c);
    } else {
      float alpha[2];
      softmax_scores<BC, false, 0, 1, true>(sacc, st, alpha, c, 0, 0, 0, false);
      rescale_o<D>(o, alpha);
    }
    uint32_t pa[BC / 16][4];
    pack_p<BC, T>(sacc, pa);
    mbar_wait(smem_u32(&bar_v[s]), phase);
    wgmma_fence();
    if constexpr (kTensorL) issue_rowsum<BC, kBf16>(lsum, pa, ring.q + Cfg::kQBytes + 2 * kStages * Cfg::kTileBytes);
    issue_pv<D, BC, kBf16>(o, pa, ring.v(s));
    wgmma_wait<0>();
    if (j + kStages < n_tiles) {
      named_barrier_sync(1, 128);  // every warp is done with stage s
      if (tid == 0) issue(j + kStages);
    }
  }
  // [/lab:inner-loop]
  if constexpr (kTensorL) rowsum_to_state(lsum, st);

  // Epilogue: the sink joins the normaliser; O rows of this sequence only.
  epilogue_masked<D, T>(o, st, mp, packed, b, bq, h, q0, seqlen_q, smem, m0, 1);
#endif
}

// The transform by call (common/hopper/attn_mask_sm90.cuh); the fixed offset only with LAB_FWD_MASK_SOFTCAP > 0.
template <class Cfg, class T>
int launch_by_transform(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  return lab::sm90::launch_by_transform<T, (LAB_FWD_MASK_SOFTCAP > 0)>(mp, [&](auto k) {
    return launch_masked_fwd<Cfg, attn_fwd_v09_kernel<Cfg, T, decltype(k)::value>>(mp, stream, dev);
  });
}

}  // namespace

// The checks (mask_fwd_go: v08's, with the TMA limits of common/hopper), then the tile by head dim and the kernel by
// dtype and transform.
extern "C" int attn_fwd_v09(const AttnMaskParams* p, void* stream) {
  int dev = 0, rc = 0;
  if (!mask_fwd_go(p, &dev, &rc)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->base.dtype == LAB_BF16;
  if (p->base.head_dim == 64)
    return bf16 ? launch_by_transform<Cfg64, __nv_bfloat16>(*p, st, dev) : launch_by_transform<Cfg64, __half>(*p, st, dev);
  return bf16 ? launch_by_transform<Cfg128, __nv_bfloat16>(*p, st, dev) : launch_by_transform<Cfg128, __half>(*p, st, dev);
}
