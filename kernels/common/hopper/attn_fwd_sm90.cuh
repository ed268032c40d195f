// Parts of the Hopper forward kernels (fwd/v05.., sm_90a) that every version
// shares: the host checks and tensor maps, the shared-memory tile addressing
// for wgmma, one consumer warpgroup's online softmax on a 64 x B_c score
// tile, and the epilogue. A version file composes them into its kernel.
//
// Tile layout in shared memory: a tile of R rows x D columns (16-bit) is
// D/64 column blocks, each R rows of 128 bytes with 128-byte swizzle (what
// one TMA box of (64, R) writes). Every block starts 1024-byte aligned.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "common/fast_div.cuh"
#include "common/launch.h"
#include "common/mask.cuh"
#include "common/mma.cuh"
#include "common/params.h"
#include "common/hopper/mbarrier.cuh"
#include "common/hopper/tma.cuh"
#include "common/hopper/wgmma.cuh"

namespace lab::sm90 {

// The ring slot of key tile j: stage j % kStages and the parity (j / kStages) & 1 of its barriers' phase. Where
// kStages is not a power of two and kEnabled, a loop carries the slot (next(): an increment and a compare) instead of
// deriving it from j (kCarry). Derived, each use is a multiply-high and its fix-ups on the uniform datapath, which
// the compiler placed between the P V wgmma issues of a ping-pong turn (the issue stalled on dispatch and the other
// consumer's turn waited for it: ncu of fwd v11's paged kernel, outputs/driver_logs/20261130-h200-ring-carry-2c6f5d6);
// with a power of two they are a mask and a shift, so such rings keep deriving (their machine code unchanged).
template <int kStages, bool kEnabled>
struct RingSlot {
  static constexpr bool kCarry = kEnabled && (kStages & (kStages - 1)) != 0;
  int stage;
  uint32_t parity;
  __device__ __forceinline__ static RingSlot of(int j) { return {j % kStages, (uint32_t)(j / kStages) & 1u}; }
  // The slot of tile j in a loop that calls next() once a tile: the carried one, or of(j) derived at the use.
  __device__ __forceinline__ RingSlot at(int j) const { return kCarry ? *this : of(j); }
  __device__ __forceinline__ void next() {  // one tile on (nothing where the slot is derived)
    if constexpr (kCarry) {
      if (++stage == kStages) {
        stage = 0;
        parity ^= 1u;
      }
    }
  }
};


constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---------------------------------------------------------------- host

// Compute capability 9.0 (sm_90a code runs nowhere else); common/launch.h caches it per device.
inline bool device_is_sm90(int* dev_out) {
  *dev_out = current_device();
  return capability(*dev_out) == 90;
}

// A head dim that a narrow call runs: a multiple of 8 below 256 that is no kernel width (64, 128, 192, 256), read
// by the next width's kernel (narrow_width: fwd v05 / v07 at 64 and 128, fwd v10 at 192 and 256) through tensor
// maps over the true D (see Narrow below).
inline bool narrow_head_dim(int d) { return d > 0 && d < 256 && d % 64 != 0 && d != 192 && d % 8 == 0; }
inline int narrow_width(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256; }

// The launcher's argument checks (common/launch.h) and TMA's own limit: coordinates are int32 and a
// dimension holds at most 2^32 elements. 0 = go, > 0 = nothing to do, < 0 = error code. narrow_ok: the
// narrow head dims below 128 pass too.
inline int check_tma_fwd_params(const AttnFwdParams* p, bool narrow_ok = false) {
  const bool narrow = narrow_ok && narrow_head_dim(p->head_dim) && narrow_width(p->head_dim) <= 128;
  if (const int rc = narrow ? lab::check_fwd_call(p) : lab::check_fwd_params(p)) return rc;
  if (p->seqlen_q > (1 << 30) || p->seqlen_k > (1 << 30)) return LAB_E_SHAPE;
  return 0;
}

// Tensor maps for Q (box q_rows) and K, V (box kv_rows); LAB_E_SHAPE if the driver rejects one.
inline int make_fwd_maps(const AttnFwdParams* p, int q_rows, int kv_rows, CUtensorMap* tq, CUtensorMap* tk,
                         CUtensorMap* tv) {
  const bool bf16 = p->dtype == LAB_BF16;
  const int D = p->head_dim;
  const int Sk = p->seqlen_k > 0 ? p->seqlen_k : 1;  // S_k = 0: a map is still needed, never read
  if (!make_bhsd_map(tq, p->q, bf16, D, p->seqlen_q, p->heads_q, p->batch, p->q_stride, q_rows) ||
      !make_bhsd_map(tk, p->k, bf16, D, Sk, p->heads_kv, p->batch, p->k_stride, kv_rows) ||
      !make_bhsd_map(tv, p->v, bf16, D, Sk, p->heads_kv, p->batch, p->v_stride, kv_rows))
    return LAB_E_SHAPE;
  return 0;
}

// One launch of a TMA forward kernel (v05..v07 share it): raise its shared-memory limit once per device,
// build the three tensor maps, one CTA per (B_r query rows, head, batch); kPersistent: one CTA per SM at
// most, each looping over work tiles. kKernel is the kernel instantiation itself (common/launch.h's
// allow_smem_once keeps its once-per-device flags per instantiation).
template <class Cfg, auto kKernel, bool kPersistent = false>
inline int launch_fwd_sm90(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  if (const cudaError_t err = allow_smem_once<kKernel>(Cfg::kSmem, dev)) return (int)err;
  CUtensorMap tq, tk, tv;
  if (int rc = make_fwd_maps(&p, 64, Cfg::BC, &tq, &tk, &tv)) return rc;
  int64_t blocks = (int64_t)((p.seqlen_q + Cfg::BR - 1) / Cfg::BR) * p.batch * p.heads_q;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  if (kPersistent && blocks > num_sms(dev)) blocks = num_sms(dev);
  kKernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmem, stream>>>(tq, tk, tv, p);
  return (int)cudaGetLastError();
}

// The same for a version with a folded-scale kernel (common softmax_scores' kFold): with the version's
// switch on and a positive scale (order-keeping, what the fold needs) kFolded runs, else kPlain.
template <class Cfg, auto kFolded, auto kPlain, bool kFoldOn, bool kPersistent = false>
inline int launch_fwd_sm90_fold(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  if constexpr (kFoldOn)
    if (p.scale > 0.f) return launch_fwd_sm90<Cfg, kFolded, kPersistent>(p, stream, dev);
  return launch_fwd_sm90<Cfg, kPlain, kPersistent>(p, stream, dev);
}

// Narrow<C>: config C run for a head dim below C::D (narrow_head_dim). The tensor maps are made over the true
// D (make_fwd_maps reads p.head_dim), so TMA's out-of-bounds fill writes the zero columns that a padded copy
// of Q, K and V would hold, without the copy's DRAM traffic; the epilogue stores O's first head_dim columns
// (whole 8-column blocks, since D is a multiple of 8) into the caller's unpadded O. Exact for the reason
// padding is (zero columns add 0 to every score; P V's extra columns are never stored). Its own kernel
// instantiations: C's keep their SASS (kNarrow = false compiles the column test away). Prediction and outcome
// against the padded call and SDPA: outputs/experiments/20261126-head-dims-narrow-fwd.json. The S GEMM runs every k16 step
// of the width unless a step count is fixed per instantiation (LAB_FWD_NARROW_QK_STEPS below).
// kSteps > 0 (LAB_FWD_NARROW_QK_STEPS below): the config issues only that many k16 steps of S = Q K^T, those that
// hold columns below the head dim; the rest would multiply TMA's zero fill. 0: every step of the width.
template <class C, int kSteps = 0>
struct Narrow : C {
  static constexpr bool kNarrow = true;
  static constexpr int kQkSteps = kSteps > 0 ? kSteps : C::D / 16;
};
// Narrow<C> for head dim kD with S over the k16 steps that hold its columns, ceil(kD / 16): NarrowSteps<Cfg128, 80> is
// Narrow<Cfg128, 5>.
template <class C, int kD>
using NarrowSteps = Narrow<C, (kD + 15) / 16>;
// Whether a config is a Narrow<C> (false for a config without kNarrow, as the backward's are).
template <class C, class = void>
struct narrow_cfg : std::false_type {};
template <class C>
struct narrow_cfg<C, std::void_t<decltype(C::kNarrow)>> : std::bool_constant<C::kNarrow> {};
// The k16 steps of S a config issues: C::D / 16, or a Narrow<C, n>'s n.
template <class C, class = void>
struct qk_steps : std::integral_constant<int, C::D / 16> {};
template <class C>
struct qk_steps<C, std::void_t<decltype(C::kQkSteps)>> : std::integral_constant<int, C::kQkSteps> {};
// LAB_FWD_NARROW_QK_STEPS (3; 2: D 80 / 96 / 32 only; 1: D 80 / 96 only; 0: off): head dims 80 and 96 run
// Narrow<Cfg128, 5> and Narrow<Cfg128, 6>; from 2 also D = 32 on Narrow<Cfg64, 2>; from 3 also D = 160 on fwd v10's
// Narrow<Cfg192, 10>. A bound read at run time instead (head_dim) makes ptxas serialize the
// wgmmas (C7515), hence a step count per instantiation. Prediction: the S GEMM loses 3/8 (D = 80) and 1/4 (D = 96)
// of its work, about 19 % and 12 % of the tensor work; v07's D = 128 loop is as much softmax- as GEMM-bound
// (outputs/experiments/20261126-head-dims-narrow-fwd.json), so +5-9 % at D = 80 and +3-6 % at D = 96 where S >= 2048, less at 512.
// Measure: lab.fwd.narrow_gpu.candidate({"LAB_FWD_NARROW_QK_STEPS": 1}) (kernel-level, in rounds with the default).
// Outcome (H100, outputs/driver_logs/20261126-h100-narrow-qk-steps-c99efe7/): 20/20 checks; time 0.886-0.950x the
// default's in all 12 cells, D = 80 0.886-0.950 and D = 96 0.895-0.941, as much at S = 512 as at 8192 (kernel-level
// 1.10-1.35x SDPA-cuDNN): more than predicted, whose discount for the softmax's share was too large (not yet
// profiled). The default since its compute-sanitizer run (memcheck, racecheck, synccheck, initcheck) and the
// narrow checks with it on: outputs/experiments/20261126-head-dims-narrow-fwd.json.
// Levels 2 and 3, D = 32 and 160 (the model head dims among the narrow ones): prediction, S loses half its steps
// at D = 32 (a quarter of the tensor work; the width-64 loop is more softmax-bound than the width-128 one, so
// +4-9 %) and 2 of 12 at D = 160 (a twelfth of the tensor work, +2-5 %). Outcome (H100,
// outputs/driver_logs/20261126-h100-narrow-qk-d32-0acd4a4/): D = 32 +3.2-6.7 % (level 1 takes 1.032-1.067x level 2's
// kernel time, least at S = 512), 12/12 checks, the four sanitizers clean: level 2 is the default. D = 160 (H100,
// outputs/driver_logs/20261126-h100-wide-tiles-258abfc/): +2.8-5.0 %, equal to level 2 bit for bit.
// Level 3 tried with D = 200 too (Narrow<Cfg256, 13>): S loses 3 of 16 steps, 9 % of the tensor work, but D = 200
// waits on its K and V loads (400-byte rows off 128-byte lines: outputs/experiments/20261126-head-dims-narrow-fwd.json), so less
// of the cut would show than at D = 160: prediction +1-4 % at D = 200, +2.8-5.0 % again at D = 160. Outcome (H100,
// lab.fwd.narrow_gpu.candidate, outputs/driver_logs/20261126-h100-narrow-level3-1c70220/; level 2 against level 3,
// kernel-level in rounds, 40/40 checks, equal bit for bit): D = 160 +1.9-4.8 % again; D = 200 -3.2 to +1.2 %, as
// much as two runs of one cell differ (0.968 and 1.007 on d200-s2048): the loads bind it, so its instantiation was
// dropped and D = 200 runs every step. Level 3 is the default since that run (22/22 narrow checks with the
// v10 build that skips O's last column block failing; memcheck, racecheck, synccheck and initcheck clean at D 160).
#ifndef LAB_FWD_NARROW_QK_STEPS
#define LAB_FWD_NARROW_QK_STEPS 3
#endif
// Whether a narrow call stores the 8-column block that starts at column c0 of O (of dQ, dK and dV in the backward).
// LAB_FWD_BUG_NARROW_SHORT, LAB_BWD_BUG_NARROW_SHORT (controls for the GPU checks, wrong on purpose): the last block
// is left unwritten, which the checks must see.
__device__ __forceinline__ bool narrow_stores(int c0, int head_dim) {
#if defined(LAB_FWD_BUG_NARROW_SHORT) || defined(LAB_BWD_BUG_NARROW_SHORT)
  return c0 + 8 < head_dim;
#else
  return c0 < head_dim;
#endif
}
// The config `C` of a version's per-call choice, narrow when the config it was reached from (`From`) is.
template <class From, class C>
using NarrowLike =
    std::conditional_t<From::kNarrow, Narrow<C, qk_steps<From>::value == C::D / 16 ? 0 : qk_steps<From>::value>, C>;

// The extern "C" entry of a TMA forward kernel: check the call, then pick the instantiation for
// (D, dtype). Launch<Cfg, T>::run(p, stream, dev) launches one (a version file defines it in one line).
// kNarrowToo: narrow head dims run on Narrow<Cfg64> (8-56) or Narrow<Cfg128> (72-120).
template <class Cfg64, class Cfg128, template <class, class> class Launch, bool kNarrowToo = false>
inline int fwd_sm90_entry(const AttnFwdParams* p, void* stream) {
  if (const int rc = check_tma_fwd_params(p, kNarrowToo)) return rc < 0 ? rc : 0;
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->dtype == LAB_BF16;
  if (p->head_dim == 64)
    return bf16 ? Launch<Cfg64, __nv_bfloat16>::run(*p, st, dev) : Launch<Cfg64, __half>::run(*p, st, dev);
  if constexpr (kNarrowToo) {
#if LAB_FWD_NARROW_QK_STEPS >= 2
    if (p->head_dim == 32)
      return bf16 ? Launch<NarrowSteps<Cfg64, 32>, __nv_bfloat16>::run(*p, st, dev)
                  : Launch<NarrowSteps<Cfg64, 32>, __half>::run(*p, st, dev);
#endif
    if (p->head_dim < 64)
      return bf16 ? Launch<Narrow<Cfg64>, __nv_bfloat16>::run(*p, st, dev)
                  : Launch<Narrow<Cfg64>, __half>::run(*p, st, dev);
#if LAB_FWD_NARROW_QK_STEPS
    if (p->head_dim == 80)
      return bf16 ? Launch<NarrowSteps<Cfg128, 80>, __nv_bfloat16>::run(*p, st, dev)
                  : Launch<NarrowSteps<Cfg128, 80>, __half>::run(*p, st, dev);
    if (p->head_dim == 96)
      return bf16 ? Launch<NarrowSteps<Cfg128, 96>, __nv_bfloat16>::run(*p, st, dev)
                  : Launch<NarrowSteps<Cfg128, 96>, __half>::run(*p, st, dev);
#endif
    if (p->head_dim < 128)
      return bf16 ? Launch<Narrow<Cfg128>, __nv_bfloat16>::run(*p, st, dev)
                  : Launch<Narrow<Cfg128>, __half>::run(*p, st, dev);
  }
  return bf16 ? Launch<Cfg128, __nv_bfloat16>::run(*p, st, dev) : Launch<Cfg128, __half>::run(*p, st, dev);
}

// Dynamic shared memory rounded up to 1024 bytes (128B-swizzle atoms must be 1024-aligned).
__device__ __forceinline__ uint8_t* align1024(uint8_t* ptr) {
  const uint32_t a = smem_u32(ptr);
  return ptr + (((a + 1023) & ~1023u) - a);
}

// ---------------------------------------------------------------- tile addressing

// Descriptor of the A operand (64 rows, k16 step kk) of a K-major tile with `rows` rows per column block.
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t tile, int rows, int kk) {
  return desc_advance(desc_sw128(tile, 16, 1024), (kk / 4) * rows * 128 + (kk % 4) * 32);
}

// Descriptor of V (B of P V, N-major): k16 step kk = keys 16kk..16kk+15, all D columns.
__device__ __forceinline__ uint64_t desc_v(uint32_t tile, int rows, int kk) {
  return desc_advance(desc_sw128(tile, rows * 128, 1024), kk * 16 * 128);
}

// The shared-memory layout of v05..v07: Cfg::kQBytes of Q tiles, then kStages K tiles, then kStages V tiles.
template <class Cfg>
struct SmemRing {
  uint32_t q;
  __device__ __forceinline__ uint32_t k(int s) const { return q + Cfg::kQBytes + s * Cfg::kTileBytes; }
  __device__ __forceinline__ uint32_t v(int s) const { return q + Cfg::kQBytes + (Cfg::kStages + s) * Cfg::kTileBytes; }
};

// The ring over this CTA's dynamic shared memory, `smem` from align1024 (what 128-byte swizzle needs).
template <class Cfg>
__device__ __forceinline__ SmemRing<Cfg> smem_ring(uint8_t* smem) {
  return SmemRing<Cfg>{smem_u32(smem)};
}

// The work of one CTA of v05 / v06: (b, h, query block) from blockIdx.x, heads slowest; causal blocks of a
// head heaviest first. n_tiles: the key tiles of BC keys the block reads (causal: up to its last row).
// work_tile_at: the same for work tile w (a persistent CTA's w-th in that order).
struct WorkTile {
  int b, h, hkv, m0, n_tiles;
};
template <class Cfg>
__device__ __forceinline__ WorkTile work_tile_at(const AttnFwdParams& p, unsigned w) {
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  const int bh = w / num_m;
  const int mb = p.causal ? num_m - 1 - (int)(w % num_m) : (int)(w % num_m);
  const int b = bh / p.heads_q, h = bh % p.heads_q;
  const int hkv = h / (p.heads_q / p.heads_kv);
  const int m0 = mb * Cfg::BR;
  const int kv_end = p.causal ? min(p.seqlen_k, min(p.seqlen_q, m0 + Cfg::BR)) : p.seqlen_k;
  return WorkTile{b, h, hkv, m0, (kv_end + Cfg::BC - 1) / Cfg::BC};
}
template <class Cfg>
__device__ __forceinline__ WorkTile cta_work_tile(const AttnFwdParams& p) {
  return work_tile_at<Cfg>(p, blockIdx.x);
}

// The `full` barriers of Q and of each K and V stage: one arrival (the TMA-issuing thread's expect_tx).
template <int kStages>
__device__ __forceinline__ void init_full_barriers(uint64_t* bar_q, uint64_t* bar_k, uint64_t* bar_v) {
  mbar_init(smem_u32(bar_q), 1);
  for (int s = 0; s < kStages; ++s) {
    mbar_init(smem_u32(&bar_k[s]), 1);
    mbar_init(smem_u32(&bar_v[s]), 1);
  }
}

// A wgmma accumulator (one flat array per thread) set to zero.
// The producer's Q_i in fwd v06 / v10: warpgroup w's 64 rows from m0 + 64 w at q + w kQBytesWG, in D / 64
// boxes of 64 columns, all completing on bar_q.
template <class Cfg>
__device__ __forceinline__ void load_q_consumers(uint32_t q, const CUtensorMap* tq, uint32_t bar_q, int m0, int h,
                                                 int b) {
  mbar_arrive_expect_tx(bar_q, Cfg::kQBytes);
  for (int w = 0; w < Cfg::kConsumers; ++w)
    for (int cb = 0; cb < Cfg::D / 64; ++cb)
      tma_load_4d(q + w * Cfg::kQBytesWG + cb * 64 * 128, tq, bar_q, cb * 64, m0 + 64 * w, h, b);
}

template <int kN>
__device__ __forceinline__ void zero_acc(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) d[i] = 0.f;
}

// S = Q_w K^T for one K tile of BC keys (SS form: both from shared memory), one commit group; the first kSteps
// k16 steps (qk_steps: all D / 16 but in a Narrow<C, n>).
template <int D, int BC, bool kBf16, int kSteps = D / 16>
__device__ __forceinline__ void issue_qk(float (&s)[BC / 2], uint32_t q, uint32_t k) {
  static_assert(kSteps >= 1 && kSteps <= D / 16, "k16 steps of S within the width");
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
    WgmmaOp<BC>::template ss<kBf16, 0>(s, desc_kmajor(q, 64, kk), desc_kmajor(k, BC, kk), kk > 0);
  wgmma_commit();
}

// O += P V for one V tile (RS form: P from registers), one commit group; overwrite: O = P V (the first
// k16 step's scale_d = 0), so a work tile's first P V needs no zeroed O.
template <int D, int BC, bool kBf16>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&pa)[BC / 16][4], uint32_t v,
                                         bool overwrite = false) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk)
    WgmmaOp<D>::template rs<kBf16, 1>(o, pa[kk], desc_v(v, BC, kk), kk == 0 && overwrite ? 0 : 1);
  wgmma_commit();
}

// Byte offset of element (r, c) in a swizzled tile with `rows` rows per column block.
__device__ __forceinline__ uint32_t swz_offset(int rows, int r, int c) {
  return (c / 64) * rows * 128 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) << 4) + (c % 8) * 2;
}

// ---------------------------------------------------------------- softmax

// One thread's share of a consumer warpgroup's online softmax: rows g and g + 8
// of its warp's 16 (index 0, 1). m is kept in the scaled log2 domain
// (scores * scale * log2 e), so any finite scale works, negative or zero.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};  // this thread's partial row sums (reduced over the quad at the end)
};

// exp2 on the FMA pipe for x <= 0, to take load off the 16-per-clock MUFU unit (FA4's trick):
// 2^x = 2^n * 2^f with n = round(x) (the 1.5 * 2^23 addition leaves n in t's low mantissa bits),
// f in [-0.5, 0.5], 2^f by a cubic fitted for relative error (max 7.5e-5, under fp16's rounding of P);
// x is clamped to -125 so that 2^n * 2^f stays a normal float (masked scores give ~1e-38, not 0).
__device__ __forceinline__ float exp2_poly(float x) {
  constexpr float kShift = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -125.f);
  const float t = x + kShift;
  const float f = x - (t - kShift);
  const float p = fmaf(fmaf(fmaf(0.0551711817f, f, 0.242611084f), f, 0.693261075f), f, 0.999928078f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// P = exp2(s * c - off) (kFold) or exp2(s - off) in place, and l += the row sums of P; kChains
// independent sum chains (see softmax_scores), exp2_poly on every kPolyEvery-th n8 block.
template <int BC, int kPolyEvery, int kChains, bool kFold>
__device__ __forceinline__ void exp_rows(float (&s)[BC / 2], RowState& st, const float (&off)[2], float c) {
  float sum[2][kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) sum[0][k] = sum[1][k] = 0.f;
  if constexpr (kChains == 1) {  // one chain: the sum runs on from l itself, as before chains existed
    sum[0][0] = st.l[0];
    sum[1][0] = st.l[1];
  }
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float arg = kFold ? fmaf(s[4 * i + e], c, -off[e >> 1]) : s[4 * i + e] - off[e >> 1];
      constexpr int kEvery = kPolyEvery > 0 ? kPolyEvery : 1;  // (no % by zero when off)
#if defined(LAB_SOFTMAX_ABLATE) && (LAB_SOFTMAX_ABLATE & 4)  // diagnostic (wrong results): no MUFU
      const float pv = arg * 0.5f;
#else
      const float pv = (kPolyEvery > 0 && i % kEvery == 0) ? exp2_poly(arg) : fast_exp2(arg);
#endif
      s[4 * i + e] = pv;
      sum[e >> 1][(2 * i + (e & 1)) % kChains] += pv;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (kChains == 1) {
      st.l[h] = sum[h][0];
    } else {
#pragma unroll
      for (int w = 1; w < kChains; w *= 2)  // pairwise: log2(kChains) dependent adds
#pragma unroll
        for (int k = 0; k + w < kChains; k += 2 * w) sum[h][k] += sum[h][k + w];
      st.l[h] += sum[h][0];
    }
  }
}

// Scale the 64 x BC score accumulator in place, mask it, update (m, l) and
// turn it into P (fp32, in place); alpha[h] = exp2(m_old - m_new) is what O
// must still be multiplied by (rescale_o). Touches neither O nor the P
// fragments, so it can run while a P V wgmma still reads them (v07).
//   row0: this thread's first row (absolute query index); col0: first key of the tile.
// kPolyEvery > 0: every kPolyEvery-th n8 column block takes exp2_poly instead of ex2.approx.
// kChains > 1: the row max and the row sum run as kChains independent chains, combined at the end
// (with one chain, a row's BC/2 values are one dependent FMNMX chain and one dependent FADD chain).
// kFold (only for c > 0, which keeps the order of the scores): the max is taken on the raw scores and the
// scale folds into the exponent, exp2(s * c - m) by one FFMA: one FMUL and one FADD less per score.
template <int BC, bool kMask, int kPolyEvery = 0, int kChains = 1, bool kFold = false, bool kRowBound = true>
__device__ __forceinline__ void softmax_scores(float (&s)[BC / 2], RowState& st, float (&alpha)[2], float c,
                                               int row0, int col0, int seqlen_k, bool causal) {
  static_assert(kChains >= 1 && (BC / 4) % kChains == 0, "kChains divides a row's BC/4 value pairs");
  const int t = threadIdx.x % 4;
  // kRowBound: the mask (common/mask.cuh's `masked`: col >= S_k, or causal col > row) as one bound per row:
  // the first hidden column relative to this thread's first one, so each element's test is one compare
  // against a compile-time offset (8 i + e % 2). H200 d128-cells run 6: +1-3 % on the D = 128 cells with
  // few keys. Otherwise `masked` per element: v07 at D = 64 ran 4-6 % faster with it in every cell, masked
  // or not (H200 sixth-run 1: the choice moves the whole kernel's code, not just the masked tiles').
  int lim[2] = {0, 0};
  if constexpr (kMask && kRowBound)
#pragma unroll
    for (int h = 0; h < 2; ++h) lim[h] = (causal ? min(seqlen_k, row0 + 8 * h + 1) : seqlen_k) - col0 - 2 * t;
  float mx[2][kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) mx[0][k] = mx[1][k] = -INFINITY;
  if constexpr (!kFold) {  // kFold: raw scores first, the scaled running max joins after
    mx[0][0] = st.m[0];
    mx[1][0] = st.m[1];
  }
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = kFold ? s[4 * i + e] : s[4 * i + e] * c;
      if constexpr (kMask && kRowBound) {
        if (8 * i + (e & 1) >= lim[e >> 1]) x = -INFINITY;
      } else if constexpr (kMask) {
        if (masked(row0 + (e >> 1) * 8, col0 + 8 * i + 2 * t + (e & 1), seqlen_k, causal)) x = -INFINITY;
      }
      s[4 * i + e] = x;
      float& m = mx[e >> 1][(2 * i + (e & 1)) % kChains];
      m = fmaxf(m, x);
    }
  float off[2];
#if defined(LAB_SOFTMAX_ABLATE) && (LAB_SOFTMAX_ABLATE & 8)  // diagnostic (wrong results): no row max
#pragma unroll
  for (int h = 0; h < 2; ++h) off[h] = alpha[h] = 1.f;
  if constexpr (false)
#endif
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int k = 1; k < kChains; ++k) mx[h][0] = fmaxf(mx[h][0], mx[h][k]);
    mx[h][0] = fmaxf(mx[h][0], __shfl_xor_sync(0xffffffffu, mx[h][0], 1));
    mx[h][0] = fmaxf(mx[h][0], __shfl_xor_sync(0xffffffffu, mx[h][0], 2));
    if constexpr (kFold) mx[h][0] = fmaxf(st.m[h], mx[h][0] * c);  // -inf * c = -inf for c > 0
    off[h] = mx[h][0] == -INFINITY ? 0.f : mx[h][0];  // a row with no key yet: keep P = 0, not NaN
    alpha[h] = fast_exp2(st.m[h] - off[h]);            // m_old = -inf gives 0
    st.m[h] = mx[h][0];
    st.l[h] *= alpha[h];
  }
  exp_rows<BC, kPolyEvery, kChains, kFold>(s, st, off, c);
}

// FA4's conditional rescaling, for unmasked tiles and a scale folded into exp2 (c > 0). The running max
// only moves when some score beats it by more than kLazySlack (log2 units): then the tile takes
// softmax_scores (returns true: O needs rescale_o). Otherwise the exps use the kept max as they are
// (P <= 2^kLazySlack: no overflow in fp32 sums or in bf16/fp16 P) and alpha is 1 (returns false: no
// O rescale). What this cuts from the common path: the max's quad shuffles and the serial chain from
// the max to the first exp, alpha's exp and the 64 O multiplies; a per-thread max and one vote remain.
// Exact: O and l carry the same offset, which the epilogue's O / l and LSE = m + log2 l take out.
constexpr float kLazySlack = 8.f;
template <int BC, int kChains>
__device__ __forceinline__ bool softmax_scores_lazy(float (&s)[BC / 2], RowState& st, float (&alpha)[2], float c) {
  constexpr int kMaxChains = 4;  // a row's BC/4 values as 4 independent FMNMX chains (the vote waits on them)
  float mx[2][kMaxChains];
#pragma unroll
  for (int k = 0; k < kMaxChains; ++k) mx[0][k] = mx[1][k] = -INFINITY;
#pragma unroll
  for (int i = 0; i < BC / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float& m = mx[e >> 1][(2 * i + (e & 1)) % kMaxChains];
      m = fmaxf(m, s[4 * i + e]);
    }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int k = 1; k < kMaxChains; ++k) mx[h][0] = fmaxf(mx[h][0], mx[h][k]);
  // st.m = -inf (no key seen yet) always votes for the full step: -inf + slack < any finite score
  const bool grow = mx[0][0] * c > st.m[0] + kLazySlack || mx[1][0] * c > st.m[1] + kLazySlack;
  if (__any_sync(0xffffffffu, grow)) {  // warp-uniform: the whole warp takes the full step
    softmax_scores<BC, false, 0, kChains, true>(s, st, alpha, c, 0, 0, 0, false);
    return true;
  }
  alpha[0] = alpha[1] = 1.f;
  exp_rows<BC, 0, kChains, true>(s, st, st.m, c);
  return false;
}

// O *= alpha per row (rows g and g + 8 of the accumulator layout).
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * i + e] *= alpha[e >> 1];
}

// P (fp32 accumulator layout) rounded to T as RS-form A fragments, one per k16 step.
template <int BC, class T>
__device__ __forceinline__ void pack_p(const float (&s)[BC / 2], uint32_t (&pa)[BC / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// The three in a row: softmax (masked or not), O rescale, P fragments.
template <int BC, int D, class T, bool kMask, int kChains, bool kFold>
__device__ __forceinline__ void softmax_step_masked(float (&s)[BC / 2], float (&o)[D / 2], uint32_t (&pa)[BC / 16][4],
                                                    RowState& st, float c, int row0, int col0, int seqlen_k,
                                                    bool causal) {
  float alpha[2];
  softmax_scores<BC, kMask, 0, kChains, kFold>(s, st, alpha, c, row0, col0, seqlen_k, causal);
  rescale_o<D>(o, alpha);
  pack_p<BC, T>(s, pa);
}
// The same for key tile j of a warpgroup whose first row is wm0 (v05, v06), masked only where the tile needs
// it (common/mask.cuh). Each branch keeps its own copy of the rescale and the packing: one join before them
// changes the schedule.
template <int BC, int D, class T, int kChains = 1, bool kFold = false>
__device__ __forceinline__ void softmax_step(float (&s)[BC / 2], float (&o)[D / 2], uint32_t (&pa)[BC / 16][4],
                                             RowState& st, float c, int row0, int j, int wm0, int seqlen_k,
                                             bool causal) {
  if (tile_needs_mask(j * BC, BC, wm0, seqlen_k, causal))
    softmax_step_masked<BC, D, T, true, kChains, kFold>(s, o, pa, st, c, row0, j * BC, seqlen_k, causal);
  else
    softmax_step_masked<BC, D, T, false, kChains, kFold>(s, o, pa, st, c, row0, j * BC, seqlen_k, causal);
}

// One key tile with nothing overlapped (v05, v06): wait K_j, S = Q K_j^T, softmax, wait V_j, O += P V_j,
// each GEMM waited for. Stage j % kStages of the ring; the caller releases the stage.
template <class Cfg, class T, int kChains = 1, bool kFold = false>
__device__ __forceinline__ void serial_tile(float (&o)[Cfg::D / 2], RowState& st, const SmemRing<Cfg>& ring,
                                            uint32_t q, uint64_t* bar_k, uint64_t* bar_v, int j, int wm0, int row0,
                                            float c, const AttnFwdParams& p) {
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  const int s = j % kStages;
  const uint32_t phase = (j / kStages) & 1;
  float sacc[BC / 2];
  mbar_wait(smem_u32(&bar_k[s]), phase);
  wgmma_fence();
  issue_qk<D, BC, kBf16, qk_steps<Cfg>::value>(sacc, q, ring.k(s));
  wgmma_wait<0>();

  uint32_t pa[BC / 16][4];
  softmax_step<BC, D, T, kChains, kFold>(sacc, o, pa, st, c, row0, j, wm0, p.seqlen_k, p.causal);

  mbar_wait(smem_u32(&bar_v[s]), phase);
  wgmma_fence();
  issue_pv<D, BC, kBf16>(o, pa, ring.v(s));
  wgmma_wait<0>();
}

// ---------------------------------------------------------------- epilogue

// A row's sum over its quad: the 4 lanes (lane / 4 equal) that hold its columns in the accumulator layout.
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Normalise O (O / l, the quad's partial row sums reduced) and write LSE for rows < S_q.
// kFastInv: 1 / l by MUFU.RCP (__fdividef) instead of the IEEE division and its slow-path branch; l >= 1
// whenever it is > 0 (the running max's own score adds exp2(0)), so the approximation's range limit is far off.
template <int D, bool kFastInv = false>
__device__ __forceinline__ void normalise_o(float (&o)[D / 2], const RowState& st, const AttnFwdParams& p, int b,
                                            int h, int m0) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float l = quad_sum(st.l[hh]);
    const float inv = l > 0.f ? (kFastInv ? __fdividef(1.f, l) : 1.f / l) : 0.f;  // S_k = 0: O = 0
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      o[4 * i + 2 * hh] *= inv;
      o[4 * i + 2 * hh + 1] *= inv;
    }
    const int row = m0 + warp * 16 + hh * 8 + g;
    if (p.lse != nullptr && t == 0 && row < p.seqlen_q)
      p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + row] =
          (l > 0.f && st.m[hh] != -INFINITY) ? (st.m[hh] + __log2f(l)) * kLn2 : -INFINITY;
  }
}

// Normalise O, write LSE, stage O through this warpgroup's (now unused) Q
// tile `stage` (64 rows, swizzled) and store rows < S_q with 16-byte stores.
// `bar_id`: a named barrier for this warpgroup's 128 threads.
// kNarrow (Narrow<C>): only the 8-column chunks below p.head_dim are stored.
template <int D, class T, bool kNarrow = false>
__device__ __forceinline__ void epilogue(float (&o)[D / 2], RowState& st, const AttnFwdParams& p, uint8_t* stage,
                                         int b, int h, int m0, int bar_id) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  normalise_o<D>(o, st, p, b, h, m0);
  named_barrier_sync(bar_id, 128);  // every warp's wgmma reads of this Q tile are over
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = warp * 16 + hh * 8 + g;
      const uint32_t val = pack2<T>(o[4 * i + 2 * hh], o[4 * i + 2 * hh + 1]);
      *reinterpret_cast<uint32_t*>(stage + swz_offset(64, r, 8 * i + 2 * t)) = val;
    }
  named_barrier_sync(bar_id, 128);
  T* out = static_cast<T*>(p.o) + (int64_t)b * p.o_stride[0] + (int64_t)h * p.o_stride[1];
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < 64 * kChunks / 128; ++i) {
    const int idx = wt + i * 128, r = idx / kChunks, c = idx % kChunks;
    if (m0 + r < p.seqlen_q && (!kNarrow || narrow_stores(c * 8, p.head_dim)))
      *reinterpret_cast<uint4*>(out + (int64_t)(m0 + r) * p.o_stride[2] + c * 8) =
          *reinterpret_cast<const uint4*>(stage + swz_offset(64, r, c * 8));
  }
}

// QUAD (H200 sixth-run 5, kernel-only rows in rounds): 1 (8-byte stores) against the 4-byte stores:
// D = 128 +6.2 / +8.4 / +2.1 / +3.9 % at 512 / 512 causal / 2048 / 2048 causal, D = 64 +3.1 / -0.5 / +0.4 % at
// 2048 / 8192 causal / 16384; 2 (16-byte stores, one more shuffle round) +4.8 / +6.7 / +2.3 / +3.5 and +2.1 /
// -0.2 / +0.7 %. 62/62 checks with each. 0: the 4-byte stores. On the H100 at D = 128 S = 512 (run 13, causal /
// not): 2 -7.6 / -1.5 %, and streaming stores (st.global.cs) -1.3 / -4.1 %: not how its extra DRAM cycles go.
#ifndef LAB_EPILOGUE_QUAD
#define LAB_EPILOGUE_QUAD 1
#endif
#ifndef LAB_EPILOGUE_FAST_INV
#define LAB_EPILOGUE_FAST_INV 1  // normalise_o's kFastInv in epilogue_direct: H200 run 6, +0.6 to +1.4 % in 5 cells
#endif
// The same without shared memory, rows < S_q straight from the accumulator layout: with QUAD = 1 (default) the
// lanes t and t ^ 1 of each quad swap words so that each stores 8 contiguous bytes (a warp's store covers 8
// rows x 32 bytes); with 0 each thread stores its own 4-byte pairs (8 rows x 16 bytes, twice the stores). For
// a persistent CTA: the Q tile stays free for the next work tile's load, issued once the last S GEMM has read Q.
// tests/fwd/test_epilogue_quad.py walks the lane exchange on the CPU. kNarrow (Narrow<C>): only the 8-column blocks
// below p.head_dim are stored (every lane still shuffles).
template <int D, class T, bool kNarrow = false>
__device__ __forceinline__ void epilogue_direct(float (&o)[D / 2], RowState& st, const AttnFwdParams& p, int b,
                                                int h, int m0) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  normalise_o<D, LAB_EPILOGUE_FAST_INV != 0>(o, st, p, b, h, m0);
  T* out = static_cast<T*>(p.o) + (int64_t)b * p.o_stride[0] + (int64_t)h * p.o_stride[1];
#if LAB_EPILOGUE_QUAD  // the quad's words exchanged by shuffles into 8-byte (1) or 16-byte (2) stores
  // (ncu, sixth-runs: each 4-byte warp store touched 8 lines, so the 32 per thread kept L1 busy ~1000 cycles per
  // warpgroup epilogue). Every lane shuffles (full-warp masks); only the stores are predicated by row.
  const int t0 = t & 1;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = m0 + warp * 16 + hh * 8 + g;
    T* dst = out + (int64_t)row * p.o_stride[2];
#pragma unroll
    for (int a = 0; a < D / 32; ++a) {  // four 8-column blocks 4a .. 4a + 3
      uint32_t c[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] = pack2<T>(o[4 * (4 * a + j) + 2 * hh], o[4 * (4 * a + j) + 2 * hh + 1]);
      // Lanes t and t ^ 1 swap: now lane t holds columns 2 (t & ~1) .. + 3 of block 2m + t0 in c[2m], c[2m + 1].
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const uint32_t x = __shfl_xor_sync(0xffffffffu, t0 ? c[2 * m] : c[2 * m + 1], 1);
        c[2 * m] = t0 ? x : c[2 * m];
        c[2 * m + 1] = t0 ? c[2 * m + 1] : x;
      }
#if LAB_EPILOGUE_QUAD == 1
      if (row < p.seqlen_q)
#pragma unroll
        for (int m = 0; m < 2; ++m)
          if (!kNarrow || narrow_stores(8 * (4 * a + 2 * m + t0), p.head_dim))
            *reinterpret_cast<uint2*>(dst + 8 * (4 * a + 2 * m + t0) + 2 * (t & 2)) = make_uint2(c[2 * m], c[2 * m + 1]);
#else
      // Lanes t and t ^ 2 swap: afterwards lane t holds all eight columns of block 4a + t, c[k] from lane k.
      const int t1 = t >> 1;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const uint32_t x = __shfl_xor_sync(0xffffffffu, t1 ? c[n] : c[n + 2], 2);
        c[n] = t1 ? x : c[n];
        c[n + 2] = t1 ? c[n + 2] : x;
      }
      if (row < p.seqlen_q && (!kNarrow || narrow_stores(8 * (4 * a + t), p.head_dim)))
        *reinterpret_cast<uint4*>(dst + 8 * (4 * a + t)) = make_uint4(c[0], c[1], c[2], c[3]);
#endif
    }
  }
#else
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = m0 + warp * 16 + hh * 8 + g;
    if (row >= p.seqlen_q) continue;
    T* dst = out + (int64_t)row * p.o_stride[2] + 2 * t;
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
      if (!kNarrow || narrow_stores(8 * i, p.head_dim))
        *reinterpret_cast<uint32_t*>(dst + 8 * i) = pack2<T>(o[4 * i + 2 * hh], o[4 * i + 2 * hh + 1]);
  }
#endif
}

}  // namespace lab::sm90
