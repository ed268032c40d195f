// Backward attention v09: head dims 192 and 256 on mma.sync (m16n8k16, fp32 accumulate), FlashAttention-2's
// wide-head backward. lab.ops runs it for every D_qk, D_v from 129 to 256 (zero-padded to 192 or 256 by
// lab.fwd.head_dims, whose autograd carries the gradients back to the unpadded tensors).
// Compile check: python -m lab compile; GPU checks and the race: lab.fwd.head_dims_gpu (wide_checks, wide_bwd_race);
//   measured rows and the four sanitizers' logs: outputs/experiments/20261126-bwd-v09-wide.json (its evidence).
//
// Same algorithm as v01 (P = exp2(s * scale * log2 e - LSE * log2 e), dV = P^T dO, dP = dO V^T,
// dS = P * (dP - Delta), dQ = scale * dS K, dK = scale * dS^T Q; Delta and LSE * log2 e from the shared pre-pass),
// what changes is where the accumulators live. v01 gives each warp 16 keys and all D columns of dK and dV:
// 2 * D / 2 floats a thread, 256 at D = 256, more than the register file allows beside the step's operands.
// Here, as in FA2 at D = 256 (B_r = B_c = 64, 8 warps), the step is split in three phases that tile the warps
// differently, joined through shared memory:
//   A. S^T = K Q^T and dP^T = V dO^T: warp w takes keys 16 (w % 4).. and queries 32 (w / 4).. (16 x 32 each);
//      P^T and dS^T go to shared memory as T, [key][query].
//   B. dV += P^T dO and dK += dS^T Q: warp w takes keys 32 (w % 2).. and columns D/4 (w / 2)..: D / 4 floats a
//      thread for each of dK and dV (64 at D = 256), held for the whole CTA. (The first build had 16 keys x D/2 columns
//      a warp, LAB_BWD_WIDE_SM80_KEY_TILES=1: the same registers, but each P^T / dS^T fragment fed D/16 products instead of
//      D/32 x 2, so 18 ldmatrix per 32 mma instead of 12. Prediction: a third fewer ldmatrix in B, 12 % fewer a
//      step, +3-8 % where the steps dominate, S >= 2048.)
//   C. dQ_i += dS K: warp w takes queries 16 (w % 4).. and columns D/2 (w / 4).., in chunks of 32 columns
//      added into the fp32 dq_accum (16-byte red.global.add.v4 on sm_90, scalar atomics on sm_80); the convert
//      pass scales and casts, as in v01.
// Grid (ceil(S_k / 64), H_kv, B), 256 threads, 1 CTA / SM. Shared memory: K, V (64 x (D + 8)), Q and dO
// (kStages x 64 x (D + 8)), P^T and dS^T (64 x 72), LSE and Delta: 2 stages 216 KiB at D = 256, 168 KiB at
// D = 192 (sm_90's 227 KiB); one stage (no overlap of the next Q, dO load) where a block may not opt in to that
// much (sm_80: 150 / 118 KiB). Limits: fp16 / bf16, any S_q, S_k (partial tiles masked), GQA, strides, any
// finite scale, top-left causal; no deterministic mode (LAB_E_MODE: dQ's atomics are unordered).
//
// Prediction (H100, bf16): FA2's own tiling and its dQ atomics, with a quarter of the atomic instructions
// (v4 reductions): the same speed as SDPA-flash's backward at D = 256 (FA2's kernel), 0.9-1.1x.
// Build flags: LAB_BWD_WIDE_SM80_STAGES (0: by the device, else 1 or 2), LAB_BWD_WIDE_SM80_RED (4: v4 reductions on sm_90; 1:
// scalar atomics everywhere), LAB_BWD_WIDE_SM80_KEY_TILES (phase B's tiling: 1, 16 keys x D/2 a warp; 2, 32 keys x D/4),
// LAB_BWD_WIDE_SM80_ROW_LOAD (1: fixed row steps per thread; 0: v01's strided tile loop).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/bwd_mma.cuh"
#include "common/bwd_prepass.cuh"
#include "common/launch.h"
#include "common/mma.cuh"
#include "common/params.h"

#ifndef LAB_BWD_WIDE_SM80_STAGES
#define LAB_BWD_WIDE_SM80_STAGES 0
#endif
#ifndef LAB_BWD_WIDE_SM80_RED
#define LAB_BWD_WIDE_SM80_RED 4
#endif
#ifndef LAB_BWD_WIDE_SM80_ROW_LOAD
#define LAB_BWD_WIDE_SM80_ROW_LOAD 1
#endif
#ifndef LAB_BWD_WIDE_SM80_KEY_TILES
#define LAB_BWD_WIDE_SM80_KEY_TILES 2
#endif

namespace {

using namespace lab;
using namespace lab::bwd;

constexpr float kLog2e = 1.4426950408889634f;

template <int D, int kStages>
struct WideCfg {
  static constexpr int kThreads = 256;  // 8 warps: 4 key (or query) tiles of 16 x 2 halves
  static constexpr int BC = 64;         // keys per CTA; 32 would halve dK, dV's registers but double the Q, dO reads
  static constexpr int BR = 64;         // queries per step; BC == BR keeps the causal start a whole block
  static constexpr int LD = D + 8;      // Q, K, V, dO pitch: +16 B keeps ldmatrix rows conflict-free
  static constexpr int LDS = BR + 8;    // P^T, dS^T pitch
  static constexpr int DH = D / 2;      // columns of dQ per warp (and of dK, dV with kKT = 1)
  // B: m16 tiles of keys a warp in dK, dV: 1 (16 keys x D/2 columns) or 2 (32 keys x D/4: a third fewer
  // ldmatrix in B for 8 more registers of A fragments)
  static constexpr int kKT = LAB_BWD_WIDE_SM80_KEY_TILES;
  static constexpr int kSmem = (2 * BC * LD + 2 * kStages * BR * LD + 2 * BC * LDS) * 2 + 2 * kStages * BR * 4;
  static_assert(D % 64 == 0 && D <= 256, "D/2 columns per warp in dQ chunks of 32");
  static_assert(BC == BR && BR / 2 == 32, "phase A: 16 keys x 32 queries per warp");
  static_assert(kSmem <= 227 * 1024, "shared memory beyond sm_90's opt-in limit");
};

// A tile of ROWS rows into shared memory: fixed row steps per thread (LAB_BWD_WIDE_SM80_ROW_LOAD=1, the default: 1417
// instructions a step at D = 256) or v01's strided loop (0: a division per 16-byte copy, 1668 a step, where ncu
// counted 1.5x FA2's instructions). Prediction: +5-10 % where steps dominate. Outcome (H100, GPU time, two rounds):
// +2.1 % at D = 192 S = 2048 causal, +0.7 % at D = 256 S = 512, -0.8 to +0.1 % at D = 256 S = 8192; ncu: 1.24x
// FA2's instructions (from 1.5x) but the time did not follow, the step waits on shared-memory loads (short
// scoreboard 3.4 cycles an issue against FA2's 2.7). Kept: no slower on balance, fewer instructions.
template <class T, int D, int ROWS, int LD, int kThreads>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int64_t row_stride, int row0, int seqlen, int tid) {
  if constexpr (LAB_BWD_WIDE_SM80_ROW_LOAD) load_tile_rows<T, D, ROWS, LD, kThreads>(dst, src, row_stride, row0, seqlen, tid);
  else load_tile<T, D, ROWS, LD, kThreads>(dst, src, row_stride, row0, seqlen, tid);
}

// Tried and removed: phase A with one product a warp: warps 0-3 form S^T = K Q^T, warps 4-7 dP^T = V dO^T, each on
// 32 keys (wk) x 32 queries (wq). A k-step loads 2 A and 2 B fragments for 8 mma, where the default's 16 x 32 tile
// of both products loads 6: a third fewer ldmatrix in the phase that issues the most of them (96 of a warp's 180 a
// step at D = 256; at 4 clocks of shared memory per ldmatrix.x4, ~5.8k of the ~12k clocks a step took on the H200).
// The S^T warps write P^T (masked) as T; after a barrier the dP^T warps read it back at their own fragment positions
// and write dS^T = P^T (dP^T - Delta): dS is formed from P rounded to T (the P phase B multiplies), one rounding
// more than the default's, inside the checks' 3x-SDPA bound (the default's worst was 1.17x). Cost: a barrier more a
// step and the S^T warps' exp2 on twice the elements (one S^T and one dP^T warp share each scheduler). Prediction:
// a warp's ldmatrix 180 -> 148 a step (-18 % of shared-memory reads), +3-8 % at S >= 2048. Outcome (H100, GPU time
// against the default): +2.1 % at D = 256 S = 8192, +0.7 % at D = 256 S = 512, -1.4 % at D = 192 S = 2048 causal;
// correct (66/66 quick wide checks) and sanitizer-clean, but not the predicted gain, so removed (its code:
// `git log -S phase_a_split`).

template <class T, int D, int kStages>
__global__ void __launch_bounds__(256, 1) bwd_dkdv_wide(const AttnBwdParams p) {
  using C = WideCfg<D, kStages>;
  constexpr int BC = C::BC, BR = C::BR, LD = C::LD, LDS = C::LDS, DH = C::DH, NQ = BR / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + BC * LD;
  T* sQ = sV + BC * LD;              // kStages buffers
  T* sdO = sQ + kStages * BR * LD;   // kStages buffers
  T* sP = sdO + kStages * BR * LD;   // P^T [key][query]
  T* sdS = sP + BC * LDS;            // dS^T [key][query]
  float* sL = reinterpret_cast<float*>(sdS + BC * LDS);  // kStages x BR
  float* sDel = sL + kStages * BR;                        // kStages x BR

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int k0 = blockIdx.x * BC, hkv = blockIdx.y, b = blockIdx.z;
  const int group = p.heads_q / p.heads_kv, sq_pad = padded_rows(p.seqlen_q);
  const int nqb = (p.seqlen_q + BR - 1) / BR;
  const int qb_begin = p.causal ? min(k0 / BR, nqb) : 0;  // causal: no query before k0 sees this block
  const int per_head = nqb - qb_begin, n_iter = group * per_head;
  const float c = p.scale * kLog2e;
  const int w16 = (warp & 3) * 16;     // A, B: this warp's 16 keys; C: its 16 query rows
  const int wq = (warp >> 2) * BR / 2;  // A: its 32 queries
  const int wd = (warp >> 2) * DH;      // B, C: its D/2 columns

  // Prologue: K, V of the block, the first (query head, query block)'s Q, dO, LSE, Delta.
  const T* kg = static_cast<const T*>(p.k) + b * p.k_stride[0] + hkv * p.k_stride[1];
  const T* vg = static_cast<const T*>(p.v) + b * p.v_stride[0] + hkv * p.v_stride[1];
  load_rows<T, D, BC, LD, 256>(sK, kg, p.k_stride[2], k0, p.seqlen_k, tid);
  load_rows<T, D, BC, LD, 256>(sV, vg, p.v_stride[2], k0, p.seqlen_k, tid);
  auto load_q = [&](int it, int buf) {
    const int hq = hkv * group + it / per_head, q0 = (qb_begin + it % per_head) * BR;
    const T* qg = static_cast<const T*>(p.q) + b * p.q_stride[0] + hq * p.q_stride[1];
    const T* dg = static_cast<const T*>(p.dout) + b * p.do_stride[0] + hq * p.do_stride[1];
    load_rows<T, D, BR, LD, 256>(sQ + buf * BR * LD, qg, p.q_stride[2], q0, p.seqlen_q, tid);
    load_rows<T, D, BR, LD, 256>(sdO + buf * BR * LD, dg, p.do_stride[2], q0, p.seqlen_q, tid);
    const int64_t r0 = ((int64_t)b * p.heads_q + hq) * sq_pad + q0;  // in bounds: rows padded to 64
    if (tid < BR / 4) {
      cp_async_16(smem_u32(sL + buf * BR + tid * 4), p.lse_log2 + r0 + tid * 4, true);
      cp_async_16(smem_u32(sDel + buf * BR + tid * 4), p.delta + r0 + tid * 4, true);
    }
  };

  // B's tiling: kKT m16 tiles of keys a warp, KW warps along the keys, the columns split over the others.
  constexpr int KT = C::kKT, KW = 4 / KT, DC = D * KW / 8;
  const int wkB = (warp % KW) * 16 * KT, wdB = (warp / KW) * DC;
  float dk[KT][DC / 8][4], dv[KT][DC / 8][4];
#pragma unroll
  for (int m = 0; m < KT; ++m)
#pragma unroll
    for (int n = 0; n < DC / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[m][n][e] = dv[m][n][e] = 0.f;
  if (n_iter > 0) load_q(0, 0);
  cp_async_commit();

  // Main loop: one (query head of the group, query block) per step.
  for (int it = 0; it < n_iter; ++it) {
    const int buf = kStages == 2 ? it & 1 : 0;
    if (kStages == 2 && it + 1 < n_iter) load_q(it + 1, buf ^ 1);
    cp_async_commit();
    if constexpr (kStages == 2) cp_async_wait<1>();
    else cp_async_wait<0>();
    __syncthreads();
    const int hq = hkv * group + it / per_head, q0 = (qb_begin + it % per_head) * BR;
    const T* tq = sQ + buf * BR * LD;
    const T* tdo = sdO + buf * BR * LD;
    const float* l2 = sL + buf * BR;
    const float* del = sDel + buf * BR;

    // A. S^T and dP^T of 16 keys x 32 queries; P^T and dS^T into shared memory (masked only where a tile can be).
    const bool need_mask = q0 + BR > p.seqlen_q || k0 + BC > p.seqlen_k || (p.causal && q0 < k0 + BC - 1);
    {
      float s[NQ][4], dp[NQ][4];
      s_dp_tile<T, D, NQ>(s, dp, sK, sV, w16, tq + wq * LD, tdo + wq * LD, LD, lane);
      p_ds_keys_as_rows<NQ>(s, dp, c, l2, del, wq, need_mask, k0 + w16, q0, g, t, p);
#pragma unroll
      for (int j = 0; j < NQ; ++j) {
        const int at = (w16 + g) * LDS + wq + j * 8 + 2 * t;  // rows w16 + g and + 8: 32 distinct banks
        *reinterpret_cast<uint32_t*>(sP + at) = pack2<T>(s[j][0], s[j][1]);
        *reinterpret_cast<uint32_t*>(sP + at + 8 * LDS) = pack2<T>(s[j][2], s[j][3]);
        *reinterpret_cast<uint32_t*>(sdS + at) = pack2<T>(dp[j][0], dp[j][1]);
        *reinterpret_cast<uint32_t*>(sdS + at + 8 * LDS) = pack2<T>(dp[j][2], dp[j][3]);
      }
    }
    __syncthreads();

    // B. dV += P^T dO and dK += dS^T Q for 16 KT keys x DC columns (queries are the k dimension).
#pragma unroll
    for (int kk = 0; kk < BR / 16; ++kk) {
      uint32_t ap[KT][4], as[KT][4];
#pragma unroll
      for (int m = 0; m < KT; ++m) {
        ldmatrix_x4(ap[m], addr_a(sP, LDS, wkB + 16 * m, kk * 16, lane));
        ldmatrix_x4(as[m], addr_a(sdS, LDS, wkB + 16 * m, kk * 16, lane));
      }
#pragma unroll
      for (int dn = 0; dn < DC / 16; ++dn) {
        uint32_t fo[4], fq[4];
        ldmatrix_x4_trans(fo, addr_b_kn_trans(tdo, LD, wdB + dn * 16, kk * 16, lane));
        ldmatrix_x4_trans(fq, addr_b_kn_trans(tq, LD, wdB + dn * 16, kk * 16, lane));
#pragma unroll
        for (int m = 0; m < KT; ++m) {
          mma_16816_x2<T>(dv[m], 2 * dn, ap[m], fo);
          mma_16816_x2<T>(dk[m], 2 * dn, as[m], fq);
        }
      }
    }

    // C. dQ_i += dS K for 16 query rows x D/2 columns, 32 columns at a time (keys are the k dimension).
    if (q0 + w16 < p.seqlen_q) {  // rows past S_q add nothing
      uint32_t ads[BC / 16][4];
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) ldmatrix_x4_trans(ads[kk], addr_a_trans(sdS, LDS, w16, kk * 16, lane));
      float* dqa = p.dq_accum + ((int64_t)b * p.heads_q + hq) * p.seqlen_q * D;
#pragma unroll
      for (int ch = 0; ch < DH / 32; ++ch) {
        float acc[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
          for (int dn = 0; dn < 2; ++dn) {
            uint32_t bk[4];
            ldmatrix_x4_trans(bk, addr_b_kn_trans(sK, LD, wd + ch * 32 + dn * 16, kk * 16, lane));
            mma_16816_x2<T>(acc, 2 * dn, ads[kk], bk);
          }
#pragma unroll
        for (int n = 0; n < 4; ++n)
          add_dq<LAB_BWD_WIDE_SM80_RED>(dqa, q0 + w16 + g, wd + ch * 32 + n * 8, t, p.seqlen_q, D, acc[n]);
      }
    }
    __syncthreads();  // P^T, dS^T and this Q / dO buffer are rewritten next step
    if (kStages == 1 && it + 1 < n_iter) load_q(it + 1, 0);
  }
  cp_async_wait<0>();

  // Epilogue: dK * scale and dV, rows >= S_k not written.
#pragma unroll
  for (int m = 0; m < KT; ++m) store_dk_dv<T, DC / 8>(p, b, hkv, k0 + wkB + 16 * m + g, wdB, t, dk[m], dv[m]);
}

// ---------------------------------------------------------------- host

template <class T, int D, int kStages>
int launch(const AttnBwdParams& p, cudaStream_t st) {
  const int64_t pre_threads = bwd_pre_threads(p, D);
  cudaError_t err = cudaSuccess;
  if (pre_threads > 0) {  // S_q == 0: no rows, dK = dV = 0 below
    err = launch_kernel<bwd_pre<T, D>>(dim3((unsigned)((pre_threads + 127) / 128)), 128, 0, st, p);
    if (err != cudaSuccess) return err;
  }
  err = cudaMemsetAsync(p.dq_accum, 0, (size_t)p.batch * p.heads_q * p.seqlen_q * D * sizeof(float), st);
  if (err != cudaSuccess) return err;
  using C = WideCfg<D, kStages>;
  err = launch_kernel<bwd_dkdv_wide<T, D, kStages>>(dim3((p.seqlen_k + C::BC - 1) / C::BC, p.heads_kv, p.batch),
                                                     C::kThreads, C::kSmem, st, p);
  if (err != cudaSuccess || p.seqlen_q == 0) return err;
  return launch_kernel<bwd_convert<T, D>>(dim3(convert_blocks(p, D)), 256, 0, st, p);
}

// Two stages where the device lets a block opt in to their shared memory, else one (LAB_BWD_WIDE_SM80_STAGES forces).
template <class T, int D>
int launch_staged(const AttnBwdParams& p, cudaStream_t st) {
  const int optin = smem_optin(current_device());
  const int stages = LAB_BWD_WIDE_SM80_STAGES ? LAB_BWD_WIDE_SM80_STAGES : optin >= WideCfg<D, 2>::kSmem ? 2 : 1;
  if (optin < WideCfg<D, 1>::kSmem) return LAB_E_SHAPE;  // sm_86 / sm_89 (99 KiB): no tile fits
  return stages == 2 ? launch<T, D, 2>(p, st) : launch<T, D, 1>(p, st);
}

}  // namespace

extern "C" int attn_bwd_v09(const AttnBwdParams* p, void* stream) {
  if (p->head_dim != 192 && p->head_dim != 256) return LAB_E_HEAD_DIM;
  if (const int rc = lab::check_bwd_call(p)) return rc < 0 ? rc : 0;
  if (p->deterministic) return LAB_E_MODE;  // dQ's fp32 atomics add in no fixed order: v01's separate dQ pass
  if (p->heads_q > 65535 || p->batch > 65535) return LAB_E_SHAPE;  // gridDim.y and .z
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim == 192) return bf16 ? launch_staged<__nv_bfloat16, 192>(*p, st) : launch_staged<__half, 192>(*p, st);
  return bf16 ? launch_staged<__nv_bfloat16, 256>(*p, st) : launch_staged<__half, 256>(*p, st);
}
