// The masks of the Hopper backward at head dims 192 / 256 (bwd/v21_masks_wide.cu): common/hopper/attn_bwd_mask_sm90.cuh's
// steps (the window's query-block range per key block, the per-element rule on crossing tiles, the softcap's
// recompute and derivative, packed sequences per MaskBwdParams::seqlens) as a Steps policy of the wide loop
// (common/hopper/attn_bwd_wide.cuh). Only warpgroup 0's step differs from the dense kernel's:
//   P^T = exp2(s' log2e - LSE_i log2e), masked        (s' = softcap tanh(s / softcap), or s)   for dV += P^T dO_i;
//   handed to warpgroup 1: P^T (1 - tanh^2(s / softcap))                                        (softcap off: P^T),
// so warpgroup 1's unchanged dS^T = hand * (dP^T - Delta_i) is the gradient of the raw scaled score that dK and dQ
// take (the derivative rides in the fp16 hand-off; no second buffer, no tanh in warpgroup 1).
#pragma once
#include "common/hopper/attn_bwd_mask_sm90.cuh"
#include "common/hopper/attn_bwd_wide.cuh"

namespace lab::sm90::bwd::wide {

// WindowSteps' work (the window's query blocks of a key block, per packed sequence) with the wide loop's p_hand.
template <bool kSoftcap, bool kVarlen = false, bool kTanhHalf = false>
struct WindowWideSteps : WindowSteps<kSoftcap, kVarlen, kTanhHalf> {
  using Params = MaskBwdParams;

  template <bool kMask>
  __device__ __forceinline__ static void hand(float (&s)[32], uint4* pbuf, const float* lse2, float c, int key0,
                                              int q0, int t, int wt, const MaskBwdParams& p, const SeqView& sv) {
    const float k_in = p.scale / p.softcap, k_out = p.softcap * kLog2e;
    const FlatWindow flat(sv.seqlen_q, sv.seqlen_k, sv.off, p.window_left, p.window_right);
    if constexpr (kSoftcap && kTanhHalf)  // s -> tanh(s k_in) in place, two at a time
#pragma unroll
      for (int i = 0; i < 32; i += 2) tanh_pair(s[i] * k_in, s[i + 1] * k_in, s[i], s[i + 1]);
#pragma unroll
    for (int r8 = 0; r8 < 4; ++r8) {
      float h[8];
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        const int i = 2 * r8 + x / 4, e = x % 4, col = 8 * i + 2 * t + (e & 1);
        float pv, dcap = 1.f;
        if constexpr (kSoftcap) {
          const float th = kTanhHalf ? s[4 * i + e] : tanh_fast(s[4 * i + e] * k_in);
          pv = ex2(fmaf(th, k_out, -lse2[col]));
#ifndef LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD
          dcap = fmaf(-th, th, 1.f);
#endif
        } else {
          pv = ex2(fmaf(s[4 * i + e], c, -lse2[col]));
        }
        if constexpr (kMask) {
          const int key = key0 + 8 * (e >> 1), q = q0 + col;
#ifdef LAB_BWD_MASK_BUG_NO_WINDOW
          if (q >= sv.seqlen_q || key >= sv.seqlen_k) pv = 0.f;  // self-test: the window forgotten on partial tiles
#else
          if (flat.hidden(q, key)) pv = 0.f;
#endif
        }
        s[4 * i + e] = pv;
        h[x] = kSoftcap ? pv * dcap : pv;
      }
      store_hand(pbuf, r8, wt, h);
    }
  }

  template <class C>
  __device__ __forceinline__ static void p_hand(float (&s)[32], uint4* pbuf, const float* rows, float c, int key0,
                                                int t, int wt, const Work& work, int m0, const MaskBwdParams& p) {
    const SeqView sv = seq_view<kVarlen>(p, work.b);
    const bool mask = m0 + C::BR > sv.seqlen_q || window_tile_needs_mask(work.n0, C::BC, m0, m0 + C::BR, sv.seqlen_k,
                                                                         sv.off, p.window_left, p.window_right);
    if (mask)
      hand<true>(s, pbuf, rows, c, key0, m0, t, wt, p, sv);
    else
      hand<false>(s, pbuf, rows, c, key0, m0, t, wt, p, sv);
  }
};

}  // namespace lab::sm90::bwd::wide
