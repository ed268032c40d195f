// Changes: vs decode v03: the ring is warp-private. Warp w copies only the 16 keys of each 64-key tile it reads (its
// rows 16 w .. 16 w + 15 of K and V, in v03's ring layout), one page id per slice (common/paged.cuh's
// RowWalk, v05's walk), and waits for and refills its own rows with __syncwarp (warp_ring_step): the main loop has no block
// barrier. The split plan, the ring's layout and depth, the page-table check, the tile's math
// (common/decode_tile_step.cuh) and the merge of the 4 warps are v03's.
// Pass 1 lives in common/decode_warp_ring_pass1.cuh (shared with v07; moving it left every kernel's PTX as it was:
// outputs/driver_logs/20261126-cpu-decode-swizzle-aee1fb7/v06_ptx_same.log).
// Compile check: python -m lab compile (sm_80 and sm_90a); GPU checks and the wrong builds: tests/decode/test_paged_gpu.py;
// the sanitizers, the race against v03 and cuDNN and Nsight Compute: outputs/experiments/20261126-paged-v06-warpring.json.
//
// decode_warpring_v06: split-K decoding over a paged (or contiguous) KV cache, tensor cores for Q K^T and P V.
//
// Algorithm: v03's pass 1 (read its header): one block (4 warps) per (split s, b, h_kv, row group of 16); 64-key
// tiles K_j, V_j in a kStages ring; warp w owns keys 16 w .. 16 w + 15 of each tile with its own (m_i, l_i, O_i)
// (S = Q K_w^T, exp2, P V_w); the warps merged through the freed ring at the end; pass 2 the shared LSE combine.
// What is new is who copies a tile: lane l of warp w copies 16-byte column (l % kVecSlots) of rows
// l / kVecSlots + kRowStep i of its slice (kVecSlots: the power of two that holds a row's vectors, as in v03), so a
// lane's copies are the rows its own warp reads, and no other warp waits for them.
//
// Prediction (from the profiles of v03 and cuDNN on the H100 one-token serving cells, outputs/experiments/20261126-paged-v06-warpring.json):
// every switch of v03's loader (hint, L2 policy, ring depth, request order, whole-row copies, a fifth fewer
// instructions) left its DRAM throughput at 80-86 % of peak against cuDNN's 85-90 %, so neither the bytes a block
// has asked for nor the requests' shape is the bound. What every one of them kept is the block barrier at the top of
// each tile: the next tile's copies go out only once all 128 threads' copies of the current tile have landed and
// all 4 warps finished the tile before it, so one late 256-byte row holds back 32 KiB of requests and the SM's
// queue empties in bursts. With warp-private rings each warp refills as soon as its own rows landed. Prediction:
// pass 1 0.96-0.99x v03's GPU time on the serving cells (pages 16/64/256 and the contiguous cache), the gain largest
// where a block has the most tiles to stream (32 x 4096, 8 x 16384, 1 x 131072), ncu DRAM throughput up by 2-4
// points, "barrier" stalls gone from the stall mix; 64 x 1024 (16 tiles a block, 1.94 waves) moves least.
// Outcome (H100 80GB HBM3, outputs/driver_logs/20261126-h100-paged-warpring-5be331d/): the prediction was wrong.
// Correct (216/216 checks through lab.ops.decode, the wrong build failing 8/8) and clean under memcheck, racecheck,
// synccheck and initcheck, but v03's GPU time over v06's is 1.005-1.011 at 64 x 1024, 0.999-1.008 at 32 x 4096,
// 8 x 16384 and 128 x 2048, 0.992-1.005 at 1 x 131072 (two identical v03 calls: up to 0.6 % apart); ncu DRAM throughput
// within a point of v03's (84.4 % at 32 x 4096 page 16, cuDNN 89.7 %). The barrier stall left the mix and the long and
// short scoreboard took its place: the warps wait for the same bytes. Off lab.ops.decode's default list
// (lab.registry.BEST_PAGED); a call may name it (outputs/experiments/20261126-paged-v06-warpring.json).
//
// Launch: as v03: grid num_splits * B * Hkv * ceil(G * q_len / 16), 128 threads; shared memory v03's ring (+ Q at
// D > 128). Limits: as v03 (D 64-256, fp16 / bf16, q_len >= 1, page_size a multiple of 16, strides of 8 elements,
// 16-byte aligned bases, page_errors for a paged call); sm_80 and sm_90a.
#include <cuda_runtime.h>

#include "common/decode_paged_launch.cuh"
#include "common/decode_warp_ring_pass1.cuh"
#include "common/launch.h"
#include "common/paged.cuh"
#include "common/params.h"

namespace {

constexpr int kKeyBlock = 64;  // WarpRingConfig::kBlockN, lab/decode/splits.py BLOCK_N: chunks are whole tiles

}  // namespace

extern "C" int decode_warpring_v06(const DecodeParams* p, void* stream_ptr) {
  static_assert(kKeyBlock == lab::decode::WarpRingConfig<128, 3, false>::kBlockN,
                "chunk rounding must match the kernel's key block");
  lab::DecodeLaunch l;  // rows in 16-row groups, chunk, device, PDL, stream (common/launch.h)
  if (const int rc = lab::decode::paged_entry(p, kKeyBlock, stream_ptr, &l)) return rc < 0 ? rc : 0;
  return lab::decode::launch_paged_family<lab::decode::PaddedRingPartial>(p, l);  // the padded ring
}
