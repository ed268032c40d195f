// wgmma: Hopper's asynchronous warpgroup matrix multiply (sm_90a).
//
// A warpgroup (4 consecutive warps, the first warp index a multiple of 4)
// issues wgmma.mma_async together; the tensor core reads B (and A, in the SS
// form) straight from shared memory through 64-bit matrix descriptors and
// accumulates into registers, while the warps go on issuing other work. The
// accumulator registers belong to the hardware from issue until a
// wait_group covering the op returns: touching them in between is undefined.
//
// Accumulator layout (m64nN, fp32): warp w of the group owns rows 16w..16w+15;
// inside a warp it is the mma.sync m16n8 layout repeated over N/8 column
// blocks: d[4i + 0..1] = row g, cols 8i + 2t + {0,1}; d[4i + 2..3] = row g + 8
// (g = lane / 4, t = lane % 4). So the S accumulator of two adjacent n8
// blocks is, packed to 16 bits, exactly the A operand of one k16 step of the
// RS form: P never leaves registers.
#pragma once
#include <stdint.h>

#include "wgmma_ops.cuh"

namespace lab::sm90 {

// Shared-memory matrix descriptor for a 128-byte-swizzled operand (the layout
// TMA writes with CU_TENSOR_MAP_SWIZZLE_128B): start address, leading and
// stride byte offsets (all >> 4), swizzle mode 1 (128B) in bits 62-63. The
// swizzle is applied to absolute address bits, so atoms (8 rows x 128 B) must
// be 1024-byte aligned; then a k-step inside the 128-byte row is just +32 B
// on the start address.
//   K-major (Q, K): LBO unused for swizzled K-major (set to 1), SBO = 1024 (8 rows x 128 B).
//   MN-major (V as B of P V): LBO = bytes between 64-column blocks, SBO = 1024 (8 keys x 128 B).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         ((uint64_t)((sbo_bytes & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// The descriptor of the same tile `bytes` further on. The start address field (bits 0-13) holds
// address >> 4 and shared memory ends below 256 KiB (2^14 * 16 B), so the offset adds as a plain 64-bit
// add with no carry out of the field: one base descriptor per tile, and a constant per wgmma (the mask
// and shift per wgmma that desc_sw128 costs cost v07 ~15 instructions before each HGMMA, ncu 2026-11-23).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  return (desc & ~0xFFFFFFFFull) | (uint32_t)((uint32_t)desc + (bytes >> 4));  // the low word alone: no carry
}

// wgmma.fence: orders this thread's prior register writes (accumulators, A fragments) before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// wgmma.commit_group: closes the wgmma ops issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// wgmma.wait_group N: returns when at most N committed groups are still in flight (their registers are then ours).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accesses of an accumulator across a wgmma issue/wait (registers are in flight).
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

}  // namespace lab::sm90
