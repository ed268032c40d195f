// The count that finds the last CTA of a KV head (bwd/v15, v16): once every consumer thread of the CTA has issued
// its last dQ reduction, the CTA counts itself on its KV head's counter (a word per (batch, KV head) after
// dq_accum, zeroed with it by the launch's memset, kInKernelConvert); the CTA that brings the count to the number
// of key blocks sees every reduction of that head's query heads after its acquire.
#pragma once
#include "common/hopper/attn_bwd_stagger.cuh"

namespace lab::sm90::bwd {

constexpr int kBarCount = 14;  // the consumers' barrier around the count (the shared headers use 1-13)

// Every consumer thread calls it after its last reduction; true in every thread of the head's last CTA, whose
// loads (ld.global.cg, or the copy engine's after a proxy fence) then see the whole group's dQ accumulator.
template <class C>
__device__ __forceinline__ bool last_cta_of_head(const Work& work, const AttnBwdParams& p) {
  __shared__ int last;
  __threadfence();  // this thread's reductions before the count (the CTA's barrier joins all 256)
  named_barrier_sync(kBarCount, 256);
  if (threadIdx.x == 0) {
    const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC;
    int* count = reinterpret_cast<int*>(p.dq_accum + (int64_t)p.batch * p.heads_q * lab::bwd::padded_rows(p.seqlen_q) * C::D) +
                 (int64_t)work.b * p.heads_kv + work.hkv;
    last = atomicAdd(count, 1) == n_kb - 1;
  }
  named_barrier_sync(kBarCount, 256);
  if (!last) return false;
  __threadfence();  // every other CTA's reductions, counted before ours, are seen by the loads after this
  return true;
}

}  // namespace lab::sm90::bwd
