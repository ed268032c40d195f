// Backward attention v17: v14's kernel with dQ added in a fixed order, so that torch.use_deterministic_algorithms
// gets bit-identical gradients from a Hopper kernel instead of v01's mma.sync passes.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd under
// torch.use_deterministic_algorithms(True).
//
// Why. dQ is a sum over key blocks: every CTA (one key block of one KV head) adds its partial of each query row
// block into dq_accum with float32 reductions. Float addition is not associative, and v14's CTAs add in whatever
// order they reach the rows, so two runs differ in dQ's last bits. v01's deterministic mode avoids the sum with a
// separate dQ pass that recomputes S and dP per query block (about 40 % more tensor work, on mma.sync): 0.23-0.27x
// SDPA-cuDNN's backward in GPU time at D = 128, S = 4096 (outputs/experiments/20261126-bwd-v17-ordered.json).
//
// What changes (OrderedSink below; the counters, OrderedSteps and the launch in common/hopper/attn_bwd_ordered.cuh;
// the loop, the config, the GEMMs and the stores are v14's):
// - a counter word per (batch, query head, 64-row block, consumer warpgroup), after dq_accum (the workspace's
//   word per padded row), zeroed by a memset before the kernel;
// - before adding its partial of a row block, a warpgroup's first thread waits until the counter says that every
//   key block after its own that adds into those rows has added (the rows of key blocks kb+1 .. last, last being
//   n_kb - 1, or with the causal mask the last key block that reaches the block's first row); the warpgroup then
//   adds, each thread fences its reductions, and the first thread counts the warpgroup's add with a release;
// - the grid runs each head's key blocks last to first, so every block a CTA waits on was dispatched before it
//   (no CTA can wait on one that is not resident), and with the causal mask block kb + 1 starts on the query block
//   after kb's first, one step ahead of kb at every row block they share: the order costs the causal grid no wait
//   once both run. Without the mask every CTA of a head starts on the same row block, so CTA kb waits for all
//   blocks after it once, at its first add (a ramp of the signal latency times the blocks ahead of it).
// - each warpgroup's adds touch its own columns (D = 128) or its own rows (D = 64, v13's row split), so ordering
//   per warpgroup orders every element's sum; the GQA group's heads have words of their own.
// v17 orders dQ in either mode: lab.ops takes it for the deterministic mode on compute capability 9.0 and keeps
// v14 otherwise.
//
// Prediction (H100, GPU time, against v14 in one process): the release fence waits for the warpgroup's reductions
// to reach L2 on every step (v06's per-step fences cost 28-35 %), partly hidden by the other warpgroup's GEMMs;
// causal 0.75-0.85x v14, non-causal 0.65-0.8x (the start ramp on top); against v01's deterministic mode 2.5-3.5x.
//
// Measured (H100, GPU time, in rounds; outputs/driver_logs/20261126-h100-bwd-v17-e2b6095/): 0.44-0.65x v14 (D = 128
// causal 0.50-0.65x, full 0.51-0.57x), 1.3-1.8x v01's deterministic mode, 0.46-0.72x SDPA-cuDNN; bit-identical over
// reruns. The causal grid lost nearly as much as the full one, so the cost is per step (the poll and the fence),
// not the start ramp: bwd/v18 takes both off the consumers.
//
// Limits: v14's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale). The order assumes the
// GPU dispatches CTAs in grid order (as it does; FlashAttention-3's deterministic backward relies on the same): a
// CTA then waits only on CTAs that started before it.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v17_ordered.cu
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_ordered.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

// v14's reductions, each after the key blocks before it in the order have added theirs (common/hopper/
// attn_bwd_ordered.cuh): the warpgroup's first thread waits for the count, every thread adds and fences its
// reductions, and the first thread counts the warpgroup's add.
struct OrderedSink : AddPartial {
  template <class C>
  __device__ __forceinline__ void add(const float (&dq)[C::kDqRegs], uint8_t*, const Work& work, int j,
                                      const AttnBwdParams& p) {
    const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
    const int hq = work.head(j), m0 = work.m0(j, C::BR);
    int* word = order_word<C>(p, work.b, hq, m0, wg);
    if (wt == 0) wait_for_count(word, adds_before<C>(work, m0, p));
    named_barrier_sync(kBarWg + wg, 128);  // the acquire above, before any thread's reductions
    red_dq<C>(dq, hq, m0, work.b, p);
    __threadfence();                       // this thread's reductions before the count
    named_barrier_sync(kBarWg + wg, 128);
    if (wt == 0) count_add(word);
  }
};

}  // namespace

extern "C" int attn_bwd_v17(const AttnBwdParams* p, void* stream) { return ordered_entry<OrderedSink>(p, stream); }
