// The mma.sync backward's vocabulary (bwd v01, bwd v09): ldmatrix addressing of row-major tiles with a padded
// pitch, two products per k-step, S and dP of a warp's 16 rows, the cp.async tile load, the fp32 dQ
// accumulation by atomics, and the dQ convert pass. Tiles are row-major in shared memory with a pitch `ld`
// (elements) that is a multiple of 8 plus 8: 16 bytes past a multiple of 128 keeps ldmatrix rows conflict-free.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/launch.h"
#include "common/mma.cuh"
#include "common/params.h"

namespace lab::bwd {

// ---------------------------------------------------------------- ldmatrix addressing
// Four operand patterns, i = lane / 8 (which 8x8 matrix this lane addresses), r = lane % 8.
__device__ __forceinline__ uint32_t tile_addr(const void* tile, int ld, int row, int col) {
  return smem_u32(tile) + (uint32_t)(row * ld + col) * 2u;
}
// A (16 x 16) from a tile stored [m][k]: regs a0..a3.
__device__ __forceinline__ uint32_t addr_a(const void* t, int ld, int m0, int k0, int lane) {
  return tile_addr(t, ld, m0 + ((lane >> 3) & 1) * 8 + (lane & 7), k0 + (lane >> 4) * 8);
}
// A (16 x 16) from a tile stored [k][m], with ldmatrix .trans.
__device__ __forceinline__ uint32_t addr_a_trans(const void* t, int ld, int m0, int k0, int lane) {
  return tile_addr(t, ld, k0 + (lane >> 4) * 8 + (lane & 7), m0 + ((lane >> 3) & 1) * 8);
}
// B for two n8 tiles (n0, n0 + 8) x k16 from a tile stored [n][k]: regs (b0, b1) of each tile.
__device__ __forceinline__ uint32_t addr_b_nk(const void* t, int ld, int n0, int k0, int lane) {
  return tile_addr(t, ld, n0 + (lane >> 4) * 8 + (lane & 7), k0 + ((lane >> 3) & 1) * 8);
}
// B for two n8 tiles from a tile stored [k][n], with ldmatrix .trans.
__device__ __forceinline__ uint32_t addr_b_kn_trans(const void* t, int ld, int n0, int k0, int lane) {
  return tile_addr(t, ld, k0 + ((lane >> 3) & 1) * 8 + (lane & 7), n0 + (lane >> 4) * 8);
}

// One pair of n8 tiles (n, n + 1) of two products at once: c1 += a1 B1 and c2 += a2 B2, B1 and B2 loaded
// with ldmatrix.x4 (kTrans: .trans) from the smem addresses b1 and b2.
template <class T, bool kTrans, int kN1, int kN2>
__device__ __forceinline__ void mma_pair_x2(float (&c1)[kN1][4], float (&c2)[kN2][4], int n, const uint32_t (&a1)[4],
                                            const uint32_t (&a2)[4], uint32_t b1, uint32_t b2) {
  uint32_t f1[4], f2[4];
  if constexpr (kTrans) {
    ldmatrix_x4_trans(f1, b1);
    ldmatrix_x4_trans(f2, b2);
  } else {
    ldmatrix_x4(f1, b1);
    ldmatrix_x4(f2, b2);
  }
  mma_16816_x2<T>(c1, n, a1, f1);
  mma_16816_x2<T>(c2, n, a2, f2);
}

// Both products a step recomputes, for one warp's 16 rows m0.. of its A tiles: s = A_s B_s^T and
// dp = A_dp B_dp^T (kN n8 tiles: rows of the B tiles), over D; every tile row-major with pitch ld. A K/V
// CTA: S^T = K_w Q^T and dP^T = V_w dO^T; a dQ CTA: S = Q_w K^T and dP = dO_w V^T.
template <class T, int D, int kN>
__device__ __forceinline__ void s_dp_tile(float (&s)[kN][4], float (&dp)[kN][4], const void* a_s, const void* a_dp,
                                          int m0, const void* b_s, const void* b_dp, int ld, int lane) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t as[4], ad[4];
    ldmatrix_x4(as, addr_a(a_s, ld, m0, kk * 16, lane));
    ldmatrix_x4(ad, addr_a(a_dp, ld, m0, kk * 16, lane));
#pragma unroll
    for (int jn = 0; jn < kN / 2; ++jn)
      mma_pair_x2<T, false>(s, dp, 2 * jn, as, ad, addr_b_nk(b_s, ld, jn * 16, kk * 16, lane),
                            addr_b_nk(b_dp, ld, jn * 16, kk * 16, lane));
  }
}

// ROWS x D tile of a (B, H, S, D) tensor into smem (pitch LD) by kThreads threads, rows >= seqlen zero-filled.
template <class T, int D, int ROWS, int LD, int kThreads>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t row_stride, int row0, int seqlen, int tid) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int c = tid; c < ROWS * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool ok = row0 + r < seqlen;
    cp_async_16(smem_u32(dst + r * LD + col), src + (ok ? (int64_t)(row0 + r) * row_stride : 0) + col, ok);
  }
}

// The same load with each thread's copies at fixed row steps: kRows rows a pass (a power of two of whole rows; at
// D = 192 the last 64 of 256 threads copy nothing), so a thread's addresses are one base plus constants, not a
// division per 16 bytes as in the strided loop above (which left ~400 address instructions a step in bwd v09).
template <class T, int D, int ROWS, int LD, int kThreads>
__device__ __forceinline__ void load_tile_rows(T* dst, const T* src, int64_t row_stride, int row0, int seqlen,
                                               int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kRows = kThreads / kChunks >= 16 ? 16 : kThreads / kChunks >= 8 ? 8 : kThreads / kChunks >= 4 ? 4 : 1;
  static_assert(ROWS % kRows == 0, "whole passes of kRows rows");
  if (kRows * kChunks < kThreads && tid >= kRows * kChunks) return;
  const int r = tid / kChunks, col = (tid % kChunks) * 8;
  const uint32_t d0 = smem_u32(dst + r * LD + col);
  const T* s0 = src + (int64_t)(row0 + r) * row_stride + col;
#pragma unroll
  for (int i = 0; i < ROWS / kRows; ++i) {
    const bool ok = row0 + r + i * kRows < seqlen;
    cp_async_16(d0 + (uint32_t)(i * kRows * LD * sizeof(T)), ok ? s0 + (int64_t)i * kRows * row_stride : src, ok);
  }
}

template <class T>
__device__ __forceinline__ void store2(T* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<T>(a, b);
}

// P^T and dS^T of a warp's 16 keys (rows) x kN n8 tiles of queries, in place: s (S^T) becomes P^T = exp2(s * c -
// LSE_log2[query]), dp (dP^T) becomes dS^T = P^T (dP^T - Delta[query]). l2 / del are this step's LSE * log2 e and
// Delta rows from column col0; key0: the warp's first key (rows key0 + g, + 8), q0: the step's first query. Masked
// elements (causal, queries >= S_q, keys >= S_k) are selected to 0, only where need_mask says the tile can hold one.
template <int kN>
__device__ __forceinline__ void p_ds_keys_as_rows(float (&s)[kN][4], float (&dp)[kN][4], float c, const float* l2,
                                                  const float* del, int col0, bool need_mask, int key0, int q0, int g,
                                                  int t, const AttnBwdParams& p) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + j * 8 + 2 * t + (e & 1);
      float pv = fast_exp2(fmaf(s[j][e], c, -l2[col]));
      if (need_mask) {
        const int key = key0 + g + (e >> 1) * 8, qi = q0 + col;
        if (!(qi < p.seqlen_q && key < p.seqlen_k && (!p.causal || key <= qi))) pv = 0.f;
      }
      s[j][e] = pv;
      dp[j][e] = pv * (dp[j][e] - del[col]);
    }
}

// The epilogue of a K/V CTA: a warp's dK (times the scale) and dV rows key, key + 8 (those < S_k), kN n8 tiles of
// columns from col0, straight from the accumulators.
template <class T, int kN>
__device__ __forceinline__ void store_dk_dv(const AttnBwdParams& p, int b, int hkv, int key, int col0, int t,
                                            const float (&dk)[kN][4], const float (&dv)[kN][4]) {
  T* dkg = static_cast<T*>(p.dk) + b * p.dk_stride[0] + hkv * p.dk_stride[1];
  T* dvg = static_cast<T*>(p.dv) + b * p.dv_stride[0] + hkv * p.dv_stride[1];
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int col = col0 + n * 8 + 2 * t;
    if (key < p.seqlen_k) {
      store2<T>(dkg + key * p.dk_stride[2] + col, dk[n][0] * p.scale, dk[n][1] * p.scale);
      store2<T>(dvg + key * p.dv_stride[2] + col, dv[n][0], dv[n][1]);
    }
    if (key + 8 < p.seqlen_k) {
      store2<T>(dkg + (key + 8) * p.dk_stride[2] + col, dk[n][2] * p.scale, dk[n][3] * p.scale);
      store2<T>(dvg + (key + 8) * p.dv_stride[2] + col, dv[n][2], dv[n][3]);
    }
  }
}

// One m16n8 accumulator tile (rows r0, r0 + 8; columns col0 .. col0 + 7) added into the fp32 dQ rows (pitch D).
// kRed 4 on sm_90: lanes t and t^1 swap halves so each holds 4 consecutive columns of one row, then one 16-byte
// red.global.add.v4.f32 per lane: a quarter of the scalar atomics. Else (and on sm_80) scalar atomicAdd.
template <int kRed>
__device__ __forceinline__ void add_dq(float* dqa, int r0, int col0, int t, int seqlen_q, int D, const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kRed == 4) {
    const bool odd = t & 1;
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
    const int row = odd ? r0 + 8 : r0;
    const int col = col0 + 2 * (t & ~1);
    const float v0 = odd ? x0 : c[0], v1 = odd ? x1 : c[1], v2 = odd ? c[2] : x0, v3 = odd ? c[3] : x1;
    if (row < seqlen_q)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dqa + (int64_t)row * D + col), "f"(v0),
                   "f"(v1), "f"(v2), "f"(v3)
                   : "memory");
    return;
  }
#endif
  const int col = col0 + 2 * t;
  if (r0 < seqlen_q) {
    atomicAdd(dqa + (int64_t)r0 * D + col, c[0]);
    atomicAdd(dqa + (int64_t)r0 * D + col + 1, c[1]);
  }
  if (r0 + 8 < seqlen_q) {
    atomicAdd(dqa + (int64_t)(r0 + 8) * D + col, c[2]);
    atomicAdd(dqa + (int64_t)(r0 + 8) * D + col + 1, c[3]);
  }
}

// dQ = scale * dq_accum, cast to T (the atomic mode's last launch), grid-stride over pairs of columns.
template <class T, int D>
__global__ void __launch_bounds__(256) bwd_convert(const AttnBwdParams p) {
  const int64_t pairs = (int64_t)p.batch * p.heads_q * p.seqlen_q * (D / 2);
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < pairs;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = idx / (D / 2);
    const int col = (int)(idx % (D / 2)) * 2;
    const int i = (int)(row % p.seqlen_q);
    const int64_t bh = row / p.seqlen_q;
    const int b = (int)(bh / p.heads_q), h = (int)(bh % p.heads_q);
    const float2 a = *reinterpret_cast<const float2*>(p.dq_accum + row * D + col);
    store2<T>(static_cast<T*>(p.dq) + b * p.dq_stride[0] + h * p.dq_stride[1] + i * p.dq_stride[2] + col,
              a.x * p.scale, a.y * p.scale);
  }
}

// The grid of bwd_convert: 256 threads a block, at most 65536 blocks (grid-stride beyond).
inline unsigned convert_blocks(const AttnBwdParams& p, int D) {
  const int64_t blocks = ((int64_t)p.batch * p.heads_q * p.seqlen_q * (D / 2) + 255) / 256;
  return (unsigned)(blocks < 65536 ? blocks : 65536);
}

// A backward kernel's launch, with its shared-memory opt-in once per device rather than on every launch.
template <auto Kernel>
cudaError_t launch_kernel(dim3 grid, int threads, int smem, cudaStream_t st, const AttnBwdParams& p) {
  if (const cudaError_t err = lab::allow_smem_once<Kernel>(smem, lab::current_device())) return err;
  Kernel<<<grid, threads, smem, st>>>(p);
  return cudaGetLastError();
}

}  // namespace lab::bwd
