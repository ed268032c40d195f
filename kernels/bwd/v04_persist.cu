// Backward attention v04: v02 as a persistent kernel (one CTA per SM looping over the key-block tiles), with
// two dS^T buffers instead of one.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261125-bwd-v04-persist.json.
//
// What changes against v02 (bwd/v02_wgmma.cu has the design; common/hopper/attn_bwd_sm90.cuh the parts):
// - Persistent tiles. v02 launches one CTA per key block (D = 128, S = 4096, 16 heads, batch 4: 2048 CTAs,
//   15.5 waves of 132). Every CTA pays its prologue (barriers, setmaxnreg, the K/V load with nothing to overlap
//   it) and its epilogue (dK, dV stores while the tensor core idles), and the last wave runs half empty.
//   SDPA-cuDNN's backward kernel is persistent (grid = 132 on the H100 and the H200). v04 launches
//   min(tiles, SMs) CTAs; CTA c takes tiles c, c + grid, ... in v02's tile order (key block fastest, causal
//   key block 0 first). The producer loads the next tile's K and V as soon as both warpgroups release the
//   last one (a kv_empty barrier of 256 arrivals) and runs the Q/dO ring on across tiles, so the next tile's
//   first loads land while the consumers store dK and dV.
// - kDsBufs = 2 (LAB_BWD_PERSIST_DS_BUFS): a dS^T buffer per step parity removes v02's "dS^T free" barrier from the
//   split-dQ path (D = 128): one 256-thread barrier per step instead of two. 226 KB of shared memory at D = 128.
// Prediction (H200 profile of v02 at D = 128, S = 4096: 2506 us against cuDNN's 2266, barrier the first stall
// reason at 2.0 cycles per issued instruction): the half-empty last wave is ~3 % and the per-CTA prologue and
// epilogue ~2 %; the second barrier ~1-2 %. +5-7 % over v02: still short of cuDNN by ~3-5 %.
// Outcome (H200, GPU time, in rounds; outputs/experiments/20261125-bwd-v04-persist.json): D = 128 non-causal 2-4 % slower than v02, D = 128
// S = 16384 causal 38 % slower (the static round-robin's imbalance), D = 64 non-causal +5 %; without persistence
// (LAB_BWD_PERSIST_PERSISTENT=0) the second buffer alone is 2-4 % slower than v02. A measured negative result: v02 stays
// the default.
//
// Limits: v02's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode). The static round-robin balances causal work only on average (each CTA meets every key-block residue).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v04_persist.cu
#include "common/hopper/attn_bwd_sm90.cuh"

#ifndef LAB_BWD_PERSIST_DS_BUFS
#define LAB_BWD_PERSIST_DS_BUFS 2
#endif
// At most this many CTAs (and one per SM): the sanitizer and driver builds set a small cap so that their small
// problems run several tiles per CTA through the kv_empty hand-off and the ring's phases across tiles.
#ifndef LAB_BWD_PERSIST_MAX_CTAS
#define LAB_BWD_PERSIST_MAX_CTAS (1 << 30)
#endif
// 1: persistent (the grid capped as above); 0: one CTA per tile as v02 (the tile loop then runs once), which
// leaves the second dS^T buffer as the only change.
#ifndef LAB_BWD_PERSIST_PERSISTENT
#define LAB_BWD_PERSIST_PERSISTENT 1
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg4 = Cfg<D, LAB_BWD_PERSIST_DS_BUFS>;

template <class C, class T>
__global__ void __launch_bounds__(C::kThreads, 1)
    bwd_dkdv_v04(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                 const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo,
                 const AttnBwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = C::D, kStages = C::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) Bars<kStages> bars;
  __shared__ __align__(8) uint64_t kv_empty;  // both warpgroups are done with the tile's K and V
  uint8_t* smem = align1024(smem_raw);
  const int n_tiles = num_tiles<C>(p);
  const int wg = threadIdx.x / 128, wt = threadIdx.x % 128;

  // Prologue
  if (threadIdx.x == 0) {
    mbar_init(smem_u32(&kv_empty), 256);
    init_bars(bars);
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<C::kRegsProducer>();
    if (wt != 0) return;
    tma_prefetch_maps(&tq, &tk, &tv);
    tma_prefetch_map(&tdo);
    int step = 0;
    for (int tile = blockIdx.x, t = 0; tile < n_tiles; tile += gridDim.x, ++t) {
      const Work work = tile_work<C>(p, tile);
      mbar_wait(smem_u32(&kv_empty), (t & 1) ^ 1);
      load_kv<C>(&tk, &tv, bars.kv, smem_u32(smem), work);
      produce_steps<C>(&tq, &tdo, bars, smem_u32(smem), work, p, step);
      step += work.n_iters;
    }
    return;
  }
  setmaxnreg_inc<C::kRegsConsumer>();
  const float c = p.scale * kLog2e;

  // Tiles: each step waits for every GEMM it issued, so after a tile's last step its K and V are free.
  int step = 0;
  for (int tile = blockIdx.x, t = 0; tile < n_tiles; tile += gridDim.x, ++t) {
    const Work work = tile_work<C>(p, tile);
    float dk[D / 2], dv[D / 2];
    zero_acc(dk);
    zero_acc(dv);
    mbar_wait(smem_u32(&bars.kv), t & 1);
    for (int it = 0; it < work.n_iters; ++it, ++step) consume_step<C, T>(dk, dv, smem, bars, work, it, step, c, p);
    mbar_arrive(smem_u32(&kv_empty));
    store_dk_dv<C, T>(dk, dv, work.n0 + 64 * wg, work, p);
  }
  if (wt == 0) bulk_wait<0>();
#endif
}

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg4<D>, T, bwd_dkdv_v04<Cfg4<D>, T>, LAB_BWD_PERSIST_PERSISTENT ? LAB_BWD_PERSIST_MAX_CTAS : 0>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v04(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
