// fwd v11's packed grid (cu_seqlens, no block table) as a persistent kernel: fwd v07's PAIR order and FUSE over the
// packed sequences, with v11's mask steps. Included by kernels/fwd/v11_masks_overlap.cu after its switches (the
// softcap's CAP_POLY / CAP_TANH_HALF), inside its anonymous namespace; the dense and paged kernels there are untouched.
//
// Why: v11's packed grid was one CTA per (sequence, head, query tile of the longest sequence), longest first, and
// each CTA paid its launch, barrier setup, Q + K_0 latency and a staged epilogue alone (8 x 2048 causal at D 128:
// 2048 CTAs, 15.5 a multiprocessor, about 8.5 key tiles each), while the dense default (fwd v07, few-keys config)
// runs one CTA per multiprocessor over the work tiles, the next tile's K_0 and Q loading under this one's last
// GEMMs and its last P V issued beside the next tile's S_0 (FUSE), its epilogue straight from registers.
//
// Work: a unit is (sequence b, head h, r); its query tiles are n_b - 1 - r then r of the sequence's own n_b =
// ceil(S_q,b / B_r) tiles (the middle one once when n_b is odd), so under a right edge every unit of a sequence
// costs n_b + 1 key tiles (causal S_q = S_k) and a static round-robin over units is balanced within a sequence.
// Units are numbered sequence by sequence (heads x ceil(n_b / 2) each, u = start_b + h ceil(n_b / 2) + r), CTA x
// takes units x, x + G, ... (G = min(units bound, multiprocessors x PACKED_WAVES)), round 2i its unit's heavy tile
// and round 2i + 1 the light one. Every role of the CTA walks the sequences with its own cursor as its unit index
// grows, reading each sequence's cu_seqlens once (no host copy, no prepass, no handoff through shared memory);
// for one length the order is fwd v07's PAIR exactly (lab/masks/packed_order.py mirrors it; its test counts the
// key tiles per CTA). A tile with rows but no key in its window (S_k,b = 0, or rows before a bottom-right
// diagonal) is written by the consumers as they pass it (O = 0, LSE = the sink or -inf) and never enters the
// pipeline, so every pipelined tile has n_tiles >= 1, which FUSE needs.
//
// Barriers: v07's FUSE set (bar_q / empty_q per consumer warpgroup, K and V full / empty per stage, the ring
// position running on across work tiles); the ping-pong token (D = 128) as v07's: each warpgroup takes
// sum(n_tiles) + 1 turns, the last warpgroup hands out the first, warpgroup 1 consumes the last pass.
// Prediction (before the first GPU run; H200, bf16, H 16, causal, kernel GPU time and the unchecked public call
// against the dense op on the same tokens): 8 x 2048 at D 128 1.17x -> 1.00-1.06x (the dense default's order, config
// and FUSE; v11's window tests per tile and per-element mask on the diagonal tile cost 1-3 %), forward + backward
// 0.91x -> 0.86-0.90x; at D 64 1.33x -> 1.05-1.15x (the dense default there is v05's loop, and v11 at D 64 has
// no ping-pong); the twelve uneven documents 0.92-1.02x the per-tile grid's time (FUSE and no CTA starts gain ~8 %,
// the static order's imbalance, 1.16x the mean key tiles on its busiest CTA against the hardware's dynamic
// longest-first, takes some back), so forward vs FlexAttention 1.34x -> 1.30-1.45x; PACKED_WAVES 2: one length 1-3 %
// slower (a CTA start per SM and twice the CTAs to balance), the uneven documents 2-5 % faster.
// Outcome (H200, outputs/driver_logs/20261129-h200-batch6-ed9df1b/W and 20261129-h200-final-c4d12fc/W; GPU time,
// medians of 11 in rounds): 8 x 2048 D 128 kernel 0.2650 ms against the per-tile grid's 0.2937 (0.90x), 1.063x the
// dense op; with ROW_BOUND (below) 0.2596 ms, 1.035x the dense op (0.2508), the unchecked public call 1.067x (its
// extra 8 us over the same launch not profiled): met in the kernel, missed by 1.7 % through the public call. D 64
// 1.128x (public 1.13x; was 1.33x). Twelve uneven documents 0.957x the per-tile grid. WAVES 2 1.022x WAVES 1 at one
// length (kept 1). Checks of the packed grid (45, two runs) pass, the wrong build BUG_PAIR_ONE fails, memcheck and
// racecheck clean. Record: outputs/experiments/20261129-masks-varlen-packed-persistent.json.
#pragma once

// LAB_FWD_MASK_BUG_PAIR_ONE: the wrong build of the scheduler: every unit's light tile is skipped (its rows never
// written), so the packed checks must fail.
// LAB_FWD_MASK_PACKED_ROW_BOUND: a masked tile of a call with no left edge and a right edge of 0 or none (causal, or
// the S_k edge alone) takes v07's mask, one bound per row (softmax_scores' kRowBound: one compare per score against
// min(S_k, row + off + 1)) instead of mask_window_wg's window test per score. v07 at D = 128: +1-3.4 % on the
// few-keys cells (d128-cells run 6). Prediction: the packed causal call 1-3 % faster (one tile in ~8.5 is masked).
// Outcome (H200, final-c4d12fc/W): 0.960x at 8 x 2048 D 128 (0.2596 against 0.2703 ms); its checks pass.
#ifndef LAB_FWD_MASK_PACKED_ROW_BOUND
#define LAB_FWD_MASK_PACKED_ROW_BOUND 1
#endif
// LAB_FWD_MASK_PACKED_WAVES: persistent CTAs per multiprocessor (1: fwd v07's grid). More let the hardware hand the
// later CTAs to whichever multiprocessor is free first, which evens uneven documents out at one CTA start each.
// 2 measured 1.022x 1's time at 8 x 2048 D 128 (H200, batch6-ed9df1b/W): 1.
#ifndef LAB_FWD_MASK_PACKED_WAVES
#define LAB_FWD_MASK_PACKED_WAVES 1
#endif
#ifndef LAB_FWD_MASK_BUG_PAIR_ONE
#define LAB_FWD_MASK_BUG_PAIR_ONE 0
#endif

// O's rows [m0, m0 + 64) of one warpgroup straight from the accumulator (normalise_o_sink, then fwd v07's QUAD
// stores: lanes t and t ^ 1 swap words so each stores 8 contiguous bytes), rows below seqlen_q only. `out` and
// `lse_row0` point at the sequence's row 0. No shared memory: the Q tile is the next work tile's already.
template <int D, class T>
__device__ __forceinline__ void epilogue_direct_sink(float (&o)[D / 2], const RowState& st, float sink_log2,
                                                     float* lse_row0, T* out, int64_t row_stride, int seqlen_q,
                                                     int m0) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4, t0 = t & 1;
  normalise_o_sink<D>(o, st, sink_log2, lse_row0, m0, seqlen_q);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = m0 + warp * 16 + hh * 8 + g;
    T* dst = out + (int64_t)row * row_stride;
#pragma unroll
    for (int a = 0; a < D / 32; ++a) {
      uint32_t c[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] = lab::pack2<T>(o[4 * (4 * a + j) + 2 * hh], o[4 * (4 * a + j) + 2 * hh + 1]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t x = __shfl_xor_sync(0xffffffffu, t0 ? c[2 * m] : c[2 * m + 1], 1);
        c[2 * m] = t0 ? x : c[2 * m];
        c[2 * m + 1] = t0 ? c[2 * m + 1] : x;
      }
      if (row < seqlen_q)
#pragma unroll
        for (int m = 0; m < 2; ++m)
          *reinterpret_cast<uint2*>(dst + 8 * (4 * a + 2 * m + t0) + 2 * (t & 2)) = make_uint2(c[2 * m], c[2 * m + 1]);
    }
  }
}

// Rows [m0, min(m0 + 64, seqlen_q)) of a tile that sees no key, by one warpgroup: O = 0, LSE = the sink's logit
// (sink_log2 / log2 e) or -inf, what normalise_o_sink gives a row with no key.
template <int D, class T>
__device__ __forceinline__ void packed_empty_rows(T* out, int64_t row_stride, float* lse_row0, float sink_log2, int m0,
                                                  int seqlen_q) {
  constexpr int kChunks = D / 8;
  const int wt = threadIdx.x % 128, m1 = min(m0 + 64, seqlen_q);
  for (int idx = wt; idx < (m1 - m0) * kChunks; idx += 128)
    *reinterpret_cast<uint4*>(out + (int64_t)(m0 + idx / kChunks) * row_stride + (idx % kChunks) * 8) =
        make_uint4(0u, 0u, 0u, 0u);
  if (lse_row0 != nullptr)
    for (int r = m0 + wt; r < m1; r += 128) lse_row0[r] = sink_log2 == -INFINITY ? -INFINITY : sink_log2 * kLn2;
}

// One work tile of the packed persistent grid: the sequence's rows and keys, the query tile and its window's key
// tiles [first, first + n) (n may be 0: rows with no key).
struct PackedTile {
  int b, h, q0, k0, sq, sk, off, m0, first, n;
};

// Each role's walk over the sequences: units [u0, u0 + span) are sequence b's (heads x ceil(n_b / 2), none
// empty), its rows and keys read from cu_seqlens once, when the walk reaches it.
struct PackedCursor {
  int b, u0, span, q0, k0, sq, sk;
};

// The rounds and locate of the packed persistent grid (the same arithmetic in every role of the CTA). The host
// bounds the units by every sequence at the longest's length (grid min(bound, multiprocessors), 2 rounds a unit);
// the walk ends where the sequences do.
template <int BR, int BC>
struct PackedOrder {
  int num_rounds, batch, heads, left, right;
  lab::FastDiv div_group;

  __device__ __forceinline__ PackedOrder(const AttnMaskParams& mp, int l, int r)
      : batch(mp.base.batch), heads(mp.base.heads_q), left(l), right(r), div_group(mp.base.heads_q / mp.base.heads_kv) {
    const int half = ((mp.base.seqlen_q + BR - 1) / BR + 1) / 2;
    num_rounds = 2 * ((mp.base.batch * mp.base.heads_q * half + (int)gridDim.x - 1) / (int)gridDim.x);
  }

  // Sequence b into the cursor (clamped: no cu_seqlens value reads or writes outside the packed tensors, v11's rule).
  __device__ __forceinline__ void load(const AttnMaskParams& mp, PackedCursor& c) const {
    packed_sequence(mp, c.b, c.q0, c.k0, c.sq, c.sk);
    c.span = heads * (((c.sq + BR - 1) / BR + 1) / 2);
  }
  __device__ __forceinline__ PackedCursor start(const AttnMaskParams& mp) const {
    PackedCursor c{0, 0, 0, 0, 0, 0, 0};
    if (batch > 0) load(mp, c);
    return c;
  }

  // Round it's tile of this CTA into w: 1 found, 0 none this round (an odd tile count's middle tile the second
  // time), -1 none left (the walk is past the last sequence; later rounds only go further).
  __device__ __forceinline__ int locate(const AttnMaskParams& mp, int it, PackedCursor& c, PackedTile& w) const {
    const int u = (it >> 1) * (int)gridDim.x + (int)blockIdx.x;
    while (c.b < batch && u >= c.u0 + c.span) {
      c.u0 += c.span;
      if (++c.b < batch) load(mp, c);
    }
    if (c.b >= batch) return -1;
    const int n_b = (c.sq + BR - 1) / BR, half_b = (n_b + 1) / 2;
    const int local = u - c.u0, h = local / half_b, r = local - h * half_b;
    const bool light = it & 1;
    if (light && (LAB_FWD_MASK_BUG_PAIR_ONE || r == n_b - 1 - r)) return 0;
    w.b = c.b;
    w.h = h;
    w.q0 = c.q0;
    w.k0 = c.k0;
    w.sq = c.sq;
    w.sk = c.sk;
    w.off = c.sk - c.sq;
    w.m0 = (light ? r : n_b - 1 - r) * BR;
    const int2 tiles = window_tiles<BC>(w.m0, min(w.m0 + BR, w.sq), w.sk, w.off, left, right);
    w.first = tiles.x;
    w.n = tiles.y;
    return 1;
  }
  __device__ __forceinline__ int kv_head(int h) const { return div_group.div(h); }
};

template <class Cfg, class T, int kTransform>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v11_packed_kernel(const __grid_constant__ CUtensorMap tq,
                                                                               const __grid_constant__ CUtensorMap tk,
                                                                               const __grid_constant__ CUtensorMap tv,
                                                                               const AttnMaskParams mp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages, kW = Cfg::kConsumers;
  using Slot = MaskRingSlot<kStages>;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kBounded = kTransform == kTanhBounded, kCap = kTransform == kTanh || kBounded;
  static_assert(Cfg::kL2GroupMB == 0, "PAIR's units keep a head's tiles together: no L2 head groups");
  const AttnFwdParams& p = mp.base;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q[kW], empty_q[kW], bar_k[kStages], bar_v[kStages], empty_k[kStages],
      empty_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring_ = smem_ring<Cfg>(smem);
  const int left = LAB_FWD_MASK_BUG_NO_WINDOW ? -1 : mp.window_left;
  const int right = LAB_FWD_MASK_BUG_NO_WINDOW ? (mp.window_right == 0 ? 0 : -1) : mp.window_right;
  const PackedOrder<Cfg::BR, BC> order(mp, left, right);
  const int wg = threadIdx.x / 128;

  // Prologue: the barriers, once for all work tiles
  if (threadIdx.x == 0) {
    for (int w = 0; w < kW; ++w) {
      mbar_init(smem_u32(&bar_q[w]), 1);
      mbar_init(smem_u32(&empty_q[w]), 4);  // its warpgroup's four warps
    }
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&bar_k[s]), 1);
      mbar_init(smem_u32(&bar_v[s]), 1);
      mbar_init(smem_u32(&empty_k[s]), 4 * kW);  // one arrival per consumer warp
      mbar_init(smem_u32(&empty_v[s]), 4 * kW);
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: v07's, over the pipelined tiles (n >= 1) of this CTA's rounds; K_0 first, then Q once each
    // warpgroup's last S GEMM of the tile before has read it, then V_0.
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      int ring = 0, t = 0;
      Slot slot = Slot::of(0);  // ring's slot (slot.at(ring))
      PackedTile w;
      PackedCursor cur = order.start(mp);
      for (int it = 0; it < order.num_rounds; ++it) {
        const int found = order.locate(mp, it, cur, w);
        if (found < 0) break;
        if (found == 0 || w.n == 0) continue;
        const int hkv = order.kv_head(w.h), row0 = w.k0 + w.first * BC;
        for (int j = 0; j < w.n; ++j, ++ring) {
          const Slot at = slot.at(ring);
          const int s = at.stage;
          const uint32_t free_parity = at.parity ^ 1;
          if (ring >= kStages) mbar_wait(smem_u32(&empty_k[s]), free_parity);
          mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring_.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, row0 + j * BC, hkv, 0);
          if (j == 0)
            for (int q = 0; q < kW; ++q) {
              if (t > 0) mbar_wait(smem_u32(&empty_q[q]), (t - 1) & 1);
              mbar_arrive_expect_tx(smem_u32(&bar_q[q]), Cfg::kQBytesWG);
              for (int cb = 0; cb < D / 64; ++cb)
                tma_load_4d(ring_.q + q * Cfg::kQBytesWG + cb * 64 * 128, &tq, smem_u32(&bar_q[q]), cb * 64,
                            w.q0 + w.m0 + 64 * q, w.h, 0);
            }
          if (ring >= kStages) mbar_wait(smem_u32(&empty_v[s]), free_parity);
          mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring_.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, row0 + j * BC, hkv, 0);
          slot.next();
        }
        ++t;
      }
    }
    return;
  }

  // Consumers
  setmaxnreg_inc<Cfg::kRegsConsumer>();
  const int ct = threadIdx.x - 128 * wg, qw = wg - 1;
  const uint32_t sQw = ring_.q + qw * Cfg::kQBytesWG;
  const float c = kCap ? mp.softcap * kLog2e : kTransform == kScale ? kLog2e : p.scale * kLog2e;
  const float tk_factor = kCap ? p.scale / mp.softcap : p.scale;
  float o[D / 2];
  RowState st;
  float sacc[BC / 2], alpha[2];
  uint32_t pa[BC / 16][4];
  PackedTile w;
  PackedCursor cur = order.start(mp);
  int ring = 0, t = 0, it = 0;  // ring: this work tile's K_0 / V_0 position (the producer's count)
  int wm0 = 0, wm1 = 1, row0 = 0, k_end = 0, k_off = 0;  // this warpgroup's rows and the window's keys from `first`
  // Key tile j of the work tile: ring slot Slot::of(ring + j) (the main loop: ks.at(ring + j), carried or derived).
  auto wait_k = [&](Slot x) { ring_wait(bar_k, x); };
  auto wait_v = [&](Slot x) { ring_wait(bar_v, x); };
  auto release_k = [&](Slot x) { ring_release(empty_k, x, ct); };
  auto release_v = [&](Slot x) { ring_release(empty_v, x, ct); };
  auto release_q = [&]() {  // this warp's S GEMMs of the work tile are done: its Q rows may be reloaded
    if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_q[qw]));
  };
  auto issue_s = [&](Slot x) { issue_qk<D, BC, kBf16>(sacc, sQw, ring_.k(x.stage)); };
  // v11's softmax step of tile j with ROW_BOUND (masked_softmax_step, common/hopper/attn_mask_sm90.cuh); returns
  // whether O needs rescale_o.
  auto softmax = [&](int j) -> bool {
    return masked_softmax_step<BC, T, kTransform, LAB_FWD_MASK_CAP_TANH_HALF != 0, LAB_FWD_MASK_CAP_POLY,
                               LAB_FWD_MASK_PACKED_ROW_BOUND != 0>(sacc, st, alpha, c, tk_factor, j, wm0, wm1, row0,
                                                                   k_end, k_off, left, right);
  };
  constexpr bool kPing = Cfg::kPingPong;
  const int next_wg = wg % kW + 1;
  auto turn = [&]() {
    if constexpr (kPing) named_barrier_sync(3 + wg, 256);
  };
  auto pass = [&]() {
    if constexpr (kPing) named_barrier_arrive(3 + next_wg, 256);
  };
  auto sink_log2 = [&](int h) { return mp.sinks != nullptr ? mp.sinks[h] * kLog2e : -INFINITY; };
  auto lse_row0 = [&](const PackedTile& x) {
    return p.lse == nullptr ? nullptr : p.lse + (int64_t)x.h * mp.total_q + x.q0;
  };
  auto out_row0 = [&](const PackedTile& x) {
    return static_cast<T*>(p.o) + (int64_t)x.h * p.o_stride[1] + (int64_t)x.q0 * p.o_stride[2];
  };
  // The next pipelined tile from round `it` on (false: none left); tiles with rows and no key are written on the way.
  auto next = [&]() -> bool {
    for (; it < order.num_rounds; ++it) {
      const int found = order.locate(mp, it, cur, w);
      if (found < 0) return false;
      if (found == 0) continue;
      if (w.n > 0) return true;
      packed_empty_rows<D, T>(out_row0(w), p.o_stride[2], lse_row0(w), sink_log2(w.h), w.m0 + 64 * qw, w.sq);
    }
    return false;
  };
  auto begin = [&]() {  // the row state and Q of work tile t
    const int shift = w.first * BC;
    wm0 = w.m0 + 64 * qw;
    wm1 = max(min(wm0 + 64, w.sq), wm0 + 1);
    row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
    k_end = w.sk - shift;
    k_off = w.off - shift;
    st = RowState{};
    if constexpr (kBounded) st.m[0] = st.m[1] = c - kCapHeadroom;  // the fixed offset (kCapHeadroom)
    mbar_wait(smem_u32(&bar_q[qw]), t & 1);
  };
  if (kPing && wg == kW) named_barrier_arrive(3 + 1, 256);  // the first turn

  bool have = next();
  if (have) {
    begin();
    zero_acc(o);
    wait_k(Slot::of(ring));
    turn();
    wgmma_fence();
    issue_s(Slot::of(ring));
    pass();
    wgmma_wait<0>();
    reg_fence(sacc);
    release_k(Slot::of(ring));
    if (w.n == 1) release_q();
    softmax(0);
    pack_p<BC, T>(sacc, pa);
  }
  // Main loop over this CTA's work tiles (FUSE): S_j and P_{j-1} V_{j-1} in flight together; a tile's last P V
  // goes out in the same turn as the next tile's S_0, whose softmax runs under it; then the tile's epilogue.
  while (have) {
    const int n = w.n;
    Slot ks = Slot::of(ring + 1), vs = Slot::of(ring);  // K_j's and V_{j-1}'s slots (ks.at(ring + j), ...)
    for (int j = 1; j < n; ++j) {
      const Slot kj = ks.at(ring + j), vj = vs.at(ring + j - 1);
      wait_k(kj);
      wait_v(vj);
      turn();
      wgmma_fence();
      issue_s(kj);
      issue_pv<D, BC, kBf16>(o, pa, ring_.v(vj.stage), j == 1);  // the tile's first P V overwrites O
      pass();
      wgmma_wait<1>();
      reg_fence(sacc);
      release_k(kj);
      if (j == n - 1) release_q();
      const bool rescale = softmax(j);
      wgmma_wait<0>();
      reg_fence(o);
      release_v(vj);
      if (rescale) rescale_o<D>(o, alpha);
      pack_p<BC, T>(sacc, pa);
      vs = ks;
      ks.next();
    }
    // This tile's last P V (stage sv) and what its epilogue needs, then the next tile's head. Each end issues its
    // wgmmas unconditionally after its fence (a wgmma under a condition there serialises every wgmma: v07's C7520).
    const int sv = (ring + n - 1) % kStages;
    const uint32_t pv = ((ring + n - 1) / kStages) & 1;
    const bool pv_first = n == 1;  // this P V is the tile's only one
    const RowState done = st;
    float* const d_lse = lse_row0(w);
    T* const d_out = out_row0(w);
    const int d_sq = w.sq, d_wm0 = wm0;
    const float d_sink = sink_log2(w.h);
    ring += n;
    ++t;
    ++it;
    have = next();
    if (!have) {  // the CTA's last work tile: its P V alone
      mbar_wait(smem_u32(&bar_v[sv]), pv);
      turn();
      wgmma_fence();
      issue_pv<D, BC, kBf16>(o, pa, ring_.v(sv), pv_first);
      pass();
      wgmma_wait<0>();
      reg_fence(o);
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[sv]));
      epilogue_direct_sink<D, T>(o, done, d_sink, d_lse, d_out, p.o_stride[2], d_sq, d_wm0);
      break;
    }
    begin();
    wait_k(Slot::of(ring));
    mbar_wait(smem_u32(&bar_v[sv]), pv);
    turn();
    wgmma_fence();
    issue_s(Slot::of(ring));
    issue_pv<D, BC, kBf16>(o, pa, ring_.v(sv), pv_first);
    pass();
    wgmma_wait<1>();  // S_0 of the next tile (committed first)
    reg_fence(sacc);
    release_k(Slot::of(ring));
    if (w.n == 1) release_q();
    softmax(0);  // touches neither O nor the P fragments, which the P V still reads
    wgmma_wait<0>();
    reg_fence(o);
    if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[sv]));
    // Epilogue of the tile before
    epilogue_direct_sink<D, T>(o, done, d_sink, d_lse, d_out, p.o_stride[2], d_sq, d_wm0);
    pack_p<BC, T>(sacc, pa);
  }
  if (kPing && wg == 1) turn();  // consumes the last warpgroup's last pass
#endif
}

// The packed persistent launch: launch_masked_fwd's packed maps, min(units, multiprocessors) CTAs.
template <class Cfg, auto kKernel>
inline int launch_packed_persistent(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  if (const cudaError_t err = lab::allow_smem_once<kKernel>(Cfg::kSmem, dev)) return (int)err;
  const AttnFwdParams& p = mp.base;
  CUtensorMap tq, tk, tv;
  const bool bf16 = p.dtype == LAB_BF16;
  const int tk_rows = mp.total_k > 0 ? mp.total_k : 1;
  if (!make_bhsd_map(&tq, p.q, bf16, p.head_dim, mp.total_q, p.heads_q, 1, p.q_stride, 64) ||
      !make_bhsd_map(&tk, p.k, bf16, p.head_dim, tk_rows, p.heads_kv, 1, p.k_stride, Cfg::BC) ||
      !make_bhsd_map(&tv, p.v, bf16, p.head_dim, tk_rows, p.heads_kv, 1, p.v_stride, Cfg::BC))
    return LAB_E_SHAPE;
  const int64_t half = ((int64_t)(p.seqlen_q + Cfg::BR - 1) / Cfg::BR + 1) / 2;
  const int64_t units = half * p.batch * p.heads_q;
  if (units <= 0) return 0;
  if (2 * units > 0x7fffffff) return LAB_E_SHAPE;  // rounds (2 per unit) and units stay ints
  const int64_t sms = (int64_t)lab::num_sms(dev) * LAB_FWD_MASK_PACKED_WAVES;
  const int64_t blocks = sms > 0 && units > sms ? sms : units;
  kKernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmem, stream>>>(tq, tk, tv, mp);
  return (int)cudaGetLastError();
}
