// The fixed dQ order of bwd/v17 and the versions after it: a counter word per (batch, query head, row block,
// consumer warpgroup) after dq_accum, each head's key blocks run last to first, the count a key block waits for
// before adding into a row block, and the entry that launches a version's sink with them. bwd/v17_ordered.cu has
// the design and its measurements; lab.backward.dq_order plays the same rules on the CPU.
#pragma once
#include "common/hopper/attn_bwd_stagger.cuh"

namespace lab::sm90::bwd {

// The counter words: one per padded query row after dq_accum; word m0 + wg of a head's rows counts the adds into
// row block m0 by warpgroup wg (row blocks are at least 64 rows, so the words never meet).
template <class C>
__device__ __forceinline__ int* order_word(const AttnBwdParams& p, int b, int hq, int m0, int wg) {
  static_assert(C::kSplitDq, "each warpgroup adds into elements of its own, so a count per warpgroup orders them");
  const int64_t sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  int* words = reinterpret_cast<int*>(p.dq_accum + (int64_t)p.batch * p.heads_q * sq_pad * C::D);
  return words + ((int64_t)b * p.heads_q + hq) * sq_pad + m0 + wg;
}

// The adds into row block m0 that come before key block kb's: those of blocks kb + 1 .. last, last being the last
// key block, or with the causal mask the last that reaches row m0 (block kb' does iff kb' * BC <= m0).
template <class C>
__device__ __forceinline__ int adds_before(const Work& work, int m0, const AttnBwdParams& p) {
  const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC;
  const int last = p.causal ? min(n_kb - 1, m0 / C::BC) : n_kb - 1;
  return last - work.n0 / C::BC;
}

// No bound on the polls: a __trap() after a count of them made ptxas spill about 2 KB a thread around the loop
// (the accumulators stay live across it) and serialise the wgmma instructions.
__device__ __forceinline__ void wait_for_count(const int* word, int count) {
  for (int seen;;) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(word) : "memory");
    if (seen == count) return;
    __nanosleep(32);
  }
}

__device__ __forceinline__ void count_add(int* word) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(word) : "memory");
}

// Head-major tiles, each head's key blocks last to first: a CTA waits only on CTAs dispatched before it.
struct OrderedSteps : DenseSteps {
  template <class C>
  __device__ __forceinline__ static Work work(const AttnBwdParams& p) {
    const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC, idx = blockIdx.x, nb = idx % n_kb;
    return tile_work<C>(p, idx - nb + (n_kb - 1 - nb));
  }
};

// The extern "C" entry of an ordered version (either dQ mode): the counters zeroed, then v14's loop with the
// version's dQ sink over OrderedSteps' grid (the pre-pass zeroes dq_accum).
template <class Sink>
struct OrderedLaunch {
  template <int D, class T>
  struct Run {
    static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
      using C = StagedCfg<D>;
      if (p.dq_accum == nullptr) return LAB_E_WORKSPACE;  // the deterministic mode needs it here too
      const int64_t rows = (int64_t)p.batch * p.heads_q * lab::bwd::padded_rows(p.seqlen_q);
      const cudaError_t err = cudaMemsetAsync(p.dq_accum + rows * C::D, 0, rows * sizeof(int), st);
      if (err != cudaSuccess) return err;
      return launch<C, T, bwd_dkdv_stagger<C, T, Sink, OrderedSteps>>(p, st, dev);
    }
  };
};
template <class Sink>
int ordered_entry(const AttnBwdParams* p, void* stream) {
  return entry<OrderedLaunch<Sink>::template Run, true>(p, stream);
}

}  // namespace lab::sm90::bwd
