// Changes: first version (FA1 order, scalar fp32).
// Compile and run (from the repo root): nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a tools/gpu/fwd_v01_main.cu kernels/fwd/v01_scalar.cu -o /tmp/v01 && /tmp/v01
//   (through torch: .venv/bin/python -m pytest -q tests/product/test_gpu.py; compile check: python -m lab compile)
// Measured: outputs/experiments/20261121-fwd-v01-baseline.json.
//
// v01_scalar: the "before" kernel. FlashAttention-1-style forward pass with
// scalar fp32 arithmetic on CUDA cores: no tensor cores, no async copies, no
// pipelining. It is slow on purpose and correct on purpose; every later
// version is measured against it and must agree with it.
//
// Algorithm (Dao et al. 2022, Algorithm 1, with the loops swapped so one CTA
// owns one query tile; the per-tile update is FA1's, normalised every step):
//   for the query tile Q_i (B_r = 64 rows) of one (batch b, head h):
//     m_i = -inf, l_i = 0, O_i = 0
//     for each key/value tile K_j, V_j (B_c = 64 rows) that Q_i can see:
//       S_ij   = scale * Q_i K_j^T                (masked entries = -inf)
//       m_new  = max(m_i, rowmax(S_ij))
//       P_ij   = exp(S_ij - m_new)
//       l_new  = exp(m_i - m_new) * l_i + rowsum(P_ij)
//       O_i    = diag(l_new)^-1 (diag(l_i exp(m_i - m_new)) O_i + P_ij V_j)
//       m_i, l_i = m_new, l_new
//     write O_i (already normalised) and LSE_i = m_i + log(l_i)
//   Natural exp (expf), as in the paper; FA2-style kernels fold scale*log2(e)
//   and use exp2 instead. FA1's paper order keeps O_i in HBM and rescales it
//   there (KV tiles outer); we keep it in registers, which changes the memory
//   traffic, not the arithmetic (lab/emulate.py emulates both orders).
//
// Launch: grid (ceil(Sq / B_r), heads_q, batch), block 256 threads (8 warps).
//   Thread t owns query row r = t / 4 of the tile; the 4 threads of a row sit
//   in one warp (row max / row sum are two xor-shuffles). Within a row, thread
//   g = t % 4 computes scores of keys g, g+4, ..., g+60 and owns output columns
//   4g + 16k .. 4g + 16k + 3 (k < D/16).
//   Dynamic shared memory, fp32: Q_i [B_r][D+4], one K_j/V_j buffer [B_c][D+4]
//   (K_j, then V_j into the same buffer), P_ij [B_r][B_c+4]:
//     D=16: 27,648 B   D=32: 35,840 B   D=64: 52,224 B   D=128: 84,992 B.
//
// Limits: head_dim 16, 32, 64, 128 (else LAB_E_HEAD_DIM); fp16 and bf16
//   (p->dtype; else LAB_E_DTYPE), fp32 accumulation everywhere; any Sq >= 1,
//   Sk >= 1 (partial tiles are masked; Sk == 0 gives LAB_E_SHAPE); any strides
//   and any element alignment (scalar global loads); heads_q % heads_kv == 0;
//   heads_q and batch <= 65535 (grid y/z).
//   Causal is SDPA's is_causal: query i sees key j iff j <= i (top-left), also
//   when Sq != Sk. Key tiles entirely right of the last query of the tile are
//   skipped.
//
// Why it is slow: every S and O entry is a chain of scalar FFMAs fed by
//   shared-memory loads (one LDS.128 per 4 FMAs in both products), so the
//   inner loops are bound by shared-memory bandwidth and FP32 issue, at a small
//   fraction of the tensor-core rate; loads are not overlapped with compute
//   (three __syncthreads per tile), and 64-row tiles give few CTAs for short
//   sequences.
//
// What changed from the previous version: nothing, this is the first.
//   Measured: outputs/experiments/20261121-fwd-v01-baseline.json (H100, 2026-11-21).
//
// Compile-time switches (each -D gives a distinct cached binary):
//   LAB_BUG_LAYOUT     the origin's class of bug: strides are ignored and every
//                      tensor is addressed as contiguous (B, H, S, D), i.e.
//                      ((b*H + h)*S + s)*D + d. Right for contiguous BHSD
//                      inputs, wrong for a (B,S,H,D) buffer viewed as
//                      (B,H,S,D) with x.transpose(1, 2).
//   LAB_BUG_NO_CAUSAL  the element-wise causal mask (j <= i) is dropped in every
//                      tile. Key tiles wholly above the diagonal are still
//                      skipped by the loop bound, so the damage is confined to
//                      the diagonal tiles: a query sees the "future" keys of
//                      its own diagonal tile, up to the end of that tile.
//   LAB_DEBUG_DUMP     when p->debug != NULL, (b=0, h=0) writes its fp32
//                      intermediates there. Needs Sq <= 64 and Sk <= 64 (one
//                      tile each; else LAB_E_SHAPE). Flat layout, row-major
//                      (offsets in floats, see lab_v01::V01DebugLayout):
//                        S [Sq][Sk] at 0                 scale*Q K^T, masked = -inf
//                        m [Sq]     at Sq*Sk             row max of S
//                        l [Sq]     at Sq*Sk + Sq        sum_j exp(S - m)
//                        P [Sq][Sk] at Sq*Sk + 2*Sq      exp(S - m) / l
//                        O [Sq][D]  at 2*Sq*Sk + 2*Sq    output before rounding
//                      total 2*Sq*Sk + 2*Sq + Sq*D floats. With p->debug ==
//                      NULL the debug build behaves like the normal one.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "common/launch.h"
#include "common/params.h"

// Debug dump layout (LAB_DEBUG_DUMP), offsets in floats into p->debug.
// Named (not anonymous) namespace: it documents the layout in every build
// without "declared but never referenced" warnings in the normal ones.
namespace lab_v01 {
struct V01DebugLayout {
  static constexpr int kMaxSeq = 64;  // one query tile and one key tile
  __host__ __device__ static int64_t s_offset(int, int) { return 0; }
  __host__ __device__ static int64_t m_offset(int sq, int sk) { return (int64_t)sq * sk; }
  __host__ __device__ static int64_t l_offset(int sq, int sk) { return (int64_t)sq * sk + sq; }
  __host__ __device__ static int64_t p_offset(int sq, int sk) { return (int64_t)sq * sk + 2 * sq; }
  __host__ __device__ static int64_t o_offset(int sq, int sk) { return 2 * (int64_t)sq * sk + 2 * sq; }
  __host__ __device__ static int64_t total(int sq, int sk, int d) {
    return 2 * (int64_t)sq * sk + 2 * sq + (int64_t)sq * d;
  }
};
}  // namespace lab_v01

namespace {

constexpr float kNegInf = -INFINITY;
constexpr unsigned kFullMask = 0xffffffffu;
// Largest opt-in dynamic shared memory per block on sm_86/sm_89 (99 KiB).
// Staying under it keeps v01 runnable on the L4 the project started on;
// sm_80 (163 KiB) and sm_90 (227 KiB) have more.
constexpr int kSmemPortableLimit = 99 * 1024;
constexpr int kMaxGridYZ = 65535;

template <int D>
struct V01Config {
  static constexpr int kBr = 64;                      // B_r: query rows per CTA
  static constexpr int kBc = 64;                      // B_c: key rows per tile
  static constexpr int kThreads = 256;                // 8 warps, 4 threads per query row
  static constexpr int kThreadsPerRow = kThreads / kBr;
  static constexpr int kScoresPerThread = kBc / kThreadsPerRow;   // 16 of S_ij per thread
  static constexpr int kVec = 4;                      // float4 shared-memory reads
  static constexpr int kOutPerThread = D / kThreadsPerRow;        // columns of O_i per thread
  static constexpr int kOutChunks = kOutPerThread / kVec;
  static constexpr int kOutChunkStride = kThreadsPerRow * kVec;   // 16: thread g owns 4g + 16k
  // Rows padded by one float4: consecutive rows start 4 banks apart, so the
  // 4 row-threads reading K_j rows g, g+4, ... (and 2 Q rows) per LDS.128
  // phase hit distinct banks.
  static constexpr int kRowStride = D + kVec;
  static constexpr int kPStride = kBc + kVec;
  static constexpr int kSmemFloats = kBr * kRowStride + kBc * kRowStride + kBr * kPStride;
  static constexpr int kSmemBytes = kSmemFloats * (int)sizeof(float);

  static_assert(kThreads % kBr == 0 && 32 % kThreadsPerRow == 0,
                "the threads of one query row must share a warp (shuffle reductions)");
  static_assert(D % kOutChunkStride == 0, "head_dim must split into float4 chunks per thread");
  static_assert(kBc % kThreadsPerRow == 0 && kBc % kVec == 0, "B_c must split over a row's threads");
  static_assert(kSmemBytes <= kSmemPortableLimit, "shared memory over the sm_86/89 per-block limit");
};

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Copies rows [row0, row0 + 64) of a (S, D) slice into fp32 shared memory.
// Rows past the end are written as zeros, not skipped: stale shared memory can
// hold NaN, and 0 * NaN would leak into O through the masked (P = 0) columns.
// Scalar loads on purpose: no alignment assumption on pointers or strides.
template <typename T, int D>
__device__ __forceinline__ void load_tile(float* dst, const T* src, int64_t seq_stride,
                                          int row0, int seqlen) {
  using Cfg = V01Config<D>;
  for (int idx = threadIdx.x; idx < Cfg::kBr * D; idx += Cfg::kThreads) {
    const int r = idx / D, d = idx % D;
    const int s = row0 + r;
    dst[r * Cfg::kRowStride + d] = (s < seqlen) ? to_float(src[(int64_t)s * seq_stride + d]) : 0.f;
  }
}

__device__ __forceinline__ float row_reduce_max(float x) {
  // The 4 threads of a row are lanes 4q..4q+3 of one warp.
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ float row_reduce_sum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}

template <typename T, int D>
__global__ void __launch_bounds__(V01Config<D>::kThreads)
attn_fwd_v01_kernel(const AttnFwdParams p) {
  using Cfg = V01Config<D>;
  extern __shared__ float4 smem_f4[];  // float4 so every row start is 16-byte aligned
  float* sQ = reinterpret_cast<float*>(smem_f4);
  float* sKV = sQ + Cfg::kBr * Cfg::kRowStride;
  float* sP = sKV + Cfg::kBc * Cfg::kRowStride;

  const int q_tile = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int h_kv = h / (p.heads_q / p.heads_kv);
  const int r = threadIdx.x / Cfg::kThreadsPerRow;   // row of the tile
  const int g = threadIdx.x % Cfg::kThreadsPerRow;   // position within the row's threads
  const int q0 = q_tile * Cfg::kBr;
  const int i = q0 + r;                               // this thread's query index
  const int Sq = p.seqlen_q, Sk = p.seqlen_k;

#ifdef LAB_BUG_LAYOUT
  // DELIBERATE BUG: offsets as if every tensor were contiguous (B, H, S, D);
  // the stride arguments are ignored.
  const int64_t q_sb = (int64_t)p.heads_q * Sq * D, q_sh = (int64_t)Sq * D, q_ss = D;
  const int64_t k_sb = (int64_t)p.heads_kv * Sk * D, k_sh = (int64_t)Sk * D, k_ss = D;
  const int64_t v_sb = k_sb, v_sh = k_sh, v_ss = k_ss;
  const int64_t o_sb = q_sb, o_sh = q_sh, o_ss = q_ss;
#else
  const int64_t q_sb = p.q_stride[0], q_sh = p.q_stride[1], q_ss = p.q_stride[2];
  const int64_t k_sb = p.k_stride[0], k_sh = p.k_stride[1], k_ss = p.k_stride[2];
  const int64_t v_sb = p.v_stride[0], v_sh = p.v_stride[1], v_ss = p.v_stride[2];
  const int64_t o_sb = p.o_stride[0], o_sh = p.o_stride[1], o_ss = p.o_stride[2];
#endif
  const T* Q = static_cast<const T*>(p.q) + b * q_sb + h * q_sh;
  const T* K = static_cast<const T*>(p.k) + b * k_sb + h_kv * k_sh;
  const T* V = static_cast<const T*>(p.v) + b * v_sb + h_kv * v_sh;
  T* O = static_cast<T*>(p.o) + b * o_sb + h * o_sh;

#ifdef LAB_DEBUG_DUMP
  float* dbg = (p.debug != nullptr && b == 0 && h == 0 && q_tile == 0) ? p.debug : nullptr;
#endif

  // Prologue
  // Causal: the last query of this tile sees keys < q_end, so later key tiles
  // contribute nothing and are not visited.
  const int q_end = min(Sq, q0 + Cfg::kBr);
  const int kv_end = p.causal ? min(Sk, q_end) : Sk;
  const int n_kv_tiles = (kv_end + Cfg::kBc - 1) / Cfg::kBc;

  load_tile<T, D>(sQ, Q, q_ss, q0, Sq);  // rows >= Sq are zero: finite scores, never stored

  float m_i = kNegInf, l_i = 0.f;
  float o[Cfg::kOutPerThread];
#pragma unroll
  for (int c = 0; c < Cfg::kOutPerThread; ++c) o[c] = 0.f;

  // Main loop
  for (int jt = 0; jt < n_kv_tiles; ++jt) {
    const int k0 = jt * Cfg::kBc;
    load_tile<T, D>(sKV, K, k_ss, k0, Sk);
    __syncthreads();  // K_j (and, on the first pass, Q_i) visible to all

    // S_ij row r, keys g + 4k: the interleave keeps the 4 threads of a row on
    // different K_j rows and different banks.
    float s[Cfg::kScoresPerThread];
#pragma unroll
    for (int k = 0; k < Cfg::kScoresPerThread; ++k) s[k] = 0.f;
    const float* q_row = sQ + r * Cfg::kRowStride;
#pragma unroll 4
    for (int d = 0; d < D; d += Cfg::kVec) {
      const float4 qv = *reinterpret_cast<const float4*>(q_row + d);
#pragma unroll
      for (int k = 0; k < Cfg::kScoresPerThread; ++k) {
        const float4 kv = *reinterpret_cast<const float4*>(
            sKV + (g + Cfg::kThreadsPerRow * k) * Cfg::kRowStride + d);
        s[k] = fmaf(qv.x, kv.x, s[k]);
        s[k] = fmaf(qv.y, kv.y, s[k]);
        s[k] = fmaf(qv.z, kv.z, s[k]);
        s[k] = fmaf(qv.w, kv.w, s[k]);
      }
    }

    float tile_max = kNegInf;
#pragma unroll
    for (int k = 0; k < Cfg::kScoresPerThread; ++k) {
      const int j = k0 + g + Cfg::kThreadsPerRow * k;
      bool visible = j < Sk;  // partial last tile
#ifndef LAB_BUG_NO_CAUSAL
      visible = visible && (!p.causal || j <= i);
#endif
      s[k] = visible ? s[k] * p.scale : kNegInf;
      tile_max = fmaxf(tile_max, s[k]);
    }
    tile_max = row_reduce_max(tile_max);
    const float m_new = fmaxf(m_i, tile_max);
    // A row that has seen no visible key yet keeps m = -inf; exponentiate
    // against 0 then, so exp(-inf - (-inf)) never makes a NaN.
    const float m_ref = (m_new == kNegInf) ? 0.f : m_new;

    float row_sum = 0.f;
#pragma unroll
    for (int k = 0; k < Cfg::kScoresPerThread; ++k) {
      const float pk = expf(s[k] - m_ref);
      sP[r * Cfg::kPStride + g + Cfg::kThreadsPerRow * k] = pk;
      row_sum += pk;
    }
    row_sum = row_reduce_sum(row_sum);
    const float alpha = expf(m_i - m_ref);          // rescales the old statistics
    const float l_new = alpha * l_i + row_sum;

#ifdef LAB_DEBUG_DUMP
    if (dbg != nullptr && jt == 0 && i < Sq) {
      // One key tile only (Sk <= 64), so m_new and l_new are final here.
      const float inv_l = 1.f / l_new;
#pragma unroll
      for (int k = 0; k < Cfg::kScoresPerThread; ++k) {
        const int j = k0 + g + Cfg::kThreadsPerRow * k;
        if (j < Sk) {
          dbg[lab_v01::V01DebugLayout::s_offset(Sq, Sk) + (int64_t)i * Sk + j] = s[k];
          dbg[lab_v01::V01DebugLayout::p_offset(Sq, Sk) + (int64_t)i * Sk + j] =
              sP[r * Cfg::kPStride + g + Cfg::kThreadsPerRow * k] * inv_l;
        }
      }
    }
#endif

    __syncthreads();  // all threads are done with K_j before V_j overwrites it
    load_tile<T, D>(sKV, V, v_ss, k0, Sk);
    __syncthreads();  // V_j visible (P_ij rows are warp-private, covered too)

    // O_i = diag(l_new)^-1 (diag(l_i alpha) O_i + P_ij V_j), FA1's update:
    // un-normalise, accumulate, normalise, so no second accumulator is needed.
    const float carry = l_i * alpha;
#pragma unroll
    for (int c = 0; c < Cfg::kOutPerThread; ++c) o[c] *= carry;
    const float* p_row = sP + r * Cfg::kPStride;
#pragma unroll 2
    for (int c = 0; c < Cfg::kBc; c += Cfg::kVec) {
      const float4 pv = *reinterpret_cast<const float4*>(p_row + c);
      const float pc[Cfg::kVec] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int e = 0; e < Cfg::kVec; ++e) {
        const float* v_row = sKV + (c + e) * Cfg::kRowStride + Cfg::kVec * g;
#pragma unroll
        for (int k = 0; k < Cfg::kOutChunks; ++k) {
          const float4 vv = *reinterpret_cast<const float4*>(v_row + Cfg::kOutChunkStride * k);
          o[Cfg::kVec * k + 0] = fmaf(pc[e], vv.x, o[Cfg::kVec * k + 0]);
          o[Cfg::kVec * k + 1] = fmaf(pc[e], vv.y, o[Cfg::kVec * k + 1]);
          o[Cfg::kVec * k + 2] = fmaf(pc[e], vv.z, o[Cfg::kVec * k + 2]);
          o[Cfg::kVec * k + 3] = fmaf(pc[e], vv.w, o[Cfg::kVec * k + 3]);
        }
      }
    }
    const float inv_l_new = (l_new > 0.f) ? 1.f / l_new : 0.f;
#pragma unroll
    for (int c = 0; c < Cfg::kOutPerThread; ++c) o[c] *= inv_l_new;
    m_i = m_new;
    l_i = l_new;
    __syncthreads();  // V_j and P_ij are read before the next K_j and P overwrite them
  }

  // Epilogue
  if (i < Sq) {
    T* o_row = O + (int64_t)i * o_ss;
#pragma unroll
    for (int k = 0; k < Cfg::kOutChunks; ++k) {
#pragma unroll
      for (int e = 0; e < Cfg::kVec; ++e) {
        o_row[Cfg::kOutChunkStride * k + Cfg::kVec * g + e] = from_float<T>(o[Cfg::kVec * k + e]);
      }
    }
    if (p.lse != nullptr && g == 0) {
      p.lse[((int64_t)b * p.heads_q + h) * Sq + i] = m_i + logf(l_i);
    }
#ifdef LAB_DEBUG_DUMP
    if (dbg != nullptr) {
      if (g == 0) {
        dbg[lab_v01::V01DebugLayout::m_offset(Sq, Sk) + i] = m_i;
        dbg[lab_v01::V01DebugLayout::l_offset(Sq, Sk) + i] = l_i;
      }
      float* o_dbg = dbg + lab_v01::V01DebugLayout::o_offset(Sq, Sk) + (int64_t)i * D;
#pragma unroll
      for (int k = 0; k < Cfg::kOutChunks; ++k) {
#pragma unroll
        for (int e = 0; e < Cfg::kVec; ++e) {
          o_dbg[Cfg::kOutChunkStride * k + Cfg::kVec * g + e] = o[Cfg::kVec * k + e];
        }
      }
    }
#endif
  }
}

template <typename T, int D>
int launch(const AttnFwdParams& p, cudaStream_t stream) {
  using Cfg = V01Config<D>;
  auto kernel = attn_fwd_v01_kernel<T, D>;
  const cudaError_t err = lab::allow_smem_once<attn_fwd_v01_kernel<T, D>>(Cfg::kSmemBytes, lab::current_device());
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((p.seqlen_q + Cfg::kBr - 1) / Cfg::kBr, p.heads_q, p.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return (int)cudaGetLastError();
}

template <typename T>
int dispatch_head_dim(const AttnFwdParams& p, cudaStream_t stream) {
  switch (p.head_dim) {
    case 16: return launch<T, 16>(p, stream);
    case 32: return launch<T, 32>(p, stream);
    case 64: return launch<T, 64>(p, stream);
    case 128: return launch<T, 128>(p, stream);
    default: return LAB_E_HEAD_DIM;
  }
}

}  // namespace

extern "C" int attn_fwd_v01(const AttnFwdParams* p, void* stream) {
  if (p == nullptr) return LAB_E_SHAPE;
  const int d = p->head_dim;
  if (d != 16 && d != 32 && d != 64 && d != 128) return LAB_E_HEAD_DIM;
  if (p->dtype != LAB_FP16 && p->dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p->batch < 0 || p->heads_q < 0 || p->seqlen_q < 0 || p->seqlen_k < 0) return LAB_E_SHAPE;
  if (p->heads_kv <= 0 || p->heads_q % p->heads_kv != 0) return LAB_E_SHAPE;
  if (p->batch > kMaxGridYZ || p->heads_q > kMaxGridYZ) return LAB_E_SHAPE;
  if (p->batch == 0 || p->heads_q == 0 || p->seqlen_q == 0) return LAB_OK;  // nothing to write
  if (p->seqlen_k == 0) return LAB_E_SHAPE;  // softmax over no keys is undefined
#ifdef LAB_DEBUG_DUMP
  if (p->debug != nullptr &&
      (p->seqlen_q > lab_v01::V01DebugLayout::kMaxSeq || p->seqlen_k > lab_v01::V01DebugLayout::kMaxSeq)) {
    return LAB_E_SHAPE;
  }
#endif
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return p->dtype == LAB_FP16 ? dispatch_head_dim<__half>(*p, s)
                              : dispatch_head_dim<__nv_bfloat16>(*p, s);
}
