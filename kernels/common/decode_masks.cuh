// The masks of real models in split-K decoding (decode v03, v06-v08; DecodeParams' window, softcap and sinks fields,
// common/params.h; the rule is lab/masks/spec.py's, bottom-right as flash_attn_with_kvcache):
//   token i of q_len sits on key diag_i = len - q_len + i and sees keys j of [0, len) with
//     j >= diag_i - left (left >= 0)   and   j <= diag_i + right (right >= 0; causal caps right at 0);
//   softcap c > 0: the scaled score s becomes c * tanh(s / c) before the mask;
//   sink s_h (one logit per query head): joins the softmax's denominator, attends to nothing.
//
// Where each step sits:
//  * The window clips the cache on the device: split s of sequence b covers keys from the window's first key W_b
//    (the first row's left edge, rounded down to a 64-key tile so the page walks and the swizzle keep their
//    alignment), not from 0, and the host plans the chunk over the window's span (left + q_len + 63 keys at most,
//    window_span) instead of the cache's capacity: a window only removes keys, splits and bytes. Lengths stay on the
//    device (graphs).
//  * Each row's key range [lo, hi) in the split replaces the causal limit; the tile step masks both ends
//    (common/decode_tile_step.cuh). A plain call has lo <= 0 and the same hi as before.
//  * Softcap acts on pass 1's scores. Sinks act only where the rows' splits meet: the combine's normaliser
//    (common/splitk_combine.cuh) or, with one split, pass 1's epilogue (decode_pv.cuh merge_warps_store), never a
//    split's partial (each split would then count the sink once: LAB_DECODE_BUG_SINK_PER_SPLIT is that wrong build).
//
// Measured (H200, bf16, Hq 32 / Hkv 8, q_len 1, B 8-32 x S 4096-16384, D 128 / 64, contiguous and pages of 64, GPU
// time, interleaved rounds; a batch shared with other jobs: outputs/driver_logs/20261129-h200-batch2-f58d500e62/T3):
// the plain kernel against its LAB_DECODE_NO_MASKS build 0.985-1.016x (noise); sinks 0.99-1.01x plain decode;
// window 4096 at S 16384 2.7-3.5x faster, window 128 (+ sinks, GPT-OSS) 3.6-28x faster; softcap 50 alone
// 0.87-0.99x with the first tanh (an exp and a divide), hence tanh.approx (softcap_tanh): 0.99-1.01x
// (outputs/driver_logs/20261129-h200-batch3-7152d73448/T3: 4 cells, also shared with other jobs).
//
// LAB_DECODE_NO_MASKS compiles the mask steps out of pass 1 (the window's first key, the rows' first keys, the
// softcap): the plain kernel as it was before them, the baseline of the A/B that shows a plain call did not slow
// down (lab/decode/mask_bench.py). The fields are then ignored; lab.ops never builds it.
#pragma once
#include <math.h>
#include <stdint.h>

#include "common/decode_util.cuh"
#include "common/paged.cuh"
#include "common/params.h"

namespace lab::decode {

constexpr int kWindowAlign = 64;  // the window's first key rounded down to whole 64-key tiles (BLOCK_N)

// Any mask set: the versions without mask steps (v01, v02, v04, v05) refuse such a call (LAB_E_MODE).
inline bool decode_masks_set(const DecodeParams* p) {
  return p != nullptr && (p->window != 0 || p->softcap != 0.f || p->sinks != nullptr);
}

// The keys the split plan covers: the cache's capacity, or with a left edge at most the window's span (its
// left + q_len keys, plus the tile rounding of its first key).
inline int window_span(const DecodeParams* p) {
  if (!p->window || p->window_left < 0) return p->seqlen_cache;
  const int64_t span = static_cast<int64_t>(p->window_left) + p->q_len + kWindowAlign - 1;
  return static_cast<int>(span < p->seqlen_cache ? span : p->seqlen_cache);
}

// The sequence's first key any of its rows sees, rounded down to a whole tile (0 without a left edge).
__device__ __forceinline__ int window_first_key(const DecodeParams& p, int len) {
#ifdef LAB_DECODE_NO_MASKS
  return 0;
#endif
  if (!p.window || p.window_left < 0) return 0;
  const int64_t first = static_cast<int64_t>(len) - p.q_len - p.window_left;
  return first <= 0 ? 0 : static_cast<int>(first) / kWindowAlign * kWindowAlign;
}

// split_keys (common/paged.cuh) from the window's first key on: the split's keys are [key_begin, key_begin +
// n_keys) of [W_b, len).
template <bool kPaged>
__device__ __forceinline__ lab::paged::SplitKeys window_split_keys(const DecodeParams& p, int b, int split,
                                                                   int chunk) {
  lab::paged::SplitKeys keys = lab::paged::split_keys<kPaged>(p, b, split, chunk);
  keys.key_begin += window_first_key(p, keys.len);
  keys.n_keys = max(0, min(keys.key_begin + chunk, keys.len) - keys.key_begin);
  return keys;
}

// Keys [lo, hi) of the split that query token tok sees, relative to the split's first key (hi capped at n_keys;
// hi <= lo: none). Without a window this is causal_keys' limit with lo = -key_begin.
__device__ __forceinline__ void row_key_range(const DecodeParams& p, int len, int tok, int key_begin, int n_keys,
                                              int& lo, int& hi) {
  const int64_t diag = static_cast<int64_t>(len) - p.q_len + tok;
  int64_t first = 0, last = p.causal ? diag : static_cast<int64_t>(len) - 1;
  if (p.window) {
    if (p.window_right >= 0) last = min(last, diag + p.window_right);
    if (p.window_left >= 0) first = max(first, diag - p.window_left);
  }
  hi = static_cast<int>(min(static_cast<int64_t>(n_keys), last + 1 - key_begin));
  lo = static_cast<int>(min(first - key_begin, static_cast<int64_t>(n_keys)));
}

// Both fragment rows' ranges of a 16-row block (rows row0 + gid and row0 + gid + 8; token = row % q_len).
__device__ __forceinline__ void block_row_ranges(const DecodeParams& p, int len, int row0, int gid, int key_begin,
                                                 int n_keys, int (&row_lo)[2], int (&row_keys)[2]) {
#ifdef LAB_DECODE_NO_MASKS  // the causal limit alone (load_q_rows wrote it), no first key
  row_lo[0] = row_lo[1] = INT32_MIN;
#else
#pragma unroll
  for (int half = 0; half < 2; ++half)
    row_key_range(p, len, (row0 + gid + 8 * half) % p.q_len, key_begin, n_keys, row_lo[half], row_keys[half]);
#endif
}

// The score map of pass 1: without softcap x * scale * log2 e; with it c * tanh(x * scale / c) * log2 e.
struct ScoreMap {
  float mul;       // the factor of a plain score (scale * log2 e), 1 when softcapped (cap_out holds it)
  float cap_in;    // scale / c, 0: no softcap
  float cap_out;   // c * log2 e
};
__device__ __forceinline__ ScoreMap score_map(const DecodeParams& p, float qk_scale) {
#ifdef LAB_DECODE_NO_MASKS
  const bool cap = false;
#else
  const bool cap = p.softcap > 0.f;
#endif
  return {cap ? 1.f : qk_scale, cap ? p.scale / p.softcap : 0.f, cap ? p.softcap * kLog2e : 0.f};
}

// tanh(y) by the SFU's tanh.approx.f32 (sm_75+; FlashAttention's softcap uses it too): relative error <= 2^-10.99
// over the whole range, so a capped score s keeps ~11 bits (the bf16 scores of the eager math keep 8). The first
// form, 1 - 2 / (e^{2|y|} + 1) from one __expf and a divide (two SFU ops and ~8 others a score), cost a softcapped
// call 1.5-13 % against plain decode on the H200 (outputs/driver_logs/20261129-h200-batch2-f58d500e62/T3).
__device__ __forceinline__ float softcap_tanh(float y) {
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(y));
  return t;
}

// Softcap a warp's 8 scores in place (a warp-uniform branch: a plain call skips it).
__device__ __forceinline__ void softcap_scores(float (&s)[2][4], const ScoreMap& map) {
#ifdef LAB_DECODE_NO_MASKS
  return;
#endif
  if (map.cap_in == 0.f) return;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = softcap_tanh(s[nt][e] * map.cap_in) * map.cap_out;
}

}  // namespace lab::decode
