// Whole-row bulk copies of a paged (or contiguous) KV cache into a padded shared-memory ring (decode v05, sm_90):
// one cp.async.bulk per K or V row (D x 2 bytes, contiguous in both layouts), completing on the stage's mbarrier
// by its byte count (each thread walks its row through the block table with common/paged.cuh's RowWalk).
//
// Why rows and not a tensor map: a row is contiguous in the page-major cache (num_pages, page_size, H_kv, D) and
// in the contiguous one (B, H_kv, S, D), and a bulk copy may land at any 16-byte aligned address, so the ring
// keeps v03's padded rows (D + 8 elements: ldmatrix without bank conflicts) and every compute step of v03 stays
// as it is. A tensor-map box would land dense (row stride D x 2 bytes: an 8-way ldmatrix conflict without a
// swizzle, and a 128-byte swizzle would rewrite every ldmatrix address of the step).
#pragma once
#include <stdint.h>

#include "common/hopper/mbarrier.cuh"
#include "common/paged.cuh"

namespace lab {
namespace paged {

// cp.async.bulk global -> shared: `bytes` (a multiple of 16; both addresses 16-byte aligned) completing as
// transaction bytes on the mbarrier `bar`. The copy engine reads whole 32-byte sectors of whole lines, where a
// thread's 16-byte cp.async asks for half a sector at a time.
__device__ __forceinline__ void bulk_row_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Orders this thread's earlier generic-proxy writes to shared memory (a zero-filled row) before later
// async-proxy writes to the same bytes (the next bulk copy into that row).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace paged
}  // namespace lab
