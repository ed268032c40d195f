// Shared-memory tiles of the mma.sync forward kernels (fwd v02..v04): the XOR swizzle, the cp.async
// tile load, and the O store staged through shared memory.
//
// A tile is rows of D 16-bit elements, 16-byte chunks per row. Chunk c of row r sits at chunk
// c ^ (r % 8): the 8 rows an ldmatrix reads hit 8 different bank groups, with no padding.
// Cfg supplies kHeadDim, kThreads, kChunksPerRow and kRowsPerWarp.
#pragma once
#include <stdint.h>

#include "common/mma.cuh"
#include "common/params.h"
#include "common/softmax.cuh"

namespace lab {

// Element offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
template <int kHeadDim>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * kHeadDim + ((chunk ^ (row & 7)) << 3);
}

// Copies rows [row0, row0 + kRows) of a [seqlen, D] matrix (row stride in
// elements) into a swizzled tile; rows >= seqlen are zero-filled.
template <class Cfg, int kRows, class T>
__device__ __forceinline__ void load_tile(uint32_t smem_tile, const T* gbase, int64_t row_stride,
                                          int row0, int seqlen, int tid) {
  constexpr int kPerThread = kRows * Cfg::kChunksPerRow / Cfg::kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = tid + i * Cfg::kThreads;
    const int r = idx / Cfg::kChunksPerRow;
    const int c = idx % Cfg::kChunksPerRow;
    const int grow = row0 + r;
    const bool valid = grow < seqlen;
    // Clamp to row 0 so the (unread) source address stays inside the tensor.
    const T* src = gbase + (valid ? (int64_t)grow * row_stride : 0) + c * 8;
    cp_async_16(smem_tile + swizzle<Cfg::kHeadDim>(r, c) * 2, src, valid);
  }
}

// Q fragment (A operand) of m tile mt and k-step kk of the warp whose rows start at warp_row0: one ldmatrix.x4;
// lane l addresses row l % 16 and chunk 2 kk + l / 16 of the m16 x k16 block.
template <int kHeadDim>
__device__ __forceinline__ void load_q_frag(uint32_t (&dst)[4], uint32_t sQ, int warp_row0, int mt, int kk, int lane) {
  const int r = warp_row0 + mt * 16 + (lane % 16);
  const int c = kk * 2 + lane / 16;
  ldmatrix_x4(dst, sQ + swizzle<kHeadDim>(r, c) * 2);
}

// Every k-step's Q fragments of the warp's kMT m16 blocks (load_q_frag), loaded once before the main loop.
template <int kHeadDim, int kMT, int kKSteps>
__device__ __forceinline__ void load_q_frags(uint32_t (&qf)[kMT][kKSteps][4], uint32_t sQ, int warp_row0, int lane) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) load_q_frag<kHeadDim>(qf[mt][kk], sQ, warp_row0, mt, kk, lane);
}

// Lane-invariant parts of the K and V ldmatrix addresses. K (B operand of Q K^T, non-transposed): lane l
// reads key (l%8) + 8*(l/16), chunk (l/8)%2. V (B operand of P V, transposed): lane l reads key
// (l%8) + 8*((l/8)%2), chunk l/16. In both, the key row % 8 == l % 8, which fixes the swizzle.
struct KVLanes {
  int k_row, k_chunk, v_row, v_chunk;
};
__device__ __forceinline__ KVLanes kv_lanes(int lane) {
  KVLanes l;
  l.k_row = (lane % 8) + 8 * (lane / 16);
  l.k_chunk = (lane / 8) % 2;
  l.v_row = (lane % 8) + 8 * ((lane / 8) % 2);
  l.v_chunk = lane / 16;
  return l;
}

// K fragment of keys 16 np.. (two n8 tiles) at k-step kk, and V fragment (.trans) of d 16 np.. at k-step kk.
template <int kHeadDim>
__device__ __forceinline__ void load_k_frag(uint32_t (&b)[4], uint32_t k_tile, int np, int kk, const KVLanes& l) {
  ldmatrix_x4(b, k_tile + swizzle<kHeadDim>(np * 16 + l.k_row, kk * 2 + l.k_chunk) * 2);
}
template <int kHeadDim>
__device__ __forceinline__ void load_v_frag(uint32_t (&b)[4], uint32_t v_tile, int np, int kk, const KVLanes& l) {
  ldmatrix_x4_trans(b, v_tile + swizzle<kHeadDim>(kk * 16 + l.v_row, np * 2 + l.v_chunk) * 2);
}

// One k-step of a warp's mma over the n-tile pairs of acc: for each pair np, load_b(b, np) reads the B
// fragment of n tiles 2np, 2np+1 (one ldmatrix.x4: b[0], b[1] the first n8 tile, b[2], b[3] the second), and
// every m tile mt accumulates a(mt) B into acc[mt] (a(mt): its A fragment of this k-step).
template <class T, int kMT, int kN, class A, class LoadB>
__device__ __forceinline__ void mma_kstep(float (&acc)[kMT][kN][4], A&& a, LoadB&& load_b) {
#pragma unroll
  for (int np = 0; np < kN / 2; ++np) {
    uint32_t b[4];
    load_b(b, np);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) mma_16816_x2<T>(acc[mt], 2 * np, a(mt), b);
  }
}

// S = Q K^T for one K tile, on a warp's kMT m16 tiles (fp32 S in acc_s, zeroed first). qf holds the Q
// fragments: all k-steps (kQF = D/16, loaded once) or one (kQF = 1, Q re-read from shared memory every k-step:
// load_q(kk) refills qf[.][0] before k-step kk). load_k(bk, np, kk) reads the K fragment of keys 16 np.. at
// k-step kk (load_k_frag, or a kernel's own addressing).
template <class T, int kKSteps, int kMT, int kNS, int kQF, class LoadQ, class LoadK>
__device__ __forceinline__ void qk_tile(float (&acc_s)[kMT][kNS][4], uint32_t (&qf)[kMT][kQF][4], LoadQ&& load_q,
                                        LoadK&& load_k) {
  zero_frags(acc_s);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    constexpr int kQ0 = 0;
    const int qk = kQF == 1 ? kQ0 : kk;  // which qf slot holds k-step kk
    if constexpr (kQF == 1) load_q(kk);
    // keys 16np.. of the K tile
    mma_kstep<T>(acc_s, [&](int mt) -> const uint32_t(&)[4] { return qf[mt][qk]; },
                 [&](uint32_t (&bk)[4], int np) { load_k(bk, np, kk); });
  }
}

// O += P V for one V tile, P being the fp32 S of the tile after the softmax (acc_s): the S accumulators of n
// tiles 2kk, 2kk+1 are exactly the A fragment of k-step kk once packed to 16 bits. kPackEarly: all of P is
// packed before the first P V mma, so the fp32 S registers die before the V fragments are loaded (half the
// registers for P during P V). load_v(bv, np, kk) reads the V fragment (.trans) of d 16 np.. at k-step kk.
template <class T, bool kPackEarly, int kMT, int kNS, int kNO, class LoadV>
__device__ __forceinline__ void pv_tile(float (&acc_o)[kMT][kNO][4], const float (&acc_s)[kMT][kNS][4],
                                        LoadV&& load_v) {
  constexpr int kKSteps = kNS / 2;
  uint32_t pp[kMT][kKSteps][4];
  auto pack = [&](int kk) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) pack_p<T>(acc_s, mt, kk, pp[mt][kk]);
  };
  if constexpr (kPackEarly) {
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) pack(kk);
  }
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    if constexpr (!kPackEarly) pack(kk);
    // d 16np.. of the V tile
    mma_kstep<T>(acc_o, [&](int mt) -> const uint32_t(&)[4] { return pp[mt][kk]; },
                 [&](uint32_t (&bv)[4], int np) { load_v(bv, np, kk); });
  }
}

// An opaque copy of a pointer: the compiler cannot hoist address arithmetic on it out of a loop (v03's
// kLaunder: one 64-bit source pointer per cp.async held across the tile loop otherwise).
template <class T>
__device__ __forceinline__ const T* launder(const T* ptr) {
  asm volatile("" : "+l"(ptr));
  return ptr;
}

// The prologue of the mma.sync forward kernels: Q_i (rows m0.. of q) as its own commit group, so its
// fragments can be read while the first K/V tiles are still in flight; then K/V tiles 0 .. kPrefetch - 1
// of kBc keys into stages 0.. (K of stage s at sKV + s * kSmemTile, V kStages tiles further), one commit
// group each, committed even when empty so the group count stays uniform; then the wait for Q, and Q
// negated for a negative scale (common/softmax.cuh; CTA-uniform, once).
template <class Cfg, int kBc, int kPrefetch, class T>
__device__ __forceinline__ void load_q_first_kv(uint32_t sQ, uint32_t sKV, void* smem, const T* q, const T* k,
                                                const T* v, const AttnFwdParams& p, int m0, int n_tiles, int tid) {
  load_tile<Cfg, Cfg::kBlockM>(sQ, q, p.q_stride[2], m0, p.seqlen_q, tid);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < kPrefetch; ++s) {
    if (s < n_tiles) {
      load_tile<Cfg, kBc>(sKV + s * Cfg::kSmemTile, k, p.k_stride[2], s * kBc, p.seqlen_k, tid);
      load_tile<Cfg, kBc>(sKV + (Cfg::kStages + s) * Cfg::kSmemTile, v, p.v_stride[2], s * kBc, p.seqlen_k, tid);
    }
    cp_async_commit();
  }
  cp_async_wait<kPrefetch>();  // Q has landed (K/V may not have)
  __syncthreads();
  if (softmax_negate_q(p.scale)) {
    negate_smem_16bit<Cfg::kSmemQ, Cfg::kThreads>(smem, tid);
    __syncthreads();
  }
}

// Writes a warp's normalised O fragments (rows warp_row0.. of the block, m16n8 layout) to this warp's own
// rows of the swizzled tile at sO, packed to 16 bits: the first half of store_o, which v04 calls on its own.
template <class Cfg, class T, int kMT, int kNO>
__device__ __forceinline__ void stage_o(const float (&acc_o)[kMT][kNO][4], uint32_t sO, int warp_row0, int g, int t) {
  constexpr int D = Cfg::kHeadDim;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNO; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = warp_row0 + mt * 16 + hh * 8 + g;
        const int col = nt * 8 + 2 * t;
        const uint32_t val = pack2<T>(acc_o[mt][nt][2 * hh], acc_o[mt][nt][2 * hh + 1]);
        const uint32_t addr = sO + (swizzle<D>(r, col / 8) + col % 8) * 2;
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(val) : "memory");
      }
}

// Writes a warp's normalised O fragments to global rows m0 + r < seqlen_q of o. The fragments go first to
// this warp's own rows of the swizzled tile at sO (stage_o; only this warp reads them, so no block barrier),
// turning 4-byte fragment stores into 16-byte coalesced row stores. kSyncFirst: a __syncwarp() before, when
// those rows were Q rows other lanes may still read.
template <class Cfg, bool kSyncFirst, class T, int kMT, int kNO>
__device__ __forceinline__ void store_o(const float (&acc_o)[kMT][kNO][4], uint32_t sO, T* o, const AttnFwdParams& p,
                                        int m0, int warp_row0, int lane, int g, int t) {
  constexpr int D = Cfg::kHeadDim;
  if constexpr (kSyncFirst) __syncwarp();
  stage_o<Cfg, T>(acc_o, sO, warp_row0, g, t);
  __syncwarp();

  constexpr int kStorePerLane = Cfg::kRowsPerWarp * Cfg::kChunksPerRow / 32;
#pragma unroll
  for (int i = 0; i < kStorePerLane; ++i) {
    const int idx = lane + i * 32;
    const int r = warp_row0 + idx / Cfg::kChunksPerRow;
    const int c = idx % Cfg::kChunksPerRow;
    const int grow = m0 + r;
    if (grow < p.seqlen_q) {
      uint4 val;
      const uint32_t addr = sO + swizzle<D>(r, c) * 2;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(addr)
                   : "memory");
      *reinterpret_cast<uint4*>(o + (int64_t)grow * p.o_stride[2] + c * 8) = val;
    }
  }
}

// The end of v02's and v03's kernel: the (empty) trailing cp.async groups drained before sQ is reused; O / l
// and LSE (normalise_rows; the LSE rows of head (b, h) start at (b H_q + h) S_q); then O out through this
// warp's own rows of sQ (store_o; kSyncFirst: after every lane's last ldmatrix of them, Q in smem).
template <class Cfg, bool kSyncFirst, class T, int kMT, int kNO>
__device__ __forceinline__ void fwd_epilogue(float (&acc_o)[kMT][kNO][4], const float (&row_max)[kMT][2],
                                             const float (&row_sum)[kMT][2], uint32_t sQ, T* o,
                                             const AttnFwdParams& p, int b, int h, int m0, int warp_row0, int lane,
                                             int g, int t) {
  cp_async_wait<0>();
  normalise_rows<true>(acc_o, row_max, row_sum, fabsf(p.scale), p.lse, ((int64_t)b * p.heads_q + h) * p.seqlen_q,
                       m0 + warp_row0, p.seqlen_q, g, t);
  store_o<Cfg, kSyncFirst>(acc_o, sQ, o, p, m0, warp_row0, lane, g, t);
}

// v03's and v04's ping-pong main loop: S_{j+1} = Q K_{j+1}^T is issued before the softmax of S_j, so one
// warp has independent tensor-core work (the S_{j+1} mma) to overlap its own exp2/max/sum of tile j,
// instead of relying on the other warps of its scheduler. Costs a second S accumulator (SAcc) and needs
// K_{j+1} resident while V_j is used: at iteration j tiles j and j+1 must have landed, so the wait leaves
// kStages - 3 groups in flight. On the last iteration the S_{j+1} product reads a buffer that holds no tile
// (stale or never written); it is computed and thrown away, which keeps the loop body one basic block for
// the scheduler. The kernel's steps of one tile: qk_tile(acc, k_tile), mask_tile(acc, j),
// softmax_pv(acc, v_tile), refill(j) (the buffer tile j-1 used gets tile j + kStages - 1).
template <class SAcc, int kStages, class KV, class QK, class Mask, class SoftmaxPV, class Refill>
__device__ __forceinline__ void pingpong_loop(int n_tiles, const KV& kvs, QK&& qk_tile, Mask&& mask_tile,
                                              SoftmaxPV&& softmax_pv, Refill&& refill) {
  static_assert(kStages >= 3, "ping-pong needs K_{j+1} and V_j resident plus a buffer in flight");
  SAcc acc_s;
  if (n_tiles > 0) {
    cp_async_wait<kStages - 2>();  // tile 0
    __syncthreads();
    qk_tile(acc_s, kvs.k(0));
  }
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<kStages - 3>();  // tile j + 1 (or its empty group)
    __syncthreads();  // landed for everyone; tile j-1's buffer is free
    refill(j);
    mask_tile(acc_s, j);
    SAcc acc_n;
    qk_tile(acc_n, kvs.k((j + 1) % kStages));
    softmax_pv(acc_s, kvs.v(j % kStages));
    copy_frags(acc_s, acc_n);
  }
}

}  // namespace lab
