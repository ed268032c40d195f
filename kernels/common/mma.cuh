// Small PTX wrappers for the sm_80+ tensor-core path (mma.sync, ldmatrix,
// cp.async) shared by the forward kernels. No CUTLASS, no cute: each wrapper
// is one instruction, so the kernel reads like the PTX it emits.
//
// Fragment layouts of mma.sync.aligned.m16n8k16.row.col (PTX ISA, "Matrix
// fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A (16x16, row-major), 4 x b32 = 8 x 16-bit:
//     a0 = A[g   ][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]
//     a2 = A[g   ][2t+8, +9]   a3 = A[g+8][2t+8, +9]
//   B (16x8, "col": element pairs run along k), 2 x b32:
//     b0 = B[2t, 2t+1][g]      b1 = B[2t+8, 2t+9][g]
//   C/D (16x8 fp32), 4 x f32:
//     c0, c1 = C[g][2t, 2t+1]  c2, c3 = C[g+8][2t, 2t+1]
// In every packed pair the lower 16 bits hold the lower column / k index.
//
// ldmatrix.m8n8.x4: lanes 8i..8i+7 give the row addresses of matrix i; lane
// l receives row l/4, columns 2(l%4), 2(l%4)+1 of each matrix in register i.
// With .trans it receives the transposed element pair (column l/4 of rows
// 2(l%4), 2(l%4)+1), which is the B layout when the matrix is stored k-major
// the wrong way round (V stored [key][d], used as B with k = key).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace lab {

// ---------------------------------------------------------------- mma.sync

// D = A * B + D, fp32 accumulate, 16-bit inputs. T selects the input type.
template <class T>
struct Mma16816;

template <>
struct Mma16816<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct Mma16816<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const uint32_t (&a)[4],
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          uint32_t b0, uint32_t b1) {
  Mma16816<T>::run(d, a, b0, b1);
}

// The two n8 tiles n and n + 1 of one ldmatrix.x4 B fragment (b[0], b[1]: the first 8 columns; b[2], b[3]:
// the next 8): d[n] += A b[0..1], d[n + 1] += A b[2..3].
template <class T, int kN>
__device__ __forceinline__ void mma_16816_x2(float (&d)[kN][4], int n, const uint32_t (&a)[4],
                                             const uint32_t (&b)[4]) {
  mma_16816<T>(d[n], a, b[0], b[1]);
  mma_16816<T>(d[n + 1], a, b[2], b[3]);
}

// Zero a warp's accumulator fragments (kM m tiles x kN n tiles, m16n8 layout).
template <int kM, int kN>
__device__ __forceinline__ void zero_frags(float (&d)[kM][kN][4]) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[mt][nt][e] = 0.f;
}

// d = s, fragment by fragment.
template <int kM, int kN>
__device__ __forceinline__ void copy_frags(float (&d)[kM][kN][4], const float (&s)[kM][kN][4]) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int nt = 0; nt < kN; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) d[mt][nt][e] = s[mt][nt][e];
}

// ---------------------------------------------------------------- ldmatrix
// volatile: the shared memory behind the address is rewritten by cp.async
// between calls, and the asm has no memory operand that would tell the
// compiler so; volatile keeps it from merging or hoisting loads across
// __syncthreads(). ptxas still schedules the SASS freely.

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ---------------------------------------------------------------- cp.async

// 16-byte global -> shared copy that bypasses L1 (.cg). When `valid` is false
// src-size is 0: nothing is read and the 16 destination bytes are zero-filled,
// which is how partial tiles (rows >= seqlen) are padded. The source address
// must still be a legal address, so callers pass a clamped pointer.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_size)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------- math

// 2^x on the SFU (one MUFU.EX2). ex2.approx(-inf) = +0, which the masked
// softmax relies on. Relative error ~2^-22, far below bf16/fp16 rounding.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- packing
// (lo, hi) -> one b32 holding two 16-bit values, lo in the low half, which is
// the element order of every mma fragment register.

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace lab
