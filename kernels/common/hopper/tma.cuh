// TMA (the tensor memory accelerator): bulk tensor copies global -> shared
// described by a CUtensorMap made on the host (sm_90).
//
// Host side: cuTensorMapEncodeTiled is a driver API function; we fetch it
// with cudaGetDriverEntryPointByVersion, so nothing links -lcuda. The map is
// passed to the kernel by value as `const __grid_constant__ CUtensorMap`
// (it must live in parameter/constant space, 64-byte aligned, never copied
// to local memory). Out-of-bounds box elements are filled with zeros, which
// is how ragged sequence tails are loaded without a bounds branch.
#pragma once
#include <cuda.h>  // CUtensorMap and its enums only: no driver symbol is linked
#include <cuda_runtime.h>
#include <stdint.h>

namespace lab::sm90 {

// ---------------------------------------------------------------- host

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's cuTensorMapEncodeTiled (ABI of CUDA 12.0), looked up once per process; nullptr if absent.
inline EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiledFn>(nullptr);
    return reinterpret_cast<EncodeTiledFn>(ptr);
  }();
  return fn;
}

// A 4-D (D, S, H, B) 16-bit tensor map with a (64, rows, 1, 1) box and 128-byte
// swizzle: one box is `rows` rows of 128 bytes, chunk c of row r stored at
// chunk c ^ (r % 8), the layout wgmma's 128B-swizzle descriptors read.
// Strides are in elements (batch, head, seq); TMA needs them to be multiples
// of 16 bytes. Returns false if the driver rejects the map.
inline bool make_bhsd_map(CUtensorMap* map, const void* base, bool bf16, int D, int S, int H, int B,
                          const int64_t stride[3], int rows) {
  EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return false;
  // A size-1 dimension's stride is never used; give it a legal value (TMA wants multiples of 16 B).
  const int64_t seq = S > 1 ? stride[2] : D;
  const int64_t head = H > 1 ? stride[1] : seq * S;
  const int64_t batch = B > 1 ? stride[0] : head * H;
  const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)S, (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {(cuuint64_t)seq * 2, (cuuint64_t)head * 2, (cuuint64_t)batch * 2};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// ---------------------------------------------------------------- device

// prefetch.tensormap: pull the map (a kernel parameter) into the TMA unit's cache before first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// The three maps of an attention kernel (Q, K, V), prefetched by the thread that issues the loads.
__device__ __forceinline__ void tma_prefetch_maps(const CUtensorMap* q, const CUtensorMap* k, const CUtensorMap* v) {
  tma_prefetch_map(q);
  tma_prefetch_map(k);
  tma_prefetch_map(v);
}

// cp.async.bulk.tensor 4-D load: coordinates innermost first (elements); completes `box bytes` of tx on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// cp.async.bulk (1-D, no tensor map): `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// to shared memory, completing `bytes` of tx on `bar`. For small contiguous rows such as per-row statistics.
__device__ __forceinline__ void bulk_load_1d(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// cp.reduce.async.bulk .add.f32: the copy engine adds `bytes` of fp32 from shared memory into global memory
// (element-wise, atomically per element), so one thread hands a whole tile's accumulation to the engine.
// Writers of the shared tile need fence_proxy_async() and a barrier before this is issued.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

// Closes this thread's bulk operations issued since the last commit into one bulk group.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Returns when at most N of this thread's bulk groups still read their shared-memory source (the source
// may then be overwritten; the global writes may still be in flight).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// Returns when at most N of this thread's bulk groups are still in flight at all (before a CTA exits).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// fence.proxy.async: generic-proxy shared-memory writes become visible to the async proxy (wgmma, TMA) after it.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// bar.sync on a named barrier: `threads` (a multiple of 32) of the CTA meet at barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// bar.arrive on a named barrier: counts this warp's arrival without waiting (the producer side of a bar.sync).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// setmaxnreg: a warpgroup gives registers back (dec) or claims them (inc); needs a launch-bounds register cap.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace lab::sm90
