// Parts of the FP8 (e4m3) Hopper forward (fwd/v13_fp8.cu, sm_90a): its params, its tensor maps, the K-major
// e4m3 descriptors, the V^T pass that puts V's keys in the order the P fragments need, one warpgroup's online
// softmax with P scaled for e4m3, and P's packing into wgmma k32 A fragments.
//
// Layouts (one warp of the warpgroup, g = lane / 4, t = lane % 4):
// - The fp32 accumulator of m64nN (S, and O): d[4i + 0..1] = row g, columns 8i + 2t + {0, 1};
//   d[4i + 2..3] = row g + 8, the same columns (common/hopper/wgmma.cuh).
// - The e4m3 A operand of m64nNk32 from registers: four 32-bit words of four bytes; word 0 = row g, columns
//   4t..4t+3; word 1 = row g + 8, the same columns; words 2, 3 = rows g, g + 8 at columns 16 + 4t..16 + 4t + 3
//   (the mma.sync m16n8k32 8-bit A layout; the lowest byte holds the lowest column).
// A thread's S accumulator holds, per 32-key step, columns {2t, 2t+1, 8+2t, 9+2t, 16+2t, ...} of its rows, and
// the A layout wants {4t..4t+3, 16+4t..}: different sets. Rather than moving bytes between lanes (FA3's
// permute_Cregs_fp8 swaps 64-bit pairs and relies on the V transpose's order), the V^T pass stores the keys
// of each 32-key block permuted, so that A column k multiplies key key_of_column(k): P packs in registers
// with no shuffle (pack_p_e4m3 below: word 0 = d[0], d[1], d[4], d[5] of the step, word 1 = d[2], d[3], d[6],
// d[7], word 2 = d[8], d[9], d[12], d[13], word 3 = d[10], d[11], d[14], d[15]).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common/hopper/attn_fwd_sm90.cuh"
#include "common/hopper/wgmma_fp8_ops.cuh"

// The FP8 forward's call (lab/fp8/op.py fills it through ctypes, field for field). Strides in elements
// (= bytes for e4m3; bf16 elements for o), batch / head / seq; the head-dim stride is 1.
typedef struct AttnFp8Params {
  const void* q;                 // e4m3 (B, H_q, S_q, D)
  const void* k;                 // e4m3 (B, H_kv, S_k, D)
  const void* v;                 // e4m3 (B, H_kv, S_k, D), read by the V^T pass only
  void* vt;                      // workspace e4m3 (B, H_kv, D, vt_cols) contiguous: V^T, keys permuted, zero tail
  void* o;                       // bf16 (B, H_q, S_q, D)
  float* lse;                    // optional (B, H_q, S_q) contiguous, natural log; NULL to skip
  const float* q_descale;        // x ~= x_fp8 * descale (FA3); NULL: 1
  const float* k_descale;
  const float* v_descale;
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int64_t descale_stride[3][2];  // (batch, head) strides of q / k / v descale, 0 for one value per tensor
  int q_descale_by_kv;           // q_descale is indexed by KV head (FA3's (B, H_kv)), else by query head
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  int vt_cols;                   // keys per V^T row: S_k rounded up to a multiple of 128
  float scale;                   // softmax scale, resolved (1/sqrt(D) by default)
  float p_scale;                 // P is stored as e4m3(P * p_scale) before P V (lab/fp8/emulate.py's P_SCALE)
  int causal;                    // top-left, as AttnFwdParams
  int* tile_counter;             // optional: one int the V^T pass zeroes, the dynamic persistent grid's next tile
} AttnFp8Params;

namespace lab::sm90 {

// ---------------------------------------------------------------- host

// A 4-D (inner, rows, H, B) byte tensor map with a (box_inner, box_rows) box, swizzled by the box's row
// bytes (128 or 64: the span the K-major descriptors below assume). Strides in bytes (batch, head, row).
inline bool make_fp8_map(CUtensorMap* map, const void* base, int inner, int rows, int H, int B,
                         const int64_t stride[3], int box_inner, int box_rows) {
  EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr || (box_inner != 128 && box_inner != 64)) return false;
  const int64_t row = rows > 1 ? stride[2] : inner;  // a size-1 dimension's stride is never used
  const int64_t head = H > 1 ? stride[1] : row * rows;
  const int64_t batch = B > 1 ? stride[0] : head * H;
  const cuuint64_t dims[4] = {(cuuint64_t)inner, (cuuint64_t)rows, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {(cuuint64_t)row, (cuuint64_t)head, (cuuint64_t)batch};
  const cuuint32_t box[4] = {(cuuint32_t)box_inner, (cuuint32_t)box_rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_inner == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The launcher's checks: a negative LAB_E_* code, 1 when there is nothing to write, 0 to go on. TMA reads Q, K
// and V^T and the V^T pass reads V in 4-byte words: 16-byte aligned bases, strides in multiples of 16 bytes.
inline int check_fp8_params(const AttnFp8Params* p) {
  if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256) return LAB_E_HEAD_DIM;
  if (p->batch < 0 || p->heads_q <= 0 || p->heads_kv <= 0 || p->heads_q % p->heads_kv || p->seqlen_q < 0 ||
      p->seqlen_k < 0 || p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30))
    return LAB_E_SHAPE;
  if (p->vt_cols < 128 || p->vt_cols < p->seqlen_k || p->vt_cols % 128 != 0) return LAB_E_SHAPE;
  const void* bases[5] = {p->q, p->k, p->v, p->vt, p->o};
  for (const void* ptr : bases)
    if (!aligned16(ptr)) return LAB_E_SHAPE;
  for (int i = 0; i < 3; ++i)
    if (p->q_stride[i] % 16 || p->k_stride[i] % 16 || p->v_stride[i] % 16 || p->o_stride[i] % 8) return LAB_E_SHAPE;
  if (p->batch == 0 || p->seqlen_q == 0) return 1;
  return 0;
}

// ---------------------------------------------------------------- V^T and its key order

// The key that A column k (0..31) of a k32 step multiplies: P's accumulator columns in the order pack_p_e4m3
// puts them into A (see the header). 0, 1, 8, 9, 2, 3, 10, 11, ..., 6, 7, 14, 15, then the same + 16.
__host__ __device__ __forceinline__ int key_of_column(int k) {
  const int r = k & 15, t = r >> 2, j = r & 3;
  return (k & 16) + (j < 2 ? 2 * t + j : 8 + 2 * t + j - 2);
}

// V^T: vt[b, hkv, d, n] = V[b, hkv, key, d] with key = 32 (n / 32) + key_of_column(n % 32), 0 for key >= S_k.
// One CTA: 128 keys x 64 columns through shared memory, coalesced 4-byte reads and writes.
// grid (vt_cols / 128, B * H_kv, D / 64), 256 threads.
__device__ __forceinline__ void zero_tile_counter(const AttnFp8Params& p) {  // the forward's kernel runs after
  if (p.tile_counter != nullptr && blockIdx.x + blockIdx.y + blockIdx.z + threadIdx.x == 0) *p.tile_counter = 0;
}

__global__ void __launch_bounds__(256) fp8_vt_kernel(const AttnFp8Params p) {
  __shared__ uint8_t tile[64][128 + 4];
  const int kb = blockIdx.x, bh = blockIdx.y, d0 = blockIdx.z * 64, tid = threadIdx.x;
  zero_tile_counter(p);
  const int b = bh / p.heads_kv, hkv = bh % p.heads_kv;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + b * p.v_stride[0] + hkv * p.v_stride[1] + d0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int idx = tid + 256 * i, key = idx / 16, w = idx % 16, gk = kb * 128 + key;
    const uint32_t x = gk < p.seqlen_k ? *reinterpret_cast<const uint32_t*>(v + gk * p.v_stride[2] + 4 * w) : 0u;
#pragma unroll
    for (int e = 0; e < 4; ++e) tile[4 * w + e][key] = (uint8_t)(x >> (8 * e));
  }
  __syncthreads();
  uint8_t* vt = static_cast<uint8_t*>(p.vt) + ((int64_t)bh * p.head_dim + d0) * p.vt_cols + kb * 128;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int idx = tid + 256 * i, d = idx / 32, w = idx % 32;
    uint32_t y = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = 4 * w + e;
      y |= (uint32_t)tile[d][(n & ~31) + key_of_column(n & 31)] << (8 * e);
    }
    *reinterpret_cast<uint32_t*>(vt + (int64_t)d * p.vt_cols + 4 * w) = y;
  }
}

// The same V^T through registers (LAB_FWD_FP8_VT = 2): lane = 8 b + 4 h + t of warp w owns the four keys
// 32 b + 16 h + {2t, 2t + 1, 2t + 8, 2t + 9} of a 128-key block, which are V^T columns 32 b + 16 h + 4t .. + 3
// (key_of_column), and 16 bytes of D (16 w .. 16 w + 15 of the CTA's 64): four 16-byte loads, a 4 x 4 byte
// transpose per word by eight byte permutes, and per d one 4-byte store at column 4 lane, so each store of a
// warp writes 128 contiguous bytes of a V^T row. No shared memory, no barrier; 16-byte loads where the pass
// above reads 4 bytes. grid (vt_cols / 128, B * H_kv, D / 64), 128 threads.
__global__ void __launch_bounds__(128) fp8_vt_regs_kernel(const AttnFp8Params p) {
  const int kb = blockIdx.x, bh = blockIdx.y, lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const int dc = blockIdx.z * 64 + 16 * w;  // this thread's first column of D
  zero_tile_counter(p);
  const int b = bh / p.heads_kv, hkv = bh % p.heads_kv;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + b * p.v_stride[0] + hkv * p.v_stride[1] + dc;
  const int key0 = kb * 128 + 32 * (lane / 8) + 16 * ((lane / 4) % 2) + 2 * (lane % 4);
  uint4 x[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const int gk = key0 + (c & 1) + 8 * (c >> 1);  // 2t, 2t + 1, 2t + 8, 2t + 9
    x[c] = gk < p.seqlen_k ? *reinterpret_cast<const uint4*>(v + (int64_t)gk * p.v_stride[2]) : make_uint4(0, 0, 0, 0);
  }
  uint8_t* vt = static_cast<uint8_t*>(p.vt) + ((int64_t)bh * p.head_dim + dc) * p.vt_cols + kb * 128 + 4 * lane;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t a = (&x[0].x)[q], bb = (&x[1].x)[q], c = (&x[2].x)[q], d = (&x[3].x)[q];
    const uint32_t ab_lo = __byte_perm(a, bb, 0x5140), ab_hi = __byte_perm(a, bb, 0x7362);  // a0 b0 a1 b1 / a2 b2 a3 b3
    const uint32_t cd_lo = __byte_perm(c, d, 0x5140), cd_hi = __byte_perm(c, d, 0x7362);
    const uint32_t out[4] = {__byte_perm(ab_lo, cd_lo, 0x5410), __byte_perm(ab_lo, cd_lo, 0x7632),
                             __byte_perm(ab_hi, cd_hi, 0x5410), __byte_perm(ab_hi, cd_hi, 0x7632)};
#pragma unroll
    for (int i = 0; i < 4; ++i) *reinterpret_cast<uint32_t*>(vt + (int64_t)(4 * q + i) * p.vt_cols) = out[i];
  }
}

// LAB_FWD_FP8_VT: 2 (default) the register pass, 1 the shared-memory pass (the same bytes; the register pass
// measured +0.3-0.8 % on the whole call, H200, outputs/driver_logs/20261129-h200-batch5-9c9667b/S).
#ifndef LAB_FWD_FP8_VT
#define LAB_FWD_FP8_VT 2
#endif
inline int launch_fp8_vt(const AttnFp8Params& p, cudaStream_t stream) {
  if ((int64_t)p.batch * p.heads_kv > 65535) return LAB_E_SHAPE;
  if (p.seqlen_k == 0) return 0;
  const dim3 grid(p.vt_cols / 128, p.batch * p.heads_kv, p.head_dim / 64);
#if LAB_FWD_FP8_VT == 2
  fp8_vt_regs_kernel<<<grid, 128, 0, stream>>>(p);
#else
  fp8_vt_kernel<<<grid, 256, 0, stream>>>(p);
#endif
  return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- device

// x as lane 0 has it, for a value that is the same in every lane of the warp by construction (a warp's or
// warpgroup's index, a word every lane loads from one shared-memory address). ptxas proves neither uniform, so the
// wgmma descriptors built from them leave the uniform datapath (an R2UR pair and a 64-bit vector add per wgmma) and
// a branch on them is one that might diverge. kOn false: x itself (the kernels' switches keep their builds before).
// Every lane must call it.
template <bool kOn = true, class T>
__device__ __forceinline__ T uniform_in_warp(T x) {
  if constexpr (kOn) return __shfl_sync(0xffffffffu, x, 0);
  return x;
}

// Descriptor of k32 step kk of a K-major e4m3 tile: `rows` rows per column block of kRowBytes (128: 128-byte
// swizzle, 64: 64-byte swizzle, the TMA box's row), a step = 32 bytes along the row. SBO = 8 rows.
template <int kRowBytes>
__device__ __forceinline__ uint64_t desc_e4m3(uint32_t tile, int rows, int kk) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "swizzle span");
  constexpr uint64_t kMode = kRowBytes == 128 ? 1 : 2;
  const uint32_t addr = tile + (kk * 32 / kRowBytes) * rows * kRowBytes + (kk * 32) % kRowBytes;
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)((8 * kRowBytes) >> 4) << 32) |
         (kMode << 62);
}

// desc_e4m3(tile, kRows, kk) from desc_e4m3(tile, kRows, 0) = base: the start-address field (bits 0-13, byte
// address / 16) moves by step kk's byte offset / 16, a compile-time constant, so a k32 step costs one add instead
// of the address arithmetic above; no carry leaves the field while the tile lies below 256 KiB (shared memory is
// 228 KiB). Bit for bit the same descriptor.
template <int kRowBytes, int kRows>
__device__ __forceinline__ uint64_t desc_e4m3_step(uint64_t base, int kk) {
  return base + (uint64_t)((((kk * 32) / kRowBytes) * kRows * kRowBytes + (kk * 32) % kRowBytes) >> 4);
}

// Four floats to four e4m3 bytes (a lowest), round to nearest, saturating (P * p_scale <= p_scale <= 448).
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));  // the second source: low byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
  return (uint32_t)lo | ((uint32_t)hi << 16);
}

// P (fp32 accumulator layout, already times p_scale) as e4m3 A fragments, one per k32 step (header: layouts).
template <int BC>
__device__ __forceinline__ void pack_p_e4m3(const float (&s)[BC / 2], uint32_t (&pa)[BC / 32][4]) {
#pragma unroll
  for (int kk = 0; kk < BC / 32; ++kk) {
    const float* d = s + 16 * kk;
    pa[kk][0] = e4m3x4(d[0], d[1], d[4], d[5]);
    pa[kk][1] = e4m3x4(d[2], d[3], d[6], d[7]);
    pa[kk][2] = e4m3x4(d[8], d[9], d[12], d[13]);
    pa[kk][3] = e4m3x4(d[10], d[11], d[14], d[15]);
  }
}

// One thread's online softmax over a 64 x BC score tile (rows g, g + 8 of its warp). c = scale * dq * dk *
// log2 e. st.m holds the running max minus log2(p_scale) (the exp2 offset), so P = exp2(x - st.m) is already
// P * p_scale and l sums P * p_scale: O = acc / l needs no p_scale, and LSE = (st.m + log2 l) ln 2 is exact
// (common normalise_o). kMask: keys >= seqlen_k and (causal) keys past the row get -inf. kPoly > 0: every
// kPoly-th 8-column block takes exp2 on the FMA pipe (common exp2_poly, relative error 7.5e-5, far under
// e4m3's 2^-4 step) instead of the MUFU unit, which FP8's faster GEMMs leave as the bottleneck (FA4's trick).
// kFold (the caller takes it only for c > 0, which keeps the order of the scores): the max runs on the raw
// scores and the scale folds into the exponent, P = exp2(s * c - off) by one FFMA, one FMUL and one FADD less
// per score (common softmax_scores' kFold). kChains: a row's max and sum as kChains independent chains (with
// one, BC / 4 dependent FMNMX and FADD per row and thread), combined pairwise at the end.
#ifndef LAB_FWD_FP8_MASK_LIMIT
#define LAB_FWD_FP8_MASK_LIMIT 0
#endif
template <int BC, bool kMask, int kPoly = 0, bool kFold = false, int kChains = 1,
          bool kLimit = LAB_FWD_FP8_MASK_LIMIT != 0>
__device__ __forceinline__ void softmax_e4m3(float (&s)[BC / 2], RowState& st, float (&alpha)[2], float c,
                                             float log2_ps, int row0, int col0, int seqlen_k, bool causal) {
  static_assert(kChains >= 1 && (BC / 4) % kChains == 0, "kChains divides a row's BC / 4 value pairs");
  const int t = threadIdx.x % 4;
  // kMask: the first masked column of each of the thread's two rows, less the thread's first column, so that
  // each score compares its compile-time offset 8 i + (e & 1) against it (two registers for the whole tile)
  // (kLimit; else the column and row per score, as before: the same mask)
  int lim[2] = {0, 0};
  if constexpr (kMask && kLimit)
#pragma unroll
    for (int h = 0; h < 2; ++h) lim[h] = (causal ? min(seqlen_k, row0 + 8 * h + 1) : seqlen_k) - (col0 + 2 * t);
  float mx[2][kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) mx[0][k] = mx[1][k] = -INFINITY;
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = kFold ? s[4 * i + e] : s[4 * i + e] * c;
      if constexpr (kMask && kLimit) {
        if (8 * i + (e & 1) >= lim[e >> 1]) x = -INFINITY;  // col >= seqlen_k, or (causal) col > row
      } else if constexpr (kMask) {
        const int col = col0 + 8 * i + 2 * t + (e & 1), row = row0 + 8 * (e >> 1);
        if (col >= seqlen_k || (causal && col > row)) x = -INFINITY;
      }
      s[4 * i + e] = x;
      float& m = mx[e >> 1][(2 * i + (e & 1)) % kChains];
      m = fmaxf(m, x);
    }
  float off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int k = 1; k < kChains; ++k) mx[h][0] = fmaxf(mx[h][0], mx[h][k]);
    mx[h][0] = fmaxf(mx[h][0], __shfl_xor_sync(0xffffffffu, mx[h][0], 1));
    mx[h][0] = fmaxf(mx[h][0], __shfl_xor_sync(0xffffffffu, mx[h][0], 2));
    const float m_tile = kFold ? mx[h][0] * c : mx[h][0];     // -inf * c = -inf for c > 0
    const float m_new = fmaxf(st.m[h], m_tile - log2_ps);      // -inf stays -inf
    off[h] = m_new == -INFINITY ? 0.f : m_new;                 // a row with no key yet: P = 0, not NaN
    alpha[h] = fast_exp2(st.m[h] - off[h]);                    // m_old = -inf gives 0
    st.m[h] = m_new;
    st.l[h] *= alpha[h];
  }
  float sum[2][kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum[0][k] = sum[1][k] = 0.f;
  if constexpr (kChains == 1) {  // one chain runs on from l itself (the order of the sums before chains)
    sum[0][0] = st.l[0];
    sum[1][0] = st.l[1];
  }
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = kFold ? fmaf(s[4 * i + e], c, -off[e >> 1]) : s[4 * i + e] - off[e >> 1];
      const float pv = (kPoly > 0 && i % (kPoly > 0 ? kPoly : 1) == kPoly - 1) ? exp2_poly(x) : fast_exp2(x);
      s[4 * i + e] = pv;
      sum[e >> 1][(2 * i + (e & 1)) % kChains] += pv;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int w = 1; w < kChains; w *= 2)  // pairwise: log2(kChains) dependent adds
#pragma unroll
      for (int k = 0; k + w < kChains; k += 2 * w) sum[h][k] += sum[h][k + w];
    st.l[h] = kChains == 1 ? sum[h][0] : st.l[h] + sum[h][0];
  }
}

}  // namespace lab::sm90
