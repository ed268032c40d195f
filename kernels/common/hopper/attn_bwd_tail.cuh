// bwd/v14's grid order for causal calls, shared by the versions after it: the CTA's tile is head-major except for
// the last heads that make up about two waves, taken key block by key block so that the grid ends on the shortest
// blocks. bwd/v14_tail.cu has the model, the prediction and the measurements.
#pragma once
#include "common/hopper/attn_bwd_stagger.cuh"

namespace lab::sm90::bwd {

// The tile of CTA `idx`: head-major (tile = head * n_kb + key block) except, with the causal mask, for the last w
// heads, whose tiles go key block by key block (lab.backward.schedule.tail_lpt_tile is the same map on the CPU).
// w is also capped so that the reordered heads' Q and dO (the GQA group's, 16-bit) fit in half the L2: with w
// heads in flight at once every one of them streams its Q and dO, and the GQA cell's nine heads of 8 MB each
// (72 MB against an L2 of 50 MB) lost 1.7 % where the model, blind to memory, promised +10.6 %.
template <class C>
__device__ __forceinline__ int tail_tile(const AttnBwdParams& p, int idx) {
  constexpr int kTailCtas = 2 * 132;                 // the reordered tail: about two waves of an H100 / H200
  constexpr long long kTailBytes = 24ll << 20;        // about half the 50 MB L2 of an H100 / H200
  const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC, heads = p.batch * p.heads_kv;
  if (!p.causal || n_kb == 0) return idx;
  const long long head_bytes = 4ll * (p.heads_q / p.heads_kv) * p.seqlen_q * C::D;  // Q and dO, 2 bytes each
  const int fit = (int)max(1ll, kTailBytes / max(1ll, head_bytes));
  const int w = min(min(heads, fit), (kTailCtas + n_kb - 1) / n_kb);
  const int first = (heads - w) * n_kb;
  if (idx < first) return idx;
  const int r = idx - first;
  return (heads - w + r % w) * n_kb + r / w;
}

struct TailSteps : DenseSteps {
  template <class C>
  __device__ __forceinline__ static Work work(const AttnBwdParams& p) {
    return tile_work<C>(p, tail_tile<C>(p, blockIdx.x));
  }
};

}  // namespace lab::sm90::bwd
