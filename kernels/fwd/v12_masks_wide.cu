// v12_masks_wide: the masked forward at head dims 192 and 256 (sm_90a): fwd v11's mask steps on fwd v10's wide tiles,
// so that Gemma-2 (D 256, softcap 50, window 4096) and Gemma-3 (D 256, window) run a lab kernel with their masks.
//
// What is new against v11 (v09's mask steps in v07's overlapped loop, D 64 / 128) and v10 (the dense wide forward):
//   - Nothing new as a step. From v11, unchanged (common/mask.cuh, common/hopper/attn_mask_sm90.cuh): the CTA's key
//     tiles are the window's key range of its 128 rows (window_key_range; tiles outside are never loaded), a tile
//     crossing an edge of a consumer's 64 rows gets mask_window_wg, softcap / scale <= 0 by transform_scores, bf16
//     softcap <= 51.3 by the fixed offset (kCapHeadroom, exp_rows_rounded: no max, no O rescale), FA4's lazy rescale
//     on tiles with no mask, the sinks in epilogue_sink, packed sequences through cu_seqlens (B = 1 maps over the
//     packed rows), the lower-right offset (diag_offset, or S_k - S_q per packed sequence), longest query blocks
//     first within L2-sized head groups when a right edge exists. From v10: the tiles (B_c 80 at D 256, 112 at
//     D 192, 2 stages) and the intra-warpgroup overlap (S_j with P_{j-1} V_{j-1}, the softmax under the P V).
//   - Not taken: v11's ping-pong between the consumers (v10 runs D 192 / 256 without it), v10's persistent snake grid
//     (its work tiles have a fixed key count per causal block; a window's vary per CTA and packed sequences per
//     batch entry: a candidate, not this version), v11's CAP_POLY / CAP_TANH_HALF candidates (both off there).
//   - The checks: mask_fwd_go's, with the wide head dims (192, 256; check_fwd_call for the rest) in place of
//     check_fwd_params' 64 / 128. A paged call (a block table in AttnMaskParams, where the struct has one) is
//     refused with LAB_E_MODE: this kernel reads K and V contiguous or packed only.
// Tiles and budget (per CTA: a producer warpgroup, two consumers of 64 query rows, B_r = 128; 384 threads;
//   setmaxnreg 24 / 240; registers per consumer thread O D/2 + S B_c/2 + P B_c/4):
//     D = 256: B_c = 80,  Q 64 KiB + 2 x (K 40 + V 40) KiB = 224 KiB (+1 KiB alignment); O 128 + S 40 + P 20.
//     D = 192: B_c = 112, Q 48 KiB + 2 x (K 42 + V 42) KiB = 216 KiB (+1 KiB alignment); O 96 + S 56 + P 28.
//   v10's measured choice at both (its header keeps the rejected B_c 64 / 96 / 128 and 3 stages with the reasons).
//   Grid: ceil(max S_q / 128) x B x H_q CTAs. Any S_q, S_k (the last tile masked by window_masked's col >= S_k).
// Prediction (written before any GPU run; H200, bf16, public op as users call it, Gemma-2 shapes B 1-2, H 8-16,
//   H_kv 4-8, causal, S 4096 / 8192): a D 256 tile holds twice D 128's GEMM work per score while the softmax's work
//   per score (mask, tanh, exp2) stays, so the MUFU unit that bound v11's softcap (+31-38 % over its plain call on an
//   H200) has half the relative load: softcap 50 costs +10-20 % over this kernel's plain causal call. The plain
//   masked causal call runs v10's loop without its persistent grid: 0.90-1.0x the dense default's (v10) speed.
//   Against FlexAttention (torch.compile'd, same mask_mod / score_mod, D 256): window 4096 and softcap 50 cells
//   1.5-3.0x, every cell >= 1.2x (the target is 1.0x). Checks: the wrong builds (LAB_FWD_MASK_BUG_NO_WINDOW, and
//   LAB_FWD_MASK_WIDE_BUG_NO_EDGE, which drops the window's edge mask but keeps S_k's) fail; every other cell passes.
// Record: outputs/experiments/20261129-masks-fwd-v12-wide.json.
// Outcome (H200, ptxas: 168 registers at launch, setmaxnreg 24 / 240, 0 spills in all 16 instantiations):
//   correctness (outputs/driver_logs/20261129-h200-batch1-278998b0f8/T1/checks.log): 148/148 rows of
//   lab.masks.gpu_wide's grid (132 dense at D 256 / 192 incl. S 4097, cross S_q != S_k both alignments, fp16,
//   strided; 16 packed; 4 at the softcap's floor; worst error 0.55 of the yardstick's tolerance), the no-window build
//   failing (max_abs 6.7 against 0.045); the no-edge build failing too (6.0 against 0.045), the GPU tests (public
//   ops incl. padded D 200, D_qk 192 / D_v 256, varlen at D 200; the one-crossing path bit for bit the full path's),
//   compute-sanitizer memcheck and racecheck clean (outputs/driver_logs/20261129-h200-batch2-f58d500e62/T1/).
//   Race (same folder, race.log; three scripts shared the GPU, so contended): flex / lab 2.36 (window, S 8192,
//   B 1 H 16 / 8), 4.72 (softcap 50), 2.96 / 4.87 (window / softcap, S 4096, B 2 H 8 / 4), 4.19 (local: window and
//   softcap); softcap over the plain masked call +2.6 % / +1.5 %, below the predicted +10-20 %.
// Limits: sm_90 only (cudaErrorNoKernelImageForDevice elsewhere; the body compiles empty for sm_80); D_qk = D_v 192 or
//   256 (lab.masks.op pads D 129-255 and D_v != D_qk); fp16 and bf16; any S_q, S_k >= 0, any window, softcap >= 0,
//   sinks; GQA; 16-byte-aligned bases, strides multiples of 8 elements; no block table.
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v12_masks_wide.cu
// Checks and race: lab.masks.gpu (checks_wide, race_wide).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>
#include <utility>

#include "common/hopper/attn_fwd_sm90.cuh"
#include "common/hopper/attn_mask_sm90.cuh"

#ifndef LAB_FWD_MASK_BUG_NO_WINDOW
#define LAB_FWD_MASK_BUG_NO_WINDOW 0  // the deliberately wrong build (drops the window), as v08's, v09's and v11's
#endif
#ifndef LAB_FWD_MASK_WIDE_BUG_NO_EDGE
#define LAB_FWD_MASK_WIDE_BUG_NO_EDGE 0  // wrong on purpose: the window's edge tiles unmasked (S_k's edge still masked)
#endif
#ifndef LAB_FWD_MASK_WIDE_D192_BC
#define LAB_FWD_MASK_WIDE_D192_BC 112
#endif
#ifndef LAB_FWD_MASK_WIDE_D256_BC
#define LAB_FWD_MASK_WIDE_D256_BC 80
#endif

namespace {
using namespace lab::sm90;

template <int D_, int BC_, int L2_GROUP_MB_>
struct Cfg12 {
  static constexpr int D = D_;
  static constexpr int kConsumers = 2;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int BC = BC_;
  static constexpr int kStages = 2;  // v10's: 3 stages need a third less B_c (its header)
  static constexpr int kL2GroupMB = L2_GROUP_MB_;  // 0: longest first over the whole grid
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = 24, kRegsConsumer = 240;
  static constexpr int kQBytesWG = 64 * D * 2;
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem + 128 <= 227 * 1024, "shared memory budget exceeded (+128: the static barriers)");
  static_assert((BC * 128) % 1024 == 0, "each 64-column block of a K/V tile starts 1024-byte aligned");
  static_assert(BC % 16 == 0 && D % 64 == 0, "k16 steps of P V, 64-column TMA boxes");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
};
// v11's L2 groups (16 MiB of K and V per group of heads): the group's size follows D through kv_head below.
using Cfg192 = Cfg12<192, LAB_FWD_MASK_WIDE_D192_BC, 16>;
using Cfg256 = Cfg12<256, LAB_FWD_MASK_WIDE_D256_BC, 16>;

// Whether AttnMaskParams carries a block table (a paged K / V cache) and this call sets it: such a call is refused.
template <class P, class = void>
struct has_block_table : std::false_type {};
template <class P>
struct has_block_table<P, std::void_t<decltype(std::declval<const P&>().block_table)>> : std::true_type {};
template <class P>
bool paged_call(const P& p) {
  if constexpr (has_block_table<P>::value) return p.block_table != nullptr;
  return false;
}

template <class Cfg, class T, int kTransform>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v12_kernel(const __grid_constant__ CUtensorMap tq,
                                                                        const __grid_constant__ CUtensorMap tk,
                                                                        const __grid_constant__ CUtensorMap tv,
                                                                        const AttnMaskParams mp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kBounded = kTransform == kTanhBounded, kCap = kTransform == kTanh || kBounded;
  const AttnFwdParams& p = mp.base;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], empty_k[kStages], empty_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);
  const bool packed = mp.cu_seqlens_q != nullptr;

  // Prologue: the work tile (v11's: query blocks longest first within L2-sized head groups when a right edge
  // exists), the sequence's rows (packed: clamped, so no cu_seqlens value reads or writes out of bounds), and
  // the window's key tiles of the CTA's 128 rows.
  const int2 tile = masked_l2_tile<Cfg>(mp);
  const int mb = tile.x, bh = tile.y;
  const int b = bh / p.heads_q, h = bh % p.heads_q, hkv = h / (p.heads_q / p.heads_kv);
  int q0 = 0, k0 = 0, seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k, off = mp.diag_offset;
  if (packed) {
    const int qa = min(max(mp.cu_seqlens_q[b], 0), mp.total_q), qb = min(max(mp.cu_seqlens_q[b + 1], qa), mp.total_q);
    const int ka = min(max(mp.cu_seqlens_k[b], 0), mp.total_k), kb = min(max(mp.cu_seqlens_k[b + 1], ka), mp.total_k);
    q0 = qa;
    k0 = ka;
    seqlen_q = min(qb - qa, p.seqlen_q);
    seqlen_k = min(kb - ka, p.seqlen_k);
    off = seqlen_k - seqlen_q;
  }
  const int m0 = mb * Cfg::BR;
  if (m0 >= seqlen_q) return;  // the whole CTA, before any barrier or load
  const int left = LAB_FWD_MASK_BUG_NO_WINDOW ? -1 : mp.window_left;
  const int right = LAB_FWD_MASK_BUG_NO_WINDOW ? (mp.window_right == 0 ? 0 : -1) : mp.window_right;
  const int2 tiles = window_tiles<BC>(m0, min(m0 + Cfg::BR, seqlen_q), seqlen_k, off, left, right);
  const int n_tiles = tiles.y, shift = tiles.x * BC;
  const int bq = packed ? 0 : b;  // the maps' batch coordinate
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) init_split_barriers<Cfg>(&bar_q, bar_k, bar_v, empty_k, empty_v);
  __syncthreads();

  if (wg == 0) {
    // Producer: Q, then the window's K_j, V_j into the ring (K and V stages released apart, v10's split barriers).
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      load_q_consumers<Cfg>(ring.q, &tq, smem_u32(&bar_q), q0 + m0, h, bq);
      produce_kv<Cfg>(ring, &tk, &tv, bar_k, bar_v, empty_k, empty_v, n_tiles, k0, shift, hkv, bq);
    }
    return;
  }

  // Consumers: 64 rows each, v10's overlapped loop with v11's softmax step.
  setmaxnreg_inc<Cfg::kRegsConsumer>();
  const int ct = threadIdx.x - 128 * wg;
  const uint32_t sQw = ring.q + (wg - 1) * Cfg::kQBytesWG;
  const int wm0 = m0 + 64 * (wg - 1), wm1 = max(min(wm0 + 64, seqlen_q), wm0 + 1);
  const int row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
  const int k_end = seqlen_k - shift, k_off = off - shift;  // the window's keys, from its first tile
  // The softmax's exp2 factor (> 0: the max may be taken on the transformed scores) and the transform before it.
  const float c = kCap ? mp.softcap * kLog2e : kTransform == kScale ? kLog2e : p.scale * kLog2e;
  const float tk_factor = kCap ? p.scale / mp.softcap : p.scale;
  float o[D / 2];
  zero_acc(o);
  RowState st;
  if constexpr (kBounded) st.m[0] = st.m[1] = c - kCapHeadroom;  // the fixed offset
  float sacc[BC / 2], alpha[2];
  uint32_t pa[BC / 16][4];
  auto wait_k = [&](int j) { mbar_wait(smem_u32(&bar_k[j % kStages]), (j / kStages) & 1); };
  auto wait_v = [&](int j) { mbar_wait(smem_u32(&bar_v[j % kStages]), (j / kStages) & 1); };
  auto release_k = [&](int j) {
    if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_k[j % kStages]));
  };
  auto release_v = [&](int j) {
    if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[j % kStages]));
  };
  // The softmax step of tile j, v11's (masked_softmax_step, common/hopper/attn_mask_sm90.cuh: no tanh pairs, no
  // exp2 on the FMA pipe); returns whether O needs rescale_o.
  auto softmax = [&](int j) -> bool {
    return masked_softmax_step<BC, T, kTransform, false, 0, false, LAB_FWD_MASK_WIDE_BUG_NO_EDGE != 0>(
        sacc, st, alpha, c, tk_factor, j, wm0, wm1, row0, k_end, k_off, left, right);
  };
  mbar_wait(smem_u32(&bar_q), 0);

  if (n_tiles > 0) {
    wait_k(0);
    wgmma_fence();
    issue_qk<D, BC, kBf16>(sacc, sQw, ring.k(0));
    wgmma_wait<0>();
    reg_fence(sacc);
    release_k(0);
    softmax(0);  // O is still 0: no rescale
    pack_p<BC, T>(sacc, pa);
  }
  // Main loop: S_j and P_{j-1} V_{j-1} in flight together, the softmax of S_j (transform, mask, exp) under P V.
  // [lab:inner-loop] v10's overlapped wide tile with v11's mask steps
  for (int j = 1; j < n_tiles; ++j) {
    wait_k(j);
    wait_v(j - 1);
    wgmma_fence();  // the P fragments and the rescaled O written before the wgmmas read them
    issue_qk<D, BC, kBf16>(sacc, sQw, ring.k(j % kStages));
    issue_pv<D, BC, kBf16>(o, pa, ring.v((j - 1) % kStages));
    wgmma_wait<1>();  // S_j (committed first)
    reg_fence(sacc);
    release_k(j);
    const bool rescale = softmax(j);
    wgmma_wait<0>();
    reg_fence(o);
    release_v(j - 1);
    if (rescale) rescale_o<D>(o, alpha);
    pack_p<BC, T>(sacc, pa);
  }
  // [/lab:inner-loop]
  if (n_tiles > 0) {
    wait_v(n_tiles - 1);
    wgmma_fence();
    issue_pv<D, BC, kBf16>(o, pa, ring.v((n_tiles - 1) % kStages));
    wgmma_wait<0>();
    reg_fence(o);
    release_v(n_tiles - 1);
  }

  // Epilogue: the sink joins the normaliser; O rows of this sequence only, staged in this warpgroup's Q tile.
  epilogue_masked<D, T>(o, st, mp, packed, b, bq, h, q0, seqlen_q, smem + (wg - 1) * Cfg::kQBytesWG, wm0, wg);
#endif
}

// v11's choice of transform (launch_by_transform of common/hopper/attn_mask_sm90.cuh): the bf16 softcap within
// kCapMaxLog2 takes the fixed offset, fp16 and larger caps the online max; a scale <= 0 is multiplied in first.
template <class Cfg, class T>
int launch_by_transform(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  return lab::sm90::launch_by_transform<T>(mp, [&](auto k) {
    return launch_masked_fwd<Cfg, attn_fwd_v12_kernel<Cfg, T, decltype(k)::value>>(mp, stream, dev);
  });
}

// mask_fwd_go (common/hopper/attn_mask_sm90.cuh) with the wide head dims: check_fwd_call for dtype, shape and
// alignment (check_fwd_params there takes 64 / 128 only), then the same mask, packing and device checks.
bool wide_mask_go(const AttnMaskParams* p, int* dev, int* rc) {
  *rc = 0;
  const AttnFwdParams& b = p->base;
  if (paged_call(*p)) *rc = LAB_E_MODE;
  else if (b.head_dim != 192 && b.head_dim != 256) *rc = LAB_E_HEAD_DIM;
  else if (p->softcap < 0.f || p->window_left < -1 || p->window_right < -1) *rc = LAB_E_SHAPE;
  else if ((p->cu_seqlens_q == nullptr) != (p->cu_seqlens_k == nullptr)) *rc = LAB_E_SHAPE;
  else if (p->cu_seqlens_q != nullptr && (p->total_q <= 0 || p->total_q > (1 << 30) || p->total_k > (1 << 30)))
    *rc = p->total_q == 0 ? 0 : LAB_E_SHAPE;
  else if (const int c = lab::check_fwd_call(&b)) *rc = c < 0 ? c : 0;
  else if (b.seqlen_q > (1 << 30) || b.seqlen_k > (1 << 30)) *rc = LAB_E_SHAPE;  // TMA's int32 coordinates
  else if (!device_is_sm90(dev)) *rc = (int)cudaErrorNoKernelImageForDevice;
  else return true;
  return false;
}

}  // namespace

// The checks (wide_mask_go), then the tile by head dim and the kernel by dtype and transform.
extern "C" int attn_fwd_v12(const AttnMaskParams* p, void* stream) {
  int dev = 0, rc = 0;
  if (!wide_mask_go(p, &dev, &rc)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->base.dtype == LAB_BF16;
  if (p->base.head_dim == 192)
    return bf16 ? launch_by_transform<Cfg192, __nv_bfloat16>(*p, st, dev)
                : launch_by_transform<Cfg192, __half>(*p, st, dev);
  return bf16 ? launch_by_transform<Cfg256, __nv_bfloat16>(*p, st, dev)
              : launch_by_transform<Cfg256, __half>(*p, st, dev);
}
