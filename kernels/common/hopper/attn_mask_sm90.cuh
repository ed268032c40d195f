// The masks of fwd v09 (kernels/fwd/v09_masks_wgmma.cu) on the wgmma accumulator layout: the window mask, the
// softcap transform and the epilogue with an attention sink. Separate from attn_fwd_sm90.cuh so that v05-v07,
// which never include it, keep their code exactly. The rule is common/mask.cuh's window_masked (lab/masks/spec.py).
//
// Layout (m64nBC f32 accumulator, one warpgroup): thread (warp w, lane l) holds s[4 i + e] for row
// row0 + 8 (e / 2), row0 = m0 + 16 w + l / 4, and column col0 + 8 i + 2 (l % 4) + e % 2.
#pragma once
#include <math.h>
#include <stdint.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"
#include "common/mask.cuh"

namespace lab::sm90 {

// ---------------------------------------------------------------- host (fwd v09, v11)

// The masked launchers' argument checks, then the device: true to go on; false ends the call with *rc (0: nothing to
// do, e.g. no packed rows or an empty shape; else LAB_E_* < 0 or a cudaError_t). paged_ok: the kernel reads a block
// table (fwd v11); the others return LAB_E_MODE when one is set.
inline bool mask_fwd_go(const AttnMaskParams* p, int* dev, int* rc, bool paged_ok = false) {
  *rc = 0;
  if (p->softcap < 0.f || p->window_left < -1 || p->window_right < -1) *rc = LAB_E_SHAPE;
  else if ((p->cu_seqlens_q == nullptr) != (p->cu_seqlens_k == nullptr)) *rc = LAB_E_SHAPE;
  else if (p->block_table != nullptr && !paged_ok) *rc = LAB_E_MODE;
  else if (p->block_table != nullptr &&
           (p->cu_seqlens_q == nullptr || p->page_errors == nullptr || p->page_size <= 0 || p->page_size % 16 ||
            p->num_pages <= 0 || p->max_pages <= 0 || (int64_t)p->max_pages * p->page_size > (1 << 30)))
    *rc = LAB_E_SHAPE;
  else if (p->cu_seqlens_q != nullptr && (p->total_q <= 0 || p->total_q > (1 << 30) || p->total_k > (1 << 30)))
    *rc = p->total_q == 0 ? 0 : LAB_E_SHAPE;
  else if (const int c = check_tma_fwd_params(&p->base)) *rc = c < 0 ? c : 0;
  else if (!device_is_sm90(dev)) *rc = (int)cudaErrorNoKernelImageForDevice;
  else return true;
  return false;
}

// Rows of one TMA box of a paged K/V tile: the largest power of two dividing page_size, at most a tile (bc), so a
// box never crosses a page and a tile of bc keys is bc / rows boxes (page_size 16: 8 boxes of 2 KiB per 64
// columns, 256: one). Each box lands at row i * rows of the tile, a multiple of 8 rows (1024 B), where the 128-byte
// swizzle pattern starts over: the tile reads as one box of bc rows would have written it.
__host__ __device__ inline int paged_box_rows(int page_size, int bc) {
  const int pow2 = page_size & -page_size;
  return pow2 < bc ? pow2 : bc;
}

// One launch of a masked kernel: its shared-memory opt-in, the tensor maps (Q boxes of 64 rows, K and V of Cfg::BC;
// packed calls: the packed (total, H, D) tensors as one sequence of total rows, B = 1), one CTA per Cfg::BR query rows
// of the longest sequence, head and batch entry.
template <class Cfg, auto kKernel>
inline int launch_masked_fwd(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  if (const cudaError_t err = allow_smem_once<kKernel>(Cfg::kSmem, dev)) return (int)err;
  const AttnFwdParams& p = mp.base;
  CUtensorMap tq, tk, tv;
  const bool bf16 = p.dtype == LAB_BF16;
  if (mp.block_table != nullptr) {  // paged K/V: (D, page_size, H_kv, num_pages) maps, boxes of paged_box_rows
    const int rows = paged_box_rows(mp.page_size, Cfg::BC);
    if (!make_bhsd_map(&tq, p.q, bf16, p.head_dim, mp.total_q, p.heads_q, 1, p.q_stride, 64) ||
        !make_bhsd_map(&tk, p.k, bf16, p.head_dim, mp.page_size, p.heads_kv, mp.num_pages, p.k_stride, rows) ||
        !make_bhsd_map(&tv, p.v, bf16, p.head_dim, mp.page_size, p.heads_kv, mp.num_pages, p.v_stride, rows))
      return LAB_E_SHAPE;
  } else if (mp.cu_seqlens_q != nullptr) {
    const int tk_rows = mp.total_k > 0 ? mp.total_k : 1;
    if (!make_bhsd_map(&tq, p.q, bf16, p.head_dim, mp.total_q, p.heads_q, 1, p.q_stride, 64) ||
        !make_bhsd_map(&tk, p.k, bf16, p.head_dim, tk_rows, p.heads_kv, 1, p.k_stride, Cfg::BC) ||
        !make_bhsd_map(&tv, p.v, bf16, p.head_dim, tk_rows, p.heads_kv, 1, p.v_stride, Cfg::BC))
      return LAB_E_SHAPE;
  } else if (const int rc = make_fwd_maps(&p, 64, Cfg::BC, &tq, &tk, &tv)) {
    return rc;
  }
  const int64_t blocks = (int64_t)((p.seqlen_q + Cfg::BR - 1) / Cfg::BR) * p.batch * p.heads_q;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  kKernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmem, stream>>>(tq, tk, tv, mp);
  return (int)cudaGetLastError();
}

// ---------------------------------------------------------------- paged K/V (fwd v11)

#ifndef LAB_FWD_MASK_PAGED_VOTE
#define LAB_FWD_MASK_PAGED_VOTE 1  // paged_table_bits' warp vote (0: without it, the A/B's baseline)
#endif

// LAB_FWD_MASK_RING_CARRY (1, default): the masked kernels' rings carry their slot where RingSlot allows it
// (common/hopper/attn_fwd_sm90.cuh: 3 stages, i.e. the paged and packed kernels' ring at D = 128 and every D = 64
// ring of fwd v11); 0: derived everywhere, the A/B's baseline. Measured (H200): the paged kernels +1.0-1.3 % at
// D 128, the packed persistent kernel +1.0-3.6 %, D 64 level (fwd v11's header, record 20261130-masks-fwd-ring-carry).
#ifndef LAB_FWD_MASK_RING_CARRY
#define LAB_FWD_MASK_RING_CARRY 1
#endif
template <int kStages>
using MaskRingSlot = RingSlot<kStages, LAB_FWD_MASK_RING_CARRY != 0>;

// A consumer warpgroup's wait for the tile in ring slot x of `full` (K or V), and its release of the slot to the
// producer through `empty` (one arrival a warp: thread ct of the warpgroup, lane 0 of each warp).
template <class Slot>
__device__ __forceinline__ void ring_wait(uint64_t* full, Slot x) {
  mbar_wait(smem_u32(&full[x.stage]), x.parity);
}
template <class Slot>
__device__ __forceinline__ void ring_release(uint64_t* empty, Slot x, int ct) {
  if (ct % 32 == 0) mbar_arrive(smem_u32(&empty[x.stage]));
}

// A block-table entry the cache has no page for (what both table scans below look for).
__device__ __forceinline__ bool page_outside(const AttnMaskParams& mp, int page) {
  return page < 0 || page >= mp.num_pages;
}

// A sequence's block table before any load: LAB_PAGE_E_SHORT when its seqlen_k keys do not fit max_pages pages,
// LAB_PAGE_E_INDEX when a page holding one of them is outside [0, num_pages); 0: every page it reads is good. All
// threads of the CTA call it (a __syncthreads_or), and every CTA of the sequence scans the whole sequence, so they
// all agree: the sequence is computed everywhere or zeroed everywhere.
__device__ __forceinline__ int paged_table_bits(const AttnMaskParams& mp, const int32_t* table, int seqlen_k) {
  if ((int64_t)seqlen_k > (int64_t)mp.max_pages * mp.page_size) return LAB_PAGE_E_SHORT;  // uniform: no barrier
  const int needed = (seqlen_k + mp.page_size - 1) / mp.page_size;
  bool bad = false;
  for (int i = threadIdx.x; i < needed; i += blockDim.x) {
    bad |= page_outside(mp, table[i]);
  }
  // The CTA's OR is the same on every thread, but the compiler cannot know: a branch on it made the whole main loop
  // after it divergent to the compiler (its descriptors in vector registers). A warp vote (VOTEU) makes it uniform.
#if LAB_FWD_MASK_PAGED_VOTE
  return __any_sync(0xffffffffu, __syncthreads_or(bad) != 0) ? LAB_PAGE_E_INDEX : 0;
#else  // the form before, for the A/B only
  return __syncthreads_or(bad) ? LAB_PAGE_E_INDEX : 0;
#endif
}

// A bad sequence's rows [m0, m1) of O (16-byte stores from `out`, row 0 of the sequence) zeroed and of the LSE set
// to -inf by `threads` threads (tid 0 .. threads - 1; the whole CTA by default), which then return: no barrier, no
// load.
template <int D, class T>
__device__ __forceinline__ void paged_zero_rows(T* out, int64_t row_stride, float* lse_row0, int m0, int m1,
                                                int tid = threadIdx.x, int threads = blockDim.x) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < (m1 - m0) * kChunks; idx += threads)
    *reinterpret_cast<uint4*>(out + (int64_t)(m0 + idx / kChunks) * row_stride + (idx % kChunks) * 8) =
        make_uint4(0u, 0u, 0u, 0u);
  if (lse_row0 != nullptr)
    for (int r = m0 + tid; r < m1; r += threads) lse_row0[r] = -INFINITY;
}

// The consumers' share of the block-table scan (PAGED_CONSUMER_SCAN): thread tid of `threads` reads every threads-th
// page a sequence of seqlen_k keys holds; then the OR over those threads by named barrier `bar_id` (bar.red, which
// only they join: the producer is issuing loads meanwhile), made uniform by a warp vote as paged_table_bits' is.
// The caller has already excluded LAB_PAGE_E_SHORT, so every slot read lies in the table's row.
__device__ __forceinline__ bool paged_table_bad(const AttnMaskParams& mp, const int32_t* table, int seqlen_k, int tid,
                                                int threads, int bar_id) {
  const int needed = (seqlen_k + mp.page_size - 1) / mp.page_size;
  uint32_t bad = 0;
  for (int i = tid; i < needed; i += threads) {
    bad |= (uint32_t)page_outside(mp, __ldg(table + i));
  }
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}"
      : "=r"(any) : "r"(bad), "r"(bar_id), "r"(threads) : "memory");
  return __any_sync(0xffffffffu, any != 0);
}

// Rows [row0, BC) of a K/V tile at `tile` (D / 64 blocks of BC rows x 128 B) set to zero by `threads` threads, then
// made visible to wgmma: a paged tile's rows past the sequence's keys come from the rest of its last page, which
// holds whatever the cache held (possibly NaN or inf, and P = 0 times NaN is NaN). The caller's barrier follows.
template <int D, int BC>
__device__ __forceinline__ void zero_tile_rows(uint8_t* tile, int row0, int tid, int threads) {
  const int chunks = (BC - row0) * 8;  // 16-byte chunks a 64-column block holds past row0
  for (int idx = tid; idx < chunks * (D / 64); idx += threads) {
    const int cb = idx / chunks, c = idx % chunks;
    *reinterpret_cast<uint4*>(tile + cb * BC * 128 + row0 * 128 + c * 16) = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_proxy_async();
}

// Hidden scores -> -inf (after any scale or softcap: the caller's softmax then runs with a positive factor).
template <int BC>
__device__ __forceinline__ void mask_window_wg(float (&s)[BC / 2], int row0, int col0, int seqlen_k, int off, int left,
                                               int right) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (window_masked(row0 + (e >> 1) * 8, col0 + 8 * i + 2 * t + (e & 1), seqlen_k, off, left, right))
        s[4 * i + e] = -INFINITY;
}

// s -> tanh(s * k) (softcap: k = scale / softcap, the softmax factor softcap log2 e) or s -> s * k (a scale <= 0,
// which the folded softmax cannot take: k = scale, factor log2 e).
template <int BC, bool kTanh>
__device__ __forceinline__ void transform_scores(float (&s)[BC / 2], float k) {
#pragma unroll
  for (int i = 0; i < BC / 2; ++i) s[i] = kTanh ? tanh_fast(s[i] * k) : s[i] * k;
}

// The softcap bounds every score: s' = softcap tanh(.) lies in [-softcap, softcap], so the row max that the online
// softmax tracks is known before any key is read. With a fixed offset m = softcap log2 e - kCapHeadroom (log2
// units) the softmax needs no max, no alpha and no O rescale: P = exp2(t softcap log2 e - m) lies in
// [2^(kCapHeadroom - 2 softcap log2 e), 2^kCapHeadroom]. Exact as the online form is (O and l carry the same
// offset; the epilogue's O / l and LSE = m + log2 l take it out) while neither end leaves fp32 / bf16's normal
// range: P <= 2^48 keeps l and O far from overflow (O <= 2^48 S_k max|V|), and a row whose every score sits at
// -softcap still has P >= 2^(48 - 2 x 74) = 2^-100, with 24 bits of normal range below it, when softcap log2 e
// <= kCapMaxLog2 (softcap <= 51.3, Gemma-2's 50 included). fp16 P (max 65504, normal from 2^-14) has no such
// room: fp16 calls and larger caps keep the online max.
constexpr float kCapHeadroom = 48.f;
constexpr float kCapMaxLog2 = 74.f;

// P = exp2(t c - off) against the fixed offset (exp_rows' FFMA and ex2), rounded to T where it is made, and l summed
// from the rounded values (two chains per row), so O = sum P V / l weighs numerator and denominator alike. With a
// running max the largest P of a row is exactly 1 and survives the rounding to 16 bits; against a fixed offset it
// lies anywhere in [2^-100, 2^48], and an fp32 l over 16-bit P leaves a row of one key (O = V) off by up to 2^-9
// (the S_q = S_k = 1 softcap checks failed so in the first run of the fixed offset). pack_p then packs the same bits.
// kPolyEvery > 0: every kPolyEvery-th n8 column block takes exp2 on the FMA pipe (exp2_poly: its arguments here lie in
// [kCapHeadroom - 2 kCapMaxLog2, kCapHeadroom], inside its range), for a loop where the tanh and the exp2 per score
// share the MUFU unit (fwd v11's LAB_FWD_MASK_CAP_POLY).
template <int BC, class T, int kPolyEvery = 0>
__device__ __forceinline__ void exp_rows_rounded(float (&s)[BC / 2], RowState& st, float off, float c) {
  float sum[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      constexpr int kEvery = kPolyEvery > 0 ? kPolyEvery : 1;  // (no % by zero when off)
      const bool poly = kPolyEvery > 0 && i % kEvery == 0;
      const float a0 = fmaf(s[4 * i + e], c, -off), a1 = fmaf(s[4 * i + e + 1], c, -off);
      const uint32_t pr = pack2<T>(poly ? exp2_poly(a0) : fast_exp2(a0), poly ? exp2_poly(a1) : fast_exp2(a1));
      float lo, hi;
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // bf16 -> fp32 is a shift
        lo = __uint_as_float(pr << 16);
        hi = __uint_as_float(pr & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&pr));
        lo = f.x;
        hi = f.y;
      }
      s[4 * i + e] = lo;
      s[4 * i + e + 1] = hi;
      sum[e >> 1][0] += lo;
      sum[e >> 1][1] += hi;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) st.l[h] += sum[h][0] + sum[h][1];
}

// P = exp2(t c - off) against the fixed offset, nothing summed (LAB_FWD_MASK_SOFTCAP=2: l comes from issue_rowsum).
template <int BC>
__device__ __forceinline__ void exp_rows_fixed(float (&s)[BC / 2], float off, float c) {
#pragma unroll
  for (int i = 0; i < BC / 2; ++i) s[i] = fast_exp2(fmaf(s[i], c, -off));
}

// The same sum of the rounded P taken by the tensor core instead (LAB_FWD_MASK_SOFTCAP=2 in fwd v09): l = P 1, an m64n8k16
// wgmma per k16 step of P V with B a tile of bf16 ones, issued in P V's commit group from the same A fragments. Its
// fp32 sum of the 16-bit P is what P V's own accumulation does, so O = sum P V / l keeps the rounded form's
// exactness (one key: O = V), and the loop drops the unpack (one integer instruction per P) and l's FADDs for four
// wgmma per 64 keys. The ones: one K-major 128B-swizzle atom (8 rows = n, 64 k = 128 B a row, 1024 B), whose bytes
// are all ones, so every k16 step reads the same atom (its 32-byte slice kk % 4, as desc_kmajor addresses K).
constexpr int kRowSumOnesBytes = 1024;

// The ones atom at `ones` (1024-aligned), written by the warpgroup's 128 threads (8 bytes each), made visible to
// wgmma; the caller's barrier follows.
__device__ __forceinline__ void fill_rowsum_ones(uint8_t* ones) {
  reinterpret_cast<uint2*>(ones)[threadIdx.x % 128] = make_uint2(0x3F803F80u, 0x3F803F80u);  // bf16 1.0 pairs
  fence_proxy_async();
}

// l += P 1 for one tile (four fp32 per thread, the m64n8 accumulator: l[0] = l[1] the row sum of row g, l[2] = l[3]
// of row g + 8, each whole, not a quad's share); the caller's issue_pv commits it with P V.
template <int BC, bool kBf16>
__device__ __forceinline__ void issue_rowsum(float (&l)[4], const uint32_t (&pa)[BC / 16][4], uint32_t ones) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) WgmmaOp<8>::template rs<kBf16, 0>(l, pa[kk], desc_kmajor(ones, 8, kk % 4), 1);
}

// The tensor core's row sums into RowState, whose l the epilogue sums over the quad: each lane holds the whole sum,
// so a quarter each (exact: a power of two, and quad_sum's two steps add equal values).
__device__ __forceinline__ void rowsum_to_state(const float (&l)[4], RowState& st) {
  st.l[0] = l[0] * 0.25f;
  st.l[1] = l[2] * 0.25f;
}

// normalise_o with a sink: st.m is the running max already in exp2 units (the folded softmax), sink_log2 the
// sink's logit times log2 e (-inf: none); top = max(m, sink) keeps exp2 from overflowing. LSE (natural log,
// including the sink) at lse_row0[row] for rows below seqlen_q, when lse_row0 is not null.
template <int D>
__device__ __forceinline__ void normalise_o_sink(float (&o)[D / 2], const RowState& st, float sink_log2,
                                                 float* lse_row0, int m0, int seqlen_q) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = quad_sum(st.l[hh]);
    const float m = st.m[hh];
    const float top = fmaxf(m, sink_log2);
    float scale = 0.f, lse = -INFINITY;
    if (top != -INFINITY) {
      const float a = exp2f(m - top);
      const float total = l * a + exp2f(sink_log2 - top);
      if (total > 0.f) {
        scale = a / total;
        lse = (top + log2f(total)) * kLn2;
      }
    }
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[4 * i + 2 * hh] *= scale;
      o[4 * i + 2 * hh + 1] *= scale;
    }
    const int row = m0 + warp * 16 + hh * 8 + g;
    if (lse_row0 != nullptr && t == 0 && row < seqlen_q) lse_row0[row] = lse;
  }
}

// epilogue with normalise_o_sink and O's rows given by a row pointer (a packed sequence's first row): O staged
// through `stage` (the Q tile, free once every warp's last wgmma has read it), then 16-byte row stores.
template <int D, class T>
__device__ __forceinline__ void epilogue_sink(float (&o)[D / 2], const RowState& st, float sink_log2, float* lse_row0,
                                              T* out, int64_t row_stride, int seqlen_q, uint8_t* stage, int m0,
                                              int bar_id) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  normalise_o_sink<D>(o, st, sink_log2, lse_row0, m0, seqlen_q);
  named_barrier_sync(bar_id, 128);
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = warp * 16 + hh * 8 + g;
      *reinterpret_cast<uint32_t*>(stage + swz_offset(64, r, 8 * i + 2 * t)) =
          pack2<T>(o[4 * i + 2 * hh], o[4 * i + 2 * hh + 1]);
    }
  named_barrier_sync(bar_id, 128);
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int i = 0; i < 64 * kChunks / 128; ++i) {
    const int idx = wt + i * 128, r = idx / kChunks, c = idx % kChunks;
    if (m0 + r < seqlen_q)
      *reinterpret_cast<uint4*>(out + (int64_t)(m0 + r) * row_stride + c * 8) =
          *reinterpret_cast<const uint4*>(stage + swz_offset(64, r, c * 8));
  }
}

// ---------------------------------------------------------------- the masked kernels' shared steps (fwd v09, v11, v12)

// The score transform a masked kernel is instantiated for (launch_by_transform picks it per call).
enum Transform { kNone = 0, kScale = 1, kTanh = 2, kTanhBounded = 3 };

// The choice of transform: the bf16 softcap within kCapMaxLog2 takes the fixed offset (kBoundedOk: the kernel has
// that form), fp16 and larger caps the online max; a scale <= 0 is multiplied in before the (folded) softmax.
// launch(std::integral_constant<int, kTransform>) launches the file's kernel for it.
template <class T, bool kBoundedOk = true, class Launch>
inline int launch_by_transform(const AttnMaskParams& mp, Launch&& launch) {
  if (mp.softcap > 0.f) {
    if constexpr (kBoundedOk && std::is_same_v<T, __nv_bfloat16>)
      if (mp.softcap * kLog2e <= kCapMaxLog2) return launch(std::integral_constant<int, kTanhBounded>{});
    return launch(std::integral_constant<int, kTanh>{});
  }
  if (mp.base.scale > 0.f) return launch(std::integral_constant<int, kNone>{});
  return launch(std::integral_constant<int, kScale>{});
}

// Sequence b's rows [q0, q0 + sq) and keys [k0, k0 + sk) of the packed tensors, clamped: no cu_seqlens value reads or
// writes outside them. fwd v11's and v12's kernels keep these lines written out: the call moved their machine code.
__device__ __forceinline__ void packed_sequence(const AttnMaskParams& mp, int b, int& q0, int& k0, int& sq, int& sk) {
  const int qa = min(max(mp.cu_seqlens_q[b], 0), mp.total_q), qb = min(max(mp.cu_seqlens_q[b + 1], qa), mp.total_q);
  const int ka = min(max(mp.cu_seqlens_k[b], 0), mp.total_k), kb = min(max(mp.cu_seqlens_k[b + 1], ka), mp.total_k);
  q0 = qa;
  k0 = ka;
  sq = min(qb - qa, mp.base.seqlen_q);
  sk = min(kb - ka, mp.base.seqlen_k);
}

// The window's key tiles of query rows [m0, m1) of a sequence of seqlen_k keys (diagonal offset off): tiles
// [x, x + y) of BC keys, y = 0 when no key is in the window.
template <int BC>
__device__ __forceinline__ int2 window_tiles(int m0, int m1, int seqlen_k, int off, int left, int right) {
  const int2 range = lab::window_key_range(m0, m1, seqlen_k, off, left, right);
  const int first = range.y > range.x ? range.x / BC : 0;
  return make_int2(first, range.y > range.x ? (range.y + BC - 1) / BC - first : 0);
}

// The work tile of a CTA of fwd v11 / v12 (one per Cfg::BR query rows, head and batch entry): query blocks longest
// first (a right edge makes later blocks heavier) within groups of heads whose window of K and V fits
// Cfg::kL2GroupMB (fwd v07's causal order, with the window's keys per head). Returns (query block, b * H + h).
template <class Cfg>
__device__ __forceinline__ int2 masked_l2_tile(const AttnMaskParams& mp) {
  const AttnFwdParams& p = mp.base;
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR, num_bh = p.batch * p.heads_q;
  const int span = mp.window_left >= 0 ? min(p.seqlen_k, mp.window_left + Cfg::BR + Cfg::BC) : p.seqlen_k;
  const int64_t kv_head = (int64_t)max(span, 1) * Cfg::D * 4;
  const int group = Cfg::kL2GroupMB > 0
                        ? (int)max((int64_t)1, min((int64_t)num_bh, (int64_t)Cfg::kL2GroupMB * (1 << 20) / kv_head))
                        : num_bh;
  const int work = blockIdx.x, g = work / (group * num_m), r = work % (group * num_m);
  const int heads = min(group, num_bh - g * group);
  const int mb = mp.window_right >= 0 ? num_m - 1 - r / heads : r / heads;
  return make_int2(mb, g * group + r % heads);
}

// Thread 0's barriers of a producer and Cfg::kConsumers consumer warpgroups: Q, K and V full (init_full_barriers)
// and K and V empty, one arrival per consumer warp; then the fence.
template <class Cfg>
__device__ __forceinline__ void init_split_barriers(uint64_t* bar_q, uint64_t* bar_k, uint64_t* bar_v,
                                                    uint64_t* empty_k, uint64_t* empty_v) {
  init_full_barriers<Cfg::kStages>(bar_q, bar_k, bar_v);
  for (int s = 0; s < Cfg::kStages; ++s) {
    mbar_init(smem_u32(&empty_k[s]), 4 * Cfg::kConsumers);  // one arrival per consumer warp
    mbar_init(smem_u32(&empty_v[s]), 4 * Cfg::kConsumers);
  }
  fence_barrier_init();
}

// The producer's K_j, V_j of n_tiles key tiles from key row k0 + shift into the ring, by thread 0 (K and V stages
// released apart, fwd v10's split barriers): each stage after its consumers' empty arrivals. k0 and shift apart, as
// the kernels wrote them: one row argument k0 + shift moved fwd v12's machine code.
template <class Cfg>
__device__ __forceinline__ void produce_kv(const SmemRing<Cfg>& ring, const CUtensorMap* tk, const CUtensorMap* tv,
                                           uint64_t* bar_k, uint64_t* bar_v, uint64_t* empty_k, uint64_t* empty_v,
                                           int n_tiles, int k0, int shift, int hkv, int bq) {
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % kStages, row = k0 + shift + j * BC;
    const uint32_t free_parity = ((j / kStages) & 1) ^ 1;
    if (j >= kStages) mbar_wait(smem_u32(&empty_k[s]), free_parity);
    mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.k(s) + cb * BC * 128, tk, smem_u32(&bar_k[s]), cb * 64, row, hkv, bq);
    if (j >= kStages) mbar_wait(smem_u32(&empty_v[s]), free_parity);
    mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(ring.v(s) + cb * BC * 128, tv, smem_u32(&bar_v[s]), cb * 64, row, hkv, bq);
  }
}

// The masked epilogue: the sink joins the normaliser (epilogue_sink); O and LSE rows of sequence b (packed: from its
// row q0 of the packed tensors; bq: the batch coordinate of O, 0 when packed) only, staged in `stage`. packed and bq
// are the caller's: taken from mp again here, their selects were made twice (the kernels' machine code moved).
template <int D, class T>
__device__ __forceinline__ void epilogue_masked(float (&o)[D / 2], const RowState& st, const AttnMaskParams& mp,
                                                bool packed, int b, int bq, int h, int q0, int seqlen_q, uint8_t* stage,
                                                int m0, int bar_id) {
  const AttnFwdParams& p = mp.base;
  const float sink_log2 = mp.sinks != nullptr ? mp.sinks[h] * kLog2e : -INFINITY;
  float* lse_row0 = p.lse == nullptr ? nullptr
                    : packed         ? p.lse + (int64_t)h * mp.total_q + q0
                                     : p.lse + ((int64_t)b * p.heads_q + h) * p.seqlen_q;
  T* out = static_cast<T*>(p.o) + (int64_t)bq * p.o_stride[0] + (int64_t)h * p.o_stride[1] + (int64_t)q0 * p.o_stride[2];
  epilogue_sink<D, T>(o, st, sink_log2, lse_row0, out, p.o_stride[2], seqlen_q, stage, m0, bar_id);
}

// fwd v11's softmax step of key tile j (touches neither O nor the P fragments; its packed persistent kernel's and
// fwd v12's too):
// the transform (the bf16 softcap's tanh on fp16 pairs with kTanhHalf), the window's mask where the tile crosses an
// edge, then the fixed offset's exp (kTanhBounded, every kPolyEvery-th n8 block on the FMA pipe) or the online
// softmax, lazy on an unmasked tile after the first. kRowBound: a masked tile with no left edge and a right edge of 0
// or none takes fwd v07's bound per row instead. kBugEdgeOnly: wrong on purpose, the window's edge tiles unmasked
// (fwd v12's LAB_FWD_MASK_WIDE_BUG_NO_EDGE). Returns whether O needs rescale_o.
template <int BC, class T, int kTransform, bool kTanhHalf, int kPolyEvery, bool kRowBound = false,
          bool kBugEdgeOnly = false>
__device__ __forceinline__ bool masked_softmax_step(float (&sacc)[BC / 2], RowState& st, float (&alpha)[2], float c,
                                                    float tk_factor, int j, int wm0, int wm1, int row0, int k_end,
                                                    int k_off, int left, int right) {
  constexpr bool kBounded = kTransform == kTanhBounded, kCap = kTransform == kTanh || kBounded;
  if constexpr (kBounded && kTanhHalf) {
#pragma unroll
    for (int i = 0; i < BC / 2; i += 2)
      lab::tanh_pair(sacc[i] * tk_factor, sacc[i + 1] * tk_factor, sacc[i], sacc[i + 1]);
  } else if constexpr (kTransform != kNone) {
    transform_scores<BC, kCap>(sacc, tk_factor);
  }
  bool mask = lab::window_tile_needs_mask(j * BC, BC, wm0, wm1, k_end, k_off, left, right);
  if (kBugEdgeOnly) mask = j * BC + BC > k_end;  // S_k's edge only
  if constexpr (!kBounded && kRowBound)
    if (mask && left < 0 && right <= 0) {  // causal (right 0) or the S_k edge alone: v07's bound per row
      softmax_scores<BC, true, 0, 2, true, true>(sacc, st, alpha, c, row0 + k_off, j * BC, k_end, right == 0);
      return true;
    }
  if (mask) mask_window_wg<BC>(sacc, row0, j * BC, k_end, k_off, left, right);
  if constexpr (kBounded) {
    exp_rows_rounded<BC, T, kPolyEvery>(sacc, st, st.m[0], c);
    return false;
  } else {
    if (!mask && j > 0) return softmax_scores_lazy<BC, 2>(sacc, st, alpha, c);
    softmax_scores<BC, false, 0, 2, true>(sacc, st, alpha, c, 0, 0, 0, false);  // masked: -inf already there
    return true;
  }
}

}  // namespace lab::sm90
