// The P V step of the tensor-core decode kernels (decode v02, v03), once.
#pragma once
#include <stdint.h>

#include "common/decode_util.cuh"
#include "common/mma.cuh"
#include "common/paged.cuh"
#include "common/params.h"

namespace lab::decode {

// Which rows a pass-1 CTA of decode v02/v03 owns: block x = (b h_kv, split, row group) with the row group
// fastest; its kRows query rows start at row0 of the rows_total (= group * q_len) rows of KV head h_kv, and
// `rows` of them exist. A warp's mma fragment rows are gid and gid + 8, its column pair tig.
struct RowBlock {
  int split, b, h_kv, row0, rows, rg;
};
template <int kRows>
__device__ __forceinline__ RowBlock row_block(const DecodeParams& p, int rows_total, int row_groups) {
  RowBlock blk;
  blk.rg = blockIdx.x % row_groups;
  blk.split = (blockIdx.x / row_groups) % p.num_splits;
  const int bh = blockIdx.x / (row_groups * p.num_splits);
  blk.b = bh / p.heads_kv;
  blk.h_kv = bh % p.heads_kv;
  blk.row0 = blk.rg * kRows;
  blk.rows = min(kRows, rows_total - blk.row0);
  return blk;
}

// The ldmatrix lane rows and columns of a warp's 16 keys of a K/V tile (decode v02, v03): K (non-trans,
// B of S = Q K^T): m0, m1 keys 0-7, m2, m3 keys 8-15, m1, m3 dims +8; V (trans, B of O += P V): m1, m3
// keys 8-15, m2, m3 dims +8.
struct WarpKVLanes {
  int k_key, k_col, v_key, v_col;
};
__device__ __forceinline__ WarpKVLanes warp_kv_lanes(int warp, int lane) {
  return {warp * 16 + (lane & 7) + ((lane >> 4) << 3), ((lane >> 3) & 1) * 8,
          warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), (lane >> 4) * 8};
}

// A lane's ldmatrix row in the ring, and where its k-step kk (16 elements: two 16-byte chunks) starts. On a padded
// ring the lane is a pointer and the step an offset; a ring of another layout (common/decode_swizzle.cuh) passes its
// own lane type with a lane_at of its own, found by argument-dependent lookup.
template <class T>
__device__ __forceinline__ const T* lane_at(const T* lane, int kk) { return lane + kk * 16; }

// S = Q K^T for one warp's 16 keys (decode v02, v03): s[nt] covers keys 8 nt .. 8 nt + 7; k_lane is this
// lane's ldmatrix row of K (k_key row, k_col column).
template <class T, int kKSteps, class Lane>
__device__ __forceinline__ void warp_qk(float (&s)[2][4], const uint32_t (&qf)[kKSteps][4], Lane k_lane) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t kb[4];
    ldmatrix_x4(kb, smem_u32(lane_at(k_lane, kk)));
    mma_16816<T>(s[0], qf[kk], kb[0], kb[1]);
    mma_16816<T>(s[1], qf[kk], kb[2], kb[3]);
  }
}

// Wide heads (D > 128, decode v02, v03): Q stays in shared memory, not in registers. O takes D / 2 fp32 registers
// per thread and Q's A fragments D / 4 more: at D 256 that is 192 before any address, and v02 spilled 228 bytes.
// stage_q_rows writes the block's 16 query rows (rows past `rows` zero) into sQ, rows kStride elements apart, by
// 16-byte loads; the caller's next block barrier publishes them (the ring's first ring_step).
template <class T, int D, int kThreads, int kStride>
__device__ __forceinline__ void stage_q_rows(T* sQ, const DecodeParams& p, int b, int h_kv, int group, int row0,
                                             int rows, int tid) {
  constexpr int kVecs = D / 8;
  for (int i = tid; i < 16 * kVecs; i += kThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) {
      const int rr = row0 + r;
      v = __ldg(reinterpret_cast<const uint4*>(static_cast<const T*>(p.q) + b * p.q_stride[0] +
                                               (h_kv * group + rr / p.q_len) * p.q_stride[1] +
                                               (rr % p.q_len) * p.q_stride[2] + c));
    }
    *reinterpret_cast<uint4*>(sQ + r * kStride + c) = v;
  }
}

// The Q of a block's 16 rows for the tile step (decode v03, v05 and the warp ring): Cfg::kQInSmem (D > 128) stages
// the rows in sQ (stage_q_rows; kPublish: a barrier here publishes them, where no ring step's barrier follows), else
// each warp loads its A fragments into qf (lab::paged::load_q_frags); and each fragment row's bottom-right causal key
// limit in the split (lab::paged::causal_keys).
template <typename T, int D, class Cfg, bool kPublish>
__device__ __forceinline__ void load_q_rows(uint32_t (&qf)[Cfg::kQInSmem ? 1 : Cfg::kKSteps][4], int (&row_keys)[2],
                                            T* sQ, const DecodeParams& p, int b, int h_kv, int group, int row0,
                                            int rows, int len, int key_begin, int n_keys, int tid, int gid, int tig) {
  if constexpr (Cfg::kQInSmem) {
    stage_q_rows<T, D, Cfg::kThreads, Cfg::kStride>(sQ, p, b, h_kv, group, row0, rows, tid);
    if constexpr (kPublish) __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half)
      row_keys[half] = lab::paged::causal_keys(p.causal, len, p.q_len, (row0 + gid + 8 * half) % p.q_len, key_begin,
                                               n_keys);
  } else {
    lab::paged::load_q_frags<T, Cfg::kKSteps>(qf, row_keys, p, b, h_kv, group, row0, rows, len, key_begin, n_keys,
                                              gid, tig);
  }
}

// S = Q K^T as warp_qk, with Q's A fragment of each k-step read by ldmatrix from the staged rows: lanes 0-15 give
// rows 0-15 at column 0, lanes 16-31 the same rows at column 8 (a0 rows 0-7, a1 rows 8-15, a2 / a3 the next 8
// columns). q_lane = sQ + (lane % 16) * kStride + (lane / 16) * 8.
template <class T, int kKSteps>
__device__ __forceinline__ void warp_qk_smem(float (&s)[2][4], const T* q_lane, const T* k_lane) {
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    uint32_t qa[4], kb[4];
    ldmatrix_x4(qa, smem_u32(q_lane + kk * 16));
    ldmatrix_x4(kb, smem_u32(k_lane + kk * 16));
    mma_16816<T>(s[0], qa, kb[0], kb[1]);
    mma_16816<T>(s[1], qa, kb[2], kb[3]);
  }
}

// O += P V for one warp's 16 keys. O is rescaled by alpha (per row half) first, but only when some row max
// of the warp moved: alpha is exactly 1 otherwise (exp2f(0)), and the vote keeps the branch warp-uniform.
// pa: P as the A fragment; v_lane: this lane's ldmatrix.trans row of V (v_ld_key row, v_ld_col column);
// two n-tiles of 8 dims per ldmatrix.x4.trans.
template <class T, int kDTiles, bool kLazy = true, class Lane>
__device__ __forceinline__ void rescale_pv(float (&acc)[kDTiles][4], const float (&alpha)[2], const uint32_t (&pa)[4],
                                           Lane v_lane) {
  if (!kLazy || __any_sync(kFullMask, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < kDTiles; ++i) {
      acc[i][0] *= alpha[0];
      acc[i][1] *= alpha[0];
      acc[i][2] *= alpha[1];
      acc[i][3] *= alpha[1];
    }
  }
#pragma unroll
  for (int dp = 0; dp < kDTiles / 2; ++dp) {
    uint32_t vb[4];
    ldmatrix_x4_trans(vb, smem_u32(lane_at(v_lane, dp)));
    mma_16816<T>(acc[2 * dp], pa, vb[0], vb[1]);
    mma_16816<T>(acc[2 * dp + 1], pa, vb[2], vb[3]);
  }
}

// The end of pass 1 (decode v02, v03): the kWarps warps' (m, l, O) of each of the block's `rows` query rows,
// left by every warp in shared memory (sO [warp][kRows][D] fp32, sM and sL [warp][kRows], m in log2 units),
// merged row by row into O (one split: the output, in the input dtype) or into the split's fp32 partial O
// and LSE. Query row row0 + r of KV head h_kv is head h_kv * group + (row0 + r) / q_len, token
// (row0 + r) % q_len. Each thread takes column pairs tid, tid + kThreads, ...
template <class T, int kWarps, int kRows, int D, int kThreads>
__device__ __forceinline__ void merge_warps_store(const float* sO, const float* sM, const float* sL, const DecodeParams& p,
                                                  int rows, int row0, int b, int h_kv, int group, int split, int tid) {
  constexpr int kPairs = D / 2;
  for (int idx = tid; idx < rows * kPairs; idx += kThreads) {
    const int r = idx / kPairs;
    const int col = 2 * (idx % kPairs);
    float m_max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, sM[w * kRows + r]);
    float l = 0.f, o0 = 0.f, o1 = 0.f;
    if (m_max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = exp2f(sM[w * kRows + r] - m_max);  // a warp that saw no key: 0
        const float2 o = *reinterpret_cast<const float2*>(sO + (w * kRows + r) * D + col);
        l = fmaf(f, sL[w * kRows + r], l);
        o0 = fmaf(f, o.x, o0);
        o1 = fmaf(f, o.y, o1);
      }
    }
    const int rr = row0 + r;
    const int h = h_kv * group + rr / p.q_len;
    const int tok = rr % p.q_len;
    // A sink joins the row's final denominator: here when this split is the only one, else in the combine
    // (common/decode_masks.cuh). LAB_DECODE_BUG_SINK_PER_SPLIT, the wrong build, adds it to every split's partial.
#ifdef LAB_DECODE_BUG_SINK_PER_SPLIT
    if (p.sinks != nullptr) {
#else
    if (p.sinks != nullptr && p.num_splits == 1) {
#endif
      const float sink = __ldg(p.sinks + h) * kLog2e;
      const float m_new = fmaxf(m_max, sink);
      const float f = exp2f(m_max - m_new);  // m_max = -inf (no key): 0
      l = fmaf(l, f, exp2f(sink - m_new));
      o0 *= f;
      o1 *= f;
      m_max = m_new;
    }
    // l == 0: no key seen (an empty split, a bad page table, causal) and no sink: O = 0, LSE = -inf.
    const float inv_l = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? (m_max + log2f(l)) * kLn2 : -INFINITY;
    const int64_t out_row = (static_cast<int64_t>(b) * p.heads_q + h) * p.q_len + tok;
    if (p.num_splits == 1) {
      T* dst = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + tok * p.o_stride[2] + col;
      *reinterpret_cast<uint32_t*>(dst) = Elem<T>::from_float2(o0 * inv_l, o1 * inv_l);
      if (p.lse != nullptr && col == 0) p.lse[out_row] = lse;
    } else {
      const int64_t part = out_row * p.num_splits + split;
      *reinterpret_cast<float2*>(p.partial_o + part * D + col) = make_float2(o0 * inv_l, o1 * inv_l);
      if (col == 0) p.partial_lse[part] = lse;
    }
  }
}

}  // namespace lab::decode
