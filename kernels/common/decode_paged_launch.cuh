// The host side every paged-family pass-1 kernel shares (decode v03, v05-v08): the entry's checks, dispatch on head dim (HeadDimPlan's
// ring depth), dtype and paged-or-contiguous, one launch on the split x batch x KV-head x row-group grid, then the
// split-K combine when the call has several splits.
//
// A version hands in its traits as Partial<T, D, kStages, kPaged>: `kernel` (its pass-1 kernel, called with
// (params, chunk, group, rows, row_groups)), `kSmemBytes` and `kThreads`. Only host code lives here, so a kernel
// that moves its launch here keeps its SASS.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/decode_head_dim.cuh"
#include "common/decode_masks.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/params.h"
#include "common/splitk_combine.cuh"

namespace lab {
namespace decode {

// A version's traits from its pass-1 kernel and config: `template <...> using Partial = PartialTraits<kernel<...>,
// Config<...>>;` (its shared memory and threads are the config's).
template <auto kKernel, class Cfg_>
struct PartialTraits {
  static constexpr auto kernel = kKernel;
  using Cfg = Cfg_;
  static constexpr int kSmemBytes = Cfg::kSmemBytes, kThreads = Cfg::kThreads;
};

template <template <class, int, int, bool> class Partial, class T, int D, int kStages, bool kPaged>
int launch_partial(const DecodeParams* p, const DecodeLaunch& l) {
  using P = Partial<T, D, kStages, kPaged>;
  cudaError_t err = allow_smem_once<P::kernel>(P::kSmemBytes, l.device);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p->num_splits) * p->batch * p->heads_kv * l.row_groups);
  P::kernel<<<grid, P::kThreads, P::kSmemBytes, l.stream>>>(*p, l.chunk, l.group, l.rows, l.row_groups);
  err = cudaGetLastError();
  if (err != cudaSuccess || p->num_splits == 1) return err;
  return launch_splitk_combine<T, D>(p, l.stream, l.use_pdl);
}

// What a paged-family entry checks before it launches, in this order: the parameters (common/launch.h), the block
// table (common/paged.cuh: also on an empty call, so a bad table is never silent), then the launch plan of 16-row
// groups and key_block-rounded chunks (over the window's span when a window is set). Returns a LAB_E_* code (< 0),
// kNothingToCompute (the entry returns 0), or 0
// with *l planned.
constexpr int kNothingToCompute = 1;
inline int paged_entry(const DecodeParams* p, int key_block, void* stream_ptr, DecodeLaunch* l) {
  const int rc = check_decode_params(p);
  if (rc < 0) return rc;
  if (const int bad = paged::check_paged_params(p)) return bad;
  if (rc > 0) return kNothingToCompute;
  if (const int bad = decode_launch(p, key_block, 16, stream_ptr, l)) return bad;
  // A window's splits cover its span, not the capacity (common/decode_masks.cuh): the chunks shrink with it.
  if (p->window) l->chunk = split_chunk(window_span(p), p->num_splits, key_block);
  return 0;
}

// One head dim: dtype and paged-or-contiguous, at HeadDimPlan's ring depth.
template <template <class, int, int, bool> class Partial, int D>
int launch_at_dim(const DecodeParams* p, const DecodeLaunch& l) {
  constexpr int S = HeadDimPlan<D>::kStages;
  const bool paged = p->block_table != nullptr;
  if (p->dtype == LAB_FP16)
    return paged ? launch_partial<Partial, __half, D, S, true>(p, l) : launch_partial<Partial, __half, D, S, false>(p, l);
  return paged ? launch_partial<Partial, __nv_bfloat16, D, S, true>(p, l)
               : launch_partial<Partial, __nv_bfloat16, D, S, false>(p, l);
}

// Every head dim of with_head_dim.
template <template <class, int, int, bool> class Partial>
int launch_paged_family(const DecodeParams* p, const DecodeLaunch& l) {
  return with_head_dim(p->head_dim, [&](auto dim) { return launch_at_dim<Partial, decltype(dim)::value>(p, l); });
}

// Only the head dims Ds (a ring layout that takes some): LAB_E_HEAD_DIM for the others.
template <template <class, int, int, bool> class Partial, int... Ds>
int launch_paged_dims(const DecodeParams* p, const DecodeLaunch& l) {
  int rc = LAB_E_HEAD_DIM;
  (void)((p->head_dim == Ds && ((rc = launch_at_dim<Partial, Ds>(p, l)), true)) || ...);
  return rc;
}

// The whole entry of a version that takes only the head dims Ds (decode v07, v08; traits with a Cfg::kBlockN):
// another head dim is LAB_E_HEAD_DIM before any other check, then paged_entry's checks and plan (chunks of whole
// key tiles: lab/decode/splits.py BLOCK_N), then the launch.
template <template <class, int, int, bool> class Partial, int D0, int... Ds>
int paged_entry_at_dims(const DecodeParams* p, void* stream_ptr) {
  constexpr int kKeyBlock = Partial<__half, D0, HeadDimPlan<D0>::kStages, true>::Cfg::kBlockN;
  static_assert(((kKeyBlock == Partial<__half, Ds, HeadDimPlan<Ds>::kStages, true>::Cfg::kBlockN) && ...),
                "one key tile at every head dim");
  if (p != nullptr && p->head_dim != D0 && ((p->head_dim != Ds) && ...)) return LAB_E_HEAD_DIM;
  DecodeLaunch l;  // rows in 16-row groups, chunk, device, PDL, stream (common/launch.h)
  if (const int rc = paged_entry(p, kKeyBlock, stream_ptr, &l)) return rc < 0 ? rc : 0;
  return launch_paged_dims<Partial, D0, Ds...>(p, l);
}

}  // namespace decode
}  // namespace lab
