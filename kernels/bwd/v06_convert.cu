// Backward attention v06: v05 with dQ written by the dK/dV kernel itself. The last warp to add its partial into
// a 16-row slab of dq_accum reads the slab back from L2, scales it and stores dQ, so the convert pass goes.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured: outputs/experiments/20261126-bwd-v06-convert.json.
//
// Why. The public op's backward is four launches: the Delta pre-pass, dq_accum zeroed, the dK/dV kernel and
// the convert pass. At D = 128, S = 4096 (B S = 16k, H D = 2048, H100) torch.profiler put them at 0.05, 0.04,
// 2.53 and 0.08 ms (outputs/experiments/20261126-bwd-v06-convert.json). The side passes move the same bytes at every S while the kernel's
// work grows with S, so at S = 1024 they are about a fifth of the call, which is where the backward trails
// cuDNN's most at D = 128. The convert pass alone reads dq_accum from DRAM (fp32: twice dQ's bytes) and
// writes dQ; here each slab is read back from L2, where its last reduction landed a step earlier, and only dQ
// goes out to DRAM.
//
// How (kernels/common/hopper/attn_bwd_stagger.cuh's loop with the sink below):
// - A 4-byte counter per (b, h, 64-row query block, column half, warp) in the workspace after dq_accum
//   (kernels/common/params.h), zeroed with dq_accum by the launch's memset.
// - Each warp's 16-byte reductions of step j are published in step j + 1: a warp barrier, then lane 0 fences
//   (release) and adds 1 to the slab's counter. By then the reductions are long complete, so the fence does not
//   wait for them; and the counter's old value is first needed in step j + 2, so the atomic's round trip to L2
//   stays off the loop's critical path too.
// - A slab receives one partial per key block whose CTA visits its query block (contributors(), which mirrors
//   tile_work's first query block) from each warpgroup that adds to it: one at D = 128 (the warpgroups own a
//   column half each), two at D = 64 (both add all columns over their own keys). The warp whose add brings
//   the count to that total fences (acquire), reads the slab with L2-only loads and stores dQ in place of the
//   convert pass, rows >= S_q skipped.
// - No key at all (S_k = 0): no CTA, so the launch keeps the convert pass for that case (dQ = 0).
//
// Prediction (H100): the convert pass's 0.08 ms off a D = 128, S = 4096 call (+2-3 %), the same ~0.06-0.08 ms
// off the shorter calls (+5-8 % at S = 1024, both head dims, B S fixed); the loop itself unchanged (the publish
// costs a warp barrier and one atomic per warp and step).
//
// Outcome (H100, GPU time, in rounds with v05 and SDPA-cuDNN's backward, 15 bench-bwd cells; outputs/experiments/20261126-bwd-v06-convert.json):
// correct (53/53 driver configs, 14/14 lab.check gradient checks, four sanitizers clean) and 28-35 % slower than
// v05 in every cell (D = 128, S = 4096: 399 against 553 TFLOP/s). The loss is far beyond the convert pass it
// removes (~3 %), so it is the publish: a fence per warp and step (MEMBAR.GPU) stalls the warp until its
// outstanding global reductions are acknowledged, and one step after they were issued they still are not: the
// dQ reductions (16 KB per warpgroup and step) queue at L2. Kept as the measured negative result; not the default.
//
// Limits: v05's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode), with the dQ partials always reduced from the registers (LAB_BWD_STAGGER_DQ_RED = 1).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v06_convert.cu
#include "common/hopper/attn_bwd_stagger.cuh"

static_assert(LAB_BWD_STAGGER_DQ_RED == 1, "v06 counts the reductions each warp issues from its registers");

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <int D>
using Cfg6 = Cfg<D, 2>;

// Key blocks whose CTA visits query block mb of a head: those with tile_work's first query block mb0 <= mb.
template <class C>
__device__ __forceinline__ int contributors(const AttnBwdParams& p, int mb) {
  const int n_kb = (p.seqlen_k + C::BC - 1) / C::BC;
  return p.causal ? min(n_kb, mb * C::BR / C::BC + 1) : n_kb;
}

// This thread's warp's slab of step j: its dq_accum part (as red_dq addresses it) and its counter.
template <class C>
struct Slab {
  float* acc;
  int* count;
  int hq, m0, part;
  __device__ __forceinline__ Slab(const Work& work, int j, const AttnBwdParams& p) {
    const int wg = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32;
    const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
    hq = work.head(j);
    m0 = work.m0(j, C::BR);
    part = C::kSplitDq ? wg : 0;
    const int64_t block = ((int64_t)work.b * p.heads_q + hq) * (sq_pad / 64) + m0 / 64;
    acc = p.dq_accum + block * 64 * C::D + part * 64 * 64;
    count = reinterpret_cast<int*>(p.dq_accum + (int64_t)p.batch * p.heads_q * sq_pad * C::D) + (block * 2 + part) * 4 + warp;
  }
  __device__ __forceinline__ int expected(const AttnBwdParams& p) const {
    return contributors<C>(p, m0 / C::BR) * (C::kSplitDq ? 1 : 2);
  }
};

template <class T>
struct ConvertLast : AddPartial {  // (its add and finish replace AddPartial's; the hooks stay empty)
  int pending = -1, old = 0;  // the step whose counter add is in flight, and lane 0's result of it

  // Lane 0 publishes the warp's reductions of step j; the old count comes back in `old`.
  template <class C>
  __device__ __forceinline__ void arrive(const Work& work, int j, const AttnBwdParams& p) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) {
      const Slab<C> slab(work, j, p);
      asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
      asm volatile("atom.relaxed.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(old) : "l"(slab.count) : "memory");
    }
    pending = j;
  }

  // If the pending add was the slab's last, this warp converts the slab: dQ = scale * dq_accum, in
  // convert_dq's index order (rows g and g + 8 of the warp's 16 at two columns per float4).
  template <class C>
  __device__ __forceinline__ void settle(const Work& work, const AttnBwdParams& p) {
    const Slab<C> slab(work, pending, p);
    const int last = __shfl_sync(0xffffffffu, old, 0) == slab.expected(p) - 1;
    pending = -1;
    if (!last) return;
    if (threadIdx.x % 32 == 0) asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
    __syncwarp();
    const int wt = threadIdx.x % 128, warp = wt / 32, g = (wt % 32) / 4, t = wt % 4;
    const int row = slab.m0 + warp * 16 + g;
    T* dst = static_cast<T*>(p.dq) + (int64_t)work.b * p.dq_stride[0] + (int64_t)slab.hq * p.dq_stride[1];
#pragma unroll
    for (int r4 = 0; r4 < 8; ++r4) {
      float a[4];
      asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(a[0]), "=f"(a[1]), "=f"(a[2]), "=f"(a[3])
                   : "l"(slab.acc + (r4 * 128 + wt) * 4)
                   : "memory");
      const int col = slab.part * 64 + 8 * r4 + 2 * t;
      if (row < p.seqlen_q)
        *reinterpret_cast<uint32_t*>(dst + (int64_t)row * p.dq_stride[2] + col) = lab::pack2<T>(a[0] * p.scale, a[1] * p.scale);
      if (row + 8 < p.seqlen_q)
        *reinterpret_cast<uint32_t*>(dst + (int64_t)(row + 8) * p.dq_stride[2] + col) =
            lab::pack2<T>(a[2] * p.scale, a[3] * p.scale);
    }
  }

  // Step j: settle step j - 2's count, publish step j - 1's reductions, then issue step j's.
  template <class C>
  __device__ __forceinline__ void add(const float (&dq)[C::kDqRegs], uint8_t*, const Work& work, int j,
                                      const AttnBwdParams& p) {
    if (pending >= 0) settle<C>(work, p);
    if (j >= 1) arrive<C>(work, j - 1, p);
    red_dq<C>(dq, work.head(j), work.m0(j, C::BR), work.b, p);
  }

  template <class C>
  __device__ __forceinline__ void finish(const Work& work, const AttnBwdParams& p) {
    if (pending >= 0) settle<C>(work, p);
    if (work.n_iters == 0) return;
    arrive<C>(work, work.n_iters - 1, p);
    settle<C>(work, p);
  }
};

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    return launch<Cfg6<D>, T, bwd_dkdv_stagger<Cfg6<D>, T, ConvertLast<T>>, 0, true>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v06(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
