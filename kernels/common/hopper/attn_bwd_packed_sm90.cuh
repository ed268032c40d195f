// Packed sequences in the masked Hopper backward (bwd/v08_masks.cu), read and written in place: no right-padded
// copies. MaskBwdParams::cu_seqlens_q / _k say where each sequence lies in the (total, H, D) tensors.
//
//   - Grid: one CTA per (KV head, key slot). Sequence b owns the slots [kslot(b), kslot(b + 1)) with
//     kslot(b) = floor((cu_k[b] + 128 b) / 128): at least ceil(S_k,b / 128) of them (at most one more), so the
//     grid, floor((total_k + 128 B) / 128) x H_kv CTAs, is known on the host with no copy of cu_seqlens, and a CTA
//     finds its sequence by a binary search over kslot (FlashAttention's padded-offset rule, on key blocks). A CTA
//     whose slot lies past its sequence's keys returns before any barrier: at most one per sequence, where the
//     padded path launched B ceil(max_seqlen_k / 128) per head.
//   - Producer: tensor maps over the packed rows (B = 1), coordinates shifted by the sequence's first row, as fwd
//     v11 does. A tile's rows past the sequence's end belong to the next one (or TMA's zeros): the per-sequence
//     mask (q >= S_q, key >= S_k; WindowSteps::p_ds_masked) zeroes their P and dS.
//   - Workspaces (Delta, LSE log2 e, dq_accum) in rows of [H_q][R], R = floor((total_q + 128 B) / 128) 128:
//     sequence b's rows start at ws(b) = floor((cu_q[b] + 128 b) / 128) 128 (128-aligned, so every 64- or
//     128-row step stays inside its own sequence's padded rows; ws(b) + ceil(S_q,b / 128) 128 <= ws(b + 1)).
//   - Pre-pass and convert pass over the workspace rows (the sequence of a row by binary search over ws): O(total)
//     work, not O(B max_seqlen). dQ rows are written for every sequence's rows; the packed rows of no sequence
//     (before cu[0], after cu[B]) get zero gradients from a last pass, as the padded path's unpad gave them.
//   - Epilogue: dK, dV of the sequence's keys only (v12's staged stores on pointers shifted to its first row).
// Everything in the loop is the dense masked kernel's (stagger_tile with WindowSteps' p_ds on the CTA's
// sequence, from shared memory), except for causal calls with no window or softcap, which take the causal steps
// (PackedSteps' kCausal; bwd/v08_masks.cu has their measurement: 0.88x the time).
//
// Measured (H200, bf16, causal, H 16, GPU time; outputs/experiments/20261129-masks-varlen-bwd-in-place.json):
// twelve documents of 23,100 tokens at D 128 (lab.masks.gpu_varlen.DOCS12): the public op's backward 1.484 ms
// against FlexAttention's document mask 2.599 ms, 1.75x (forward 1.83x, forward + backward 1.77x; f58d500e62,
// outputs/driver_logs/20261129-h200-batch2-f58d500e62/T7); the kernel call 1.481 ms in place against 5.052 ms
// through the padded copies (3.41x). torch.profiler (contended run, outputs/driver_logs/20261129-h200-batch1-
// 278998b0f8/T7): main kernel 1334 us in place, 1388 us padded (the same tiles); pre-pass + convert 214 us; the
// padded path's gathers, fills, memset and passes over 49k rows 3.5 ms. Grid order: slot-major 1.046x the
// head-minor default's time (predicted: a few % from the tail).
// With the causal steps (5aab27b, outputs/experiments/20261130-masks-packed-bwd-causal-steps.json): twelve documents
// 1.260 ms against Flex's 2.600 (2.06x); one length, 8 x 2048 at D 128, 0.768 ms against the dense op's 0.801
// (0.96x its time) and Flex's 1.232 (1.60x). The runs below are the window rule's.
// Final run (7152d73448, outputs/driver_logs/20261129-h200-batch3-7152d73448/T7; the lab, Flex and dense rows
// within 0.6 % interquartile ranges): twelve documents, backward 1.477 ms against Flex's 2.585 (1.75x; forward +
// backward 1.78x); 512-4096-token documents at D 64 (gpu_varlen.DOCS_MIXED, 128 queries a step) 0.630 against
// 1.323 ms (2.10x; forward + backward 2.31x); one length, 8 x 2048 at D 128: backward 0.910 ms against the dense
// op's 1.058 (0.86x its time), forward + backward 0.93x, the forward alone (fwd v11) 1.18x the dense default's;
// the padded copies' call 2.96-3.78x the in-place one.
#pragma once
#include "common/hopper/attn_bwd_mask_sm90.cuh"

namespace lab::sm90::bwd {

// Sequence b's first row and length on each side, clamped as the forward's (fwd v11): no cu_seqlens value makes a
// read or write leave the packed tensors.
struct PackedSeq {
  int qa, sq, ka, sk;
};
__device__ __forceinline__ PackedSeq packed_seq(const MaskBwdParams& p, int b) {
  const int qa = min(max(__ldg(p.cu_seqlens_q + b), 0), p.total_q);
  const int qb = min(max(__ldg(p.cu_seqlens_q + b + 1), qa), p.total_q);
  const int ka = min(max(__ldg(p.cu_seqlens_k + b), 0), p.total_k);
  const int kb = min(max(__ldg(p.cu_seqlens_k + b + 1), ka), p.total_k);
  return PackedSeq{qa, min(qb - qa, p.seqlen_q), ka, min(kb - ka, p.seqlen_k)};
}

// The grid's order: 1 (the default), the KV head fastest, so a key block's CTAs of every head run together, the
// sequences in order and each one's key blocks longest (causal) first: the grid ends on the last sequence's
// shortest blocks, and a sequence's Q and dO (all heads) are read while they sit in L2. 0: the key slot fastest
// (the dense grid's order: one head's sequences in turn), where the last head's longest blocks of its last long
// sequence may start in the last wave. Measured beside the dense kernels' order (sequence-major, each head's key
// blocks together: 4.7 % slower at 8 x 2048 and 1.9 % at twelve documents, removed) and with ncu against bwd v14 on
// the same tiles: outputs/experiments/20261129-masks-packed-bwd-orders-beside-dense.json.
#ifndef LAB_BWD_PACKED_HEAD_MINOR
#define LAB_BWD_PACKED_HEAD_MINOR 1
#endif

// The dQ convert after the dK / dV kernel: 1 (the default), one CTA per 64-row workspace block (convert_dq_packed_tile:
// the block's sequence found once, dQ written as 16-byte chunks of whole rows through shared memory) wherever dQ's
// pointer and strides allow 16-byte chunks, else 0's; 0, one thread per float4 of dq_accum, each finding its own
// sequence (convert_dq_packed, the default before, kept as the reference the block convert is checked against).
// The tile kernel's comment says why, what was predicted and what was measured.
#ifndef LAB_BWD_PACKED_BLOCK_CONVERT
#define LAB_BWD_PACKED_BLOCK_CONVERT 1
#endif

constexpr int kPackedAlign = 128;  // rows: the workspace's sequence alignment, and keys of a slot (Cfg::BC)

__host__ __device__ __forceinline__ int64_t packed_ws_rows(int total_q, int batch) {
  return ((int64_t)total_q + (int64_t)kPackedAlign * batch) / kPackedAlign * kPackedAlign;
}
__host__ __device__ __forceinline__ int64_t packed_key_slots(int total_k, int batch) {
  return ((int64_t)total_k + (int64_t)kPackedAlign * batch) / kPackedAlign;
}
// First workspace row of sequence b, and its first key slot (clamped first rows qa / ka).
__device__ __forceinline__ int64_t ws_start(int qa, int b) {
  return ((int64_t)qa + (int64_t)kPackedAlign * b) / kPackedAlign * kPackedAlign;
}
__device__ __forceinline__ int64_t kslot_start(int ka, int b) {
  return ((int64_t)ka + (int64_t)kPackedAlign * b) / kPackedAlign;
}

// The largest b in [0, batch) with start(b) <= x (start non-decreasing in b; 0 when none is).
template <class Start>
__device__ __forceinline__ int last_seq_at(int batch, int64_t x, Start start) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start(mid) <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}
__device__ __forceinline__ int ws_seq(const MaskBwdParams& p, int64_t row) {
  return last_seq_at(p.batch, row, [&](int b) {
    return ws_start(min(max(__ldg(p.cu_seqlens_q + b), 0), p.total_q), b);
  });
}

// The masks' steps on the CTA's sequence: WindowSteps' P^T / dS^T, the sequence's view from shared memory
// (written by the kernel's thread 0 before its first __syncthreads). kCausal: the call is causal with no window or
// softcap (window_left < 0, window_right == 0), so a tile needs the mask only on the sequence's bottom-right
// diagonal or past its S_q, and an element is hidden when q >= S_q or key > q + off (a key past S_k is past every
// live row's q + off), the dense kernel's three compares in place of window_masked's five and its loads of the
// window's bounds.
template <bool kSoftcap, bool kTanhHalf, bool kCausal = false>
struct PackedSteps {
  using Params = MaskBwdParams;
  using Rules = WindowSteps<kSoftcap, true, kTanhHalf>;
  static_assert(!(kCausal && kSoftcap), "the causal steps have no softcap");
  __device__ __forceinline__ static SeqView& seq() {
    __shared__ SeqView sv;
    return sv;
  }
  template <bool kMask, int N>
  __device__ __forceinline__ static void p_ds_causal(float (&s)[N], float (&dp)[N], const float* lse2,
                                                     const float* delta, float c, int key0, int q0, int t,
                                                     const SeqView& sv) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * i + 2 * t + (e & 1);
        float pv = ex2(fmaf(s[4 * i + e], c, -lse2[col]));
        if constexpr (kMask) {
          const int key = key0 + 8 * (e >> 1), q = q0 + col;
#ifndef LAB_BWD_MASK_BUG_NO_WINDOW
          if (q >= sv.seqlen_q || key > q + sv.off) pv = 0.f;
#else
          if (q >= sv.seqlen_q || key >= sv.seqlen_k) pv = 0.f;  // self-test: the diagonal forgotten
#endif
        }
        s[4 * i + e] = pv;
        dp[4 * i + e] = pv * (dp[4 * i + e] - delta[col]);
      }
  }
  template <class C>
  __device__ __forceinline__ static void p_ds(float (&s)[C::BR / 2], float (&dp)[C::BR / 2], const float* rows,
                                              float c, int kw0, int m0, const MaskBwdParams& p) {
    const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
    const SeqView sv = seq();
    if constexpr (kCausal) {
      if (m0 + C::BR > sv.seqlen_q || kw0 + 63 > m0 + sv.off)
        p_ds_causal<true>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, sv);
      else
        p_ds_causal<false>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, sv);
      return;
    }
    const bool mask = m0 + C::BR > sv.seqlen_q ||
                      window_tile_needs_mask(kw0, 64, m0, m0 + C::BR, sv.seqlen_k, sv.off, p.window_left,
                                             p.window_right);
    if (mask)
      Rules::template p_ds_masked<true>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p, sv);
    else
      Rules::template p_ds_masked<false>(s, dp, rows, rows + C::BR, c, kw0 + warp * 16 + g, m0, t, p, sv);
  }
};

// dQ partials into the sequence's workspace rows (red_dq's order and reductions; row base hq R + ws(b)).
struct PackedPartial {
  int64_t ws0, rows;  // ws(b), R
  float* accum;
  template <class C>
  __device__ __forceinline__ void add(const float (&dq)[C::kDqRegs], uint8_t*, const Work& work, int j,
                                      const AttnBwdParams&) {
    static_assert(LAB_BWD_STAGGER_DQ_RED, "packed calls add dQ from registers");
    const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
    const int64_t row = (int64_t)work.head(j) * rows + ws0 + work.m0(j, C::BR);
    float* dst = accum + row * C::D + (C::kSplitDq ? wg * 64 * C::kDqCols : 0);
#pragma unroll
    for (int r4 = 0; r4 < C::kDqCols / 8; ++r4)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + (r4 * 128 + wt) * 4),
                   "f"(dq[4 * r4]), "f"(dq[4 * r4 + 1]), "f"(dq[4 * r4 + 2]), "f"(dq[4 * r4 + 3])
                   : "memory");
  }
};

// The producer of a packed CTA (one thread): K and V of the key block at the sequence's keys, then every step's Q_i,
// dO_i at its rows and LSE_i, Delta_i from its workspace rows.
template <class C>
__device__ __forceinline__ void produce_packed(const CUtensorMap* tq, const CUtensorMap* tk, const CUtensorMap* tv,
                                               const CUtensorMap* tdo, Bars<C::kStages>& bars, uint32_t base,
                                               const Work& work, int qa, int ka, int64_t ws0, int64_t rows_ws,
                                               const MaskBwdParams& p) {
  tma_prefetch_maps(tq, tk, tv);
  tma_prefetch_map(tdo);
#ifdef LAB_BWD_PACKED_BUG_NO_OFFSET
  ka = 0;  // self-test: every sequence's keys read from the first sequence's rows
#endif
  mbar_arrive_expect_tx(smem_u32(&bars.kv), 2 * C::kKVBytes);
  for (int cb = 0; cb < C::D / 64; ++cb) {
    tma_load_4d(base + C::kOffK + cb * C::BC * 128, tk, smem_u32(&bars.kv), cb * 64, ka + work.n0, work.hkv, 0);
    tma_load_4d(base + C::kOffV + cb * C::BC * 128, tv, smem_u32(&bars.kv), cb * 64, ka + work.n0, work.hkv, 0);
  }
  for (int it = 0; it < work.n_iters; ++it) {
    const int s = it % C::kStages, hq = work.head(it), m0 = work.m0(it, C::BR);
    mbar_wait(smem_u32(&bars.empty[s]), ((it / C::kStages) & 1) ^ 1);
    const uint32_t full = smem_u32(&bars.full[s]);
    mbar_arrive_expect_tx(full, 2 * C::kQBytes + 2 * C::kRowBytes);
    for (int cb = 0; cb < C::D / 64; ++cb) {
      tma_load_4d(base + C::kOffQ + s * C::kQBytes + cb * C::BR * 128, tq, full, cb * 64, qa + m0, hq, 0);
      tma_load_4d(base + C::kOffDo + s * C::kQBytes + cb * C::BR * 128, tdo, full, cb * 64, qa + m0, hq, 0);
    }
    const int64_t row = (int64_t)hq * rows_ws + ws0 + m0;
    const uint32_t rows = base + C::kOffRows + s * 2 * C::kRowBytes;
    bulk_load_1d(rows, p.lse_log2 + row, C::kRowBytes, full);
    bulk_load_1d(rows + C::kRowBytes, p.delta + row, C::kRowBytes, full);
  }
}

// The dK / dV kernel of packed calls: bwd_dkdv_stagger's body (common/hopper/attn_bwd_stagger.cuh) on one key block
// of one sequence.
template <class C, class T, bool kSoftcap, bool kTanhHalf, bool kCausal = false>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_packed(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                    const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                    const MaskBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Steps = PackedSteps<kSoftcap, kTanhHalf, kCausal>;
  constexpr int D = C::D;
  static_assert(C::BC == kPackedAlign && kPackedAlign % C::BR == 0,
                "a key slot is one CTA's key block; a step's rows stay inside the sequence's padded workspace rows");
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<C::kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);

  // Prologue: the CTA's sequence and key block (the whole CTA returns before any barrier when it has none).
  const int64_t slots = packed_key_slots(p.total_k, p.batch);
  const int hkv = LAB_BWD_PACKED_HEAD_MINOR ? (int)(blockIdx.x % p.heads_kv) : (int)(blockIdx.x / slots);
  const int64_t slot = LAB_BWD_PACKED_HEAD_MINOR ? blockIdx.x / p.heads_kv : blockIdx.x % slots;
  const int b = last_seq_at(p.batch, slot, [&](int bb) {
    return kslot_start(min(max(__ldg(p.cu_seqlens_k + bb), 0), p.total_k), bb);
  });
  const PackedSeq ps = packed_seq(p, b);
  const int64_t nb = slot - kslot_start(ps.ka, b);
  if (nb < 0 || nb * C::BC >= ps.sk) return;
  const SeqView sv{ps.sq, ps.sk, ps.sk - ps.sq};
  Work work;
  work.b = b;
  work.hkv = hkv;
  work.n0 = (int)nb * C::BC;
  work.group = p.heads_q / p.heads_kv;
  {
    const int n1 = min(work.n0 + C::BC, sv.seqlen_k);
    const int2 rows = window_rows(work.n0, n1, sv.seqlen_q, sv.off, p.window_left, p.window_right);
    work.mb0 = rows.y < rows.x ? 0 : rows.x / C::BR;
    work.n_mb = rows.y < rows.x ? 0 : rows.y / C::BR + 1;
    work.n_iters = work.group * (work.n_mb - work.mb0);
  }
  const int64_t rows_ws = packed_ws_rows(p.total_q, p.batch), ws0 = ws_start(ps.qa, b);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;
  const bool stagger = LAB_BWD_STAGGER == 1 || (LAB_BWD_STAGGER == 2 && !p.causal);

  if (threadIdx.x == 0) {
    init_bars(bars);
    Steps::seq() = sv;
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt == 0) produce_packed<C>(&tq, &tk, &tv, &tdo, bars, base, work, ps.qa, ps.ka, ws0, rows_ws, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  float dk[D / 2], dv[D / 2];
  PackedPartial sink{ws0, rows_ws, p.dq_accum};

  // Main loop
  stagger_tile<C, T, PackedPartial, Steps>(dk, dv, sink, smem, bars, bars.kv, 0, C::kOffK, C::kOffV, work, 0,
                                           stagger, p);

  // Epilogue: the sequence's keys, through pointers at its first row (batch entry 0 of the shifted tensors).
  AttnBwdParams pe = p;
  pe.dk = static_cast<T*>(p.dk) + (int64_t)ps.ka * p.dk_stride[2];
  pe.dv = static_cast<T*>(p.dv) + (int64_t)ps.ka * p.dv_stride[2];
  pe.seqlen_k = ps.sk;
  Work we = work;
  we.b = 0;
  if constexpr (C::kStageDkDv)
    store_dk_dv_staged<C, T>(dk, dv, work.n0 + 64 * wg, we, pe, smem + C::kOffDq);
  else
    store_dk_dv<C, T>(dk, dv, work.n0 + 64 * wg, we, pe);
#endif
}

// The pre-pass over the workspace rows [H_q][R] (bwd_pre's lanes and sums): a row of sequence b below
// ceil(S_q,b / 128) 128 gets Delta and LSE log2 e (0 past S_q,b, where the loop masks its P and dS) and its dq_accum
// row zeroed; the rows between sequences are never read and stay as they are.
template <class T, int D>
__global__ void __launch_bounds__(128) bwd_pre_packed(const MaskBwdParams p) {
  constexpr int kLanes = lab::bwd::pre_lanes(D);
  const int64_t rows_ws = packed_ws_rows(p.total_q, p.batch);
  const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t row = idx / kLanes;  // over H_q * R
  const int chunk = (int)(idx % kLanes);
  const bool in_range = row < (int64_t)p.heads_q * rows_ws;
  const int h = (int)(row / rows_ws);
  const int64_t rho = row % rows_ws;
  int i = -1, qa = 0, sq = 0;
  if (in_range) {
    const int b = ws_seq(p, rho);
    const PackedSeq ps = packed_seq(p, b);
    const int64_t r = rho - ws_start(ps.qa, b);
    if (r >= 0 && r < (int64_t)(ps.sq + kPackedAlign - 1) / kPackedAlign * kPackedAlign) i = (int)r;
    qa = ps.qa;
    sq = ps.sq;
  }
  const bool pad_row = i >= 0, live = pad_row && i < sq;
#ifndef LAB_BWD_PACKED_BUG_NO_ZERO  // self-test: dq_accum left as it was (the checks poison it with NaN)
  if (pad_row && chunk < D / 8) {
    float4* z = reinterpret_cast<float4*>(p.dq_accum + row * D + chunk * 8);
    z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#endif
  float dot = 0.f;
  if (live && chunk < D / 8) {
    const int64_t t = qa + i;
    const T* o = static_cast<const T*>(p.o) + h * p.o_stride[1] + t * p.o_stride[2] + chunk * 8;
    const T* d = static_cast<const T*>(p.dout) + h * p.do_stride[1] + t * p.do_stride[2] + chunk * 8;
    const uint4 ov = *reinterpret_cast<const uint4*>(o), dv = *reinterpret_cast<const uint4*>(d);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) dot += static_cast<float>(oe[e]) * static_cast<float>(de[e]);
  }
#pragma unroll
  for (int off = kLanes / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (pad_row && chunk == 0) {
    float delta = 0.f, lse2 = 0.f;
    if (live) {
      const int64_t r = (int64_t)h * p.total_q + qa + i;
      delta = dot - (p.dlse != nullptr ? p.dlse[r] : 0.f);
      lse2 = p.lse[r] * lab::bwd::kPreLog2e;
    }
#ifdef LAB_BWD_BUG_NO_DELTA
    delta = 0.f;
#endif
    p.delta[row] = delta;
    p.lse_log2[row] = lse2;
  }
}

// dQ = scale dq_accum for every sequence's rows (convert_quad's accumulator order, over the workspace's 64-row
// blocks; a block's sequence by binary search).
template <class C, class T>
__global__ void __launch_bounds__(256) convert_dq_packed(const MaskBwdParams p) {
  constexpr int D = C::D, kPartQuads = 16 * C::kDqCols;
  const int64_t rows_ws = packed_ws_rows(p.total_q, p.batch);
  const int64_t quads = (int64_t)p.heads_q * rows_ws * D / 4;
  for (int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; idx < quads;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int64_t block = idx / (64 * D / 4);  // (h, 64-row block of R)
    const int in = (int)(idx % (64 * D / 4));
    const int h = (int)(block / (rows_ws / 64));
    const int64_t rho0 = block % (rows_ws / 64) * 64;
    const int b = ws_seq(p, rho0);
    const PackedSeq ps = packed_seq(p, b);
    const int64_t r0 = rho0 - ws_start(ps.qa, b);
    if (r0 < 0 || r0 >= ps.sq) continue;
    const int part = in / kPartQuads, r4 = (in % kPartQuads) / 128, wt = in % 128;
    const int warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
    const int row = (int)r0 + warp * 16 + g;
    const int col = (C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4 + 2 * t;
    const float4 a = reinterpret_cast<const float4*>(p.dq_accum)[idx];
    T* dst = static_cast<T*>(p.dq) + h * p.dq_stride[1] + col + (int64_t)ps.qa * p.dq_stride[2];
    if (row < ps.sq)
      *reinterpret_cast<uint32_t*>(dst + row * p.dq_stride[2]) = lab::pack2<T>(a.x * p.scale, a.y * p.scale);
    if (row + 8 < ps.sq)
      *reinterpret_cast<uint32_t*>(dst + (row + 8) * p.dq_stride[2]) = lab::pack2<T>(a.z * p.scale, a.w * p.scale);
  }
}

// The dQ convert by workspace block (LAB_BWD_PACKED_BLOCK_CONVERT). Why: torch.profiler of one forward + backward at
// 8 x 2048 tokens, H 16, D 128 (H200, outputs/driver_logs/20261129-h200-batch1-278998b0f8/T7) put convert_dq_packed at
// 82 us for 136 MiB of dq_accum read and 64 MiB of dQ written (~40 us at 4.8 TB/s: twice its floor). It gives each
// thread one float4 and pays for it with two 64-bit divisions by the runtime row count, a binary search over
// cu_seqlens (three dependent loads at B 8) and packed_seq's loads before the float4's own load can issue, and writes
// dQ as 4-byte stores: a warp's store covers 8 rows x 16 bytes, half of each 32-byte sector, the other half from
// another warp. The tile kernel takes the sequence once per CTA (a 64-row block of the workspace lies inside one
// sequence's padded rows or between two), issues all of a thread's loads together (8 float4 of dq_accum), and writes
// whole rows: the 64 x D block of bf16 dQ transposed through 17 KB of shared memory (rows of D / 2 + 4 words: the
// accumulator's 8 rows x 4 lanes of a warp land on 32 banks), then 16-byte stores, a warp's 512 contiguous bytes of
// two rows. Prediction (H200, bf16, causal, H 16, D 128): convert 82 -> 42-50 us at 8 x 2048.
// Outcome (H200, torch.profiler, 942340c, outputs/driver_logs/20261129-h200-fp8-persist-packed-passes-942340c/P):
// 91.8 -> 48.0 us at 8 x 2048, 117.4 -> 68.1 us at twelve documents. The same run measured and rejected the pre-pass
// by block (66.1 -> 73.4 us: four CTAs of 256 threads a multiprocessor, each a sequence search, then two groups of
// loads, serialise more latency than the thread pass's grid hides) and dq_accum zeroed by a memset beside it (the
// pair 83 against 66 us); the zeroing itself stays, since every key block's CTA adds into a query row with red.global
// in no fixed order (outputs/experiments/20261129-masks-varlen-bwd-packed-passes.json). Through the public op
// (chapter n16, session 20261129-154731-h200-e975986): FlexAttention's document mask over ours 1.341 -> 1.415x at
// one length, 1.753 -> 1.819x at twelve documents
// (outputs/experiments/20261129-varlen-bwd-block-convert-public-op.json). Self-test build: LAB_BWD_PACKED_BUG_TILE_ROWS.

// The block convert takes the heads fastest and the rows from the last: the CTAs running together write whole packed
// rows (all heads of a token are 4 KB apart, not H_q R rows), and it starts on the rows whose dq_accum the dK / dV
// grid's last CTAs (the last sequence's, head-minor) added into, which may still sit in the 50 MB L2 (the last of
// 8 x 2048 tokens: 16 MiB of dq_accum).
// The workspace block starting at row rho0 (of [H_q][R]): its sequence's first packed row and length, the block's first
// row inside the sequence (r0; negative or past the padded rows: the block lies between sequences).
struct WsBlock {
  int qa, sq;
  int64_t r0;
};
__device__ __forceinline__ WsBlock ws_block(const MaskBwdParams& p, int64_t rho0) {
  const int b = ws_seq(p, rho0);
  const PackedSeq ps = packed_seq(p, b);
  return WsBlock{ps.qa, ps.sq, rho0 - ws_start(ps.qa, b)};
}

// dQ = scale dq_accum over one 64-row block of one head per CTA (convert_quad's accumulator order): the block's float4
// packed to T pairs into a [64][D / 2 + 4] word tile, then each row's 16-byte chunks stored. Grid: H_q R / 64 CTAs.
template <class C, class T>
__global__ void __launch_bounds__(256) convert_dq_packed_tile(const MaskBwdParams p) {
  constexpr int D = C::D, kPartQuads = 16 * C::kDqCols, kQuads = 64 * D / 4 / 256, kStride = D / 2 + 4;
  constexpr int kChunks = D / 8;  // 16-byte chunks of a row of dQ
  static_assert(64 * D / 4 % 256 == 0 && 64 * kChunks % 256 == 0 && kStride % 4 == 0, "whole float4 / uint4 passes");
  __shared__ __align__(16) uint32_t tile[64 * kStride];
  const int64_t rows_ws = packed_ws_rows(p.total_q, p.batch), blocks = rows_ws / 64;
  const int h = (int)(blockIdx.x % p.heads_q);
  const int64_t rho0 = (blocks - 1 - blockIdx.x / p.heads_q) * 64;  // last rows first, heads fastest (see WsBlock)
  const WsBlock wb = ws_block(p, rho0);
  if (wb.r0 < 0 || wb.r0 >= wb.sq) return;  // between sequences, or the padding past S_q
  const float4* src = reinterpret_cast<const float4*>(p.dq_accum) + ((int64_t)h * rows_ws + rho0) * (D / 4);
  float4 a[kQuads];
#pragma unroll
  for (int k = 0; k < kQuads; ++k) a[k] = src[k * 256 + threadIdx.x];
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    const int in = k * 256 + threadIdx.x;
    const int part = in / kPartQuads, r4 = (in % kPartQuads) / 128, wt = in % 128;
    const int warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
#ifdef LAB_BWD_PACKED_BUG_TILE_ROWS
    // self-test: rows g and g ^ 1 of each warp's eight swapped in the transpose
    const int row = warp * 16 + (g ^ 1), word = ((C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4 + 2 * t) / 2;
#else
    const int row = warp * 16 + g, word = ((C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4 + 2 * t) / 2;
#endif
    tile[row * kStride + word] = lab::pack2<T>(a[k].x * p.scale, a[k].y * p.scale);
    tile[(row + 8) * kStride + word] = lab::pack2<T>(a[k].z * p.scale, a[k].w * p.scale);
  }
  __syncthreads();
  T* dst = static_cast<T*>(p.dq) + h * p.dq_stride[1] + ((int64_t)wb.qa + wb.r0) * p.dq_stride[2];
  const int64_t left = wb.sq - wb.r0;  // rows of the block inside the sequence
#pragma unroll
  for (int k = 0; k < 64 * kChunks / 256; ++k) {
    const int u = k * 256 + threadIdx.x, row = u / kChunks, c = u % kChunks;
    if (row < left)
      *reinterpret_cast<uint4*>(dst + row * p.dq_stride[2] + c * 8) =
          *reinterpret_cast<const uint4*>(tile + row * kStride + c * 4);
  }
}

// Zero gradients for the packed rows of no sequence (before the first, after the last, past a sequence clamped to
// max_seqlen): one thread per packed row of q, then of k; a covered row is left to the kernels above.
template <int D, class T>
__global__ void __launch_bounds__(256) zero_stray_rows(const MaskBwdParams p) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const bool is_q = t < p.total_q;
  if (t >= (int64_t)p.total_q + p.total_k) return;
  const int row = (int)(is_q ? t : t - p.total_q);
  const int* cu = is_q ? p.cu_seqlens_q : p.cu_seqlens_k;
  const int total = is_q ? p.total_q : p.total_k;
  const int b = last_seq_at(p.batch, row, [&](int bb) { return (int64_t)min(max(__ldg(cu + bb), 0), total); });
  const PackedSeq ps = packed_seq(p, b);
  const int a = is_q ? ps.qa : ps.ka, n = is_q ? ps.sq : ps.sk;
  if (row >= a && row < a + n) return;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const int heads = is_q ? p.heads_q : p.heads_kv;
  for (int h = 0; h < heads; ++h)
    for (int c = 0; c < D; c += 8) {
      if (is_q) {
        T* dq = static_cast<T*>(p.dq) + h * p.dq_stride[1] + (int64_t)row * p.dq_stride[2];
        *reinterpret_cast<uint4*>(dq + c) = zero;
      } else {
        T* dk = static_cast<T*>(p.dk) + h * p.dk_stride[1] + (int64_t)row * p.dk_stride[2];
        T* dv = static_cast<T*>(p.dv) + h * p.dv_stride[1] + (int64_t)row * p.dv_stride[2];
        *reinterpret_cast<uint4*>(dk + c) = zero;
        *reinterpret_cast<uint4*>(dv + c) = zero;
      }
    }
}

// dsinks[h] -= sum over the sequences' rows of exp(sink_h - LSE_i) Delta_i (sink_grad's reduction; LSE from the
// forward's [H_q, total_q], Delta from the workspace rows).
__global__ void __launch_bounds__(256) sink_grad_packed(const MaskBwdParams p) {
  const int bh = blockIdx.x, h = bh % p.heads_q, b = bh / p.heads_q;
  const PackedSeq ps = packed_seq(p, b);
  const int64_t ws = (int64_t)h * packed_ws_rows(p.total_q, p.batch) + ws_start(ps.qa, b);
  const float sink = p.sinks[h];
  float acc = 0.f;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < ps.sq; i += gridDim.y * blockDim.x)
    acc += expf(sink - p.lse[(int64_t)h * p.total_q + ps.qa + i]) * p.delta[ws + i];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float warp_sum[8];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < 8; ++w) total += warp_sum[w];
    atomicAdd(p.dsinks + h, -total);
  }
}

// The launches of a packed call: pre-pass, dK / dV kernel, convert, stray rows, sinks' gradient.
template <class C, class T, bool kSoftcap, bool kTanhHalf, bool kCausal = false>
int launch_packed(const MaskBwdParams& p, cudaStream_t st, int dev) {
  constexpr int D = C::D;
  constexpr auto kKernel = bwd_dkdv_packed<C, T, kSoftcap, kTanhHalf, kCausal>;
  const bool bf16 = std::is_same_v<T, __nv_bfloat16>;
  if (p.total_q < 0 || p.total_k < 0 || p.total_q > (1 << 30) || p.total_k > (1 << 30) || p.seqlens != nullptr ||
      p.cu_seqlens_k == nullptr)
    return LAB_E_SHAPE;
  // (empty packed tensors: the caller's zeros; lab/masks/varlen_bwd.py never launches them)
  if (p.total_q == 0 || p.total_k == 0) return LAB_E_SHAPE;
  cudaError_t err = cudaSuccess;
  const int64_t rows_ws = packed_ws_rows(p.total_q, p.batch);
  const int64_t pre = (int64_t)p.heads_q * rows_ws * lab::bwd::pre_lanes(D);
  // The block convert writes dQ as 16-byte chunks: dq 16-byte aligned with strides of whole chunks (torch.empty_like
  // of a tensor the tensor maps read), else the per-thread convert.
  const bool tiles = LAB_BWD_PACKED_BLOCK_CONVERT && reinterpret_cast<uintptr_t>(p.dq) % 16 == 0 &&
                     p.dq_stride[1] % 8 == 0 && p.dq_stride[2] % 8 == 0 &&
                     (int64_t)p.heads_q * rows_ws / 64 <= 0x7fffffff && rows_ws > 0;
  if (pre > 0) {
    bwd_pre_packed<T, D><<<(unsigned)((pre + 127) / 128), 128, 0, st>>>(p);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int64_t slots = packed_key_slots(p.total_k, p.batch);
  const int64_t ctas = slots * p.heads_kv;
  if (ctas > 0x7fffffff) return LAB_E_SHAPE;
  {
    CUtensorMap tq, tk, tv, tdo;
    if (!make_bhsd_map(&tq, p.q, bf16, D, p.total_q, p.heads_q, 1, p.q_stride, C::BR) ||
        !make_bhsd_map(&tdo, p.dout, bf16, D, p.total_q, p.heads_q, 1, p.do_stride, C::BR) ||
        !make_bhsd_map(&tk, p.k, bf16, D, p.total_k, p.heads_kv, 1, p.k_stride, C::BC) ||
        !make_bhsd_map(&tv, p.v, bf16, D, p.total_k, p.heads_kv, 1, p.v_stride, C::BC))
      return LAB_E_SHAPE;
    if ((err = lab::allow_smem_once<kKernel>(C::kSmem, dev)) != cudaSuccess) return err;
    if (ctas > 0) {
      kKernel<<<(unsigned)ctas, C::kThreads, C::kSmem, st>>>(tq, tk, tv, tdo, p);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    const int64_t grid = ((int64_t)p.heads_q * rows_ws * D / 4 + 255) / 256;
    if (tiles) {
      convert_dq_packed_tile<C, T><<<(unsigned)(p.heads_q * rows_ws / 64), 256, 0, st>>>(p);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
    if (!tiles && grid > 0) {
      convert_dq_packed<C, T><<<(unsigned)(grid < 65536 ? grid : 65536), 256, 0, st>>>(p);
      if ((err = cudaGetLastError()) != cudaSuccess) return err;
    }
  }
  const int64_t rows = (int64_t)p.total_q + p.total_k;
  zero_stray_rows<D, T><<<(unsigned)((rows + 255) / 256), 256, 0, st>>>(p);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  if (p.dsinks != nullptr && p.sinks != nullptr && p.batch > 0 && p.seqlen_q > 0) {
    const int chunks = min((p.seqlen_q + 4095) / 4096, 64);
    sink_grad_packed<<<dim3((unsigned)(p.batch * p.heads_q), (unsigned)chunks), 256, 0, st>>>(p);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace lab::sm90::bwd
