// Backward attention v11: v10 (D = 64's K_w, V_w in registers) with persistent CTAs on short sequences, each
// loading the next tile's K and V into a second buffer while it works on the current one.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v11-persist.json.
//
// Why. torch.profiler of one call at D = 128, S = 512 (B = 32, H = 16, H100): our dK/dV kernel 446 us against
// cuDNN's 395, while the other passes cost the same (pre-pass + memset 92 us, cuDNN's dot(dO, O) 97; convert
// 78 against 79). At S = 4096 and above the kernels are level. A CTA of v07 does S / 64 steps (8 at S = 512)
// between a prologue that waits for its K and V with nothing to overlap them (64 KB at D = 128) and an epilogue
// that stores dK and dV while the tensor core idles; at one CTA per SM the next CTA's prologue cannot start
// under it. cuDNN's backward kernel is persistent (grid = the SM count).
//
// What changes (common/hopper/attn_bwd_stagger.cuh's stagger_tile is v07's per-tile loop, shared):
// - min(tiles, SMs) CTAs; in round r CTA c takes tile r * grid + c (r even) or r * grid + grid - 1 - c (r odd),
//   in v07's order (key block fastest): zigzag_tile below says why.
// - Two K/V buffers. With the dQ partials reduced from registers (LAB_BWD_STAGGER_DQ_RED), the 4 x kDqBytes of dQ
//   staging in Cfg's layout are unused; they hold exactly a second K and V (D = 128: 64 KB; D = 64: 32 KB), so
//   the shared-memory budget does not move. The producer loads tile t + 1's K and V into buffer (t + 1) & 1
//   as soon as it has issued tile t's last step (two steps before the consumers finish it), once both
//   warpgroups released that buffer (kv_empty[b], 256 arrivals after their last dQ GEMM of tile t - 1).
// - The Q/dO ring runs on across tiles (its stage and phase count the CTA's steps), so tile t + 1's first
//   loads land while the consumers store tile t's dK and dV.
// - Both consumer warpgroups meet once per tile (a 256-thread named barrier) before the dS^T buffers are
//   reused: within a tile they hand them over by the ready/free pairs, which assume a fresh start.
// - Only where S_k <= LAB_BWD_STAGGER_PERSIST_MAX_SK (and D = 64): v04 (v02 made persistent) lost 38 % at D = 128, S = 16384
//   causal to the static round-robin's imbalance, and 2-4 % on long non-causal problems; short tiles are the
//   ones a per-CTA prologue and epilogue weigh on.
//
// Outcome (H100, GPU time, in rounds with v10; outputs/experiments/20261126-bwd-v11-persist.json): the plain round-robin (CTA c: tiles c,
// c + grid, ...) lost 13-33 % on causal calls: with 132 CTAs and 4 key blocks per head at S = 512 a CTA always
// drew the same key block, so a quarter of them did every longest tile; the zigzag rounds removed that. Then:
// D = 64 S = 512 +3-4 % (1.01-1.02x SDPA-cuDNN), S = 1024 +0.5-2 %, S = 2048 -1 to +1 %; D = 128 S = 512 -6 to
// -10 %, S = 1024 -2 to -4 %, S = 2048 level. Hence the rule above: D = 64 and S_k <= 1024 only. Why D = 128
// loses is not settled: ncu at S = 512 finds v10's kernel and cuDNN's both L2-bound (79-80 % L2 throughput),
// and at D = 128 every tile's K and V (64 KB) loaded early into the second buffer adds to that L2 traffic.
// Prediction (H100, GPU time, S <= 2048): the kernel's share of v07's gap to cuDNN at S = 512 (446 against 395
// us, ~11 %) is mostly per-CTA cost: +5-9 % on the kernel at S = 512, +3-5 % at 1024, +1-3 % at 2048, and a
// third to a half of that on the whole call (the pre-pass, memset and convert are unchanged).
//
// Limits: v07's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v11_persist.cu
#include "common/hopper/attn_bwd_stagger.cuh"

// Persistent CTAs where S_k is at most this, at D = 64 (and at D = 128 with LAB_BWD_STAGGER_PERSIST_D128=1); elsewhere
// v10's one CTA per tile. Measured (below): persistence pays at D = 64 up to S = 1024 only.
#ifndef LAB_BWD_STAGGER_PERSIST_MAX_SK
#define LAB_BWD_STAGGER_PERSIST_MAX_SK 1024
#endif
#ifndef LAB_BWD_STAGGER_PERSIST_D128
#define LAB_BWD_STAGGER_PERSIST_D128 0
#endif
// At most this many CTAs (and one per SM): the sanitizer and driver builds set a small cap so that their small
// problems run several tiles per CTA through both K/V buffers and the ring's phases across tiles.
#ifndef LAB_BWD_STAGGER_PERSIST_MAX_CTAS
#define LAB_BWD_STAGGER_PERSIST_MAX_CTAS (1 << 30)
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg11 = Cfg<D, 2, true, D == 64>;

// K/V buffer b: buffer 0 is Cfg's K and V, buffer 1 the dQ staging area (4 x kDqBytes), unused with
// LAB_BWD_STAGGER_DQ_RED.
template <class C>
__device__ __forceinline__ uint32_t k_off(int b) { return b ? C::kOffDq : C::kOffK; }
template <class C>
__device__ __forceinline__ uint32_t v_off(int b) { return b ? C::kOffDq + C::kKVBytes : C::kOffV; }

// The tile of round r for CTA c: rounds alternate direction (c, then grid - 1 - c), so when the grid is a
// multiple of the key blocks per head (132 CTAs, 4 key blocks at S = 512), a CTA's causal key blocks pair long
// with short (kb, then n_kb - 1 - kb) instead of one CTA always drawing key block 0, the longest.
__device__ __forceinline__ int zigzag_tile(int r, int c, int grid) { return r * grid + ((r & 1) ? grid - 1 - c : c); }

// This CTA's tiles in zigzag order: f(work, t, step) with t its count of tiles before this one and step its count
// of steps (the ring's stage and phase run on across tiles). The producer and the consumers walk the same list.
template <class C, class F>
__device__ __forceinline__ void for_each_tile(const AttnBwdParams& p, int n_tiles, F&& f) {
  int step = 0;
  for (int r = 0, t = 0; r * gridDim.x < n_tiles; ++r) {
    const int tile = zigzag_tile(r, blockIdx.x, gridDim.x);
    if (tile >= n_tiles) continue;
    const Work work = tile_work<C>(p, tile);
    f(work, t, step);
    step += work.n_iters;
    ++t;
  }
}

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_persist(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                     const AttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D;
  constexpr int kBarTile = 14;  // both consumer warpgroups are past the last tile's dS^T buffers
  static_assert(4 * C::kDqBytes >= 2 * C::kKVBytes, "a second K and V fit in the dQ staging area");
  static_assert(C::kOffDq % 1024 == 0 && C::kKVBytes % 1024 == 0, "128B-swizzle atoms are 1024-aligned");
  static_assert(LAB_BWD_STAGGER_DQ_RED, "the dQ staging area must be free (dQ reduced from registers)");
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<C::kStages> bars;  // its kv barrier is unused: kv_full per buffer instead
  __shared__ __align__(8) uint64_t kv_full[2], kv_empty[2];
  uint8_t* smem = align1024(smem_raw);
  const uint32_t base = smem_u32(smem);
  const int n_tiles = num_tiles<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;

  // Prologue
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {
      mbar_init(smem_u32(&kv_full[b]), 1);
      mbar_init(smem_u32(&kv_empty[b]), 256);
    }
    init_bars(bars);  // (its fence covers the barriers above)
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt != 0) return;
    tma_prefetch_maps(&tq, &tk, &tv);
    tma_prefetch_map(&tdo);
    for_each_tile<C>(p, n_tiles, [&](const Work& work, int t, int step) {
      const int b = t & 1;
      mbar_wait(smem_u32(&kv_empty[b]), ((t >> 1) & 1) ^ 1);  // tile t - 2's K and V are no longer read
      load_kv_at<C>(&tk, &tv, kv_full[b], base + k_off<C>(b), base + v_off<C>(b), work);
      produce_steps<C>(&tq, &tdo, bars, base, work, p, step);
    });
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  const bool stagger = LAB_BWD_STAGGER == 1 || (LAB_BWD_STAGGER == 2 && !p.causal);
  AddPartial sink{};
  for_each_tile<C>(p, n_tiles, [&](const Work& work, int t, int step) {
    const int b = t & 1;
    if (t > 0) named_barrier_sync(kBarTile, 256);
    float dk[D / 2], dv[D / 2];
    stagger_tile<C, T, AddPartial, DenseSteps>(dk, dv, sink, smem, bars, kv_full[b], (t >> 1) & 1, k_off<C>(b),
                                               v_off<C>(b), work, step, stagger, p);
    mbar_arrive(smem_u32(&kv_empty[b]));  // every GEMM of the tile is complete: its K and V are free
    store_dk_dv<C, T>(dk, dv, work.n0 + 64 * wg, work, p);
  });
#endif
}

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    using C = Cfg11<D>;
    if ((D == 64 || LAB_BWD_STAGGER_PERSIST_D128) && p.seqlen_k <= LAB_BWD_STAGGER_PERSIST_MAX_SK)
      return launch<C, T, bwd_dkdv_persist<C, T>, LAB_BWD_STAGGER_PERSIST_MAX_CTAS>(p, st, dev);
    return launch<C, T, bwd_dkdv_stagger<C, T, AddPartial>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v11(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
