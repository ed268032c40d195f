// Backward attention v02: the first Hopper backward (sm_90a): wgmma for all five GEMMs, TMA loads on an
// mbarrier ring, a producer warp and two consumer warpgroups (setmaxnreg), dQ reduced by the copy engine.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261125-bwd-v02-wgmma.json.
//
// The algorithm is v01's (FA2's backward; the header of bwd/v01_mma.cu has the equations), with keys as the
// wgmma M dimension so that P^T and dS^T come out of the accumulators already in the A-operand layout:
//   per CTA: one key block K_j, V_j of B_c = 128 keys of one KV head; consumer warpgroup w owns keys 64w..+63
//   for every query head of the GQA group, every query block Q_i of B_r = 64 rows (causal: i >= j only):
//     S^T  = K_w Q_i^T           SS  m64n64,  k = D      (K-major K and Q tiles, as TMA wrote them)
//     dP^T = V_w dO_i^T          SS  m64n64,  k = D
//     P^T  = exp2(S^T * scale * log2 e - LSE_i * log2 e)          (LSE from the forward: no running max)
//     dV_w += P^T dO_i           RS  m64nD,   k = B_r  (P^T from registers, dO read MN-major)
//     dS^T = P^T * (dP^T - Delta_i)
//     dK_w += dS^T Q_i           RS  m64nD,   k = B_r
//     dS^T -> shared memory (bf16/fp16, 128B swizzle), then dQ_i partial = dS_i K:
//       D = 128: warpgroup w computes columns 64w..64w+63 over all 128 keys (both halves of dS^T, the K
//                column block w): SS m64n64, k = 128, A read M-major (transposed) from the dS^T tile;
//       D = 64:  warpgroup w computes all 64 columns over its own 64 keys: SS m64n64, k = 64.
//     The 64 x 64 fp32 partial goes to shared memory in accumulator order (each thread's 4 consecutive
//     registers as one 16-byte store, threads consecutive: no bank conflict) and one thread of the warpgroup
//     hands it to the copy engine (cp.reduce.async.bulk .add.f32, 16 KB) into dq_accum, double-buffered.
//   dK (times scale) and dV stay in registers for the whole CTA and are stored once: the GQA sum is a loop.
// dq_accum therefore holds each 64-row block of dQ in the accumulator order of the warpgroup that wrote it
// (FA3's trick; no transposition on the critical path), and convert_dq puts it back in (B, H, S, D)
// order, times scale, cast. Rows are padded to 64 (AttnBwdParams' workspace rule).
//
// Launches: bwd_pre (common/bwd_prepass.cuh), a memset of dq_accum, bwd_dkdv_v02, convert_dq. The parts
// (config, producer, GEMM steps, hand-offs, epilogue, host launch) are in common/hopper/attn_bwd_sm90.cuh.
// Launch shape of bwd_dkdv_v02: grid ceil(S_k / 128) * H_kv * B (the key block fastest: the CTAs of one head
// run together and share its Q and dO in L2; causal: key block 0, the longest, first), 384 threads (warpgroup
// 0 and 1 consumers, 240 registers each; warpgroup 2 the producer, 24 registers, one thread issuing TMA).
// Shared memory: K and V (2 x 128 x D x 2 B), kStages x (Q_i, dO_i, LSE_i, Delta_i), dS^T (128 x 64 x 2 B),
// 2 x 2 dQ buffers of 16 KB: D = 128: 210 KB, D = 64: 146 KB.
//
// Limits: sm_90 only; D 64 and 128; fp16 and bf16; any S_q, S_k >= 0 (TMA's zero fill gives the ragged tails,
// masked where a tile needs it: causal diagonal, keys >= S_k, queries >= S_q); GQA; any finite scale;
// 16-byte-aligned bases, strides multiples of 8 elements. Deterministic mode is not this kernel's: the
// reduction order of the copy engine's adds is not fixed, so lab.ops runs v01's separate dQ pass then.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v02_wgmma.cu
#include "common/hopper/attn_bwd_sm90.cuh"

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_v02(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                 const AttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D, kStages = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<kStages> bars;
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const Work work = cta_work<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;

  // Prologue
  if (threadIdx.x == 0) init_bars(bars);
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt == 0) produce<C>(&tq, &tk, &tv, &tdo, bars, base, work, p);
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  const float c = p.scale * kLog2e;
  float dk[D / 2], dv[D / 2];
  zero_acc(dk);
  zero_acc(dv);
  mbar_wait(smem_u32(&bars.kv), 0);

  // Main loop: each step waits for every GEMM it issued before the next begins.
  for (int it = 0; it < work.n_iters; ++it) consume_step<C, T>(dk, dv, smem, bars, work, it, it, c, p);
  if (wt == 0) bulk_wait<0>();

  // Epilogue
  store_dk_dv<C, T>(dk, dv, work.n0 + 64 * wg, work, p);
#endif
}

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg<D>, T, bwd_dkdv_v02<Cfg<D>, T>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v02(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
