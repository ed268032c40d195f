// Changes: vs v04 (the sm_80 default): the masks real models use, as steps of the shared vocabulary.
//   - sliding window (common/mask.cuh window_*): a block of rows reads only the key tiles in its window's key
//     range; the tiles outside are never loaded (skipped, not masked), so a window of W keys costs
//     O(S_q (W + B_r + B_c)). The K/V pointers are moved to the range's first tile, so the shared prologue
//     (load_q_first_kv) and pipeline run unchanged on the shifted keys. Only tiles that cross the window's edges
//     or S_k pay for the per-element mask.
//   - softcap (kSoftcap, a template switch so the plain kernel keeps v04's loop): S -> tanh(S scale / softcap)
//     right after Q K^T, and the exp2 step runs with the factor softcap log2(e).
//   - sinks: one logit per query head joins the final normaliser (common/softmax.cuh normalise_rows_sink).
//   - packed sequences (cu_seqlens): the grid is ceil(max_seqlen_q / B_r) x B x H_q as in FlashAttention-2;
//     a CTA finds its sequence's rows from cu_seqlens on the device and returns at once when its block starts
//     past that sequence's end. No padding, no host sync.
//   Everything else (tiles, swizzle, lazy rescale, cp.async pipeline) is v04's at its default configs (no small-
//   grid tile, no split loop: one loop with the mask test per tile).
// Compile check: python -m lab compile (sm_80, sm_90a). Through torch: lab.ops.attention(..., window_size=...,
//   softcap=..., sinks=...) and lab.ops.attention_varlen; checks and race: lab.masks.gpu (checks("v08"), race).
// Measured: outputs/experiments/20261126-masks-fwd-v08.json. On the H100 (no sm_80 GPU was run) 1.05-1.43x v09's time; 104/104
//   masked checks, memcheck and racecheck clean (outputs/driver_logs/20261126-h100-masks/). D = 128 spills 44 B
//   (v04's split loop, which this file does not keep, is what took v04 to 0).
//
// Launch: 1-D grid of ceil(S_q / 128) * B * H_q CTAs (S_q = max_seqlen_q when packed), 128 threads, v04's shared
// memory (80 KiB at D = 64, 96 KiB at D = 128). Limits: v04's (D in {64, 128}, fp16/bf16, any finite scale).
// LAB_FWD_MASK_BUG_NO_WINDOW=1 builds the deliberately wrong kernel the checks must catch: it drops the window.

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/launch.h"
#include "common/mask.cuh"
#include "common/mma.cuh"
#include "common/mma_fwd_tiles.cuh"
#include "common/params.h"
#include "common/smem_tile.cuh"
#include "common/softmax.cuh"

#ifndef LAB_FWD_MASK_BUG_NO_WINDOW
#define LAB_FWD_MASK_BUG_NO_WINDOW 0
#endif

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -INFINITY;
constexpr float kLazyLog2 = 8.0f;  // v04's lazy rescale: offset lag allowed, in exp2 units

// v04's default tiles: 4 warps x 32 rows, B_c = 64; 4 stages at D = 64, 2 at D = 128.
template <int D, int kStages>
struct Cfg : lab::MmaFwdSplitTiles<D, 4, 2, 64, kStages, 2, 1> {};
using Cfg64 = Cfg<64, 4>;
using Cfg128 = Cfg<128, 2>;

using lab::swizzle;

// v04's K/V copy: one row pointer per thread advanced by 8 rows per copy.
template <class C, class T>
__device__ __forceinline__ void load_kv_tile(uint32_t smem_tile, const T* gbase, int64_t row_stride, int row0,
                                             int seqlen, int tid) {
  constexpr int kRowStep = C::kThreads / C::kChunksPerRow;
  constexpr int kPerThread = C::kBlockNLoad / kRowStep;
  const int r0 = tid / C::kChunksPerRow;
  const int c = tid % C::kChunksPerRow;
  const T* src = gbase + (int64_t)(row0 + r0) * row_stride + c * 8;
  const int64_t step = (int64_t)kRowStep * row_stride;
  const uint32_t dst = smem_tile + swizzle<C::kHeadDim>(r0, c) * 2;
  const int left = seqlen - row0 - r0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const bool valid = i * kRowStep < left;
    lab::cp_async_16(dst + i * kRowStep * C::kHeadDim * 2, valid ? src + i * step : gbase, valid);
  }
}

// The rows, keys and pointers of one CTA's sequence: dense (b of the batch) or packed (from cu_seqlens).
template <class T>
struct SeqView {
  const T *q, *k, *v;
  T* o;
  float* lse;  // row 0's LSE of this (sequence, head), or null
  int seqlen_q, seqlen_k, off;
};

template <class T>
__device__ __forceinline__ SeqView<T> seq_view(const AttnMaskParams& mp, int b, int h, int h_kv) {
  const AttnFwdParams& p = mp.base;
  SeqView<T> s;
  int64_t q0 = 0, k0 = 0;
  if (mp.cu_seqlens_q != nullptr) {
    // Clamped so that no cu_seqlens value reads or writes outside the packed tensors.
    const int qa = min(max(mp.cu_seqlens_q[b], 0), mp.total_q), qb = min(max(mp.cu_seqlens_q[b + 1], qa), mp.total_q);
    const int ka = min(max(mp.cu_seqlens_k[b], 0), mp.total_k), kb = min(max(mp.cu_seqlens_k[b + 1], ka), mp.total_k);
    s.seqlen_q = min(qb - qa, p.seqlen_q);
    s.seqlen_k = min(kb - ka, p.seqlen_k);
    s.off = s.seqlen_k - s.seqlen_q;
    q0 = qa;
    k0 = ka;
    s.lse = p.lse != nullptr ? p.lse + (int64_t)h * mp.total_q + qa : nullptr;
  } else {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.off = mp.diag_offset;
    s.lse = p.lse != nullptr ? p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q : nullptr;
  }
  const int64_t bq = mp.cu_seqlens_q != nullptr ? 0 : b;  // packed: the batch stride is not used
  s.q = static_cast<const T*>(p.q) + bq * p.q_stride[0] + h * p.q_stride[1] + q0 * p.q_stride[2];
  s.k = static_cast<const T*>(p.k) + bq * p.k_stride[0] + h_kv * p.k_stride[1] + k0 * p.k_stride[2];
  s.v = static_cast<const T*>(p.v) + bq * p.v_stride[0] + h_kv * p.v_stride[1] + k0 * p.v_stride[2];
  s.o = static_cast<T*>(p.o) + bq * p.o_stride[0] + h * p.o_stride[1] + q0 * p.o_stride[2];
  return s;
}

template <class C, class T, bool kSoftcap>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks) attn_fwd_v08_kernel(const AttnMaskParams mp) {
  constexpr int D = C::kHeadDim;
  constexpr int Br = C::kBlockM;
  constexpr int Bc = C::kBlockN;
  constexpr int kMT = C::kMTiles;
  constexpr int kStages = C::kStages;
  const AttnFwdParams& p = mp.base;

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;

  // ---- which (sequence b, head h, query block) this CTA owns: query block fastest (one head's K/V shared in L2),
  // heaviest first when the window has a right edge (causal: the last blocks see the most keys; v03's order)
  const int num_m_blocks = (p.seqlen_q + Br - 1) / Br;
  const int m_block = mp.window_right >= 0 ? num_m_blocks - 1 - (int)(blockIdx.x % num_m_blocks)
                                           : (int)(blockIdx.x % num_m_blocks);
  const int bh = blockIdx.x / num_m_blocks;
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const int h_kv = h / (p.heads_q / p.heads_kv);
  const SeqView<T> sv = seq_view<T>(mp, b, h, h_kv);
  const int m0 = m_block * Br;
  if (m0 >= sv.seqlen_q) return;  // packed: this block starts past its sequence (no barrier has run yet)
  const int m1 = min(m0 + Br, sv.seqlen_q);
  const int left = LAB_FWD_MASK_BUG_NO_WINDOW ? -1 : mp.window_left;
  const int right = LAB_FWD_MASK_BUG_NO_WINDOW ? (mp.window_right == 0 ? 0 : -1) : mp.window_right;

  // ---- the window's tiles: [first, last) of B_c keys; the K/V pointers, S_k and the diagonal move to `first`
  const int2 range = lab::window_key_range(m0, m1, sv.seqlen_k, sv.off, left, right);
  const int first = range.y > range.x ? range.x / Bc : 0;
  const int n_tiles = range.y > range.x ? (range.y + Bc - 1) / Bc - first : 0;
  const int shift = first * Bc;
  const T* q = sv.q;
  const T* k = sv.k + (int64_t)shift * p.k_stride[2];
  const T* v = sv.v + (int64_t)shift * p.v_stride[2];
  const int seqlen_k = sv.seqlen_k - shift;
  const int off = sv.off - shift;
  AttnFwdParams sp = p;  // the prologue's view of this sequence: its lengths, on the shifted keys
  sp.seqlen_q = sv.seqlen_q;
  sp.seqlen_k = seqlen_k;

  const uint32_t sQ = lab::smem_u32(smem);
  const lab::KVStages<C> kvs{sQ + C::kSmemQ};

  // ================================================================ Prologue
  lab::load_q_first_kv<C, Bc, kStages - 1>(sQ, kvs.base, smem, q, k, v, sp, m0, n_tiles, tid);

  const int warp_row0 = warp * C::kRowsPerWarp;
  uint32_t qf[kMT][1][4];
  float acc_o[kMT][C::kNTilesO][4];
  float row_max[kMT][2];
  float row_sum[kMT][2];
  lab::init_softmax_state(acc_o, row_max, row_sum);

  // The exp2 factor of a score: |scale| log2 e, or with softcap (scores are tanh values) softcap log2 e.
  const float scale_log2 = (kSoftcap ? mp.softcap : fabsf(p.scale)) * kLog2e;
  const float scale_over_cap = kSoftcap ? fabsf(p.scale) / mp.softcap : 0.f;

  const lab::KVLanes kvl = lab::kv_lanes(lane);
  const uint32_t q_base = sQ + (warp_row0 + (lane % 16)) * D * 2;
  const uint32_t q_x = (((lane / 16) ^ lane) & 7) << 4;
  const uint32_t k_lane = kvl.k_row * D * 2;
  const uint32_t k_x = ((kvl.k_chunk ^ lane) & 7) << 4;
  const uint32_t v_lane = kvl.v_row * D * 2;
  const uint32_t v_x = ((kvl.v_chunk ^ lane) & 7) << 4;

  using SAcc = float[kMT][C::kNTilesS][4];
  auto qk_tile = [&](SAcc& acc_s, uint32_t k_tile) {
    auto reload_q = [&](int kk) {
      const uint32_t qa = q_base + (q_x ^ (kk << 5));
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) lab::ldmatrix_x4(qf[mt][0], qa + mt * 16 * D * 2);
    };
    auto load_k = [&](uint32_t (&bk)[4], int np, int kk) {
      lab::ldmatrix_x4(bk, k_tile + k_lane + (k_x ^ (kk << 5)) + np * 16 * D * 2);
    };
    lab::qk_tile<T, C::kKStepsQK>(acc_s, qf, reload_q, load_k);
  };

  // v04's lazy online softmax, then O += P V.
  auto softmax_pv = [&](SAcc& acc_s, uint32_t v_tile) {
    float mx[kMT][2];
    bool grow = false;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        mx[mt][hh] = lab::quad_row_max(acc_s, row_max[mt][hh], mt, hh);
        grow |= (mx[mt][hh] - row_max[mt][hh]) * scale_log2 > kLazyLog2;
      }
    if (__any_sync(0xffffffffu, grow)) {
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float alpha = lab::fast_exp2(row_max[mt][hh] * scale_log2 - lab::row_offset(mx[mt][hh], scale_log2));
          row_max[mt][hh] = mx[mt][hh];
          row_sum[mt][hh] *= alpha;
          lab::rescale_row(acc_o, mt, hh, alpha);
        }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
        row_sum[mt][hh] += lab::exp_row(acc_s, mt, hh, lab::row_offset(row_max[mt][hh], scale_log2), scale_log2);
    auto load_v = [&](uint32_t (&bv)[4], int np, int kk) {
      lab::ldmatrix_x4_trans(bv, v_tile + v_lane + kk * 16 * D * 2 + (v_x ^ (np << 5)));
    };
    lab::pv_tile<T, false>(acc_o, acc_s, load_v);
  };

  // ================================================================ Main loop
  // [lab:inner-loop] S_j = Q K_j^T over the window's tiles only; softcap; the mask where a tile crosses an edge
#pragma unroll 1
  for (int j = 0; j < n_tiles; ++j) {
    lab::cp_async_wait<kStages - 2>();
    __syncthreads();
    const int jn = j + kStages - 1;
    if (jn < n_tiles) {
      const int st = jn % kStages;
      load_kv_tile<C>(kvs.k(st), lab::launder(k), p.k_stride[2], jn * Bc, seqlen_k, tid);
      load_kv_tile<C>(kvs.v(st), lab::launder(v), p.v_stride[2], jn * Bc, seqlen_k, tid);
    }
    lab::cp_async_commit();
    float acc_s[kMT][C::kNTilesS][4];
    qk_tile(acc_s, kvs.k(j % kStages));
    if constexpr (kSoftcap) lab::softcap_scores(acc_s, scale_over_cap);
    const int n0 = j * Bc;
    if (lab::window_tile_needs_mask(n0, Bc, m0, m1, seqlen_k, off, left, right))
      lab::mask_scores_window(acc_s, m0 + warp_row0, n0, seqlen_k, off, left, right, g, t);
    softmax_pv(acc_s, kvs.v(j % kStages));
  }
  // [/lab:inner-loop]

  // ================================================================ Epilogue
  lab::cp_async_wait<0>();
  const float sink_log2 = mp.sinks != nullptr ? mp.sinks[h] * kLog2e : kNegInf;
  lab::normalise_rows_sink(acc_o, row_max, row_sum, scale_log2, sink_log2, sv.lse, m0 + warp_row0, sv.seqlen_q, g, t);
  // O out through this warp's own rows of sQ (kSyncFirst: after every lane's last ldmatrix of them); sp
  // carries this sequence's S_q as the row bound, sv.o its first row.
  lab::store_o<C, true>(acc_o, sQ, sv.o, sp, m0, warp_row0, lane, g, t);
}

template <class C, class T, bool kSoftcap>
int launch(const AttnMaskParams& mp, cudaStream_t stream) {
  constexpr auto kernel = attn_fwd_v08_kernel<C, T, kSoftcap>;
  const cudaError_t err = lab::allow_smem_once<kernel>(C::kSmemBytes, lab::current_device());
  if (err != cudaSuccess) return (int)err;
  const int64_t blocks = (int64_t)((mp.base.seqlen_q + C::kBlockM - 1) / C::kBlockM) * mp.base.batch * mp.base.heads_q;
  if (blocks > lab::kMaxGridX) return LAB_E_SHAPE;
  kernel<<<(unsigned)blocks, C::kThreads, C::kSmemBytes, stream>>>(mp);
  return (int)cudaGetLastError();
}

template <class C, class T>
int launch_by_softcap(const AttnMaskParams& mp, cudaStream_t stream) {
  return mp.softcap > 0.f ? launch<C, T, true>(mp, stream) : launch<C, T, false>(mp, stream);
}

}  // namespace

// The scale rule and checks of every mma.sync forward launcher (common/mma_fwd_tiles.cuh fwd_entry), then the
// tile by head dim and the kernel by dtype and softcap.
extern "C" int attn_fwd_v08(const AttnMaskParams* p, void* stream) {
  AttnMaskParams mp = *p;
  if (mp.softcap < 0.f || mp.window_left < -1 || mp.window_right < -1) return LAB_E_SHAPE;
  if ((mp.cu_seqlens_q == nullptr) != (mp.cu_seqlens_k == nullptr)) return LAB_E_SHAPE;
  if (mp.block_table != nullptr) return LAB_E_MODE;  // paged K/V: fwd v11 only
  return lab::fwd_entry(&p->base, stream, [&mp](const AttnFwdParams& kp, cudaStream_t st, bool bf16) -> int {
    mp.base = kp;
    if (kp.head_dim == 64)
      return bf16 ? launch_by_softcap<Cfg64, __nv_bfloat16>(mp, st) : launch_by_softcap<Cfg64, __half>(mp, st);
    return bf16 ? launch_by_softcap<Cfg128, __nv_bfloat16>(mp, st) : launch_by_softcap<Cfg128, __half>(mp, st);
  });
}
