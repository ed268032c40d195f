// Backward attention v15: v14 with dQ converted inside the main kernel, by the last CTA of each KV head, where the
// group's dQ accumulator is small enough for one CTA; the convert pass only for larger heads.
// Compile check: .venv/bin/python -m lab compile; through torch: lab.ops.attention(...) then autograd.
// Measured (H100, GPU time beside v14 in one process; outputs/driver_logs/20261126-h100-bwd-v15-run1/): correct
// (driver 53/53, the no-D build failing; memcheck, racecheck, synccheck, initcheck clean; 14/14 gradient checks)
// and 10-17 % slower than v14 wherever it converts (D = 128 S = 512: 0.93x SDPA-cuDNN against v14's 1.06x), the
// same at either larger threshold; where the pass remains it is v14. A measured negative result: v16 says why.
//
// Why. bench-bwd keeps B·S = 16k and H·D = 2048, so dq_accum is 134 MB of fp32 in every cell and the convert pass
// costs the same ~78 us everywhere (torch.profiler, H100, D = 128, S = 512; cuDNN's own convert is 79 us): 14 % of
// the call at S = 512, 6 % at 2048, 3 % at 4096. It reads those 134 MB from DRAM after the main kernel has written
// them back. The D = 128 cells that still miss cuDNN are exactly the short ones (S = 512-2048, level in GPU time).
// A head's dQ is final when its last key block's CTA ends; at S = 512 that head's accumulator is 256 KB, reduced
// moments ago and still in L2, and the CTA that finishes it has nothing left to do.
//
// What changes (the Sink's finish only; the loop, the config, the order and every other store are v14's):
// after its last dQ reduction every consumer thread fences, the CTA counts itself in its KV head's counter (one
// word per (batch, KV head) after dq_accum, zeroed with it by the memset, as v06's counters are), and the CTA
// that brings the count to the number of key blocks converts the GQA group's whole dQ (rows < S_q) from L2
// (ld.global.cg) before its dK / dV epilogue. v06 converted per 16-row slab behind a fence every step and lost
// 28-35 % to those fences; here there is one fence and one atomic per CTA. Only where the group's accumulator is
// at most LAB_BWD_LASTCONV_CONVERT_BYTES: one CTA converts it at a few hundred GB/s at best, so at S = 16384 (8 MB a head)
// the last CTA of the grid would convert alone for longer than the whole pass takes.
//
// Prediction (GPU time, against v14): the pass's 78 us gone, paid back by the converting CTAs (the total 134 MB
// read from L2 at ~60 GB/s per SM is ~17 us of the whole GPU's time, plus whatever the last wave's converts add
// to the end): +8-10 % at D = 128 S = 512, +4-6 % at 1024, +2-4 % at 2048 (the 1 MB default; S = 4096, 2 MB,
// is tried as LAB_BWD_LASTCONV_CONVERT_BYTES=2097152); D = 64 the same by S (its accumulator rows are half as wide, so the
// default reaches S = 4096); nothing where the pass remains.
//
// Limits: v14's (sm_90 only; D 64 and 128; fp16, bf16; any lengths; GQA; any finite scale; no deterministic
// mode).
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/bwd/v15_lastconv.cu
#define LAB_BWD_ZERO_IN_PRE 1
#include "common/hopper/attn_bwd_lastcta.cuh"
#include "common/hopper/attn_bwd_tail.cuh"

// The largest GQA group's dQ accumulator (bytes, fp32, S_q rows) that its KV head's last CTA converts itself.
#ifndef LAB_BWD_LASTCONV_CONVERT_BYTES
#define LAB_BWD_LASTCONV_CONVERT_BYTES (1 << 20)
#endif

namespace {
using namespace lab::sm90;
using namespace lab::sm90::bwd;

// v14's reductions, then the KV head's count; its last CTA converts the group's dQ.
template <class T>
struct ConvertSink : AddPartial {
  template <class C>
  __device__ __forceinline__ static void convert_group(const Work& work, const AttnBwdParams& p) {
    constexpr int kQuads = 64 * C::D / 4, kUnroll = 4;  // float4s of a 64-row block; loads in flight per thread
    const int sq_pad = lab::bwd::padded_rows(p.seqlen_q);
    const int per_head = (p.seqlen_q + 63) / 64 * kQuads;  // the 64-row blocks that hold rows < S_q
    const int total = work.group * per_head;
    const int64_t head_stride = (int64_t)sq_pad / 64 * kQuads;
    const int64_t first = ((int64_t)work.b * p.heads_q + (int64_t)work.hkv * work.group) * head_stride;
    const float4* acc = reinterpret_cast<const float4*>(p.dq_accum);
    for (int i0 = threadIdx.x; i0 < total; i0 += 256 * kUnroll) {
      float4 a[kUnroll];
      int64_t idx[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {  // every load issued before the first store
        const int i = i0 + u * 256;
        idx[u] = first + (int64_t)(i / per_head) * head_stride + i % per_head;
        if (i < total) a[u] = __ldcg(acc + idx[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i0 + u * 256 < total) convert_quad<C, T>(p, idx[u], sq_pad, [&](int64_t) { return a[u]; });
    }
  }

  template <class C>
  __device__ __forceinline__ void finish(const Work& work, const AttnBwdParams& p) {
    if (last_cta_of_head<C>(work, p)) convert_group<C>(work, p);
  }
};

template <int D, class T>
struct Launch {
  static int run(const AttnBwdParams& p, cudaStream_t st, int dev) {
    using C = StagedCfg<D>;  // v14's configuration
    const int64_t group_bytes = (int64_t)(p.heads_q / p.heads_kv) * p.seqlen_q * D * 4;
    if (group_bytes <= LAB_BWD_LASTCONV_CONVERT_BYTES)
      return launch<C, T, bwd_dkdv_stagger<C, T, ConvertSink<T>, TailSteps>, 0, true>(p, st, dev);
    return launch<C, T, bwd_dkdv_stagger<C, T, AddPartial, TailSteps>>(p, st, dev);
  }
};

}  // namespace

extern "C" int attn_bwd_v15(const AttnBwdParams* p, void* stream) { return entry<Launch>(p, stream); }
