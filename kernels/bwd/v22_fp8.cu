// Backward attention v22: the FP8 backward. All five GEMMs on e4m3 wgmma (sm_90a), D 64 and 128.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.fp8.backward.attention_fp8_train(...,
// backward="fp8") then autograd.
//
// Algorithm (one CTA: key block K_j of B_c = 128 keys of one KV head; two consumer warpgroups of 64 keys each, one
// producer warp; query blocks Q_i of B_r = 64 rows of every query head of the group, causal from the diagonal):
//   S_i^T  = K_j Q_i^T                      (SS, m64n64k32, K-major both: as stored)
//   dP_i^T = V_j dO_i^T                     (SS, the same shape; dO quantised to e4m3 per tensor)
//   P^T = exp2(S^T c - LSE_i log2 e), dS^T = P^T (dP^T - Delta_i)           (fp32, registers)
//   dV_j += P^T dO_i                        (RS: P^T from registers as e4m3(P * 448); B = dO_i^T, K-major)
//   dK_j += dS^T Q_i                        (RS: dS^T as e4m3 with a per-key-row scale; B = Q_i^T)
//   dQ_i += dS_i K_j                        (SS: dS through shared memory with a per-tile scale; B = K_j^T)
// FP8 wgmma reads both shared-memory operands K-major only, so the three GEMMs that contract over a sequence axis
// need Q^T, dO^T and K^T: one pre-pass each writes them (the forward's V^T pass, common/hopper/attn_fp8_sm90.cuh,
// with its key order: within each 32 columns, column n holds row 32 (n / 32) + key_of_column(n % 32), the order in
// which an accumulator packs into e4m3 A fragments with no shuffle). dS is written to shared memory in K^T's column
// order, so dQ's GEMM pairs the same keys.
//
// Scales (powers of two, so every rescale is exact):
//   dK: dS has no scale known before the loop (its amax needs S and dP). Each thread's two key rows keep a running
//     multiplier m = 2^(7 - floor(log2 amax)) over the steps so far (amax of |dS q_descale| of the row, over the
//     step's 64 queries: a quad reduction); when a step's amax lowers m, the row's dK accumulator is multiplied by
//     m_new / m_old first, as the online softmax rescales O. dK = scale * acc / m.
//   dQ: a step's dQ partial leaves the CTA after the step, so its scale is per step: each warpgroup's half of the
//     tile (64 queries x its 64 keys) gets the multiplier of its own amax, and dQ's GEMM runs the two halves in
//     turn (dq_step says how one accumulator takes both).
//   dV: e4m3(P * 448) times e4m3(dO / do_descale): dV = acc * do_descale / 448.
//   S^T and dP^T come out of the fp32 accumulator times q_descale k_descale and v_descale do_descale.
//
// Launch: pre-pass (Delta = rowsum(dO O), LSE log2 e, dq_accum zeroed: the bf16 backward's), the three transposes,
// the main kernel (grid ceil(S_k / 128) x H_kv x B CTAs of 384 threads, kSmem below), the dQ convert pass (the bf16
// backward's, dq_accum * scale).
// Limits: sm_90a only (the body is guarded for sm_80 builds); D 64 or 128; e4m3 Q, K, V and dO, bf16 O, dO and
// gradients; any lengths; GQA; top-left causal or none; not deterministic (dQ added by the copy engine).
//
// D 64 (Fp8Cfg<64>): the same loop and tiles. K, V, Q and dO rows are 64 bytes (64-byte swizzle), so S^T and dP^T
// take two k32 steps instead of four, dK and dV are m64n64 (32 registers each), and dQ splits by columns as at
// D 128: warpgroup w takes columns 32 w.. over all 128 keys, an m64n32 GEMM (half the reductions into dq_accum of a
// split by keys, bwd v07's choice for the bf16 kernel at D 64). Q^T, K^T and dO^T keep their shapes with D rows.
// Prediction, written before the first GPU run: the elementwise work per score is D 128's while the GEMMs halve, so
// the step is bound by it even more; 0.6-0.8x our bf16 backward at D 64 (against 0.72-0.75x at D 128), with
// gradient errors at D 128's (3-5e-2 relative L2: the roundings are per element, not per D).
// Measured (H200, chapter n15, session 20261130-095213-h200-2899687; outputs/experiments/20261130-bwd-fp8-d64.json):
// 0.545-0.547x our bf16 backward at D 64 (B S = 16384, H 16; S 4k and 8k causal), under the prediction; 7 / 7 D 64
// checks at the emulation's error (dQ 4.1e-2 at S 4097 causal); memcheck, racecheck, synccheck clean. ncu: 29
// thread-instructions a score against bwd v14's 13.5 at D 64, whose tile takes 128 queries a step and so spreads its
// per-step work over twice the scores; the tensor pipe 18 % active against 58 %.
//
// LAB_BWD_FP8_WRONG=1: the deliberately wrong build (dK leaves without its row multiplier), which the checks must
// see fail.
//
// Measured (H200, one process, GPU time of the call with its passes against the lab's bf16 backward, bwd v14, on
// the dequantised inputs; B S = 16384, H 16; outputs/driver_logs/20261129-h200-fp8-bwd-*):
//   checks: dQ, dK, dV 3.6-4.6e-2 relative L2 from float64 on the dequantised inputs (bf16 flash on the same
//     inputs: 2.8-4.3e-3), the emulation's ~4e-2 (lab.fp8.emulate_bwd.kernel_model); with V and dO of mean 1 at
//     S 4097, dQ 1.0e-1 / 7.8e-2 causal (bf16: 7.7e-3 / 5.9e-3): dP = dO V^T carries the mean, Delta cancels it,
//     and dO's e4m3 rounding is relative to the large dP. dV there was 4.9e-2 / 6.6e-2 while dV accumulated in the
//     tensor core across the steps; with LAB_BWD_FP8_DV_PROMOTE 3.2e-3 / 3.8e-3 (the emulation's 3.1e-3), at a
//     cost of 6-10 % (0.79x our bf16 backward at S 8k against 0.87x; outputs/driver_logs/20261129-h200-fp8-bwd-
//     dv-promote-591c2bb). Q and K of mean 1: dK 3.8e-2, as with none. The wrong build: dK 1.9e2. memcheck,
//     racecheck, synccheck clean.
//   speed, as ratio of our bf16 backward's time (non-causal S 4k / 8k / 16k, causal 8k):
//     first loop (both warpgroups in lockstep, dQ through shared memory and the copy engine, one tile multiplier
//       per step exchanged by all eight warps): 0.87 / 0.89 / 0.91 / 0.85. Predicted 0.9-1.1x.
//     this loop (dQ deferred behind two dS buffers, the bf16 stagger; predicted 1.1-1.25x the first):
//       0.84 / 0.85 / 0.84 / 0.84 with two dQ accumulators; without the start stagger 0.78 / 0.79 / 0.77 / 0.77.
//     K_w, V_w as register fragments (S^T, dP^T as RS; predicted +8-15 % if shared-memory bandwidth bound):
//       -9 to -11 % (96 bytes spilled); K_w alone -3 to -5 %; three stages +0 to +3 %.
//     dS as 4-byte words instead of byte stores: +3 to +9 % in the same rounds (0.88 / 0.88 / 0.87 / 0.86).
//     the producer asleep in its wait: +1-3 %; LSE / Delta as float2 pairs: -4-5 % (not taken); dQ issued beside
//     S and dP (its wait theirs): 128 bytes spilled, not run.
//     With dV promoted (the default): 0.79 / 0.80 (S 8k non-causal / causal).
//   ncu (S 8192, one launch each): this kernel executes 1.67x the instructions of bwd v14's main kernel
//     (2.68e9 against 1.60e9) for the same tiles, issue slots 48 % busy against 35 %, the most common stall
//     "selected" (issuing) where v14 waits on its GEMMs: the FP8 GEMMs take half the time, and the elementwise
//     work per score (two exponent-scaled packs, the row and tile amax, dS's multipliers, 19 % of instructions
//     FMUL) is now what bounds the step. The 1.3x target needs that work overlapped with the next step's S and
//     dP GEMMs inside a warpgroup, which two more 32-register accumulators do not fit beside dK and dV.
#include "common/hopper/attn_bwd_fp8_params.h"
#include "common/hopper/attn_bwd_stagger.cuh"
#include "common/hopper/attn_fp8_sm90.cuh"

#ifndef LAB_BWD_FP8_WRONG
#define LAB_BWD_FP8_WRONG 0
#endif
// Q / dO stages in flight (2: the bf16 backward's; e4m3 tiles leave room for 3).
#ifndef LAB_BWD_FP8_STAGES
#define LAB_BWD_FP8_STAGES 2
#endif
// 1: each step's P^T dO_i goes into an accumulator of its own (its first k32 step write-only) and is added to dV in
// fp32 after the step's dS is stored; 0: dV accumulates in the tensor core across every step. Why: Hopper's FP8 wgmma
// accumulator drops the small increments of a sum that grows (the forward's P V, fwd v13's LAB_FWD_FP8_PV_PROMOTE),
// and dV_j = sum_i P_ij dO_i grows with the queries wherever dO has a mean: with V and dO of mean 1 at S 4097, dV
// came out 4.9e-2 from float64 against the emulation's 3.1e-3. dK's multipliers are powers of two per row, and dQ
// leaves the CTA every step, so neither runs such a sum at its full length.
#ifndef LAB_BWD_FP8_DV_PROMOTE
#define LAB_BWD_FP8_DV_PROMOTE 1
#endif
#ifndef LAB_BWD_FP8_STAGGER
#define LAB_BWD_FP8_STAGGER 1
#endif
// 1 (default): the warpgroup and warp indices, and dQ's choice of which half of dS goes first, are taken from lane 0
// by a shuffle, and the quotients of two power-of-two multipliers are products with an exact reciprocal (pow2_inv);
// 0: the kernel before. Why: ptxas does not treat threadIdx.x / 128 as the same in every lane of a warp, nor a value
// every lane loads from one shared-memory word, so the descriptors built from them left the uniform datapath (SASS
// of the D 64 loop: 116 R2UR); and each `/` of two floats is a call to the IEEE division's slow path (11 FCHK and
// CALL pairs in the loop) where the operands are powers of two and a product is exact. dK and dV come out bit for
// bit as before (a power of two scales a correctly rounded quotient exactly); dQ, summed by atomic adds in no fixed
// order, differs from run to run of either build alike. SASS (sm_90a, nvcc 13.0), D 64 / D 128 kernel:
// 2560 -> 2456 / 3312 -> 3216 instructions, R2UR 130 -> 104 / 168 -> 134, FCHK 11 -> 4 (the four left: k / 448
// before the loop, the epilogue's three). Prediction, written before the H200 run (one process, interleaved rounds,
// against LAB_BWD_FP8_LEAN 0): +2-5 % at D 64 and +1-4 % at D 128 (about 16 instructions of two divisions and some
// 20 of descriptor moves a step, of the ~900 a thread issues per step at D 64), and every output bit for bit.
// Measured (outputs/experiments/20261130-bwd-fp8-lean.json; driver logs 20261130-h200-fp8-bwd-lean-31785b4): +8.9 % /
// +5.8 % at D 64 (S 4k / 8k causal), +12.7 % / +6.5 % at D 128, above the prediction: the divisions sat on the
// dependent path between the dQ step's two GEMMs, where the loop waits (ncu's "wait" stall leads), so they cost more
// than their count. dK, dV bit for bit; dQ within the spread of two runs of one build (equal.txt). memcheck,
// racecheck, synccheck clean.
#ifndef LAB_BWD_FP8_LEAN
#define LAB_BWD_FP8_LEAN 1
#endif
// 1: dQ's two halves of dS (each warpgroup's 64 keys, each with its multiplier) run as two GEMMs issued together into
// accumulators of their own, one wait, then f (ratio first + second) in fp32; 0: the half with the larger
// multiplier, a wait, its partial times the ratio, the other half accumulated on top, a second wait. Why: the lean
// build's A/B showed the dQ step's dependent path weighing more than its instruction count, and that path holds a
// whole GEMM latency between the halves. Registers: a second kDqRegs accumulator (16 at D 64, 32 at D 128) while
// dQ runs, when S, dP and the step's dV partial are dead. Prediction, written before the H200 run (one process,
// interleaved rounds, against 0): +2-5 % at D 64, +1-4 % at D 128; dK and dV bit for bit (dQ's sum in fp32
// instead of the tensor core's, within the spread of its atomic adds).
// Measured (outputs/experiments/20261130-bwd-fp8-dq-two.json): +1.3 % / +1.7 % at D 64 (S 4k / 8k causal), +1.8 % /
// +4.0 % at D 128; dK, dV bit for bit; dQ moved by up to 7.8e-3 against 2.4e-4 between two runs (the fp32 sum, not
// the tensor core's), every kernel check passing; no spill; memcheck, racecheck, synccheck clean.
#ifndef LAB_BWD_FP8_DQ_TWO
#define LAB_BWD_FP8_DQ_TWO 1
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;
using lab::aligned16;
using lab::strides_ok;

// The tile choice is the bf16 backward's (common/hopper/attn_bwd_sm90.cuh, Cfg): B_c 128 as two m64 warpgroups,
// B_r 64 (S^T and dP^T at 32 registers each beside dK and dV's 128). e4m3 halves every tile, so the transposed
// copies fit beside the originals: 3 x 16 KB of K, V, K^T, kStages x 4 x 8 KB of Q, dO, Q^T, dO^T.
// dQ: split by columns (warpgroup w: columns 64 w.. over all 128 keys), deferred by one step behind two dS buffers
// (the bf16 backward's stagger loop, common/hopper/attn_bwd_stagger.cuh): a warpgroup never waits for the other
// inside a step. Each warpgroup writes its 64 keys of dS with a multiplier of its own, so dQ runs as two GEMMs of
// 64 keys into two accumulators, added in fp32 with their own descales. Rejected: dQ over a warpgroup's own keys
// (all D columns, no exchange at all) doubles the dQ partials added in L2 (64 KB per CTA step; at FP8's step rate
// about 5 TB/s of reductions at S 16k).
template <int D_>
struct Fp8Cfg {
  static constexpr int D = D_, BR = 64, BC = 128, kStages = LAB_BWD_FP8_STAGES;
  static constexpr bool kSplitDq = true;
  static constexpr int kDqCols = D / 2, kDqRegs = D / 4;  // warpgroup w's dQ: columns kDqCols w.. over all 128 keys
  static constexpr int kThreads = 384, kRegsConsumer = 240, kRegsProducer = 24;
  static constexpr int kKVBytes = BC * D;       // K, V, K^T (e4m3): 16 KB each at D 128
  static constexpr int kQBytes = BR * D;        // Q_i, dO_i, Q_i^T, dO_i^T: 8 KB each at D 128
  static constexpr int kStageBytes = 4 * kQBytes;
  static constexpr int kDsBytes = BR * BC;      // dS_i (64 queries x 128 keys)
  static constexpr int kRowBytes = BR * 4;      // LSE_i or Delta_i
  static constexpr int kOffK = 0, kOffV = kKVBytes, kOffKt = 2 * kKVBytes;
  static constexpr int kOffQ = 3 * kKVBytes;    // [stage]: Q, dO, Q^T, dO^T
  static constexpr int kOffDs = kOffQ + kStages * kStageBytes;  // [buffer]
  static constexpr int kOffRows = kOffDs + 2 * kDsBytes;
  static constexpr int kOffAmax = kOffRows + kStages * 2 * kRowBytes;  // [warpgroup][step parity][warp] amax
  static constexpr int kOffMul = kOffAmax + 2 * 2 * 4 * 4;              // [buffer][warpgroup] dS multiplier
  static constexpr int kSmem = kOffMul + 2 * 2 * 4 + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
  static_assert(kOffDs % 1024 == 0 && kOffQ % 1024 == 0, "swizzle atoms are 1024-byte aligned");
  static_assert(D == 64 || D == 128, "K, V, Q and dO rows are one 64- or 128-byte swizzle span");
};
constexpr float kPScale = 448.f;  // P is stored as e4m3(P * 448), as the forward's (lab.fp8.emulate.P_SCALE)

constexpr bool kLean = LAB_BWD_FP8_LEAN != 0;  // uniform_in_warp<kLean> (common/hopper/attn_fp8_sm90.cuh)

// 1 / x for x = 2^k, |k| <= 126 (every multiplier here: pow2_under clamps k to [-120, 120]), exactly.
__device__ __forceinline__ float pow2_inv(float x) { return __int_as_float(0x7f000000 - __float_as_int(x)); }

// 2^(7 - floor(log2 a)) for a > 0: a times it lies in [128, 256), inside e4m3's 448 with the top binade's precision.
__device__ __forceinline__ float pow2_under(float a) {
  const int e = ((__float_as_int(a) >> 23) & 0xff) - 127;
  const int k = min(max(7 - e, -120), 120);
  return __int_as_float((k + 127) << 23);
}


struct Maps {
  CUtensorMap q, k, v, kt, do8, qt, dot;
};

// Producer (one thread): K, V, K^T once, then Q_i, dO_i, Q_i^T, dO_i^T, LSE_i, Delta_i per step into the ring.
template <class C>
__device__ __forceinline__ void produce(const Maps& m, Bars<C::kStages>& bars, uint32_t base, const Work& work,
                                        const AttnBwdParams& p) {
  tma_prefetch_maps(&m.q, &m.k, &m.v);
  tma_prefetch_maps(&m.kt, &m.do8, &m.qt);
  tma_prefetch_map(&m.dot);
  const uint32_t kv = smem_u32(&bars.kv);
  mbar_arrive_expect_tx(kv, 3 * C::kKVBytes);
  tma_load_4d(base + C::kOffK, &m.k, kv, 0, work.n0, work.hkv, work.b);
  tma_load_4d(base + C::kOffV, &m.v, kv, 0, work.n0, work.hkv, work.b);
  tma_load_4d(base + C::kOffKt, &m.kt, kv, work.n0, 0, work.hkv, work.b);
  const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
  for (int it = 0; it < work.n_iters; ++it) {
    const int s = it % C::kStages, hq = work.head(it), m0 = work.m0(it, C::BR);
    // asleep in the barrier: a spinning try_wait takes issue slots from the two consumer warps on its scheduler
    mbar_wait_suspend(smem_u32(&bars.empty[s]), ((it / C::kStages) & 1) ^ 1);
    const uint32_t full = smem_u32(&bars.full[s]), st = base + C::kOffQ + s * C::kStageBytes;
    mbar_arrive_expect_tx(full, 4 * C::kQBytes + 2 * C::kRowBytes);
    tma_load_4d(st, &m.q, full, 0, m0, hq, work.b);
    tma_load_4d(st + C::kQBytes, &m.do8, full, 0, m0, hq, work.b);
    tma_load_4d(st + 2 * C::kQBytes, &m.qt, full, m0, 0, hq, work.b);
    tma_load_4d(st + 3 * C::kQBytes, &m.dot, full, m0, 0, hq, work.b);
    const int64_t row = ((int64_t)work.b * p.heads_q + hq) * sq_pad + m0;
    const uint32_t rows = base + C::kOffRows + s * 2 * C::kRowBytes;
    bulk_load_1d(rows, p.lse_log2 + row, C::kRowBytes, full);
    bulk_load_1d(rows + C::kRowBytes, p.delta + row, C::kRowBytes, full);
  }
}

// P^T and dS^T of a step, both times 448: s (S^T's accumulator) becomes 448 P^T = exp2(S^T c - LSE log2 e +
// log2 448), the e4m3 operand of dV as it stands; dp (dP^T's accumulator, before its descale dpd) becomes
// 448 dS^T = 448 P^T (dP^T dpd - Delta). The 448 rides on through dS's multipliers and leaves in the epilogues.
// Masked as p_ds_step: the causal diagonal and the ragged ends only.
constexpr float kLog2PScale = 8.807354922057604f;  // log2(448)
template <bool kMask>
__device__ __forceinline__ void p_ds_scaled_as(float (&s)[32], float (&dp)[32], const float* lse2, const float* delta,
                                               float c, float dpd, int key0, int q0, int t, const AttnBwdParams& p) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    // the thread's two columns 8 i + 2 t, + 1 of LSE log2 e and Delta
    float off[2], del[2];  // (float2 pairs of these measured 4-5 % slower)
#pragma unroll
    for (int e = 0; e < 2; ++e) off[e] = kLog2PScale - lse2[8 * i + 2 * t + e], del[e] = delta[8 * i + 2 * t + e];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * i + 2 * t + (e & 1);
      float pv = ex2(fmaf(s[4 * i + e], c, off[e & 1]));
      if constexpr (kMask) {
        const int key = key0 + 8 * (e >> 1), q = q0 + col;
        if (q >= p.seqlen_q || key >= p.seqlen_k || (p.causal && key > q)) pv = 0.f;
      }
      s[4 * i + e] = pv;
      dp[4 * i + e] = pv * fmaf(dp[4 * i + e], dpd, -del[e & 1]);
    }
  }
}
template <class C>
__device__ __forceinline__ void p_ds_scaled(float (&s)[32], float (&dp)[32], const float* rows, float c, float dpd,
                                            int kw0, int m0, const AttnBwdParams& p) {
  const int wt = threadIdx.x % 128, warp = uniform_in_warp<kLean>(wt / 32), g = (wt % 32) / 4, t = wt % 4;
  const bool mask = (p.causal && kw0 + 63 > m0) || m0 + C::BR > p.seqlen_q || kw0 + 64 > p.seqlen_k;
  if (mask)
    p_ds_scaled_as<true>(s, dp, rows, rows + C::BR, c, dpd, kw0 + warp * 16 + g, m0, t, p);
  else
    p_ds_scaled_as<false>(s, dp, rows, rows + C::BR, c, dpd, kw0 + warp * 16 + g, m0, t, p);
}

// dQ of step j (issued during step j + 1, or after the loop): wait for the other warpgroup's half of dS_j, the
// GEMM over both halves, release the buffer, add the partial into dq_accum. Each half of dS has its own
// multiplier: the half with the larger one (the smaller values) goes first, its partial is multiplied by the ratio
// of the two (a power of two <= 1: exact, no overflow), and the other half is added: in an accumulator of its own
// and an fp32 FFMA (LAB_BWD_FP8_DQ_TWO), or on top in the tensor core after a wait. Every GEMM in flight (this
// step's dV / dK too) is complete on return.
template <class C>
__device__ __forceinline__ void dq_step(uint8_t* smem, const Work& work, int j, float k_descale,
                                        const AttnBwdParams& p) {
  const int wg = uniform_in_warp<kLean>((int)threadIdx.x / 128), other = wg ^ 1, buf = j & 1;
  const uint32_t base = smem_u32(smem);
  named_barrier_sync(ready_bar(buf, other), 256);
  const uint32_t ds_s = base + C::kOffDs + buf * C::kDsBytes, kt_w = base + C::kOffKt + wg * C::kDqCols * 128;
  const float* mul = reinterpret_cast<const float*>(smem + C::kOffMul) + 2 * buf;
  const float m0 = mul[0], m1 = mul[1];
  const int first = uniform_in_warp<kLean>(m0 >= m1 ? 0 : 1);  // the half with the larger multiplier
  const uint64_t ds_d = desc_e4m3<128>(ds_s, C::BR, 0), kt_d = desc_e4m3<128>(kt_w, C::D, 0);
  const float ratio = kLean ? (first == 0 ? m1 * pow2_inv(m0) : m0 * pow2_inv(m1))
                                       : (first == 0 ? m1 / m0 : m0 / m1);
  // dS was 448 dS; k_descale / 448 is the CTA's (consume_step's Descales), times 1 / m exactly
  const float f = kLean ? k_descale * pow2_inv(first == 0 ? m1 : m0)
                                   : k_descale / (kPScale * (first == 0 ? m1 : m0));
  float dq[C::kDqRegs];
  if constexpr (LAB_BWD_FP8_DQ_TWO) {
    // both halves at once, each into its own accumulator, one wait: dQ = f (ratio first + second) in fp32
    float dq2[C::kDqRegs];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      WgmmaFp8Op<C::kDqCols>::ss(dq, desc_e4m3_step<128, C::BR>(ds_d, 2 * first + kk),
                                 desc_e4m3_step<128, C::D>(kt_d, 2 * first + kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      WgmmaFp8Op<C::kDqCols>::ss(dq2, desc_e4m3_step<128, C::BR>(ds_d, 2 * (1 - first) + kk),
                                 desc_e4m3_step<128, C::D>(kt_d, 2 * (1 - first) + kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    reg_fence(dq2);
    if (j + 2 < work.n_iters) named_barrier_arrive(free_bar(buf, other), 256);
#pragma unroll
    for (int i = 0; i < C::kDqRegs; ++i) dq[i] = fmaf(dq[i], ratio, dq2[i]) * f;
  } else {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      WgmmaFp8Op<C::kDqCols>::ss(dq, desc_e4m3_step<128, C::BR>(ds_d, 2 * first + kk),
                                 desc_e4m3_step<128, C::D>(kt_d, 2 * first + kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
#pragma unroll
    for (int i = 0; i < C::kDqRegs; ++i) dq[i] *= ratio;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      WgmmaFp8Op<C::kDqCols>::ss(dq, desc_e4m3_step<128, C::BR>(ds_d, 2 * (1 - first) + kk),
                                 desc_e4m3_step<128, C::D>(kt_d, 2 * (1 - first) + kk), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dq);
    if (j + 2 < work.n_iters) named_barrier_arrive(free_bar(buf, other), 256);
#pragma unroll
    for (int i = 0; i < C::kDqRegs; ++i) dq[i] *= f;
  }
  red_dq_offsets<C>(dq, work.head(j), work.m0(j, C::BR), work.b, p);
}

// The descales of the CTA's KV head and the per-tensor dO descale.
struct Descales {
  float k, v, dout;
  float dq;  // dQ's factor before 1 / m: k / 448 (LAB_BWD_FP8_LEAN; k otherwise, dq_step divides by 448 m)
};

// One step of a consumer warpgroup (query block `it` of the tile). mrow: the running dK multipliers of the
// thread's two key rows. Every GEMM it issues is waited for before it returns.
template <class C>
__device__ __forceinline__ void consume_step(float (&dk)[C::D / 2], float (&dv)[C::D / 2], float (&mrow)[2],
                                             uint8_t* smem, Bars<C::kStages>& bars, const Work& work, int it,
                                             const AttnBwdFp8Params& pf, const Descales& ds) {
  const AttnBwdParams& p = pf.base;
  const int wg = uniform_in_warp<kLean>((int)threadIdx.x / 128), wt = threadIdx.x % 128;
  const int warp = uniform_in_warp<kLean>(wt / 32);
  const int lane = wt % 32, g = lane / 4, t = lane % 4;
  const uint32_t base = smem_u32(smem);
  const int kw0 = work.n0 + 64 * wg;
  const int s = it % C::kStages, hq = work.head(it), m0 = work.m0(it, C::BR);
  const uint32_t st = base + C::kOffQ + s * C::kStageBytes;
  const uint32_t q_s = st, do_s = st + C::kQBytes, qt_s = st + 2 * C::kQBytes, dot_s = st + 3 * C::kQBytes;
  const uint32_t k_w = base + C::kOffK + wg * 64 * C::D, v_w = base + C::kOffV + wg * 64 * C::D;
  const float* rows = reinterpret_cast<const float*>(smem + C::kOffRows + s * 2 * C::kRowBytes);
  const float q_ds = __ldg(pf.q_descale + (int64_t)work.b * p.heads_q + hq);
  const float c = p.scale * kLog2e * q_ds * ds.k;
  mbar_wait(smem_u32(&bars.full[s]), (it / C::kStages) & 1);
  if (LAB_BWD_FP8_STAGGER && it == 0 && wg == 1) named_barrier_sync(kBarStagger, 256);

  // one descriptor per tile, each k32 step a constant offset (desc_e4m3_step); rows of D bytes, D's swizzle
  const uint64_t q_d = desc_e4m3<C::D>(q_s, C::BR, 0), do_d = desc_e4m3<C::D>(do_s, C::BR, 0);
  const uint64_t k_d = desc_e4m3<C::D>(k_w, C::BC, 0), v_d = desc_e4m3<C::D>(v_w, C::BC, 0);
  float sacc[32], dpacc[32];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < C::D / 32; ++kk)
    WgmmaFp8Op<64>::ss(sacc, desc_e4m3_step<C::D, C::BC>(k_d, kk), desc_e4m3_step<C::D, C::BR>(q_d, kk), kk > 0);
  wgmma_commit();
#pragma unroll
  for (int kk = 0; kk < C::D / 32; ++kk)
    WgmmaFp8Op<64>::ss(dpacc, desc_e4m3_step<C::D, C::BC>(v_d, kk), desc_e4m3_step<C::D, C::BR>(do_d, kk), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(sacc);
  reg_fence(dpacc);
  p_ds_scaled<C>(sacc, dpacc, rows, c, ds.v * ds.dout, kw0, m0, p);
  if (LAB_BWD_FP8_STAGGER && it == 0 && wg == 0) named_barrier_arrive(kBarStagger, 256);

  // P^T as e4m3(P * 448) A fragments for dV
  uint32_t pa[2][4], dsa[2][4];
  pack_p_e4m3<64>(sacc, pa);

  // dK's row multipliers: each row's amax over the step (its quad holds the row), then rescale dK where it fell
  float am[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 32; ++i) am[(i >> 1) & 1] = fmaxf(am[(i >> 1) & 1], fabsf(dpacc[i]));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    am[h] = fmaxf(am[h], __shfl_xor_sync(0xffffffffu, am[h], 1));
    am[h] = fmaxf(am[h], __shfl_xor_sync(0xffffffffu, am[h], 2));
  }
  float ratio[2] = {1.f, 1.f};
  bool lowered = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float a = am[h] * q_ds;
    if (a > 0.f) {
      const float m_new = pow2_under(a);
      if (m_new < mrow[h]) {
        ratio[h] = kLean ? m_new * pow2_inv(mrow[h]) : m_new / mrow[h];
        mrow[h] = m_new;
        lowered = true;
      }
    }
  }
  if (__any_sync(0xffffffffu, lowered))
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) dk[i] *= ratio[(i >> 1) & 1];
  {
    // pack_p_e4m3's order (words 0, 2: row g; 1, 3: row g + 8), each row times its multiplier
    const float f0 = q_ds * mrow[0], f1 = q_ds * mrow[1];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const float* d = dpacc + 16 * kk;
      dsa[kk][0] = e4m3x4(d[0] * f0, d[1] * f0, d[4] * f0, d[5] * f0);
      dsa[kk][1] = e4m3x4(d[2] * f1, d[3] * f1, d[6] * f1, d[7] * f1);
      dsa[kk][2] = e4m3x4(d[8] * f0, d[9] * f0, d[12] * f0, d[13] * f0);
      dsa[kk][3] = e4m3x4(d[10] * f1, d[11] * f1, d[14] * f1, d[15] * f1);
    }
  }
  wgmma_fence();
  const uint64_t dot_d = desc_e4m3<64>(dot_s, C::D, 0), qt_d = desc_e4m3<64>(qt_s, C::D, 0);
  if constexpr (!LAB_BWD_FP8_DV_PROMOTE) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) WgmmaFp8Op<C::D>::rs(dv, pa[kk], desc_e4m3_step<64, C::D>(dot_d, kk), 1);
  }
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) WgmmaFp8Op<C::D>::rs(dk, dsa[kk], desc_e4m3_step<64, C::D>(qt_d, kk), 1);
  wgmma_commit();

  // dS_it's buffer: the other warpgroup has read dS_{it-2} (its dQ GEMM of that step is complete)
  const int buf = it & 1;
  if (it >= 2) named_barrier_sync(free_bar(buf, wg), 256);
  // This warpgroup's dS multiplier: the amax over its 64 keys x 64 queries, through shared memory (slots by step
  // parity: a slot is rewritten two steps later, after this warpgroup's barriers of the step between)
  float ta = fmaxf(am[0], am[1]);
  ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 4));
  ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 8));
  ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, 16));
  float* slots = reinterpret_cast<float*>(smem + C::kOffAmax) + (2 * wg + buf) * 4;
  if (lane == 0) slots[warp] = ta;
  named_barrier_sync(kBarWg + wg, 128);
  const float tmax = fmaxf(fmaxf(slots[0], slots[1]), fmaxf(slots[2], slots[3]));
  const float mt = tmax > 0.f ? pow2_under(tmax) : 1.f;
  if (wt == 0) reinterpret_cast<float*>(smem + C::kOffMul)[2 * buf + wg] = mt;

  // dS (queries x keys, keys in K^T's column order, 128B swizzle) as e4m3(dS * mt), this warpgroup's 64 keys. A
  // thread's keys g and g + 8 and its partner's (lane ^ 4: g ^ 1) are the four columns 4 (g / 2) .. + 3 of a word
  // (key_of_column's inverse), so the pair swaps half of their bytes and each writes one 4-byte word, the even lane
  // row q and the odd lane row q + 1 (one byte store per value measured 8 % slower).
  uint8_t* dst = smem + C::kOffDs + buf * C::kDsBytes;
  const int odd = g & 1, ncol = 64 * wg + 32 * (warp >> 1) + 16 * (warp & 1) + 4 * (g >> 1);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint16_t lo, hi;  // keys g, g + 8: low byte row q, high byte row q + 1
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(dpacc[4 * i + 1] * mt), "f"(dpacc[4 * i] * mt));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
        : "=h"(hi)
        : "f"(dpacc[4 * i + 3] * mt), "f"(dpacc[4 * i + 2] * mt));
    const uint32_t mine = (uint32_t)lo | ((uint32_t)hi << 16);
    const uint32_t other = __shfl_xor_sync(0xffffffffu, mine, 4);
    const uint32_t word = odd ? __byte_perm(other, mine, 0x7351) : __byte_perm(mine, other, 0x6240);
    const int q = 8 * i + 2 * t + odd;
    *reinterpret_cast<uint32_t*>(dst + q * 128 + (((ncol >> 4) ^ (q & 7)) << 4) + (ncol & 15)) = word;
  }
  fence_proxy_async();
  named_barrier_arrive(ready_bar(buf, wg), 256);
  if constexpr (LAB_BWD_FP8_DV_PROMOTE) {
    // dS is stored (dpacc is dead), so the step's dV partial has registers: issue, wait, add in fp32
    float dvs[C::D / 2];
    wgmma_fence();
    WgmmaFp8Op<C::D>::rs0(dvs, pa[0], desc_e4m3_step<64, C::D>(dot_d, 0));
    WgmmaFp8Op<C::D>::rs(dvs, pa[1], desc_e4m3_step<64, C::D>(dot_d, 1), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(dvs);
#pragma unroll
    for (int i = 0; i < C::D / 2; ++i) dv[i] += dvs[i];
  }
  if (it >= 1) {
    dq_step<C>(smem, work, it - 1, ds.dq, p);
  } else {
    wgmma_wait<0>();
  }
  named_barrier_sync(kBarWg + wg, 128);  // this warpgroup's own dS stores, before its dQ GEMM reads them next step
  reg_fence(dk);
  reg_fence(dv);
  mbar_arrive(smem_u32(&bars.empty[s]));  // this thread's reads of the stage are over
}

// Epilogue: dK = scale * acc / m (per row) and dV = acc * do_descale / 448, bf16, keys < S_k.
template <class C>
__device__ __forceinline__ void store_dk_dv(const float (&dk)[C::D / 2], const float (&dv)[C::D / 2],
                                            const float (&mrow)[2], int kw0, const Work& work, const AttnBwdParams& p,
                                            float dout_descale) {
  const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
  __nv_bfloat16* dkg = static_cast<__nv_bfloat16*>(p.dk) + (int64_t)work.b * p.dk_stride[0] +
                       (int64_t)work.hkv * p.dk_stride[1];
  __nv_bfloat16* dvg = static_cast<__nv_bfloat16*>(p.dv) + (int64_t)work.b * p.dv_stride[0] +
                       (int64_t)work.hkv * p.dv_stride[1];
  const float fv = dout_descale / kPScale;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = kw0 + warp * 16 + hh * 8 + g;
    if (key >= p.seqlen_k) continue;
    const float fk = LAB_BWD_FP8_WRONG ? p.scale / kPScale : p.scale / (kPScale * mrow[hh]);  // dS was 448 dS
#pragma unroll
    for (int i = 0; i < C::D / 8; ++i) {
      const int col = 8 * i + 2 * t;
      *reinterpret_cast<uint32_t*>(dkg + (int64_t)key * p.dk_stride[2] + col) =
          lab::pack2<__nv_bfloat16>(dk[4 * i + 2 * hh] * fk, dk[4 * i + 2 * hh + 1] * fk);
      *reinterpret_cast<uint32_t*>(dvg + (int64_t)key * p.dv_stride[2] + col) =
          lab::pack2<__nv_bfloat16>(dv[4 * i + 2 * hh] * fv, dv[4 * i + 2 * hh + 1] * fv);
    }
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_fp8_kernel(const __grid_constant__ Maps maps, const AttnBwdFp8Params pf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const AttnBwdParams& p = pf.base;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<C::kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const Work work = cta_work<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;

  // Prologue
  if (threadIdx.x == 0) init_bars(bars);
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt == 0) produce<C>(maps, bars, base, work, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  const int64_t kvh = (int64_t)work.b * p.heads_kv + work.hkv;
  const float kd = __ldg(pf.k_descale + kvh);
  const Descales ds{kd, __ldg(pf.v_descale + kvh), __ldg(pf.do_descale), kLean ? kd / kPScale : kd};
  float dk[C::D / 2], dv[C::D / 2];
  zero_acc(dk);
  zero_acc(dv);
  float mrow[2] = {0x1p120f, 0x1p120f};  // no dS seen yet: the first nonzero row amax lowers it
  mbar_wait(smem_u32(&bars.kv), 0);

  // Main loop
  for (int it = 0; it < work.n_iters; ++it) consume_step<C>(dk, dv, mrow, smem, bars, work, it, pf, ds);
  if (work.n_iters > 0) dq_step<C>(smem, work, work.n_iters - 1, ds.dq, p);

  // Epilogue
  store_dk_dv<C>(dk, dv, mrow, work.n0 + 64 * wg, work, p, ds.dout);
#endif
}

// A transpose pre-pass (the forward's V^T pass) of a (B, H, S, D) e4m3 tensor into (B, H, D, cols).
int transpose_fp8(const void* src, const int64_t (&stride)[3], void* dst, int batch, int heads, int rows, int cols,
                  int head_dim, cudaStream_t st) {
  AttnFp8Params t = {};
  t.v = src;
  t.vt = dst;
  for (int i = 0; i < 3; ++i) t.v_stride[i] = stride[i];
  t.batch = batch;
  t.heads_q = t.heads_kv = heads;
  t.seqlen_q = t.seqlen_k = rows;
  t.head_dim = head_dim;
  t.vt_cols = cols;
  return launch_fp8_vt(t, st);
}

bool strides16(const int64_t (&s)[3]) { return s[0] % 16 == 0 && s[1] % 16 == 0 && s[2] % 16 == 0; }

int check_call(const AttnBwdFp8Params* pf) {
  if (pf == nullptr) return LAB_E_SHAPE;
  const AttnBwdParams& p = pf->base;
  if (p.head_dim != 64 && p.head_dim != 128) return LAB_E_HEAD_DIM;
  if (p.dtype != LAB_BF16) return LAB_E_DTYPE;
  if (p.deterministic) return LAB_E_MODE;
  if (p.batch < 0 || p.seqlen_q < 0 || p.seqlen_k < 0 || p.heads_q <= 0 || p.heads_kv <= 0 ||
      p.heads_q % p.heads_kv != 0 || p.seqlen_q > (1 << 30) || p.seqlen_k > (1 << 30) ||
      (int64_t)p.batch * p.heads_q > 65535)
    return LAB_E_SHAPE;
  if (p.batch == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) return 1;
  if (pf->q_cols < p.seqlen_q || pf->q_cols % 128 || pf->k_cols < p.seqlen_k || pf->k_cols % 128) return LAB_E_SHAPE;
  if (p.lse == nullptr || p.delta == nullptr || p.lse_log2 == nullptr || p.dq_accum == nullptr ||
      pf->qt == nullptr || pf->kt == nullptr || pf->dot == nullptr || pf->q_descale == nullptr ||
      pf->k_descale == nullptr || pf->v_descale == nullptr || pf->do_descale == nullptr)
    return LAB_E_WORKSPACE;
  const void* bases[13] = {p.q, p.k, p.v, p.o, p.dout, pf->dout8, p.dq, p.dk, p.dv, p.delta, p.lse_log2, p.dq_accum,
                           pf->qt};
  for (const void* b : bases)
    if (!aligned16(b)) return LAB_E_SHAPE;
  if (!aligned16(pf->kt) || !aligned16(pf->dot) || !strides16(p.q_stride) || !strides16(p.k_stride) ||
      !strides16(p.v_stride) || !strides16(pf->dout8_stride) || !strides_ok(p.o_stride) || !strides_ok(p.do_stride) ||
      !strides_ok(p.dq_stride) || !strides_ok(p.dk_stride) || !strides_ok(p.dv_stride))
    return LAB_E_SHAPE;
  return 0;
}

// One call at head dim C::D: the passes and the main kernel (check_call has run).
template <class C>
int run(const AttnBwdFp8Params* pf, cudaStream_t st, int dev) {
  const AttnBwdParams& p = pf->base;
  cudaError_t err;
  // Prologue passes: Delta, LSE log2 e and dq_accum zeroed; Q^T, K^T, dO^T
  const int64_t pre = lab::bwd::bwd_pre_threads(p, C::D);
  lab::bwd::bwd_pre<__nv_bfloat16, C::D, true, false><<<(unsigned)((pre + 127) / 128), 128, 0, st>>>(p);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  int rc;
  if ((rc = transpose_fp8(p.q, p.q_stride, pf->qt, p.batch, p.heads_q, p.seqlen_q, pf->q_cols, C::D, st)) ||
      (rc = transpose_fp8(p.k, p.k_stride, pf->kt, p.batch, p.heads_kv, p.seqlen_k, pf->k_cols, C::D, st)) ||
      (rc = transpose_fp8(pf->dout8, pf->dout8_stride, pf->dot, p.batch, p.heads_q, p.seqlen_q, pf->q_cols, C::D,
                          st)))
    return rc;
  Maps m;
  const int64_t qt_stride[3] = {(int64_t)p.heads_q * C::D * pf->q_cols, (int64_t)C::D * pf->q_cols, pf->q_cols};
  const int64_t kt_stride[3] = {(int64_t)p.heads_kv * C::D * pf->k_cols, (int64_t)C::D * pf->k_cols, pf->k_cols};
  if (!make_fp8_map(&m.q, p.q, C::D, p.seqlen_q, p.heads_q, p.batch, p.q_stride, C::D, C::BR) ||
      !make_fp8_map(&m.do8, pf->dout8, C::D, p.seqlen_q, p.heads_q, p.batch, pf->dout8_stride, C::D, C::BR) ||
      !make_fp8_map(&m.k, p.k, C::D, p.seqlen_k, p.heads_kv, p.batch, p.k_stride, C::D, C::BC) ||
      !make_fp8_map(&m.v, p.v, C::D, p.seqlen_k, p.heads_kv, p.batch, p.v_stride, C::D, C::BC) ||
      !make_fp8_map(&m.qt, pf->qt, pf->q_cols, C::D, p.heads_q, p.batch, qt_stride, 64, C::D) ||
      !make_fp8_map(&m.dot, pf->dot, pf->q_cols, C::D, p.heads_q, p.batch, qt_stride, 64, C::D) ||
      !make_fp8_map(&m.kt, pf->kt, pf->k_cols, C::D, p.heads_kv, p.batch, kt_stride, 128, C::D))
    return LAB_E_SHAPE;
  if ((err = lab::allow_smem_once<bwd_fp8_kernel<C>>(C::kSmem, dev)) != cudaSuccess) return err;
  const int64_t blocks = (int64_t)((p.seqlen_k + C::BC - 1) / C::BC) * p.heads_kv * p.batch;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  bwd_fp8_kernel<C><<<(unsigned)blocks, C::kThreads, C::kSmem, st>>>(m, *pf);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  // Epilogue pass: dQ = scale * dq_accum
  const int64_t quads = (int64_t)p.batch * p.heads_q * lab::bwd::padded_rows(p.seqlen_q) * C::D / 4;
  const int64_t grid = (quads + 255) / 256;
  convert_dq<C, __nv_bfloat16><<<(unsigned)(grid < 65536 ? grid : 65536), 256, 0, st>>>(p);
  return cudaGetLastError();
}

}  // namespace

extern "C" int attn_bwd_v22(const AttnBwdFp8Params* pf, void* stream) {
  if (const int rc = check_call(pf)) return rc < 0 ? rc : 0;
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  return pf->base.head_dim == 64 ? run<Fp8Cfg<64>>(pf, st, dev) : run<Fp8Cfg<128>>(pf, st, dev);
}
