// Changes: vs v09 (the masks on v05's serial loop: one warpgroup that waits for each GEMM) and v07 (the default
// dense kernel): v09's mask steps in v07's loop, so that a masked or packed call runs at the default's speed.
//   - From v07: a producer warpgroup (TMA, separate `empty` barriers for K and V) and two consumer warpgroups of 64
//     query rows (B_r = 128); in each consumer S_{j+1} = Q K_{j+1}^T and P_j V_j in flight together, the softmax of
//     S_{j+1} under P_j V_j; at D = 128 the consumers take turns issuing (ping-pong); FA4's lazy rescale on tiles
//     that need no mask; causal-like grids (a right edge) longest first within groups of heads whose keys fit L2.
//   - From v09, unchanged as steps (common/mask.cuh, common/hopper/attn_mask_sm90.cuh): the CTA's key tiles are the
//     window's key range of its 128 rows (window_key_range): the producer's TMA coordinates start at the range's
//     first tile and tiles outside are never loaded or computed; a tile crossing an edge of a warpgroup's 64 rows
//     gets mask_window_wg before the softmax; softcap / scale <= 0 by transform_scores; the bf16 softcap with a
//     fixed offset (kCapHeadroom, l from the rounded P: exp_rows_rounded), which needs no max and no O rescale;
//     the sinks in the final normaliser (epilogue_sink); packed sequences through cu_seqlens (B = 1 tensor maps
//     over the packed rows, the sequence's first rows read by the CTA), a CTA past its sequence returns at once.
// Tiles: B_c = 128 at both head dims (the window sizes people use are multiples of 128, so the edge tiles are
// fewer than with v07's 176; v07 measured B_c 128 within 2-3 % of 176 on long unmasked rows), 2 stages at D = 128
// (Q 32 + 2 x (K 32 + V 32) = 160 KiB), 3 at D = 64 (Q 16 + 3 x 32 = 112 KiB). Grid: ceil(max S_q / 128) x B x H_q
// CTAs of 384 threads. Any S_q, S_k (the last tile masked by window_masked's col >= S_k).
// Compile check: python -m lab compile. Checks and race: lab.masks.gpu (checks("v11"), race).
// Prediction (H100, bf16, D = 128, H = 16, the n13 race cells): v09's loop cost 1.43-1.77x v07's time on the same
//   unmasked work, and its causal-window rows are those cells' whole time; in v07's loop the masked kernel's plain
//   causal call within ~5 % of the default's (the non-persistent long config: 2k causal rows lose what v07's
//   persistent PAIR order gains at S <= 2048), so: window vs FlexAttention 1.41-2.49 -> 2.0-3.5 (every cell >= 1.5);
//   packed sequences of one length vs the dense default 1.44 -> 1.05-1.15; softcap overhead over the masked plain
//   call about as now (the tanh per score still on the MUFU beside exp2, which v07's overlap does not remove).
// Outcome (H100, b0e2c88, outputs/driver_logs/20261126-h100-masks-v11-b0e2c88/): 108/108 checks of the chapter's grid (the
//   wrong-window build fails as it must), memcheck, racecheck, synccheck, initcheck clean over the public calls. ncu at
//   S 16384, window 4096 (clocks as they run): 785 us against v09's 1040 (-25 %), SM throughput 67 % against 48 %,
//   memory 58 % against 83 %. Public op, version named (so both pay the Python path's host time, which the default's
//   one-crossing path does not), cold, ms v11 / v09 / Flex: window S 4k W 1k 0.208 / 0.191 / 0.308, W 4k 0.268 /
//   0.300 / 0.437; S 16k W 1k 0.405 / 0.412 / 0.571, W 4k 0.865 / 1.106 / 1.351; packed 8 x 2048 0.354 / 0.418 (dense
//   default 0.246), uneven 0.646 / 0.867; the plain causal call at S 16k 1.758 / 2.520 (dense default 1.686); softcap
//   30 at S 16k 2.444 / 2.707. So the long cells gained what v07's loop predicted, the plain masked call is within
//   4 % of the default at S 16k; the packed call of one length did not reach the dense default (0.354 against 0.246:
//   the default's causal S = 2048 runs v07's persistent PAIR order with FUSE, which v11 does not have), and the
//   softcap now costs +39 % over v11's own plain call (v09: +7 %): the plain call got faster and the tanh beside each
//   exp2 on the MUFU unit did not (a candidate below). Default for the masked calls on compute capability 9.0 since.
//   As the default (n13 session 20261126-180645-h100-80gb-hbm3-ae71cb7, H100, public op, one crossing, cold): window
//   2.62 / 2.68 / 2.00 / 1.84x FlexAttention (S 4k W 1k / 4k, S 16k W 1k / 4k; predicted 2.0-3.5: met, every cell >= 1.5);
//   packed of one length 1.19x the dense default's time (predicted 1.05-1.15: missed; 1.03x this kernel's own dense
//   call, so the rest is the loop against the default's persistent PAIR order); softcap +33 / +35 % (predicted about
//   v09's +9 %: missed, see above); sinks +0.1 / +0.3 %. 214/214 checks (v11 and v08), 95/95 gradient checks through
//   bwd v08 with this forward's LSE.
// Candidates (H100, ae71cb7, GPU time in rounds; outputs/driver_logs/20261126-h100-masks-v11-session-ae71cb7/):
//   CAP_POLY = 2: softcap 30 at S 4k / 16k 0.160 / 2.022 ms against 0.165 / 2.146 (-3.4 / -5.8 %; no softcap 0.129 /
//   1.582), its checks 26/26 (the softcap grid at D 128 and 64, the rows at the cap's floor); not yet sanitized, so
//   off. Predicted from the MUFU count (1.5 issues per score instead of 2): -10-15 %; the FMA pipe's cubic and the
//   tanh's own latency keep most of it. STAGES = 3: window S 16k 0.323 / 0.791 ms against 0.324 / 0.789, packed 8 x
//   2048 0.301 against 0.298 (dense default 0.252): no gain, off.
// Softcap's cost (H100, D = 128, per SM and 64 x 128 tile of each consumer): the two GEMMs take 2 x 64 x 128 x 128 x 2
//   / 4096 FLOP per clock = 1024 clocks of the tensor core; the exp2 per score alone 8192 / 16 MUFU issues per clock =
//   512 clocks, the tanh beside it another 512, so with the softcap the MUFU unit's time matches the tensor core's and
//   the overlap has no slack left: the +33-39 % is the MUFU, not the FMAs (a multiply per score) nor registers.
// Prediction (CAP_POLY 2 default, CAP_TANH_HALF candidate; H100, bf16, D 128, H 16, causal, softcap 30, GPU time):
//   CAP_POLY 2 as measured before, -3-6 % against CAP_POLY 0; CAP_TANH_HALF 1 with CAP_POLY 2 (MUFU 1.0 per score, the
//   plain kernel's count, the exp2 poly's FMAs and the pair's conversions added) -10-15 % against CAP_POLY 0 alone,
//   softcap overhead over the plain call +33 % -> +15-20 %; the fp16-rounded tanh costs c x 2^-12 in the exponent at
//   the cap (c = softcap log2 e: 1.2 % per P at softcap 50), so the rows at the cap's floor may fail: the checks
//   decide.
// Outcome (H100, 30ac632 with CAP_POLY 2 as the default, outputs/driver_logs/20261126-h100-masks-cap-30ac632/): GPU
//   time, ms, plain / CAP_POLY 0 / 2: D 128 S 4k 0.130 / 0.166 / 0.161 (-3.0 %), S 16k 1.581 / 2.153 / 2.024 (-6.0 %);
//   D 64 S 4k 0.104 / 0.141 / 0.146 (+3.4 %: at D = 64 the GEMMs are half as long, the FMA pipe's cubic is not hidden).
//   ncu of the CAP_POLY 2 call at S 16k: tensor pipe 57 % active, XU (MUFU) 43 % of its peak, FMA 27 %, ALU 20 %, 168
//   registers, no spills: the MUFU share is 0.75 of the tensor's, as the count above gives for 1.5 issues per score,
//   and neither pipe is full, so the softmax's MUFU chain under the other warpgroup's GEMMs sets the time.
//   compute-sanitizer memcheck, racecheck, synccheck, initcheck over the public calls: clean. Chapter n13 with it
//   (records in that folder): forward checks 214/214, softcap and sinks gate 1.316 (CAP_POLY 0 on the H100 at ae71cb7:
//   1.349), but 94/95 gradient checks: bwd v08's row "all" (window 128, softcap 50, sinks, D 128, S 1025) at 1.046x its
//   dQ tolerance, where fourteen earlier records of that row read 0.26-0.92. Whether the cubic's ~7e-5 relative error
//   in P (through the O and LSE the backward takes) or the draw put it over is not settled, so CAP_POLY stays 0 (then
//   the PTX is byte for byte the measured default's). CAP_TANH_HALF did not build there (the pair tanh is
//   lab::tanh_pair); since fixed, it was timed and checked on an H200 (555d8ce,
//   outputs/driver_logs/20261127-h200-masks-cap-tanh-half-555d8ce/): alone -7.2 / -7.8 % at D 128 S 4k / 16k, +1.0 % at
//   D 64; with CAP_POLY 2 only -2.4 / -2.8 % (+7.6 % at D 64), short of the -10-15 % predicted; and every pair-tanh
//   build fails 14 check rows (bf16, softcap 30 and 50) on the LSE (errors 0.010-0.028, the fp16 tanh's rounding at
//   the cap), so it stays off. The softcap's overhead over the plain call on the H200: +31 / +38 % (S 4k / 16k).
// The prologue (the sequence's rows from cu_seqlens, the window's tiles) is v09's written out: as shared device functions
// (masked_seq, window_tiles) it changed both kernels' integer code (tools/sass/sass_guard.sh), which no GPU run has
// covered, so it stays as is until a run checks the shared form.
// Paged K/V (block_table in AttnMaskParams, lab.masks.paged; the kPaged instantiations only, so the SASS of every
//   other kernel here is unchanged: tools/sass/sass_guard.sh, sm_80 and sm_90a identical): packed calls whose K and V
//   are (num_pages, page_size, H_kv, D) caches. The producer is one warp: lane i reads the page of box i of the next
//   tile from the table and issues box i of this one, TMA boxes of the largest power of two dividing page_size
//   (16-128 rows, paged_box_rows) into the tile's rows, which the 128-byte swizzle lays out as one box of B_c rows
//   would; a box past the sequence's keys gets page num_pages, outside the map (zeros, full byte count), so no table
//   entry past the sequence is read. Every CTA checks its sequence's table: more keys than max_pages * page_size
//   before anything else, the pages (an index outside [0, num_pages)) by its consumers while the producer loads
//   (PAGED_CONSUMER_SCAN; the whole CTA before any load in the first form, paged_table_bits); for a bad one each CTA
//   writes zeros to its rows (O = 0, LSE = -inf: no key, no sink), and CTA (m 0, h 0) writes its page_errors bits. The last tile's V rows past
//   the keys are zeroed in shared memory before P V (the rest of a page is not the next sequence's keys, as in packed
//   K/V, but whatever the cache held: P = 0 times a NaN there is NaN). The wrong build LAB_FWD_MASK_BUG_IGNORE_TABLE
//   reads page key / page_size of the cache instead. Prediction (H200, chunked prefill B 4, 512 queries after 8192
//   keys, H 32 / 8, causal, bf16): page 64 and 256 within 3 % of the same call on packed K/V (the same tiles, 2-4 TMA
//   issues per tile instead of 2), page 16 within 5 % (16 issues per tile, still far under a tile's ~1400 tensor
//   clocks).
// Outcome (H200, f58d500, outputs/driver_logs/20261129-h200-batch2-f58d500e62/T6): the checks of lab.masks.gpu_paged
//   all pass (pages 16-256 and 48, shuffled tables, NaN in the cache rows no sequence owns, bad tables flagged, the
//   table-ignoring build fails), memcheck clean; but the launch alone ran at 0.68 / 0.81 / 0.82 of the packed call's
//   speed at page 16 / 64 / 256 (D 128; 0.85 at D 64 page 64), missed. At page 256 the TMA work is the packed call's,
//   and the SASS showed why: the bad-table bits (from __syncthreads_or, not uniform to the compiler) fed the key
//   count, so the main loop's wgmma descriptors moved from uniform to vector registers (1 uniform op and 44 R2UR in
//   the loop against 67 and 14). A bad sequence's CTA now zeroes its rows and returns, leaving the key count alone:
//   56 uniform ops, 16 R2UR. The plain packed call before / after the paged instantiations: 1.013-1.019x (noise;
//   identical SASS). Page 16's further gap is its 16 boxes a tile; a cp.async gather of small pages (FlashAttention-3's
//   way) is the next candidate, not built. The fix's clean race is owed: its one run shared the GPU with two other
//   scripts (outputs/driver_logs/20261129-h200-batch3-7152d73448/T6: 0.72 / 0.84 / 0.85 at page 16 / 64 / 256, 0.90
//   at D 64 page 64, the checks and memcheck clean). Record: outputs/experiments/20261129-paged-prefill-v11.json.
// Prediction (paged candidates, before any was measured; H200, the race's cells, kernel GPU time against the contiguous
//   call): at page 256 the TMA work and the consumers' loop are the contiguous call's, so the 0.85x left there was
//   put on the memory side (the shuffled table's scattered pages, a 2-stage ring exposing each page's latency):
//   the identity table (the contiguous call's bytes read through the table) >= 0.97x; PAGED_D128_STAGES 3 / D64 5
//   and PAGED_PREFETCH 3 (L2 prefetch of the boxes three tiles ahead) each +5-10 % at pages 64 / 256; PAGED_LATE_CHECK
//   (the table scan on the producer's second warp, its verdict at the epilogue) +1 %.
// Outcome (H200, ae234c2, outputs/driver_logs/20261129-h200-batch4-b88a6be/Q, GPU time, contiguous / paged, IQR
//   within +-0.5 %): the identity table ran as the shuffled one (0.714 / 0.853 / 0.869 / 0.924 against 0.716 / 0.851 /
//   0.871 / 0.926 at D 128 page 16 / 64 / 256, D 64 page 64), so the layout costs nothing and the gap is the kernel's
//   own. STAGES 3 at D 128: 0.716 / 0.901 / 0.905 (kept); 5 at D 64: 0.893 (lost, D 64 keeps 3). PREFETCH 3: 0.472 /
//   0.745 / 0.767 / 0.788 (the prefetches queue in the same TMA unit ahead of the loads that are due; removed).
//   LATE_CHECK: 0.713 / 0.845 / 0.867 / 0.905 (no gain; removed). ncu at page 256, identity table: 461 us against
//   401, the same DRAM bytes and 4 % more instructions, issue slots 32 % against 36 %: the warps wait longer, not
//   more. The SASS then showed why: the consumers' loop set up its barrier addresses and wgmma descriptors in vector
//   registers (S2R of the thread index, IMAD chains, an R2UR before each use: 1476 instructions against 1731 that
//   are mostly uniform ops), because the bad-table branch before it, on a __syncthreads_or result that the compiler
//   cannot prove uniform, made all code after it divergent to the compiler (the first fix kept the key count clean
//   but not the branch). paged_table_bits now passes that result through a warp vote (VOTEU.ANY, a uniform
//   predicate): the paged loop is the contiguous one's again, 1731 instructions.
// Prediction (the uniform vote, 3 stages at D 128): page 256 and D 64 page 64 >= 0.97x, page 64 >= 0.95x, page 16
//   ~0.80x (its 16 boxes a tile per K or V remain: PAGED_GATHER, cp.async of pages below 64 keys by the producer
//   warpgroup, is the candidate for it, with PAGED_WALK, the producer's box coordinates without a division a tile).
// Outcome (H200, outputs/driver_logs/20261129-h200-batch5-9c9667b/Q, GPU time, contiguous / paged, IQR within +-1 %):
//   vote + 3 stages 0.713 / 0.930 / 0.931 / 0.947 (page 16 / 64 / 256, D 64 page 64; the identity table alike);
//   with 2 stages 0.703 / 0.835 / 0.852 / 0.948. PAGED_WALK on top: 0.829 / 0.967 / 0.970 / 0.954, so the producer's
//   divisions after each empty wait (three a tile, ~0.1 us of dependent integer ops before the TMA issue) were on the
//   loads' path: now the only producer. PAGED_GATHER: 0.222x at page 16 (removed; pages of 64 and up unaffected).
//   Checks of every build (the six cases, bad tables, both table-ignoring builds failing) and memcheck clean.
//   As the default (ca72b20, outputs/driver_logs/20261129-h200-final-ca72b20/Q): GPU time 0.832 / 0.971 / 0.974 /
//   0.967; through the public op as chapter n16 races it (cold, host time in) 0.792 / 0.925 / 0.930 / 0.899, the
//   paged serving call's Python path costing 2-4 % of a 0.4 ms call against the packed call's one C++ crossing.
//   Predicted >= 0.97 / 0.95: met in GPU time at page 256 and D 64 (page 64 0.971), missed through the public op;
//   page 16 below as predicted (its 16 boxes a tile are issued one lane at a time; the next candidate issues them
//   from all four producer warps). Checks, the failing wrong build and memcheck clean.
// PAGED_ISSUE_WARPS (prediction at the switch: page 16 0.83 -> 0.90-0.94x, the rest within 1 %). Outcome (H200,
//   outputs/driver_logs/20261129-h200-batch6-ed9df1b/V, GPU time, contiguous / paged, against the contiguous call
//   before its persistent grid, IQRs in the log): 4 warps 0.970 / 0.973 / 0.976 / 0.979 at page 16 / 64 / 256, D 64
//   page 64, 1 warp 0.831 / 0.974 / 0.974 / 0.968; at page 16 against the persistent grid 4 warps 0.975, 2 warps
//   0.966. So the one-lane issue loop was page 16's whole gap (better than predicted: the TMA unit takes 2 KiB boxes
//   as fast as the big ones); the default since. Through the public op, with the serving call's one crossing
//   (lab.masks.paged): 1.015 / 1.019 / 1.018 / 1.071x the contiguous call (on its PACKED_PERSIST grid; its host
//   path a call 32 us against the paged call's 22), checks, the failing wrong build, memcheck and racecheck clean;
//   as the default (outputs/driver_logs/20261129-h200-final-c4d12fc/V) 1.024 / 1.025 / 1.053 / 1.063x, all clean again.
//   Record: outputs/experiments/20261129-paged-prefill-public-op.json. Those public-op ratios stand against the
//   persistent grid, which ran chunked prefill 3.5-7 % behind the per-tile grid; the launcher now keeps such calls on
//   the per-tile grid, against which the paged kernel runs at 0.970 / 0.974 / 0.982x (page 64 / 256, D 64; GPU time,
//   outputs/experiments/20261129-masks-packed-persistent-chunked-prefill.json). The public op is not yet raced there.
// Measured: outputs/experiments/20261126-masks-fwd-v11.json; the paged gap: outputs/experiments/20261129-paged-prefill-gap.json.
// RING_CARRY (attn_mask_sm90.cuh MaskRingSlot): the paged kernels' ring has 3 stages at D = 128 and the contiguous
//   per-tile one 2. ncu's warp-state samples at page 256 (H200, outputs/driver_logs/20261130-h200-ring-carry-2c6f5d6/
//   A_profile): the paged consumer loop ran fewer instructions than the contiguous one yet 3.2 % more samples, at the
//   ping-pong turn and on the P V wgmma issue ('dispatch' 767 against 356), where the compiler had put (j - 1) % 3
//   and / 3 (a multiply-high and its fix-ups on the uniform datapath; with 2 stages a mask and a shift). Prediction:
//   the slot carried through the loop takes the paged kernel from 0.97 to 0.98-0.99x the contiguous one at D 128,
//   the packed persistent kernel (3 stages) gains alike, D 64 (no ping-pong) is unchanged. Outcome (GPU time, B_ab):
//   page 16 / 64 / 256 0.970 / 0.972 / 0.971 -> 0.980 / 0.984 / 0.981x, D 64 0.983 -> 0.980x (level); the packed
//   persistent kernel 3.6 % faster at 8 x 2048 D 128 (1.067 -> 1.030x the dense op's forward), 2.1 % at D 64, 1.0 %
//   on twelve documents; checks and the wrong builds as before, memcheck and racecheck clean. Through the public op,
//   chapter n16's session on it: 0.973 / 0.979 / 0.971x, D 64 0.971x (gate >= 0.95: met in every cell).
//   Record: outputs/experiments/20261130-masks-fwd-ring-carry.json.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"
#include "common/hopper/attn_mask_sm90.cuh"

#ifndef LAB_FWD_MASK_BUG_NO_WINDOW
#define LAB_FWD_MASK_BUG_NO_WINDOW 0  // the deliberately wrong build (drops the window), as v08's and v09's
#endif
#ifndef LAB_FWD_MASK_BUG_IGNORE_TABLE
#define LAB_FWD_MASK_BUG_IGNORE_TABLE 0  // the wrong paged build: page key / page_size, the block table ignored
#endif

// Candidates (timed and checked before they can be the default: outputs/experiments/20261126-masks-v11-candidates.json):
// STAGES at D = 128: 3 is fwd v07's few-keys config (B_c 128, 3 stages: Q 32 + 3 x 64 = 224 KiB).
#ifndef LAB_FWD_MASK_OVERLAP_D128_STAGES
#define LAB_FWD_MASK_OVERLAP_D128_STAGES 2
#endif
// CAP_POLY: the bf16 softcap's fixed-offset softmax takes exp2 on the FMA pipe for every N-th n8 block (0: none):
// the tanh and the exp2 of each score otherwise both issue on the MUFU unit, about the tensor core's time at D = 128.
// Off: 2 gains 3-6 % at D = 128 and loses 3 % at D = 64, and as the default it left one gradient check over its
// tolerance (the header's softcap paragraph).
#ifndef LAB_FWD_MASK_CAP_POLY
#define LAB_FWD_MASK_CAP_POLY 0
#endif
// CAP_TANH_HALF: the bf16 softcap's tanh on fp16 pairs (common/mask.cuh tanh_pair, as bwd v08's default): one MUFU
// issue per two scores. With CAP_POLY = 2 the MUFU issues per score fall from 1.5 to 1.0, the plain kernel's count.
#ifndef LAB_FWD_MASK_CAP_TANH_HALF
#define LAB_FWD_MASK_CAP_TANH_HALF 0
#endif
// Paged K/V (the header's paged paragraphs). PAGED_D128_STAGES / PAGED_D64_STAGES: the paged kernels' own ring
// depth: 3 at D = 128 (224 KiB) hides more of each tile's TMA latency, +5 % at pages 64 / 256 (D = 64 keeps
// 3: 5 lost 4 %). With the four issuing warps and the walk, 2 at D = 128 again (H200, GPU time): -0.8 % at page
// 16, level at 64, -0.3 % at 256, so 3 stays (outputs/experiments/20261129-paged-d128-two-stages.json).
#ifndef LAB_FWD_MASK_PAGED_D128_STAGES
#define LAB_FWD_MASK_PAGED_D128_STAGES 3
#endif
#ifndef LAB_FWD_MASK_PAGED_D64_STAGES
#define LAB_FWD_MASK_PAGED_D64_STAGES 3
#endif
// PAGED_ISSUE_WARPS: the producer warps that issue a paged tile's TMA boxes (1, 2, 4): box b of a tile by warp b % W,
// lane b / W, each warp after its own empty wait; lane 0 of warp 0 alone sets the stage's expected bytes (the whole
// tile, as before: another warp's boxes may complete first, which only takes the barrier's tx-count below zero while
// its one arrival is still pending, so the phase cannot complete early). Why: a TMA issue takes its coordinates from
// uniform registers, so a warp whose lanes hold different pages issues its boxes one lane at a time (a loop of R2UR
// and UTMALDG); page 16 is 8 boxes x D / 64 column blocks = 16 issues a K or V tile on one warp's scheduler, 4 on
// each of four. Prediction (H200, the race's cells, kernel GPU time against the contiguous call): page 16 0.83 ->
// 0.90-0.94x (the issue loop off the loads' path; what is left is the TMA unit's own cost of 2 KiB boxes), pages 64
// / 256 and D 64 unchanged within 1 % (1-2 boxes a tile: one or two warps issue, as before one lane each).
// Measured (the header's last outcome): page 16 0.831 -> 0.970x with 4 warps (2 warps: 0.966), the rest within 1 %.
#ifndef LAB_FWD_MASK_PAGED_ISSUE_WARPS
#define LAB_FWD_MASK_PAGED_ISSUE_WARPS 4
#endif
static_assert(LAB_FWD_MASK_PAGED_ISSUE_WARPS == 1 || LAB_FWD_MASK_PAGED_ISSUE_WARPS == 2 ||
                  LAB_FWD_MASK_PAGED_ISSUE_WARPS == 4,
              "the producer warpgroup has four warps: 1, 2 or 4 issue the paged boxes");
// PAGED_CONSUMER_SCAN: where a CTA scans its sequence's block table for pages outside [0, num_pages). 0 (the form
// before): all 384 threads, before the barriers are set up and before any load (paged_table_bits), so the producer's
// first TMA issue waits for the scan's loads and the CTA-wide barrier. 1: the too-short table (no load) is still
// decided first; the pages are scanned by the 256 consumer threads while the producer issues Q and the first tiles
// (paged_table_bad: a named-barrier OR that the producer does not join), and a bad sequence's verdict is applied at
// the epilogue (O = 0, LSE = -inf, as before). Meanwhile its loads are safe: a page index outside the map is a TMA box
// out of bounds (zeros, full byte count), and the consumers drain every tile, so no copy is in flight at exit.
// Why (H200, ncu --set full of lab.masks.gpu_paged.profile_calls at a547f00; outputs/driver_logs/
// 20261129-h200-paged-scan-profile-a547f00): at page 256 the paged kernel executes the contiguous one's instructions
// (133.0 M against 132.8 M) and the same tensor-pipe cycles, yet runs 413 us against 403; its extra warp samples
// (43,387 against 42,168) sit on the scan: 1,632 at the VOTEU after __syncthreads_or (1,446 of them 'barrier'),
// 3.8 % of all samples, which the contiguous kernel has not. Prediction: -2.5-3.5 % of the paged kernels' time.
// Outcome (H200, GPU time against the contiguous call, two passes; outputs/driver_logs/20261129-h200-paged-consumer-
// scan-14fb368): +0.1-0.6 % in every cell (D 128 page 16 0.963 / 0.965 -> 0.969 / 0.969, D 64 page 64 0.974 / 0.972
// -> 0.980 / 0.977): those warps would have waited for the first tile anyway. Kept as the default; checks, memcheck
// and racecheck clean. Record: outputs/experiments/20261129-paged-consumer-scan.json.
#ifndef LAB_FWD_MASK_PAGED_CONSUMER_SCAN
#define LAB_FWD_MASK_PAGED_CONSUMER_SCAN 1
#endif
// PACKED_PERSIST: causal packed self-attention calls (cu_seqlens, no block table, no window, max_seqlen_q ==
// max_seqlen_k; the launcher's rule) on a persistent grid in fwd v07's PAIR order with FUSE
// (common/hopper/attn_mask_packed_sm90.cuh); other packed calls and 0: one CTA per (sequence, head, query tile).
// H200: 8 x 2048 D 128 0.884x the per-tile grid's time, 1.035x the dense op's forward (was 1.17x); D 64 1.13x
// (was 1.33x); twelve uneven documents 0.957x (outputs/experiments/20261129-masks-varlen-packed-persistent.json).
// PACKED_D128_STAGES: its ring at D = 128 (3: v07's few-keys config, 224 KiB; nothing staged through shared memory).
#ifndef LAB_FWD_MASK_PACKED_PERSIST
#define LAB_FWD_MASK_PACKED_PERSIST 1
#endif
#ifndef LAB_FWD_MASK_PACKED_D128_STAGES
#define LAB_FWD_MASK_PACKED_D128_STAGES 3
#endif

namespace {
using namespace lab::sm90;

template <int D_, int STAGES_, bool PINGPONG_, int L2_GROUP_MB_>
struct Cfg11 {
  static constexpr int D = D_;
  static constexpr int kConsumers = 2;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int BC = 128;
  static constexpr int kStages = STAGES_;
  static constexpr bool kPingPong = PINGPONG_;
  static constexpr int kL2GroupMB = L2_GROUP_MB_;  // 0: longest first over the whole grid
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = 24, kRegsConsumer = 240;
  static constexpr int kQBytesWG = 64 * D * 2;
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem + 128 <= 227 * 1024, "shared memory budget exceeded");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
  // Named barriers: 1..2 the consumers' epilogues, 4..5 their turns (ping-pong), 6 both consumers (paged tail),
  // 7 both consumers (PAGED_CONSUMER_SCAN's OR).
};
// D = 64: no ping-pong (v07: -1 to +2 %) and no L2 groups (v07: -7 to 0 % at D = 64).
using Cfg64 = Cfg11<64, 3, false, 0>;
using Cfg128 = Cfg11<128, LAB_FWD_MASK_OVERLAP_D128_STAGES, true, 16>;
// The paged kernels' configs: the same but for the ring depth (the same types, and kernels, at the defaults).
using Cfg64Paged = Cfg11<64, LAB_FWD_MASK_PAGED_D64_STAGES, false, 0>;
using Cfg128Paged = Cfg11<128, LAB_FWD_MASK_PAGED_D128_STAGES, true, 16>;
// The packed persistent kernel's configs (common/hopper/attn_mask_packed_sm90.cuh: no L2 groups, PAIR's units).
using Cfg64Packed = Cfg11<64, 3, false, 0>;
using Cfg128Packed = Cfg11<128, LAB_FWD_MASK_PACKED_D128_STAGES, true, 0>;

// The packed persistent kernel (after the switches and Transform it reads, inside this file's namespace).
#include "common/hopper/attn_mask_packed_sm90.cuh"

template <class Cfg, class T, int kTransform, bool kPaged>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v11_kernel(const __grid_constant__ CUtensorMap tq,
                                                                        const __grid_constant__ CUtensorMap tk,
                                                                        const __grid_constant__ CUtensorMap tv,
                                                                        const AttnMaskParams mp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kBounded = kTransform == kTanhBounded, kCap = kTransform == kTanh || kBounded;
  const AttnFwdParams& p = mp.base;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], empty_k[kStages], empty_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring = smem_ring<Cfg>(smem);
  const bool packed = mp.cu_seqlens_q != nullptr;

  // Prologue: the work tile. Query blocks longest first (a right edge makes later blocks heavier) within groups
  // of heads whose window of K and V fits kL2GroupMB (v07's causal order, with the window's keys per head).
  const int2 tile = masked_l2_tile<Cfg>(mp);
  const int mb = tile.x, bh = tile.y;
  const int b = bh / p.heads_q, h = bh % p.heads_q, hkv = h / (p.heads_q / p.heads_kv);
  int q0 = 0, k0 = 0, seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k, off = mp.diag_offset;
  if (packed) {  // clamped: no cu_seqlens value reads or writes outside the packed tensors
    const int qa = min(max(mp.cu_seqlens_q[b], 0), mp.total_q), qb = min(max(mp.cu_seqlens_q[b + 1], qa), mp.total_q);
    const int ka = min(max(mp.cu_seqlens_k[b], 0), mp.total_k), kb = min(max(mp.cu_seqlens_k[b + 1], ka), mp.total_k);
    q0 = qa;
    k0 = ka;
    seqlen_q = min(qb - qa, p.seqlen_q);
    seqlen_k = min(kb - ka, p.seqlen_k);
    off = seqlen_k - seqlen_q;
  }
  // Paged K/V: keys by block table from key 0 of the sequence (its cu_seqlens_k rows are not read); a bad table
  // zeroes the sequence's rows here (O = 0, LSE = -inf: no key, no sink) and sets its flag, which CTA (mb 0, h 0)
  // writes on every call. The bits leave every other value alone: derived from __syncthreads_or, they are not
  // uniform to the compiler, and a key count derived from them put the main loop's descriptors in vector registers
  // (an R2UR before each wgmma: the paged call ran at 0.82x the packed one on the same tiles).
  const int32_t* table = kPaged ? mp.block_table + (int64_t)b * mp.block_table_stride : nullptr;
  T* const o_seq = static_cast<T*>(p.o) + (int64_t)h * p.o_stride[1] + (int64_t)q0 * p.o_stride[2];
  float* const lse_seq = p.lse == nullptr ? nullptr : p.lse + (int64_t)h * mp.total_q + q0;
  if constexpr (kPaged) {
    k0 = 0;
    // PAGED_CONSUMER_SCAN: here only the too-short table (no load, no barrier), and the table of a sequence with no
    // rows in this CTA, which CTA (mb 0, h 0) still reports; the pages of the rest are the consumers' (below).
    const bool early = LAB_FWD_MASK_PAGED_CONSUMER_SCAN == 0 || mb * Cfg::BR >= seqlen_q ||
                       (int64_t)seqlen_k > (int64_t)mp.max_pages * mp.page_size;
    if (early) {
      const int page_bits = paged_table_bits(mp, table, seqlen_k);
      if (mb == 0 && h == 0 && threadIdx.x == 0) mp.page_errors[b] = page_bits;
      if (page_bits) {
        if (mb * Cfg::BR < seqlen_q)
          paged_zero_rows<D, T>(o_seq, p.o_stride[2], lse_seq, mb * Cfg::BR, min(mb * Cfg::BR + Cfg::BR, seqlen_q));
        return;
      }
    }
  }
  const int m0 = mb * Cfg::BR;
  if (m0 >= seqlen_q) return;  // the whole CTA, before any barrier or load
  const int left = LAB_FWD_MASK_BUG_NO_WINDOW ? -1 : mp.window_left;
  const int right = LAB_FWD_MASK_BUG_NO_WINDOW ? (mp.window_right == 0 ? 0 : -1) : mp.window_right;
  const int2 tiles = window_tiles<BC>(m0, min(m0 + Cfg::BR, seqlen_q), seqlen_k, off, left, right);
  const int n_tiles = tiles.y, shift = tiles.x * BC;
  const int bq = packed ? 0 : b;  // the maps' batch coordinate
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) init_split_barriers<Cfg>(&bar_q, bar_k, bar_v, empty_k, empty_v);
  __syncthreads();

  if (wg == 0) {
    // Producer (v07's, over the window's tiles only)
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if constexpr (kPaged) {
      // PAGED_ISSUE_WARPS warps: box b of each tile is issued by warp b % W, lane b / W, which reads the page of box
      // b of the next one. Each lane walks its box's (table slot, row in page) by a fixed step a tile (one division
      // in the prologue, none in the loop), so after each empty wait only the TMA issue is left (a division there put
      // ~0.1 us a tile on the loads' path).
      constexpr int W = LAB_FWD_MASK_PAGED_ISSUE_WARPS;
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, box = lane * W + warp;
      const int rows = paged_box_rows(mp.page_size, BC), boxes = BC / rows;
      if (warp >= W || warp >= boxes) return;  // (warp 0 holds box 0: it always stays)
      const bool leader = threadIdx.x == 0;
      if (leader) {
        tma_prefetch_maps(&tq, &tk, &tv);
        load_q_consumers<Cfg>(ring.q, &tq, smem_u32(&bar_q), q0 + m0, h, 0);
      }
      const int ps = mp.page_size, step_slots = BC / ps, step_rows = BC - step_slots * ps;
      int key = shift + box * rows, slot = key / ps, in_page = key - slot * ps;
      auto fetch = [&]() {  // the page of this lane's box at `key`; num_pages (outside the map) past the keys
        if (box >= boxes || key >= seqlen_k) return mp.num_pages;
        return LAB_FWD_MASK_BUG_IGNORE_TABLE ? slot : __ldg(table + slot);
      };
      auto advance = [&]() {
        key += BC;
        slot += step_slots;
        in_page += step_rows;
        if (in_page >= ps) {  // step_rows < ps: at most one carry
          in_page -= ps;
          ++slot;
        }
      };
      int page = fetch(), row = in_page;
      advance();
      MaskRingSlot<kStages> tile = MaskRingSlot<kStages>::of(0);  // (tile.at(j): tile j's ring slot)
      for (int j = 0; j < n_tiles; ++j) {
        const auto at = tile.at(j);
        const int s = at.stage;
        const int next = fetch(), next_row = in_page;
        advance();
        const uint32_t free_parity = at.parity ^ 1;
        if (j >= kStages) mbar_wait(smem_u32(&empty_k[s]), free_parity);
        if (leader) mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
        __syncwarp();
        if (box < boxes)
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring.k(s) + cb * BC * 128 + box * rows * 128, &tk, smem_u32(&bar_k[s]), cb * 64, row, hkv,
                        page);
        if (j >= kStages) mbar_wait(smem_u32(&empty_v[s]), free_parity);
        if (leader) mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
        __syncwarp();
        if (box < boxes)
#pragma unroll
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring.v(s) + cb * BC * 128 + box * rows * 128, &tv, smem_u32(&bar_v[s]), cb * 64, row, hkv,
                        page);
        page = next;
        row = next_row;
        tile.next();
      }
    } else if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      load_q_consumers<Cfg>(ring.q, &tq, smem_u32(&bar_q), q0 + m0, h, bq);
      produce_kv<Cfg>(ring, &tk, &tv, bar_k, bar_v, empty_k, empty_v, n_tiles, k0, shift, hkv, bq);
    }
    return;
  }

  // Consumers
  setmaxnreg_inc<Cfg::kRegsConsumer>();
  const int ct = threadIdx.x - 128 * wg;
  bool table_bad = false;  // PAGED_CONSUMER_SCAN's verdict, applied at the epilogue
  if constexpr (kPaged && LAB_FWD_MASK_PAGED_CONSUMER_SCAN != 0) {
    table_bad = paged_table_bad(mp, table, seqlen_k, threadIdx.x - 128, 128 * Cfg::kConsumers, 7);
    if (mb == 0 && h == 0 && threadIdx.x == 128) mp.page_errors[b] = table_bad ? LAB_PAGE_E_INDEX : 0;
  }
  const uint32_t sQw = ring.q + (wg - 1) * Cfg::kQBytesWG;
  const int wm0 = m0 + 64 * (wg - 1), wm1 = max(min(wm0 + 64, seqlen_q), wm0 + 1);
  const int row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
  const int k_end = seqlen_k - shift, k_off = off - shift;  // the window's keys, from its first tile
  // The softmax's exp2 factor (> 0, so the max may be taken on the transformed scores: folded form) and the
  // transform before it: softcap tanh(s scale / softcap) with factor softcap log2 e; a scale <= 0 multiplied first.
  const float c = kCap ? mp.softcap * kLog2e : kTransform == kScale ? kLog2e : p.scale * kLog2e;
  const float tk_factor = kCap ? p.scale / mp.softcap : p.scale;
  float o[D / 2];
  zero_acc(o);
  RowState st;
  if constexpr (kBounded) st.m[0] = st.m[1] = c - kCapHeadroom;  // the fixed offset (kCapHeadroom)
  float sacc[BC / 2], alpha[2];
  uint32_t pa[BC / 16][4];
  using Slot = MaskRingSlot<kStages>;  // (the ring slot of a key tile: RingSlot::of(j), or carried)
  auto wait_k = [&](Slot x) { ring_wait(bar_k, x); };
  auto wait_v = [&](Slot x) { ring_wait(bar_v, x); };
  auto release_k = [&](Slot x) { ring_release(empty_k, x, ct); };
  auto release_v = [&](Slot x) { ring_release(empty_v, x, ct); };
  // The softmax step of tile j (masked_softmax_step, common/hopper/attn_mask_sm90.cuh); returns whether O needs
  // rescale_o.
  auto softmax = [&](int j) -> bool {
    return masked_softmax_step<BC, T, kTransform, LAB_FWD_MASK_CAP_TANH_HALF != 0, LAB_FWD_MASK_CAP_POLY>(
        sacc, st, alpha, c, tk_factor, j, wm0, wm1, row0, k_end, k_off, left, right);
  };
  // Ping-pong (D = 128): each consumer takes n_tiles + 1 turns; the last one hands out the first.
  constexpr bool kPing = Cfg::kPingPong;
  const int next_wg = wg % Cfg::kConsumers + 1;
  auto turn = [&]() {
    if constexpr (kPing) named_barrier_sync(3 + wg, 256);
  };
  auto pass = [&]() {
    if constexpr (kPing) named_barrier_arrive(3 + next_wg, 256);
  };
  if (kPing && wg == Cfg::kConsumers && n_tiles > 0) named_barrier_arrive(3 + 1, 256);
  mbar_wait(smem_u32(&bar_q), 0);

  if (n_tiles > 0) {
    wait_k(Slot::of(0));
    turn();
    wgmma_fence();
    issue_qk<D, BC, kBf16>(sacc, sQw, ring.k(0));
    pass();
    wgmma_wait<0>();
    reg_fence(sacc);
    release_k(Slot::of(0));
    softmax(0);  // O is still 0: no rescale
    pack_p<BC, T>(sacc, pa);
  }
  // Main loop: S_j and P_{j-1} V_{j-1} in flight together, the softmax of S_j (transform, mask, exp) under P V.
  // [lab:inner-loop] v07's overlapped key tile with v09's mask steps
  Slot ks = Slot::of(1), vs = Slot::of(0);  // K_j's and V_{j-1}'s slots (RingSlot::at: carried, or derived from j)
  for (int j = 1; j < n_tiles; ++j) {
    auto kj = [&] { return ks.at(j); };
    auto vj = [&] { return vs.at(j - 1); };
    wait_k(kj());
    wait_v(vj());
    turn();
    wgmma_fence();
    issue_qk<D, BC, kBf16>(sacc, sQw, ring.k(kj().stage));
    issue_pv<D, BC, kBf16>(o, pa, ring.v(vj().stage));
    pass();
    wgmma_wait<1>();
    reg_fence(sacc);
    release_k(kj());
    const bool rescale = softmax(j);
    wgmma_wait<0>();
    reg_fence(o);
    release_v(vj());
    if (rescale) rescale_o<D>(o, alpha);
    pack_p<BC, T>(sacc, pa);
    vs = ks;
    ks.next();
  }
  // [/lab:inner-loop]
  if (n_tiles > 0) {
    wait_v(Slot::of(n_tiles - 1));
    if constexpr (kPaged) {  // the last tile's rows past the keys: zeros, not the rest of the page (zero_tile_rows)
      const int tail = seqlen_k - shift - (n_tiles - 1) * BC;
      if (tail < BC) {
        const uint32_t v_tile = ring.v((n_tiles - 1) % kStages);
        zero_tile_rows<D, BC>(smem + (v_tile - smem_u32(smem)), tail, threadIdx.x - 128, 128 * Cfg::kConsumers);
        named_barrier_sync(6, 128 * Cfg::kConsumers);
      }
    }
    turn();
    wgmma_fence();
    issue_pv<D, BC, kBf16>(o, pa, ring.v((n_tiles - 1) % kStages));
    pass();
    wgmma_wait<0>();
    reg_fence(o);
    release_v(Slot::of(n_tiles - 1));
  }
  if (kPing && wg == 1 && n_tiles > 0) turn();  // consumes the last warpgroup's last pass

  if constexpr (kPaged && LAB_FWD_MASK_PAGED_CONSUMER_SCAN != 0)
    if (table_bad) {  // every tile was drained above: no copy is in flight
      paged_zero_rows<D, T>(o_seq, p.o_stride[2], lse_seq, wm0, max(min(wm0 + 64, seqlen_q), wm0), ct, 128);
      return;
    }
  // Epilogue: the sink joins the normaliser; O rows of this sequence only, staged in this warpgroup's Q tile.
  epilogue_masked<D, T>(o, st, mp, packed, b, bq, h, q0, seqlen_q, smem + (wg - 1) * Cfg::kQBytesWG, wm0, wg);
#endif
}

template <class Cfg, class T, int kTransform>
int launch(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  using PCfg = std::conditional_t<Cfg::D == 64, Cfg64Paged, Cfg128Paged>;
  if (mp.block_table != nullptr)
    return launch_masked_fwd<PCfg, attn_fwd_v11_kernel<PCfg, T, kTransform, true>>(mp, stream, dev);
  using KCfg = std::conditional_t<Cfg::D == 64, Cfg64Packed, Cfg128Packed>;
  // The persistent grid only where it was measured to win: causal packing of self-attention (max_seqlen_q ==
  // max_seqlen_k, no window), where query tiles differ in work and the PAIR order balances them. On chunked prefill
  // (512 queries after 7680 cached keys a sequence: tiles of near-equal work) it ran 3.5-7 % behind the per-tile
  // grid, which the hardware schedules as well; windowed and non-causal packing were never timed on it.
  if constexpr (LAB_FWD_MASK_PACKED_PERSIST != 0)
    if (mp.cu_seqlens_q != nullptr && mp.base.seqlen_q == mp.base.seqlen_k && mp.window_left < 0 &&
        mp.window_right == 0)
      return launch_packed_persistent<KCfg, attn_fwd_v11_packed_kernel<KCfg, T, kTransform>>(mp, stream, dev);
  return launch_masked_fwd<Cfg, attn_fwd_v11_kernel<Cfg, T, kTransform, false>>(mp, stream, dev);
}

template <class Cfg, class T>
int launch_by_transform(const AttnMaskParams& mp, cudaStream_t stream, int dev) {
  return lab::sm90::launch_by_transform<T>(mp,
                                           [&](auto k) { return launch<Cfg, T, decltype(k)::value>(mp, stream, dev); });
}

}  // namespace

// v09's checks (mask_fwd_go), then the tile by head dim and the kernel by dtype and transform.
extern "C" int attn_fwd_v11(const AttnMaskParams* p, void* stream) {
  int dev = 0, rc = 0;
  if (!mask_fwd_go(p, &dev, &rc, true)) return rc;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  const bool bf16 = p->base.dtype == LAB_BF16;
  if (p->base.head_dim == 64)
    return bf16 ? launch_by_transform<Cfg64, __nv_bfloat16>(*p, st, dev) : launch_by_transform<Cfg64, __half>(*p, st, dev);
  return bf16 ? launch_by_transform<Cfg128, __nv_bfloat16>(*p, st, dev) : launch_by_transform<Cfg128, __half>(*p, st, dev);
}
