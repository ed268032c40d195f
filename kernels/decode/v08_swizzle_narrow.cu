// Changes: vs decode v07 (the unpadded, swizzled ring at D 64 / 128): the same ring at D 80 and 96, where a row is 10
// or 12 chunks of 16 bytes, not whole groups of 8. Chunk c of key row r sits at c ^ ((r & 7) >> s), s = 2 at D 80 and
// 1 at D 96 (common/decode_swizzle.cuh's SwizzleRows): rows start 10 r or 12 r chunks in, so 8 consecutive rows' bank
// quads repeat every 4 or 2 rows, and the smaller XOR term separates the repeats while permuting a row's chunks only
// inside its aligned pairs (D 80) or quads (D 96): every 32-byte sector of the cache lands whole in one aligned 32-byte
// sector of the ring. Pass 1 is v06's kernel (common/decode_warp_ring_pass1.cuh) with kSwizzle, as v07.
// Compile check: python -m lab compile (sm_80 and sm_90a); the layout: lab.decode.swizzle_model (lane by lane);
// GPU checks: tests/decode/test_paged_gpu.py (at D 80 / 96). Measured:
// outputs/experiments/20261127-decode-v08-narrow-swizzle.json.
//
// decode_swizzle_narrow_v08: split-K decoding over a paged (or contiguous) KV cache at D 80 / 96, tensor cores for
// Q K^T and P V. Algorithm: v03's pass 1 with v06's warp-private ring (read their headers); pass 2 the LSE combine.
//
// Prediction (written before it ran on a GPU). At D 80 / 96 lab.ops.decode runs v03 (paged) and v02 (contiguous),
// whose rings pad a row to D + 8 elements (176 / 208 bytes): every odd row starts 16 bytes off a 32-byte boundary, so
// half the 32-byte sectors a copy instruction reads land in two shared sectors. Counted lane by lane
// (lab.decode.swizzle_model) that is 1.50x the sectors the addresses need at D 80 and 96, as at D 128, where
// ncu measured 1.51x cuDNN's crossbar sectors for v02 / v03 / v06 and 1.00x for v07 (v07's whole-line count, the
// other model, gives the padded ring 1.25-1.44x; at D 80 it gives v08 1.20x, the sector count 1.00x, so a profile of
// v08 at D 80 tells the two models apart). v08's ring moves 1.00x by the sector count, with conflict-free copies and
// ldmatrix (1 wavefront each), and 80 / 96 KiB of shared memory a block against v03's 88 / 104 (two blocks an SM
// either way). Expected: what v07 gave at D 128, v08 gives at D 80 / 96: GPU time 0.94-0.975x v03's on the paged
// cache and 0.94-0.975x v02's on the contiguous one (v07 / v03 at D 128: 0.938-0.975 on an H200, 0.948-0.982 on an
// H100). Against SDPA-cuDNN at the n11 head-dim cells (page 64; 8 x 16384 and 128 x 2048): contiguous >= 0.97x, paged
// >= 0.95x at 128 x 2048; at 8 x 16384 paged, where the eager n11 rows had v03 at 0.83-0.94x (H100) and 0.88-0.89x
// (H200), the 0.95 gate is met only if v03's GPU-time ratio there is above ~0.90. What v08 keeps from v03 at these
// dims: 6 (D 80) or 4 (D 96) of a row's 16 copy lanes idle, and the same per-tile softmax over fewer bytes.
// Outcome (H100, outputs/driver_logs/20261127-h100-decode-v08-cee9b7f/): the layout prediction was right. 168/168
// checks, the wrong build failing, four sanitizers clean; ncu at D 80: v02 / v03 / v06 move 1.45-1.53x cuDNN's
// crossbar sectors, v08 0.96-1.00x (the sector count; the whole-line count's 1.20 refuted). GPU time v08 / v03 on
// the paged serving cells 0.955-0.984 at D 80, 0.917-1.006 at D 96 (level at 8 x 16384, up to +0.6 % at 32 x 4096);
// v08 / v02 contiguous 0.916-0.986. The paged cells at 8 x 16384 stay under 0.95x cuDNN (D 80 0.844, D 96 0.877): the
// page-major cache at D 80 is read 1.16-1.19x from DRAM there (rows share lines with the neighbouring heads'), not a
// ring matter. lab.ops.decode's default at D 80 / 96 (outputs/experiments/20261127-decode-v08-narrow-swizzle.json).
//
// Launch: as v03: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; shared memory 4 stages x 2 x 64 x D
// x 2 bytes (D 80: 80 KiB; D 96: 96 KiB). Limits: D 80 / 96 (LAB_E_HEAD_DIM otherwise), as v03 else (fp16 / bf16,
// q_len >= 1, page_size a multiple of 16, strides of 8 elements, 16-byte aligned bases, page_errors for a paged
// call); sm_80 and sm_90a.
#include <cuda_runtime.h>

#include "common/decode_paged_launch.cuh"
#include "common/decode_warp_ring_pass1.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/params.h"

extern "C" int decode_swizzle_narrow_v08(const DecodeParams* p, void* stream_ptr) {
  // pass 1: common/decode_warp_ring_pass1.cuh's kernel with the swizzled ring; the entry: common/decode_paged_launch.cuh
  return lab::decode::paged_entry_at_dims<lab::decode::SwizzledRingPartial, 80, 96>(p, stream_ptr);
}
