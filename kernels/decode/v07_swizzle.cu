// Changes: vs decode v06 (warp-private ring): the ring is unpadded and swizzled (common/decode_swizzle.cuh): a smem row
// is D elements, not D + 8, and 16-byte chunk c of key row r sits at chunk c ^ (r & 7). The copies, the walk, the
// page-table check, the softmax and the merge are v06's. D 64 and 128 (the same ring at D 80 / 96: decode v08).
// Pass 1 is v06's kernel (common/decode_warp_ring_pass1.cuh) with kSwizzle.
// Compile check: python -m lab compile (sm_80 and sm_90a); GPU checks: tests/decode/test_paged_gpu.py.
// Measured: outputs/experiments/20261127-decode-v07-swizzle.json.
//
// decode_swizzle_v07: split-K decoding over a paged (or contiguous) KV cache, tensor cores for Q K^T and P V.
// Algorithm: v03's pass 1 with v06's warp-private ring (read their headers); pass 2 the shared LSE combine.
//
// Prediction (profiles of v03 / v06 and cuDNN on the H100 serving cells, outputs/experiments/
// 20261126-paged-hint-probe.json): for the same 16.79 M DRAM sectors at 32 x 4096 page 16, v06's copies move 25.2 M sectors
// over the crossbar, 24 a copy instruction where its addresses need 16; cuDNN's move 16.8 M, and the L2 prefetch hint
// is not the cause. Counted lane by lane (lab.decode.swizzle_model): shared-memory bank conflicts are not it
// (padded and swizzled are both 1 wavefront per quarter-warp copy and per ldmatrix matrix); what the pad changes is
// where a 256-byte row lands: at 272 r bytes, 14 of a slice's 16 rows straddle three aligned 128-byte chunks, so a
// copy instruction writes 20 chunks (23 counted row by row: 1.25-1.44x the 16 sectors it reads) where the swizzled
// ring writes 16 (1.00x: each 128-byte line of the cache lands in one aligned chunk, permuted inside it). If the copy
// is charged by destination chunk, v07 moves 16.8 M crossbar sectors (cuDNN's count) and ~4.2 M L2 requests, pass 1's
// DRAM throughput rises from 84 % toward cuDNN's 89-90 %, and its GPU time falls 3-6 % below v06's on the cells of
// 32 x 4096 and larger (v06 0.930-0.945x cuDNN there); 64 x 1024 (under 2 waves) less. If the sectors stay at
// 25.2 M, the destination is not the cause either and GPU time is v06's within 1 % (the swizzle adds an XOR
// to each ldmatrix address; 6 % less shared memory a block, 96 against 102 KiB at D 128, changes no occupancy).
// Outcome (H200, 555d8ce, outputs/driver_logs/20261127-h200-decode-v07-555d8ce/): right. The crossbar carries 1.00x
// cuDNN's sectors (v06 1.51x), pass 1 reads DRAM at 88.0 % of peak (v06 84.0, cuDNN 90.4), GPU time 0.945-0.977x
// v06's at 32 x 4096 and larger, 0.938-0.975x v03's on all 20 serving cells; against SDPA-cuDNN contiguous
// 0.989-1.018, paged 0.939-0.994. 168/168 checks, the four sanitizers clean. lab.ops.decode's default at D 64 / 128
// (contiguous, paged and causal calls; one row a KV head since 72ec60c). Record:
// outputs/experiments/20261127-decode-v07-swizzle.json.
//
// Launch: as v03: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; shared memory kStages x 2 x 64 x D
// x 2 bytes (D 128: 3 stages, 96 KiB; D 64: 4 stages, 64 KiB). Limits: D 64 / 128 (LAB_E_HEAD_DIM otherwise), as v03
// else (fp16 / bf16, q_len >= 1, page_size a multiple of 16, strides of 8 elements, 16-byte aligned bases,
// page_errors for a paged call); sm_80 and sm_90a.
#include <cuda_runtime.h>

#include "common/decode_paged_launch.cuh"
#include "common/decode_warp_ring_pass1.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/params.h"

extern "C" int decode_swizzle_v07(const DecodeParams* p, void* stream_ptr) {
  // pass 1: common/decode_warp_ring_pass1.cuh's kernel with the swizzled ring; the entry: common/decode_paged_launch.cuh
  return lab::decode::paged_entry_at_dims<lab::decode::SwizzledRingPartial, 64, 128>(p, stream_ptr);
}
