// Device helpers for the decode kernels (kernels/decode/*.cu).
//
// Kept apart from kernels/common/mma.cuh (tensor-core wrappers, another
// owner): this file only has what a memory-bound decode kernel needs:
// 16-byte cp.async with zero fill, 16-bit <-> fp32 conversion of packed
// pairs, warp reductions and the Hopper programmatic-dependent-launch hooks.
// Everything compiles for sm_80 and sm_90a.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace lab {
namespace decode {

constexpr float kLog2e = 1.4426950408889634f;  // scores are kept in log2 units: exp(x) = exp2(x * log2e)
constexpr float kLn2 = 0.6931471805599453f;    // back to natural-log LSE on the way out
constexpr unsigned kFullMask = 0xffffffffu;

// ---------------------------------------------------------------------------
// 16-bit element types: unpack two packed elements to fp32 and back.
// ---------------------------------------------------------------------------
template <typename T>
struct Elem;

template <>
struct Elem<__half> {
  static __device__ __forceinline__ float2 to_float2(uint32_t packed) {
    __half2 h = *reinterpret_cast<const __half2*>(&packed);
    return __half22float2(h);
  }
  static __device__ __forceinline__ uint32_t from_float2(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

template <>
struct Elem<__nv_bfloat16> {
  // bf16 is the top half of an fp32: two integer ops instead of two cvt.
  static __device__ __forceinline__ float2 to_float2(uint32_t packed) {
    return make_float2(__uint_as_float(packed << 16), __uint_as_float(packed & 0xffff0000u));
  }
  static __device__ __forceinline__ uint32_t from_float2(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// Eight elements held in one 16-byte vector -> eight floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  float2 a = Elem<T>::to_float2(raw.x), b = Elem<T>::to_float2(raw.y);
  float2 c = Elem<T>::to_float2(raw.z), d = Elem<T>::to_float2(raw.w);
  f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
  f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
}

// ---------------------------------------------------------------------------
// cp.async, 16 bytes, L1-bypassing (.cg): K/V are streamed once, caching them
// in L1 would only evict the Q and score tiles. `valid == false` zero-fills the
// destination without touching global memory, so the last partial tile holds
// zeros (finite) rather than stale data that could be NaN.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---------------------------------------------------------------------------
// Warp reductions (butterfly: every lane ends with the result).
// ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

// ---------------------------------------------------------------------------
// Programmatic dependent launch (sm_90+). The producer lets its dependent
// grid be scheduled early; the dependent waits for the producer's memory
// before reading it. On older targets, or when the dependent was launched
// without the PDL attribute, both are no-ops and stream order applies.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_for_producer() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------
// The keys split `split` of sequence b reads: [key_begin, key_begin + n_keys) of its contiguous cache, and
// the K/V rows there. The length is clamped to [0, S_cache] on the device (the op never reads lengths on
// the host: no sync, graph-safe), so no address past the cache is ever formed.
// ---------------------------------------------------------------------------
template <typename T>
struct SplitKV {
  int n_keys;
  const T* k;
  const T* v;
};

template <typename T, typename Params>
__device__ __forceinline__ SplitKV<T> split_kv(const Params& p, int b, int h_kv, int split, int chunk) {
  int len = p.cache_seqlens ? p.cache_seqlens[b] : p.seqlen_cache;
  len = max(0, min(len, p.seqlen_cache));
  const int key_begin = split * chunk;
  SplitKV<T> s;
  s.n_keys = max(0, min(key_begin + chunk, len) - key_begin);
  s.k = static_cast<const T*>(p.k_cache) + b * p.k_stride[0] + h_kv * p.k_stride[1] +
        static_cast<int64_t>(key_begin) * p.k_stride[2];
  s.v = static_cast<const T*>(p.v_cache) + b * p.v_stride[0] + h_kv * p.v_stride[1] +
        static_cast<int64_t>(key_begin) * p.v_stride[2];
  return s;
}

// One tile of kBlockN K and V rows of a split into shared memory, kLoadIters 16-byte copies per thread
// (thread tid takes vectors tid, tid + kThreads, ...; kVecPerRow of kVecElems elements per row). Rows past
// n_keys are zero-filled and never addressed past the cache. copy(dst, src, valid): the 16-byte cp.async
// (decode v01 plain, v02 with an L2 prefetch-size hint).
template <int kThreads, int kLoadIters, int kVecPerRow, int kVecElems, int kBlockN, typename T, typename Copy>
__device__ __forceinline__ void load_split_tile(T* sK, int k_smem_stride, T* sV, int v_smem_stride,
                                                const SplitKV<T>& kv, int64_t k_row_stride, int64_t v_row_stride,
                                                int tile, int tid, Copy copy) {
#pragma unroll
  for (int it = 0; it < kLoadIters; ++it) {
    const int i = tid + it * kThreads;
    const int j = i / kVecPerRow;
    const int c = (i % kVecPerRow) * kVecElems;
    const int key = tile * kBlockN + j;
    const bool valid = key < kv.n_keys;
    const int64_t src_row = valid ? key : 0;  // never form an address past the cache
    copy(sK + j * k_smem_stride + c, kv.k + src_row * k_row_stride + c, valid);
    copy(sV + j * v_smem_stride + c, kv.v + src_row * v_row_stride + c, valid);
  }
}

// The K/V ring of decode v02/v03 in dynamic shared memory: stage s is kStageBytes from smem on, K first,
// V kVOffset elements after K. (v01 keeps its two lambdas: through KVRing its SASS is reordered, same count.)
template <typename T, int kStageBytes, int kVOffset>
struct KVRing {
  unsigned char* smem;
  __device__ __forceinline__ T* k(int s) const { return reinterpret_cast<T*>(smem + s * kStageBytes); }
  __device__ __forceinline__ T* v(int s) const { return k(s) + kVOffset; }
};

// The top of a ring iteration (decode v01-v03): tile t is complete once at most kStages - 2 younger groups
// are pending; the barrier also tells everyone that the stage refilled here was fully consumed in
// iteration t - 1; then tile t + kStages - 1 goes into that stage (load_tile(tile, stage)) and its group is
// committed (always: keeps the group count uniform).
template <int kStages, typename LoadTile>
__device__ __forceinline__ void ring_step(int t, int n_tiles, LoadTile&& load_tile) {
  cp_async_wait<kStages - 2>();
  __syncthreads();
  const int next = t + kStages - 1;
  if (next < n_tiles) load_tile(next, next % kStages);
  cp_async_commit();
}

// The ring's prologue (decode v03, v04): tiles 0 .. kStages - 2 into stages 0 .. kStages - 2, a group each,
// committed also when the tile does not exist, so that ring_step's wait count stays right.
template <int kStages, typename LoadTile>
__device__ __forceinline__ void ring_prologue(int n_tiles, LoadTile&& load_tile) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_async_commit();
  }
}

}  // namespace decode

}  // namespace lab
