// The host side every paged-family pass-1 kernel shares (decode v03, v05): dispatch on head dim (HeadDimPlan's
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
#include "common/launch.h"
#include "common/params.h"
#include "common/splitk_combine.cuh"

namespace lab {
namespace decode {

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

template <template <class, int, int, bool> class Partial>
int launch_paged_family(const DecodeParams* p, const DecodeLaunch& l) {
  const bool paged = p->block_table != nullptr;
  return with_head_dim(p->head_dim, [&](auto dim) {
    constexpr int D = decltype(dim)::value, S = HeadDimPlan<D>::kStages;
    if (p->dtype == LAB_FP16)
      return paged ? launch_partial<Partial, __half, D, S, true>(p, l)
                   : launch_partial<Partial, __half, D, S, false>(p, l);
    return paged ? launch_partial<Partial, __nv_bfloat16, D, S, true>(p, l)
                 : launch_partial<Partial, __nv_bfloat16, D, S, false>(p, l);
  });
}

}  // namespace decode
}  // namespace lab
