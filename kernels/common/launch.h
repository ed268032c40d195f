// Host-side launch helpers shared by every launcher in kernels/ (fwd/*, decode/*, common/splitk_combine.cuh).
//
// One home for what each launcher used to define for itself: the 16-byte preconditions of cp.async and
// the vector stores, the current device and its SM count (cached: host calls cost launch latency, most of
// the time at small sizes), and the opt-in to more than 48 KB of dynamic shared memory, made once per
// (kernel, device) instead of on every call.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/params.h"

namespace lab {

constexpr int kMaxDevices = 64;               // devices whose per-device state is cached
constexpr int kSmemDefaultBytes = 48 * 1024;  // dynamic smem a kernel gets without the opt-in
constexpr int64_t kMaxGridX = 0x7fffffff;     // gridDim.x limit

// Preconditions of the 16-byte loads and stores (LAB_E_SHAPE otherwise): 16-byte aligned bases, batch /
// head / seq strides in multiples of 8 16-bit elements.
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
inline bool strides_ok(const int64_t (&s)[3]) { return s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0; }

// The current device, or -1 when it cannot be read or is beyond kMaxDevices (nothing is cached then).
inline int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return -1;
  return dev;
}

// Multiprocessors of `dev`, read once (0 when unknown).
inline int num_sms(int dev) {
  static int sms[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return 0;
  if (sms[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 0;
    sms[dev] = n;
  }
  return sms[dev];
}

// The most dynamic shared memory a block of `dev` may opt in to, in bytes, read once (0 when unknown).
inline int smem_optin(int dev) {
  static int bytes[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return 0;
  if (bytes[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) return 0;
    bytes[dev] = n;
  }
  return bytes[dev];
}

// Compute capability of `dev` as 10 * major + minor (90 on Hopper), read once (0 when unknown).
inline int capability(int dev) {
  static int cc[kMaxDevices] = {};
  if (dev < 0 || dev >= kMaxDevices) return 0;
  if (cc[dev] == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
      return 0;
    cc[dev] = 10 * major + minor;
  }
  return cc[dev];
}

// Opt `Kernel` in to `bytes` of dynamic shared memory, once per device (every call for a device outside
// [0, kMaxDevices)).
// A template on the kernel itself: each instantiation of a kernel template gets its own flags.
template <auto Kernel>
cudaError_t allow_smem_once(int bytes, int dev) {
  static bool done[kMaxDevices] = {};
  if (bytes <= kSmemDefaultBytes) return cudaSuccess;
  const bool cached = dev >= 0 && dev < kMaxDevices;
  if (cached && done[dev]) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && cached) done[dev] = true;
  return err;
}

// The checks every forward launcher of head dims 64 and 128 (fwd v02-v07) makes before it launches: a
// negative LAB_E_* code for a call it cannot take, 1 when there is nothing to write (an empty batch or no
// query row; a launcher returns 0 then), 0 to go on. fp16/bf16, H_q % H_kv == 0, 16-byte aligned bases and
// strides of 8 elements (cp.async, vector stores and TMA all need them; lab.ops copies anything else).
// check_fwd_call: all of it but the head dim, for a launcher of other head dims (fwd v10: 192 and 256).
inline int check_fwd_call(const AttnFwdParams* p);
inline int check_fwd_params(const AttnFwdParams* p) {
  if (p->head_dim != 64 && p->head_dim != 128) return LAB_E_HEAD_DIM;
  return check_fwd_call(p);
}
inline int check_fwd_call(const AttnFwdParams* p) {
  if (p->dtype != LAB_FP16 && p->dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_k < 0 || p->heads_q <= 0 || p->heads_kv <= 0 ||
      p->heads_q % p->heads_kv != 0)
    return LAB_E_SHAPE;
  if (p->batch == 0 || p->seqlen_q == 0) return 1;
  if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->o) || !strides_ok(p->q_stride) ||
      !strides_ok(p->k_stride) || !strides_ok(p->v_stride) || !strides_ok(p->o_stride))
    return LAB_E_SHAPE;
  return 0;
}

// The checks every backward launcher (bwd v01-v03) makes before it launches, the same convention: a negative
// LAB_E_* code, 1 when there is nothing to write (an empty batch or no key: dQ, dK, dV were zeroed by the
// caller), 0 to go on. D in {64, 128}, fp16/bf16, H_q % H_kv == 0, the pre-pass workspaces (and dq_accum unless
// deterministic), 16-byte aligned bases and strides of 8 elements for every tensor.
// check_bwd_call: all of it but the head dim, for a launcher of other head dims (bwd v09: 192 and 256).
inline int check_bwd_call(const AttnBwdParams* p);
inline int check_bwd_params(const AttnBwdParams* p) {
  if (p->head_dim != 64 && p->head_dim != 128) return LAB_E_HEAD_DIM;
  return check_bwd_call(p);
}
inline int check_bwd_call(const AttnBwdParams* p) {
  if (p->dtype != LAB_FP16 && p->dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_k < 0 || p->heads_q <= 0 || p->heads_kv <= 0 ||
      p->heads_q % p->heads_kv != 0)
    return LAB_E_SHAPE;
  if (p->batch == 0 || p->seqlen_k == 0) return 1;
  if (p->lse == nullptr || p->delta == nullptr || p->lse_log2 == nullptr ||
      (!p->deterministic && p->dq_accum == nullptr))
    return LAB_E_WORKSPACE;
  if (!aligned16(p->q) || !aligned16(p->k) || !aligned16(p->v) || !aligned16(p->o) || !aligned16(p->dout) ||
      !aligned16(p->dq) || !aligned16(p->dk) || !aligned16(p->dv) || !aligned16(p->delta) ||
      !aligned16(p->lse_log2) || (!p->deterministic && !aligned16(p->dq_accum)) || !strides_ok(p->q_stride) ||
      !strides_ok(p->k_stride) || !strides_ok(p->v_stride) || !strides_ok(p->o_stride) ||
      !strides_ok(p->do_stride) || !strides_ok(p->dq_stride) || !strides_ok(p->dk_stride) ||
      !strides_ok(p->dv_stride))
    return LAB_E_SHAPE;
  return 0;
}

// The checks every decode launcher (decode v01-v03) makes before it launches: a negative LAB_E_* code for a
// call it cannot take, 1 when there is nothing to compute (an empty batch, no query token or no query head;
// a launcher returns 0 then), 0 to go on. D in {64, 80, 96, 128, 192, 256} (a launcher of fewer checks its own:
// decode v01, v04 take 64 and 128), fp16/bf16, H_q % H_kv == 0, splits in [1, LAB_MAX_NUM_SPLITS] with their
// workspaces, 16-byte aligned bases and strides of 8 elements.
inline int check_decode_params(const DecodeParams* p) {
  if (p == nullptr) return LAB_E_SHAPE;
  const int d = p->head_dim;
  if (d != 64 && d != 80 && d != 96 && d != 128 && d != 192 && d != 256) return LAB_E_HEAD_DIM;
  if (p->dtype != LAB_FP16 && p->dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p->batch < 0 || p->q_len < 0 || p->heads_q < 0 || p->heads_kv <= 0 || p->seqlen_cache < 0 ||
      p->num_splits < 1 || p->num_splits > LAB_MAX_NUM_SPLITS || p->heads_q % p->heads_kv != 0)
    return LAB_E_SHAPE;
  if (p->batch == 0 || p->q_len == 0 || p->heads_q == 0) return 1;
  if (p->num_splits > 1 && (p->partial_o == nullptr || p->partial_lse == nullptr)) return LAB_E_WORKSPACE;
  if (!aligned16(p->q) || !aligned16(p->k_cache) || !aligned16(p->v_cache) || !aligned16(p->o) ||
      !strides_ok(p->q_stride) || !strides_ok(p->k_stride) || !strides_ok(p->v_stride) || !strides_ok(p->o_stride))
    return LAB_E_SHAPE;
  return 0;
}

// The keys of one split (lab/decode/splits.py split_bounds): chunk = roundup(ceil(S_cache / splits), key block), so
// every split but the last is whole key tiles.
inline int split_chunk(int seqlen_cache, int num_splits, int key_block) {
  const int per_split = (seqlen_cache + num_splits - 1) / num_splits;
  return (per_split + key_block - 1) / key_block * key_block;
}

// What a decode launcher (decode v01-v03) works out once its parameters passed check_decode_params: the
// query rows of a KV head (group = H_q / H_kv heads of q_len tokens each, at most 2^20), their blocks of
// rows_per_block (v02/v03: 16-row groups; v01 passes 0: its grid's y covers the rows, row_groups = 1), the
// split's keys (split_chunk, key_block: the kernel's key tile), the device and whether it launches with
// programmatic dependent launch (from Hopper on), the stream. LAB_E_SHAPE when the rows or grid.x
// (splits x B x H_kv x row_groups) are too many, 0 otherwise.
struct DecodeLaunch {
  int group, rows, row_groups, chunk, device;
  bool use_pdl;
  cudaStream_t stream;
};
inline int decode_launch(const DecodeParams* p, int key_block, int rows_per_block, void* stream_ptr,
                         DecodeLaunch* out) {
  const int group = p->heads_q / p->heads_kv;
  const int64_t rows_total = static_cast<int64_t>(group) * p->q_len;
  if (rows_total > (1 << 20)) return LAB_E_SHAPE;
  const int row_groups =
      rows_per_block > 0 ? static_cast<int>((rows_total + rows_per_block - 1) / rows_per_block) : 1;
  if (static_cast<int64_t>(p->num_splits) * p->batch * p->heads_kv * row_groups > kMaxGridX) return LAB_E_SHAPE;
  const int device = current_device();
  // LAB_DECODE_NO_PDL in the environment: the combine in plain stream order, a diagnostic (does a sanitizer's report
  // on the combine depend on programmatic dependent launch?).
  static const bool no_pdl = getenv("LAB_DECODE_NO_PDL") != nullptr;
  *out = {group,  static_cast<int>(rows_total), row_groups, split_chunk(p->seqlen_cache, p->num_splits, key_block),
          device, capability(device) >= 90 && !no_pdl, static_cast<cudaStream_t>(stream_ptr)};
  return 0;
}

}  // namespace lab
