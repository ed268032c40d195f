// mbarrier: the shared-memory barrier that TMA loads complete on (sm_90).
//
// An mbarrier counts arrivals (set at init) and, for async copies, bytes
// ("transaction count"). A phase completes when both reach zero; its parity
// (0, 1, 0, ...) is what waiters test. The ring pattern: a consumer waits on
// full[s] with parity (n / stages) & 1 for its n-th use of stage s; a
// producer waits on empty[s] with the opposite parity, which a fresh barrier
// already satisfies, so the first round never blocks.
#pragma once
#include <stdint.h>

namespace lab::sm90 {

// Shared-window address of a __shared__ object, as PTX .shared operands want it.
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// mbarrier.init: count = arrivals per phase; must be seen by the async proxy (fence below) before any TMA uses it.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// fence.mbarrier_init: makes initialised barriers visible to the other proxies (TMA) before first use.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// arrive + expect_tx: one arrival, and the phase also waits for `bytes` of async-copy data.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// plain arrive (release semantics: this thread's prior shared-memory reads/writes happen before the phase ends).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// try_wait.parity: true once the phase with this parity has completed (acquire); may time out, so loop.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// mbar_wait for a thread with nothing else to do (a producer waiting for a free stage): try_wait with a suspend-time
// hint (ns), so the thread sleeps in the barrier instead of re-issuing try_wait and branch, issue slots the other
// warps on its scheduler would use (bwd/v22: the spinning producer re-issued ~1,100 instructions a consumer step).
__device__ __forceinline__ void mbar_wait_suspend(uint32_t bar, uint32_t parity, uint32_t hint_ns = 1000000) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity), "r"(hint_ns)
        : "memory");
}

}  // namespace lab::sm90
