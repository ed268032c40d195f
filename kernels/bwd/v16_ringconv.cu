// Backward attention v16: v15's in-kernel dQ convert by each KV head's last CTA, fed by the copy engine and stored
// in whole 16-byte pieces.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured (H100, GPU time beside v14 in one process; outputs/driver_logs/20261126-h100-bwd-v16-run1/): correct
// (driver 53/53, the no-D build failing; four sanitizers clean; 14/14) and level to 6 % slower than v14: D = 128
// +0.6 % at S = 512 causal, -1.0 % non-causal, -0.7 to -3.8 % at S = 1024-4096; D = 64 -1.6 to -6.1 %; the GQA
// cell -8 % with 8 MB groups allowed. Four times v15's speed, still not the pass's: the convert lands on the CTA
// that ends each head, which with one CTA per SM is the grid's critical path, while the pass at full occupancy
// overlapped nothing and hid its latency behind 2048 threads an SM. A measured negative result; v14 stays.
//
// Why. v15 moved the convert pass (78 us of every bench-bwd call on the H100, 14 % at D = 128 S = 512) into the
// last CTA of each KV head and lost 6-14 % (outputs/driver_logs/20261126-h100-bwd-v15-run1/): the converting CTA,
// alone on its SM with 256 threads, kept only 16 KB of ld.global.cg in flight (4 float4 a thread) and wrote dQ in
// 4-byte pieces over two rows per float4, so a head took longer to convert on one SM than the whole GPU's pass
// spends on it, while the SM could start no other CTA. Both limits are the converting CTA's, not the idea's.
//
// What changes (the Sink's finish only; v15's count, v14's loop, order and epilogue): the last CTA hands the
// group's 64-row blocks of dq_accum to the copy engine (cp.async.bulk, 32 KB at D = 128) in a ring of four
// buffers over the main loop's free K/V/Q/dO area, so up to 128 KB are in flight from L2; each block is read
// from shared memory in accumulator order (conflict-free float4s), the four threads that share a row's 8 columns
// gather them by shuffles, and one of them stores 16 bytes. The threshold LAB_BWD_RINGCONV_CONVERT_BYTES bounds the
// group's accumulator one CTA converts; larger heads keep the pass.
//
// Prediction (GPU time, against v14): a 32 KB block in well under a microsecond from L2, so a head at S = 512
// (256 KB) in ~2-3 us where v15 took ~20: the pass's 78 us traded for ~15 us of the whole GPU: +8-10 % at D = 128
// S = 512, +4-6 % at 1024, +2-3 % at 2048, +1-2 % at 4096; the same at D = 64 by S.
//
// Limits: v14's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode); dQ with 16-byte aligned rows (always, as the binding allocates it), else v14's pass.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v16_ringconv.cu
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_lastcta.cuh"
#include "common/hopper/attn_bwd_tail.cuh"

// The largest GQA group's dQ accumulator (bytes, fp32, S_q rows) that its KV head's last CTA converts itself.
#ifndef LAB_BWD_RINGCONV_CONVERT_BYTES
#define LAB_BWD_RINGCONV_CONVERT_BYTES (2 << 20)
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

template <class T>
struct RingConvertSink : AddPartial {
  static constexpr int kBufs = 4;

  // One 64-row block of dq_accum (in shared memory, accumulator order) to dQ rows m0.. of one head: float4 `in`
  // holds rows g and g + 8 of warp wt / 32 at columns 8 r4 + 2t, +1 (convert_quad's map); lanes t = 0..3 of a g
  // hold a row's 8 columns, gathered into lane t = 0 (row g) and t = 1 (row g + 8).
  template <class C>
  __device__ __forceinline__ static void convert_block(const float* blk, T* head, int m0, const AttnBwdParams& p) {
    constexpr int kQuads = 64 * C::D / 4, kPartQuads = 16 * C::kDqCols;
    const int lane = threadIdx.x % 32, t = lane % 4, g = lane / 4, warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int j = 0; j < kQuads / 256; ++j) {
      const int in = j * 256 + threadIdx.x;
      const int part = in / kPartQuads, r4 = (in % kPartQuads) / 128;
      const float4 a = reinterpret_cast<const float4*>(blk)[in];
      const uint32_t lo = lab::pack2<T>(a.x * p.scale, a.y * p.scale), hi = lab::pack2<T>(a.z * p.scale, a.w * p.scale);
      uint32_t v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t l = __shfl_sync(0xffffffffu, lo, (lane & ~3) + k), h = __shfl_sync(0xffffffffu, hi, (lane & ~3) + k);
        v[k] = t == 0 ? l : h;
      }
      const int row = m0 + warp * 16 + g + (t == 1 ? 8 : 0);
      const int col = (C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4;
      if (t < 2 && row < p.seqlen_q)
        *reinterpret_cast<uint4*>(head + (int64_t)row * p.dq_stride[2] + col) = make_uint4(v[0], v[1], v[2], v[3]);
    }
  }

  template <class C>
  __device__ __forceinline__ void finish(const Work& work, const AttnBwdParams& p) {
    constexpr int kBlockBytes = 64 * C::D * 4;
    static_assert(kBufs * kBlockBytes <= C::kOffDq, "the ring stays below the staging area of the dK / dV epilogue");
    if (!last_cta_of_head<C>(work, p)) return;
    __shared__ __align__(8) uint64_t ring[kBufs];
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = align1024(smem_raw);
    const int n_blk = (p.seqlen_q + 63) / 64, total = work.group * n_blk;
    const int64_t head_blocks = lab::bwd::padded_rows(p.seqlen_q) / 64;
    const float* first = p.dq_accum + ((int64_t)work.b * p.heads_q + (int64_t)work.hkv * work.group) * head_blocks * 64 * C::D;
    const auto issue = [&](int n) {  // block n of the group (head n / n_blk, rows 64 (n % n_blk)..) into its buffer
      const uint32_t bar = smem_u32(&ring[n % kBufs]);
      fence_proxy_async();  // the buffer's last generic reads before the copy engine writes it
      mbar_arrive_expect_tx(bar, kBlockBytes);
      bulk_load_1d(smem_u32(smem) + (n % kBufs) * kBlockBytes,
                   first + ((int64_t)(n / n_blk) * head_blocks + n % n_blk) * 64 * C::D, kBlockBytes, bar);
    };
    if (threadIdx.x == 0) {
      for (int k = 0; k < kBufs; ++k) mbar_init(smem_u32(&ring[k]), 1);
      fence_barrier_init();
      asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the acquired reductions before the engine reads
      for (int n = 0; n < min(kBufs, total); ++n) issue(n);
    }
    named_barrier_sync(kBarCount, 256);  // the ring's barriers are initialised
    for (int n = 0; n < total; ++n) {
      mbar_wait(smem_u32(&ring[n % kBufs]), (n / kBufs) & 1);
      const int h = work.hkv * work.group + n / n_blk;
      T* head = static_cast<T*>(p.dq) + (int64_t)work.b * p.dq_stride[0] + (int64_t)h * p.dq_stride[1];
      convert_block<C>(reinterpret_cast<const float*>(smem + (n % kBufs) * kBlockBytes), head, n % n_blk * 64, p);
      named_barrier_sync(kBarCount, 256);  // every thread's reads of this buffer are over
      if (threadIdx.x == 0 && n + kBufs < total) issue(n + kBufs);
    }
  }
};

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    using C = StagedCfg<D>;  // v14's configuration
    const int64_t group_bytes = (int64_t)(p.heads_q / p.heads_kv) * p.seqlen_q * D * 4;
    const bool rows16 = reinterpret_cast<uintptr_t>(p.dq) % 16 == 0 && p.dq_stride[0] % 8 == 0 &&
                        p.dq_stride[1] % 8 == 0 && p.dq_stride[2] % 8 == 0;
    if (group_bytes <= LAB_BWD_RINGCONV_CONVERT_BYTES && rows16)
      return launch<C, T, bwd_dkdv_stagger<C, T, RingConvertSink<T>, TailSteps>, 0, true>(p, st, dev);
    return launch<C, T, bwd_dkdv_stagger<C, T, AddPartial, TailSteps>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v16(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
