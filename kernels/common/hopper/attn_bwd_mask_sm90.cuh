// The masks of the Hopper backward (bwd/v08_masks.cu) as a Steps policy of the staggered loop
// (common/hopper/attn_bwd_stagger.cuh): the sliding window's query-block range per key block, the window mask on
// partial tiles, the softcap's recompute and derivative, the sinks' gradient, and packed sequences (each rule per
// sequence, from a device array of lengths over right-padded dense buffers). The rule is common/mask.cuh's
// window_masked, applied per element as its FlatWindow (lab/masks/spec.py writes it out; spec.query_block_range is
// this file's window_work).
//
// The equations (s = scale q.k, the score the forward capped; LSE the forward's, natural log, sink included):
//   s' = softcap tanh(s / softcap)   (softcap off: s' = s)
//   P  = exp(s' - LSE)               (a sink needs nothing more: its share is in LSE)
//   dS' = P (dP - Delta),  Delta = rowsum(dO O) - dLSE
//   dS = dS' (1 - tanh^2(s / softcap))   the gradient of the raw scaled score, which dK = scale dS^T Q and
//                                        dQ = scale dS K take as the dense loop does
//   dsink_h = -sum_{b, i} exp(sink_h - LSE_i) Delta_i   (d LSE_i / d sink_h = exp(sink_h - LSE_i), and
//                                        d O_i / d sink_h = -O_i exp(sink_h - LSE_i))
#pragma once
#include <math.h>

#include <type_traits>

#include "common/hopper/attn_bwd_stagger.cuh"
#include "common/mask.cuh"

// The mask's parameters after the dense backward's; lab/masks/backward.py packs the same layout.
struct MaskBwdParams : AttnBwdParams {
  int window_left, window_right;  // -1: unbounded (causal arrives as window_right = 0)
  int diag_offset;                // query row i is aligned with key i + diag_offset
  float softcap;                  // 0: off
  const float* sinks;             // [H_q] or NULL
  float* dsinks;                  // [H_q] zeroed by the caller, or NULL: no sink gradient wanted
  // Packed sequences: [2][batch] int32, S_q then S_k of each sequence, or NULL (dense). Sequence b's rows and keys
  // are the first S_q / S_k of batch entry b of the dense tensors (seqlen_q / seqlen_k: max_seqlen_q / _k), each
  // sequence aligned bottom-right with its own offset S_k - S_q; lengths are clamped to the dense ones.
  const int* seqlens;
  // Packed sequences read in place (common/hopper/attn_bwd_packed_sm90.cuh), or NULL: q, o, dout, dq are
  // (total_q, H_q, D) and k, v, dk, dv (total_k, H_kv, D) with strides {unused, head, token}; sequence b is rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) (clamped to [0, total) and max_seqlen, as the forward's); batch is the
  // number of sequences, seqlen_q / seqlen_k are max_seqlen_q / _k; lse and dlse are [H_q, total_q]. seqlens must
  // then be NULL.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q, total_k;
};
// (the base's 336 bytes, then 4 ints / floats and 5 pointers and 2 ints: no padding anywhere, so the sizes pin the
// offsets)
static_assert(sizeof(AttnBwdParams) == 336 && sizeof(MaskBwdParams) == 400, "lab/masks/backward.py packs this layout");

// The softcap's tanh on fp16 pairs (common/mask.cuh tanh_pair: half the MUFU issues, about twice the error of
// tanh.approx.f32) for bf16 calls: 1 on (the default), 0 off; measured in bwd/v08_masks.cu's header.
#ifndef LAB_BWD_MASK_TANH_HALF
#define LAB_BWD_MASK_TANH_HALF 1
#endif

namespace lab::sm90::bwd {

// Where the fp16-pair tanh may stand in for the f32 one: bf16 calls only. dS is rounded to the call's dtype before
// the dK / dQ GEMMs; bf16's 8 bits of mantissa hide the pair's error, fp16's 11 do not (an fp16 gradient check
// failed by 1.8-2.9x its tolerance with the pair), so fp16 keeps tanh.approx.f32.
template <class T>
inline constexpr bool kTanhHalfFor = LAB_BWD_MASK_TANH_HALF && std::is_same_v<T, __nv_bfloat16>;

// The query rows [lo, hi] (inclusive; hi < lo: none) that see some key of [n0, n1): row i sees key j iff
// j >= i + off - left and j <= i + off + right, so i <= n1 - 1 - off + left and i >= n0 - off - right.
// 64-bit: a window "beyond S" may be near INT_MAX.
__device__ __forceinline__ int2 window_rows(int n0, int n1, int seqlen_q, int off, int left, int right) {
  const long long lo = right >= 0 ? (long long)n0 - off - right : 0;
  const long long hi = left >= 0 ? (long long)n1 - 1 - off + left : (long long)seqlen_q - 1;
  const long long a = lo > 0 ? lo : 0, b = hi < seqlen_q - 1 ? hi : (long long)seqlen_q - 1;
  return make_int2((int)(b < a ? 1 : a), (int)(b < a ? 0 : b));
}

// One sequence's view: its S_q, S_k and diagonal offset (the whole call's for dense calls).
struct SeqView {
  int seqlen_q, seqlen_k, off;
};
// Packed sequences (kVarlen): sequence b's lengths from p.seqlens, clamped to the dense buffers, bottom-right.
template <bool kVarlen>
__device__ __forceinline__ SeqView seq_view(const MaskBwdParams& p, int b) {
  if constexpr (!kVarlen) {
    return SeqView{p.seqlen_q, p.seqlen_k, p.diag_offset};
  } else {
    const int sq = min(max(__ldg(p.seqlens + b), 0), p.seqlen_q);
    const int sk = min(max(__ldg(p.seqlens + p.batch + b), 0), p.seqlen_k);
    return SeqView{sq, sk, sk - sq};
  }
}

// The window rule on a step's masked tile is common/mask.cuh's FlatWindow: the bounds read once a step, each element
// four compares on key - q with no branch. window_masked per element, which it replaced, compiled to a branch an
// element with the window's bounds loaded again from the parameter bank.
// Prediction (H200, bf16, the kernel call beside the branchy rule, GPU time; cde1e83's commit message): 10-20 % less
// time at window 1024 / S 4096, 5-8 % causal with sinks, 15-30 % at GPT-OSS's window 128 (D 64), 5-15 % at D 256,
// 15-25 % packed with window 256. Outcome (cde1e83, outputs/driver_logs/20261130-h200-masks-flat-rule-cde1e83/):
// 0.932x the time at window 1024, 0.979x causal with sinks, 0.935x softcap 30 + window 1024, 0.734x GPT-OSS's
// window 128 with sinks at D 64, 0.986x Gemma-2's window 4096 + softcap 50 at D 256 and 0.959x window 1024 at D 256,
// 0.888x packed (twelve documents, window 256): the rule's cost scales with the share of masked steps, which only
// the narrow windows make large, and the wide loop at D 256 spends more of a step in its GEMMs. dK, dV and d sinks
// were the branchy build's bits (outputs/driver_logs/20261130-h200-masks-flat-default-84e896d/).

// Steps for the masks: only the query blocks of a key block's window are visited (a window of W costs O(S W)).
// kVarlen: every rule per packed sequence, so a key block past its sequence's S_k visits nothing and a query block
// past its S_q is never visited: the padding of the dense buffers costs copies, not tiles. kTanhHalf: the softcap's
// tanh on fp16 pairs (kTanhHalfFor<T> says for which dtype).
template <bool kSoftcap, bool kVarlen = false, bool kTanhHalf = false>
struct WindowSteps {
  using Params = MaskBwdParams;

  template <class C>
  __device__ __forceinline__ static Work work(const MaskBwdParams& p) {
    Work w = cta_work<C>(p);
    const SeqView sv = seq_view<kVarlen>(p, w.b);
    const int n1 = min(w.n0 + C::BC, sv.seqlen_k);
    const int2 rows = window_rows(w.n0, n1, sv.seqlen_q, sv.off, p.window_left, p.window_right);
    if (rows.y < rows.x || w.n0 >= sv.seqlen_k) {
      w.mb0 = w.n_mb = 0;
    } else {
      w.mb0 = rows.x / C::BR;
      w.n_mb = rows.y / C::BR + 1;
    }
    w.n_iters = w.group * (w.n_mb - w.mb0);
    return w;
  }

  // One thread's share of S^T / dP^T (keys: rows, queries: columns), as p_ds of the dense loop.
  // N = B_r / 2: 32 (64 queries a step) or 64 (128, the packed path's D = 64 config).
  template <bool kMask, int N>
  __device__ __forceinline__ static void p_ds_masked(float (&s)[N], float (&dp)[N], const float* lse2,
                                                     const float* delta, float c, int key0, int q0, int t,
                                                     const MaskBwdParams& p, const SeqView& sv) {
    const float k_in = p.scale / p.softcap, k_out = p.softcap * kLog2e;
    const FlatWindow flat(sv.seqlen_q, sv.seqlen_k, sv.off, p.window_left, p.window_right);
    if constexpr (kSoftcap && kTanhHalf)  // s -> tanh(s k_in) in place, two at a time
#pragma unroll
      for (int i = 0; i < N; i += 2) tanh_pair(s[i] * k_in, s[i + 1] * k_in, s[i], s[i + 1]);
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * i + 2 * t + (e & 1);
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
        dp[4 * i + e] = pv * (dp[4 * i + e] - delta[col]) * dcap;
      }
  }

  template <class C>
  __device__ __forceinline__ static void p_ds(float (&s)[32], float (&dp)[32], const float* rows, float c, int kw0,
                                              int m0, const MaskBwdParams& p) {
    const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
    const SeqView sv = seq_view<kVarlen>(p, kVarlen ? cta_work<C>(p).b : 0);
    const bool mask = m0 + C::BR > sv.seqlen_q ||
                      window_tile_needs_mask(kw0, 64, m0, m0 + C::BR, sv.seqlen_k, sv.off, p.window_left,
                                             p.window_right);
    if (mask)
      p_ds_masked<true>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p, sv);
    else
      p_ds_masked<false>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p, sv);
  }
};

// dsinks[h] -= sum over (b, i) of exp(sink_h - LSE_i) Delta_i: one CTA per (b, h) and chunk of rows, after the
// pre-pass (Delta in its padded rows), one atomic add per CTA.
__global__ void __launch_bounds__(256) sink_grad(const MaskBwdParams p) {
  const int bh = blockIdx.x, h = bh % p.heads_q;
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  // Packed sequences: only sequence b's own rows (the padding's LSE and Delta are never read).
  const int rows = p.seqlens != nullptr ? seq_view<true>(p, bh / p.heads_q).seqlen_q : p.seqlen_q;
  const float sink = p.sinks[h];
  float acc = 0.f;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < rows; i += gridDim.y * blockDim.x)
    acc += expf(sink - p.lse[(int64_t)bh * p.seqlen_q + i]) * p.delta[(int64_t)bh * sq_pad + i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float warp_sum[8];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += warp_sum[w];
    atomicAdd(p.dsinks + h, -total);
  }
}

inline int launch_sink_grad(const MaskBwdParams& p, cudaStream_t st) {
  if (p.dsinks == nullptr || p.sinks == nullptr || p.seqlen_q == 0 || p.batch == 0) return 0;
  const int chunks = min((p.seqlen_q + 4095) / 4096, 64);
  sink_grad<<<dim3((unsigned)(p.batch * p.heads_q), (unsigned)chunks), 256, 0, st>>>(p);
  return cudaGetLastError();
}

}  // namespace lab::sm90::bwd
