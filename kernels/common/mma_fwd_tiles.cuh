// The tile arithmetic of the mma.sync forward kernels (fwd v02-v04): from the tile choice (head dim, warps,
// m16 tiles per warp, B_c, pipeline stages, CTAs per SM; v04 also a K/V split) the block's rows, the fragment
// counts and the shared memory, with the checks every such tile must pass. A version adds its own switches on
// top (v03: struct FwdConfig : MmaFwdTiles<...>; v04: struct FwdConfig : MmaFwdSplitTiles<...>). Also the
// host launch of such a kernel on the grid fwd_block reads (launch_fwd).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/launch.h"
#include "common/params.h"
#include "common/softmax.cuh"

namespace lab {

constexpr int kMaxSmemPerBlock = 227 * 1024;  // H100 opt-in limit (A100: 163 KiB)

// kKVSplit (1 or 2; v04's H): the warps form kKVSplit groups over the same rows; group g takes keys
// [g * B_c, (g+1) * B_c) of every loaded tile of kKVSplit * B_c keys (kBlockNLoad). 1: one group, every warp
// its own rows (v02, v03).
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, int kStages_, int kMinBlocks_, int kKVSplit_>
struct MmaFwdSplitTiles {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = kWarps_;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMTiles = kMTiles_;           // m16 tiles per warp
  static constexpr int kRowsPerWarp = 16 * kMTiles;
  static constexpr int kKVSplit = kKVSplit_;
  static constexpr int kRowWarps = kWarps / kKVSplit;       // warps over distinct rows
  static constexpr int kBlockM = kRowWarps * kRowsPerWarp;  // B_r
  static constexpr int kBlockN = kBlockN_;                  // B_c (per warp group)
  static constexpr int kBlockNLoad = kBlockN * kKVSplit;    // keys per pipeline tile
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocks = kMinBlocks_;  // for __launch_bounds__

  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kKStepsQK = kHeadDim / 16;     // k16 steps of Q K^T
  static constexpr int kNTilesS = kBlockN / 8;        // n8 tiles of S
  static constexpr int kKStepsPV = kBlockN / 16;      // k16 steps of P V
  static constexpr int kNTilesO = kHeadDim / 8;       // n8 tiles of O

  static constexpr int kSmemQ = kBlockM * kHeadDim * 2;
  static constexpr int kSmemTile = kBlockNLoad * kHeadDim * 2;  // one K_j or one V_j
  static constexpr int kSmemBytes = kSmemQ + 2 * kStages * kSmemTile;

  static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory budget exceeded");
  static_assert(kHeadDim % 64 == 0, "XOR swizzle needs >= 8 chunks of 16 bytes per row");
  static_assert(kBlockN % 16 == 0, "B_c must be a multiple of the mma k (16)");
  static_assert(kStages >= 2, "need at least double buffering to overlap loads");
  static_assert((kBlockM * kChunksPerRow) % kThreads == 0, "Q tile load must split evenly");
  static_assert((kBlockNLoad * kChunksPerRow) % kThreads == 0, "K/V tile load must split evenly");
  static_assert(kKVSplit == 1 || kKVSplit == 2, "kKVSplit is 1 or 2");
  static_assert(kWarps % kKVSplit == 0, "");
  static_assert((kRowsPerWarp * kChunksPerRow) % 32 == 0, "O store must split evenly");
};

// The tiles without a K/V split (v02's config; v03 adds its switches on top). A struct, not an alias, so the
// kernels' names keep the name MmaFwdTiles.
template <int kHeadDim_, int kWarps_, int kMTiles_, int kBlockN_, int kStages_, int kMinBlocks_>
struct MmaFwdTiles : MmaFwdSplitTiles<kHeadDim_, kWarps_, kMTiles_, kBlockN_, kStages_, kMinBlocks_, 1> {};

// Host: launches `Kernel` (a forward kernel of tile Cfg taking the params by value) on the 1-D grid of
// ceil(S_q / B_r) * B * H_q CTAs that fwd_block reads, Cfg::kThreads threads, Cfg::kSmemBytes of dynamic
// shared memory (opted in once per device, allow_smem_once). A cudaError_t as int, or LAB_E_SHAPE when the
// grid is too large for gridDim.x.
template <auto Kernel, class Cfg>
int launch_fwd(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  const cudaError_t err = allow_smem_once<Kernel>(Cfg::kSmemBytes, dev);
  if (err != cudaSuccess) return (int)err;
  const int64_t num_m_blocks = (p.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const int64_t blocks = num_m_blocks * p.batch * p.heads_q;
  if (blocks > kMaxGridX) return LAB_E_SHAPE;
  Kernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return (int)cudaGetLastError();
}

// Host: the entry of an mma.sync forward launcher (attn_fwd_v02..v04): the params with the kernel's scale (any
// finite scale: common/softmax.cuh), the checks every forward launcher makes (check_fwd_params: an error code,
// or 0 when there is nothing to write), then launch(params, stream, bf16), which picks the tile and launches.
template <class Launch>
int fwd_entry(const AttnFwdParams* p, void* stream, Launch&& launch) {
  AttnFwdParams kernel_params = *p;
  kernel_params.scale = softmax_kernel_scale(p->scale);
  if (const int rc = check_fwd_params(&kernel_params)) return rc < 0 ? rc : 0;
  return launch(kernel_params, static_cast<cudaStream_t>(stream), kernel_params.dtype == LAB_BF16);
}

// fwd_entry for a kernel with one tile per head dim (v02, v03): Kernel<Cfg, T>::kernel launched (launch_fwd)
// with Cfg64 or Cfg128 and T __half or __nv_bfloat16.
template <class Cfg64, class Cfg128, template <class, class> class Kernel>
int fwd_entry_by_head_dim(const AttnFwdParams* p, void* stream) {
  return fwd_entry(p, stream, [](const AttnFwdParams& kp, cudaStream_t st, bool bf16) {
    const int dev = current_device();
    if (kp.head_dim == 64)
      return bf16 ? launch_fwd<Kernel<Cfg64, __nv_bfloat16>::kernel, Cfg64>(kp, st, dev)
                  : launch_fwd<Kernel<Cfg64, __half>::kernel, Cfg64>(kp, st, dev);
    return bf16 ? launch_fwd<Kernel<Cfg128, __nv_bfloat16>::kernel, Cfg128>(kp, st, dev)
                : launch_fwd<Kernel<Cfg128, __half>::kernel, Cfg128>(kp, st, dev);
  });
}

// A thread's ids in an mma.sync kernel: thread, warp, lane, and the lane's place in the m16n8 fragments:
// g, its row within an 8-row half (the mma group), and t, its column pair (the thread in the group).
struct MmaThread {
  int tid, warp, lane, g, t;
};
__device__ __forceinline__ MmaThread mma_thread() {
  MmaThread th;
  th.tid = threadIdx.x;
  th.warp = th.tid / 32;
  th.lane = th.tid % 32;
  th.g = th.lane / 4;
  th.t = th.lane % 4;
  return th;
}

// The K/V pipeline buffers, which follow Q in shared memory (at sQ + kSmemQ): stage s's K tile at k(s), its V
// tile kStages tiles further, at v(s).
template <class Cfg>
struct KVStages {
  uint32_t base;
  __device__ __forceinline__ uint32_t k(int stage) const { return base + stage * Cfg::kSmemTile; }
  __device__ __forceinline__ uint32_t v(int stage) const { return base + (Cfg::kStages + stage) * Cfg::kSmemTile; }
};

// The (batch b, query head h, KV head h_kv, first query row m0) of this CTA in the 1-D grid of
// ceil(S_q / kBlockM) * B * H_q CTAs. Non-causal: the query block index runs fastest, so the CTAs resident at
// one time share one head's K/V in L2. Causal, kHeadMajor (v03 on): the same order with the heaviest block of
// each head first (FA2's order); otherwise (v02) the block index runs slowest, heaviest first over all heads.
struct FwdBlock {
  int b, h, h_kv, m0;
};
template <int kBlockM, bool kHeadMajor>
__device__ __forceinline__ FwdBlock fwd_block(const AttnFwdParams& p) {
  const int num_m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  int m_block, bh;
  if constexpr (kHeadMajor) {
    if (p.causal) {
      m_block = num_m_blocks - 1 - blockIdx.x % num_m_blocks;
      bh = blockIdx.x / num_m_blocks;
    } else {
      m_block = blockIdx.x % num_m_blocks;
      bh = blockIdx.x / num_m_blocks;
    }
  } else {
    const int bh_count = p.batch * p.heads_q;
    if (p.causal) {
      bh = blockIdx.x % bh_count;
      m_block = num_m_blocks - 1 - blockIdx.x / bh_count;
    } else {
      m_block = blockIdx.x % num_m_blocks;
      bh = blockIdx.x / num_m_blocks;
    }
  }
  FwdBlock blk;
  blk.b = bh / p.heads_q;
  blk.h = bh % p.heads_q;
  blk.h_kv = blk.h / (p.heads_q / p.heads_kv);
  blk.m0 = m_block * kBlockM;
  return blk;
}

// This CTA's head of Q and O and its KV head of K and V (GQA), strides still to be applied per row.
template <class T>
struct FwdHeads {
  const T* q;
  const T* k;
  const T* v;
  T* o;
};
template <class T>
__device__ __forceinline__ FwdHeads<T> fwd_heads(const AttnFwdParams& p, const FwdBlock& blk) {
  FwdHeads<T> hd;
  hd.q = static_cast<const T*>(p.q) + blk.b * p.q_stride[0] + blk.h * p.q_stride[1];
  hd.k = static_cast<const T*>(p.k) + blk.b * p.k_stride[0] + blk.h_kv * p.k_stride[1];
  hd.v = static_cast<const T*>(p.v) + blk.b * p.v_stride[0] + blk.h_kv * p.v_stride[1];
  hd.o = static_cast<T*>(p.o) + blk.b * p.o_stride[0] + blk.h * p.o_stride[1];
  return hd;
}

// K/V tiles of kBlockN keys the block starting at row m0 reads: all keys, or (causal) up to its last real row.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ int fwd_kv_tiles(const AttnFwdParams& p, int m0) {
  const int last_row = min(m0 + kBlockM, p.seqlen_q);  // exclusive
  const int n_end = p.causal ? min(p.seqlen_k, last_row) : p.seqlen_k;
  return (n_end + kBlockN - 1) / kBlockN;
}

}  // namespace lab
