// v13_fp8: the FP8 forward on Hopper (sm_90a): e4m3 Q, K, V with FlashAttention-3's descales, bf16 O, fp32 LSE.
//
// What is new against v05 / v07 (whose TMA ring, and v07's producer and two consumer warpgroups, it keeps):
// - S_ij = Q_i K_j^T by wgmma m64n{B_c}k32 e4m3 x e4m3 (SS: both K-major, Q and K rows are D-contiguous), scaled
//   by scale * dq * dk (x ~= x_fp8 * descale: the descales fold into the softmax scale, as FA3 does).
// - P V: FP8 wgmma reads B K-major only, so V must arrive as V^T (D rows of keys). A pass before the kernel
//   (fp8_vt_regs_kernel, or fp8_vt_kernel with LAB_FWD_FP8_VT = 1: common/hopper/attn_fp8_sm90.cuh) writes V^T into a (B, H_kv, D, S_k rounded up to 128)
//   e4m3 workspace, zero past S_k, with the keys of each 32-key block permuted (key_of_column) so that P's fp32
//   accumulator packs into the e4m3 A fragments of m64n{D}k32 in registers with no lane exchange (the
//   layouts: the common header). FA3 transposes in the producer (ldmatrix / stmatrix); here that is the next
//   step. The pass's cost (lab.fp8.checks.vt_pass_share, H200, outputs/driver_logs/20261129-h200-batch2-
//   f58d500e62/T4): 31 us of 754 us (4.1 %) at B 4, H 16, S 4k, D 128; 11 us of 1.40 ms (0.8 %) at GQA 16 / 4,
//   S 8k; 12 % of a small call (B 1, H 4, S 4k causal: 6.6 of 55 us).
// - P is stored as e4m3(P * p_scale), p_scale = 448 (lab/fp8/emulate.py's P_SCALE, cuDNN's scale_s): the
//   offset log2(p_scale) is folded into the running max, so exp2 gives P * p_scale directly and l carries the
//   same factor; O = acc / l * dv, LSE exact (attn_fp8_sm90.cuh's softmax_e4m3).
// - wgmma e4m3 sums S in a ~13-bit accumulator: each k32 step's products and the running sum are cut to the
//   13 bits below the largest of them. lab/fp8/emulate.py models it (s_accumulator="fp22-align") and predicts
//   this kernel's LSE error on outlier inputs to four digits (2.4292 vs 2.4293); cuDNN FP8 shares the hardware.
//
// Algorithm (per consumer warpgroup: 64 query rows of Q_i; B_r = 128 per CTA, 64 in the one-warpgroup build):
//   for j: S = Q8 K8_j^T; x = S * scale * dq * dk * log2 e; mask; m_new = max(m, rowmax x);
//          P = exp2(x - m_new + log2 p_scale); l = l * exp2(m - m_new) + rowsum P;
//          O = O * exp2(m - m_new) + e4m3(P) V8_j   (e4m3(P) V8_j in an accumulator of its own, added in float32:
//                                                    LAB_FWD_FP8_PV_PROMOTE, below, says why)
//   O = O / l * dv (bf16); LSE = (m + log2 (l / p_scale)) ln 2.
// LAB_FWD_FP8_OVERLAP (1, default): FA3's intra-warpgroup overlap: S_{j+1} is issued before P_j V_j, and
// softmax j+1 runs while P_j V_j is in flight; 0: each GEMM waited for before the softmax (v05's order).
//
// Launch: the V^T pass (grid vt_cols / 128 x B H_kv x D / 64, 256 threads), then ceil(S_q / B_r) * B * H_q work
// tiles (query block fastest; causal: heaviest block of each head first): one CTA each for the one-warpgroup
// kernel, min(tiles, SMs) persistent CTAs for the warp-specialised one (LAB_FWD_FP8_PERSISTENT). Warp-specialised
// (default at D 128 / 256):
// 384 threads, Q 128 D + stages * (B_c D (K) + D B_c (V^T)) bytes: D 128 (B_c 192, 4 stages) 209 KiB, D 256
// (B_c 128, 2 stages) 161 KiB (D 64, B_c 128, 4 stages: 73 KiB). One warpgroup (default at D 64): 128 threads,
// 64 D + stages * 2 B_c D: D 64 / 128 (B_c 128, 3 stages) 53 / 105 KiB, D 256 (B_c 64, 2 stages) 81 KiB.
//
// Limits: sm_90 only; D 64, 128, 256; e4m3 inputs, bf16 output; any S_q, S_k >= 0; GQA; causal top-left;
// 16-byte aligned bases and strides in multiples of 16 bytes (lab.fp8.op copies anything else).
// LAB_FP8_BUG_NO_V_DESCALE: a wrong build on purpose (v_descale dropped), which lab.fp8.checks must fail.
//
// Prediction: wgmma e4m3 runs at twice bf16's rate, so the GEMMs take half of v05's time and the softmax
// (same work as bf16 per element) becomes the larger part: with 2-3 CTAs per SM, ~550-750 TFLOP/s at D 128,
// under cuDNN FP8's 978 (n15): the producer / consumer warpgroups of v07 are the next step.
// Outcome of the first default (H200, outputs/driver_logs/20261129-h200-batch3-7152d73448/T4, lab.fp8.race in rounds,
// public call with its V^T pass, TFLOP/s and x cuDNN FP8): D 128 S 4k 735 (0.76x), S 16k 797 (0.78x), causal
// S 8k 702 (0.75x), GQA 16 / 4 785 (0.78x), D 64 295 (0.90x; that cell contended: bf16 SDPA ran at 299 against
// 493 in outputs/driver_logs/20261129-h200-batch1-278998b0f8/T4), D 256 831 (0.85x, warp-specialised); 1.10-1.17x
// bf16 SDPA-cuDNN at D 128. The >= 1.0x target
// is not met. All 17 checks pass (O within 1.0x of the modelled emulation, under cuDNN FP8's error in every cell
// it runs, LSE within 2x the model's), and the wrong build fails.
// First outcome, one-warpgroup build (H200, outputs/driver_logs/20261129-h200-batch1-278998b0f8/T4; every task's script
// ran at once on that GPU, so the times are indicative only): lab.fp8.race, TFLOP/s of the public call (V^T pass
// included) against cuDNN FP8 in the same rounds: D 128 S 4k 727 (0.75x), S 16k 796 (0.77x), causal S 8k 697
// (0.75x), D 64 494 (0.85x), D 256 772 (0.79x), GQA 16/4 775 (0.77x); 1.00-1.15x bf16 SDPA-cuDNN. Better than
// predicted. Accuracy: 15 of 17 checks within 1.0x of the emulation's error and under cuDNN FP8's (O bf16
// against its e4m3), LSE within 6e-4; the wrong build (no v_descale) fails; memcheck and racecheck clean. The
// two outlier checks failed against the float32-S emulation: wgmma e4m3 keeps a ~13-bit accumulator, which
// lab/fp8/emulate.py now models (s_accumulator). The V^T pass: 12 % of a B 1, H 4, S 4k causal call.
//
// The profile beside cuDNN FP8 (H200, ncu 2025.3 --set full --clock-control none, one launch each, B 4 H 16 S 4k
// D 128 and B 2 H 8 S 8k D 256; outputs/driver_logs/20261129-h200-batch4-b88a6be/S/prof.tgz: details, raw and
// SASS-source exports). cuDNN's kernel is cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f8_knob_32_
// 64x256x128 (D 256: knob_7_64x128x256): persistent (grid 132 = the SMs), 384 threads (a producer and two
// consumer warpgroups), 227 KiB of shared memory, 64 x 256 tiles at D 128 and 64 x 128 at D 256. Against it:
//                         D 128: ours (1 wg)  cuDNN     D 256: ours (ws, B_c 64)  cuDNN
//   duration                    761 us        561 us            1283 us           1113 us
//   tensor pipe                 38 %          53 %              46 %              53 %
//   MUFU (xu) pipe              40 %          55 %              24 %              28 %
//   issue slots busy            44 %          53 %              48 %              37 %
//   warps per scheduler         2.0           3.0               2.2               3.0
//   warp instructions           3.19e8        2.77e8            5.85e8            4.14e8
// Same MUFU count per score in both (~1.03), same FADD (2: the sum and the subtracted max) and FMNMX (~1.1).
// What differs: (1) cuDNN's key tile is 2x ours (256 / 128 at D 128, 128 / 64 at D 256), so O's rescale costs
// it half the FMULs per score: ours 2.0 FMUL per score at D 128 (21 % of our instructions) against its 1.6; at
// D 256 5.0 (29 %; 4 of them O's rescale) against its 3.1; (2) our wgmma descriptors were rebuilt per k32 step in
// the loop (ULOP3 / USHF / UMOV / UIADD3 / R2UR, 12 % of our instructions at D 128, 61 of the 618 of an
// unmasked tile per thread in the SASS), which cuDNN's loop has not; (3) cuDNN keeps 3 warps per scheduler on one
// persistent CTA where our two one-warpgroup CTAs give 2, and our stalls are fixed-latency dependencies
// ('wait', 1.1 cycles per issue) more than any pipe: neither the tensor pipe nor MUFU is saturated in either.
// Changes, one at a time (lab.fp8.race in rounds, same batch, TFLOP/s of the public call; the default then):
// LAB_FWD_FP8_FOLD (the scale in one FFMA, the max on raw S): D 128 S 4k 693 -> 738 (+6 %), S 16k +6 %, causal
// +7 %, D 64 509 -> 551 (+8 %), D 256 836 -> 868 (+4 %). + LAB_FWD_FP8_SKIP_RESCALE: D 256 868 -> 940 (+8 %),
// one-warpgroup D 128 -1 % (so the default skips in the warp-specialised kernel only). B_c 128 at D 256 (2
// stages): 836 -> 1039 (+24 %, 1.06x cuDNN's 984). D 128 warp-specialised with B_c 192 plus fold and skip: 751
// at S 4k (+8 %), 743 causal (+12 %), 878 at S 16k (+17 %). Rejected: B_c 64 with three CTAs per SM at D 128
// (645, -7 %: more CTAs, no more MUFU), B_c 192 one-warpgroup (661 / 692 with fold-skip, 2 stages), POLY 8 / 4
// on top of fold (-1 % / -6 % at D 64: the FMA pipe's polynomial costs more issue than MUFU saves), chains of 2
// (+0.4-1.4 %, within the noise of a rebuild). LAB_FWD_FP8_DESC (one add per k32 step) is the same descriptors
// with 41 fewer instructions per D 128 tile in the SASS; its own effect: the final race below.
// Outcome of the new default (LAB_FWD_FP8_WARPSPEC 3 and the knobs above; H200, alone on the GPU, lab.fp8.race in
// rounds with the old default and cuDNN FP8, outputs/driver_logs/20261129-h200-batch5-9c9667b/S): D 128 S 4k 746
// TFLOP/s (old 691, +8 %; 0.77x cuDNN FP8's 971), S 16k 871 (750, +16 %; 0.84x), causal S 8k 736 (660, +12 %;
// 0.79x), GQA 16 / 4 830 (730, +14 %; 0.82x), D 64 555 (509, +9 %; 0.96x), D 256 1205 (835, +44 %; 1.22x cuDNN's
// 984): the >= 1.0x target is met at D 256 only. 17 / 17 checks (the emulation at the default's key tile), the wrong
// build fails, memcheck and racecheck clean at D 64 / 128 / 256. One change each against it, same rounds:
// descriptors off -0.1 % at D 128, -0.8 % at D 256; skip off -4 % at D 256; the register V^T pass (LAB_FWD_FP8_VT =
// 2) +0.3-0.8 %; 2 chains +4 % at D 128 S 4k, +0.0 % at D 256; one warpgroup at D 128 +1.5 % at S 4k, -1 % causal.
// ncu of the new default: D 128 708 us (761 before), D 256 888 us (1283 before).
// Then 2 chains and the register V^T pass as the default (LAB_FWD_FP8_CHAINS 2, LAB_FWD_FP8_VT 2; H200, same
// rounds, outputs/driver_logs/20261129-h200-final-ca72b20/S): D 128 S 4k 783 (746 without, +5 %; 0.80x cuDNN
// FP8), S 16k 920 (+6 %; 0.89x), causal S 8k 775 (+5 %; 0.83x), GQA 16 / 4 884 (+5 %; 0.87x), D 64 563 (+1 %;
// 0.97x), D 256 1211 (+1 %; 1.24x). 17 / 17 checks, memcheck and racecheck clean. Still short of cuDNN at D 64 /
// 128; the profile's remaining differences: cuDNN's persistent grid and its 256-key tile at D 128 (ours spills at
// 240 registers with P of tile j - 1 live through softmax j; a ping-pong without the intra-warpgroup overlap frees it).
// Those two next (records 20261129-fwd-fp8-v13-persistent-pingpong-b256 and -b256-noncausal; predictions and H200
// outcomes at LAB_FWD_FP8_PERSISTENT, _WS_OVERLAP and _S_WRITE_ONLY below). The 256-key tile fits 240 registers
// unspilled only with P V waited for before S is issued, S's first k32 step write-only and a two-register mask; it
// then ran 0.998x the default at S 4k, 0.960x at 16k and 0.968x GQA (causal keeps B_c 192: -0.1 %):
// rejected. The persistent grid gained 0.6-3.3 % over a loop-carrying build whose descriptors had left the uniform
// datapath (-3.6-5.2 % against the previous kernel); the default now has no loop and runs as that kernel (H200
// final, outputs/driver_logs/20261129-h200-final-c4d12fc/X: 778 / 929 / 773 / 892 TFLOP/s at D 128 S 4k / 16k /
// causal 8k / GQA 16 / 4, 0.81 / 0.90 / 0.83 / 0.88x cuDNN FP8; D 64 560, 0.97x; D 256 1209, 1.23x; 0.999-1.005x
// the previous kernel in the same rounds; 17 / 17 checks, the wrong build fails, memcheck and racecheck clean).
// The >= 1.0x target still holds at D 256 only; a persistent grid that keeps its descriptors uniform is next.
// Then LAB_FWD_FP8_WARP_UNIFORM and the persistent grid as the default (H200, lab.fp8.race in rounds with the previous
// default's SASS and cuDNN FP8; outputs/driver_logs/20261129-h200-fp8-persist-packed-passes-942340c/X): D 128 S 4k 800
// TFLOP/s (previous 782, +2.3 %; 0.82x cuDNN FP8), S 16k 946 (+1.8 %; 0.91x), causal S 8k 791 (+1.6 %; 0.84x), GQA 16 /
// 4 915 (+2.7 %; 0.90x), D 64 581 (+3.0 %; 1.00x), D 256 1236 (+1.2 %; 1.25x). 19 / 19 checks (two new cells with more
// work tiles than SMs), the wrong build fails, memcheck and racecheck clean, O and LSE bit for bit the previous
// default's at every race shape. The target is met at D 256; D 64 ties cuDNN; D 128 is 0.82-0.91x.
//
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v13_fp8.cu
#include <cuda_bf16.h>

#include "common/hopper/attn_fp8_sm90.cuh"

#ifndef LAB_FWD_FP8_OVERLAP
#define LAB_FWD_FP8_OVERLAP 1
#endif
// LAB_FWD_FP8_WARPSPEC (3, default: warp-specialised at D 128 / 256, one warpgroup at D 64; 2: the same at D 256
// only, the default before the profile; 1: always; 0: never) runs v07's shape: a producer warpgroup (TMA
// only, 24 registers) and two consumer warpgroups (240 registers, 64 query rows each, B_r = 128) sharing each
// K / V tile, with `empty` barriers per stage and ping-pong turns (one warpgroup's GEMMs issue while the other
// runs its softmax), each consumer in the overlapped loop of LAB_FWD_FP8_OVERLAP = 1. Prediction: +15-25 % over
// the one-warpgroup kernel, as v06 -> v07 gave bf16. Outcome (H200, lab.fp8.race in rounds, outputs/driver_logs/
// 20261129-h200-batch3-7152d73448/T4; two other tasks' scripts shared the GPU): 0.86x the one-warpgroup kernel at
// D 128 (631 vs 735 TFLOP/s at S 4k, 687 vs 797 at 16k, 607 vs 702 causal 8k, 674 vs 785 GQA 16 / 4), 0.92x at
// D 64, 1.08x at D 256 (831 vs 770). Refuted at D 64 / 128: two or three one-warpgroup CTAs per SM already
// overlap one CTA's softmax with another's GEMMs, and with e4m3's half-time GEMMs the ping-pong turns serialise
// more than they hide (then not profiled; with B_c 192 and the fold it wins at D 128: the profile paragraph
// above). So 2 then: warp-specialised at D 256 only (one CTA of the one-warpgroup
// kernel fits per SM there). Both kernels: every check (17 cells and variants) passes, compute-sanitizer
// memcheck and racecheck clean (one warpgroup: outputs/driver_logs/20261129-h200-batch1-278998b0f8/T4; synccheck too,
// warp-specialised, D 128: outputs/driver_logs/20261129-h200-batch2-f58d500e62/T4).
// Rejected beside it (same race, warp-specialised): LAB_FWD_FP8_POLY 4 +1 % at D 128, -4 % at D 64; B_c 192 at
// D 128 / 256 at D 64 (LAB_FWD_FP8_WS_D*_BC) +3-7 % at D 128, still 0.91x the one-warpgroup kernel.
#ifndef LAB_FWD_FP8_WARPSPEC
#define LAB_FWD_FP8_WARPSPEC 3
#endif
// LAB_FWD_FP8_POLY (0: off; N: every N-th 8-column block of P takes exp2 on the FMA pipe, softmax_e4m3's kPoly).
#ifndef LAB_FWD_FP8_POLY
#define LAB_FWD_FP8_POLY 0
#endif
// LAB_FWD_FP8_FOLD (0: off; 1, default: softmax_e4m3's kFold wherever c > 0, a CTA-uniform test: the scale
// folds into one FFMA per score) and LAB_FWD_FP8_CHAINS (softmax_e4m3's kChains: independent max / sum chains per
// row; 2, default since the last race, with the register V^T pass: +5 % at D 128, +1 % at D 64 / 256).
#ifndef LAB_FWD_FP8_FOLD
#define LAB_FWD_FP8_FOLD 1
#endif
#ifndef LAB_FWD_FP8_CHAINS
#define LAB_FWD_FP8_CHAINS 2
#endif
// LAB_FWD_FP8_SKIP_RESCALE (0: off; 1: a warp whose rows all kept their running max, alpha = exp2(0) = 1, skips
// O's D / 2 multiplies per thread; one vote per tile, the result unchanged bit for bit; 2, default: in the
// warp-specialised kernel only, where it measured +8 % at D 256 (B_c 64) and the one-warpgroup kernel -1 %).
#ifndef LAB_FWD_FP8_SKIP_RESCALE
#define LAB_FWD_FP8_SKIP_RESCALE 2
#endif
// LAB_FWD_FP8_DESC (0: off; 1: the k32 steps' descriptors by desc_e4m3_step from one base per tile, which the
// loop-invariant Q base leaves outside the loop; the same descriptors, ~60 fewer uniform-datapath instructions
// per tile at D 128 (the address masks and shifts of desc_e4m3 per step, counted in the SASS)).
#ifndef LAB_FWD_FP8_DESC
#define LAB_FWD_FP8_DESC 1
#endif
// LAB_FWD_FP8_S_WRITE_ONLY (0, default; 1: S's first k32 step by ss0, D an output only). With ss() for every
// step S's accumulator is an input of the first ("+f", scale_d = 0 being a run-time predicate to the compiler),
// so S of tile j - 1 (already packed into P) stays live until S_j is issued: B_c / 2 registers held for nothing.
// Prediction: no change at B_c 192 (no spill there), and with LAB_FWD_FP8_WS_OVERLAP 2 the 256-key tile at
// D 128 without the 208 B spill. Outcome (ptxas, 13.0): with order 2 and the two-register mask (softmax_e4m3's
// kLimit) B_c 256 compiles without spills, with any one of the three missing it spills 196-252 B; alone it made
// D 256 spill 140 B under order 1. So the 256-key config takes all three (CfgWs::kWide), other tiles none.
#ifndef LAB_FWD_FP8_S_WRITE_ONLY
#define LAB_FWD_FP8_S_WRITE_ONLY 0
#endif
// LAB_FWD_FP8_WS_OVERLAP, the warp-specialised consumers' order per turn (1, default: FA3's intra-warpgroup
// overlap, S_j and P_{j-1} V_{j-1} issued, softmax j after S_j alone, P V in flight; 0: both GEMMs waited for
// before softmax j (the ping-pong between the two warpgroups is the only overlap); 2: P_{j-1} V_{j-1} issued and
// waited for, then S_j: P's 32 and S's B_c / 2 registers are never live at once, the 256-key tile's condition).
// Prediction: 0 and 2 lose 3-8 % at B_c 192 (the GEMMs' latency is no longer hidden inside a warpgroup); 2 with
// B_c 256 and S_WRITE_ONLY gains that back and more where O's rescale and the per-tile row reductions dominate
// (cuDNN's 256-key tile: 1.6 FMUL per score against our 2.0): +3-6 % at D 128 over the default.
// Outcome (H200, lab.fp8.race in rounds, outputs/driver_logs/20261129-h200-batch6-ed9df1b/X, against the default
// of the same build): 0 -7 to -10 % at D 128 and -2.6 % at D 256; 2 at B_c 192 -1.3 to -2.0 %; 2 at B_c 256
// (spill-free) +3.2 % at S 4k, +0.9 % at 16k, -0.1 % causal 8k, +1.0 % GQA 16 / 4. Intra-warpgroup overlap
// stays the order of B_c <= 192.
#ifndef LAB_FWD_FP8_WS_OVERLAP
#define LAB_FWD_FP8_WS_OVERLAP 1
#endif
// Rejected beside it: the row sum of P on the tensor pipe (8 rows under each V^T column block, e4m3 ones in the
// first, so that P V at N = 136 gives O's column 128 = rowsum(e4m3(P)) and the softmax drops its FADD chain; built
// at 99aa7ae). +0.8-1.5 % at D 128, and wrong: the FP8 wgmma accumulator loses the small increments of that growing
// all-positive sum (O's relative L2 6.6e-2 at 4k keys, 0.32 at 16k; LSE off by 1e-2 to 7e-2). Record
// 20261129-fwd-fp8-v13-rowsum-on-the-tensor-pipe.
// LAB_FWD_FP8_PV_PROMOTE (1, default: each key tile's P V into a fresh accumulator (rs0 at its first k32 step),
// added to O in float32 after its wait, at D 64 and 128; 0: P V accumulates into O across every key tile, the
// kernel before). Why: the FP8 wgmma accumulator adds each k32 step's products to the running sum at reduced
// precision, so a sum that grows with the keys loses its small increments. Zero-mean V (every check and race cell
// before) keeps O's running sums small; with V of mean 1 (randn + 1) O came out 5 % low at 4096 keys and 18 % low
// at 16384, cuDNN FP8 alike, where the float32 emulation is 0.2 % off (outputs/driver_logs/20261129-h200-fp8-v-mean-
// 3ae0da8). Per key tile the running sum spans B_c keys. At D 128 the second accumulator (64 registers) fits only
// under order 2 (S and P never live with it; B_c 192 under order 1 spilled 988 B), so promotion takes it there.
// Prediction and outcome (H200, outputs/driver_logs/20261129-h200-fp8-promote-7245939; record
// 20261129-fwd-fp8-v13-pv-promote): O's relative L2 with V = randn + 1 from 5.0e-2 / 1.8e-1 (4k / 16k keys) to
// 2.4e-3 / 2.3e-3 (predicted 2-4e-3; the emulation 2.1e-3 / 1.9e-3; cuDNN FP8 4.7e-2 / 1.8e-1), zero-mean V
// unchanged; the speed -6.5 % at S 4k, -9 % at 16k, -7 % causal, -8 % GQA 16 / 4 at D 128 (predicted -2 to -6 %:
// the 64 FADD a tile and order 2 cost more than order 2 alone) and -2.5 % at D 64 (predicted -2 to -5 %). 14 / 14
// checks at D 64 / 128. The default since: a silent 5-25 % error on inputs as ordinary as a V with a mean outweighs
// 6-9 % of speed.
#ifndef LAB_FWD_FP8_PV_PROMOTE
#define LAB_FWD_FP8_PV_PROMOTE 1
#endif
// LAB_FWD_FP8_PV_PROMOTE_D256 (1, default: the same at D 256, by parts of kPromotePart columns below; 0: unpromoted).
// Prediction (H200, the D 256 race cell and V = randn + mu): O's relative L2 with a V of mean 1 at 16k keys from
// 1.8e-1 to 2-3e-3; speed B_c 128 -10 to -25 % (424 B of spill in the loop), B_c 64 -20 to -30 %. Outcome
// (outputs/driver_logs/20261129-h200-fp8-promote-d256-0282b02; record 20261129-fwd-fp8-v13-pv-promote-d256):
// 2.1e-3 / 2.0e-3 (B_c 128 / 64; cuDNN FP8 1.9e-1); 929 and 905 TFLOP/s against the unpromoted 1206: -23 % / -25 %,
// 0.95x / 0.92x cuDNN FP8 (B_c 64 unpromoted alone: -16 %). B_c 128 the default: under cuDNN FP8's speed now, but
// 80x more accurate where V has a mean.
#ifndef LAB_FWD_FP8_PV_PROMOTE_D256
#define LAB_FWD_FP8_PV_PROMOTE_D256 1
#endif
// LAB_FWD_FP8_PERSISTENT (1, default since the uniform descriptors: the warp-specialised kernel on min(tiles, SMs)
// CTAs, each looping over work tiles t, t + grid, ...; the producer loads tile t + grid's Q and first K / V while the
// consumers finish tile t, as cuDNN's persistent FP8 kernel; 0: one CTA per work tile, no loop). One CTA per SM either
// way (209 KiB of shared memory), so the one-CTA-per-tile grid pays per tile a CTA launch, barrier set-up, Q's and
// K_0's load latency and an idle tensor pipe during the last P V and the epilogue. Prediction: the gap between S 4k
// (0.80x cuDNN) and S 16k (0.89x) at D 128 is mostly that per-tile cost (22 key tiles per query tile at 4k, 86 at 16k):
// +5-8 % at S 4k, +1-3 % at 16k, causal less certain (static striding: heavy and light tiles mix per CTA; FA3 schedules
// causal dynamically).
// 2: persistent for non-causal calls only (causal keeps one CTA per tile, which the hardware hands out as SMs free).
// 3: persistent with dynamic tiles (FA3's DynamicPersistentTileScheduler): a CTA's first tile is blockIdx.x, each
// next one gridDim.x + atomicAdd(tile_counter, 1), which the producer fetches a tile ahead and hands to the
// consumers in shared memory with Q (bar_q); tile_counter is zeroed by the V^T pass before. The order of the tiles
// stays the one-CTA-per-tile grid's (causal: heaviest query block of each head first), now taken as CTAs free, as
// the hardware hands out that grid's CTAs.
// Outcome (H200, as above): against the default of the same build, static +3.3 % at D 128 S 4k, +1.0 %
// at 16k, +0.6 % causal, +1.8 % GQA, +0.7 % at D 256; dynamic -1 to -3 % under static (the atomic and the hand-off
// in the producer's path); 17 / 17 checks on both, bit for bit the default's O and LSE. But the loop over tiles
// moved the ring's descriptors off the uniform datapath (an R2UR and a 64-bit add per wgmma inside the issue
// block that holds the ping-pong turn: 95 instructions against 61 at D 128), which cost the default build 3.6-5.2 %
// in every cell against the previous kernel file in the same rounds; so no persistent build beat it. The default
// now has no loop (one tile per CTA; its main loop's SASS within 1.5 % of the previous kernel's), key tile j in stage
// j % kStages in every build; the persistent builds still lose the uniform descriptors (issue block 122 at B_c
// 256), the open problem before this can be judged.
// Outcome with uniform descriptors (H200, lab.fp8.race in rounds against the one-CTA-per-tile grid of the same file;
// TFLOP/s medians, IQRs in the record 20261129-fwd-fp8-v13-uniform-persistent;
// outputs/driver_logs/20261129-h200-fp8-persist-packed-passes-942340c/X): static (1) +0.9 % at D 128 S 4k (800 / 793),
// +0.3 % at 16k (946 / 943), +0.2 % causal 8k (791 / 790, within the IQRs), +1.3 % GQA 16 / 4 (915 / 903), +0.9 % at D
// 256 (1236 / 1224): ahead in every cell it covers, so the default. Non-causal only (2): causal 792, the same as 1.
// Dynamic (3): -2.4 % at S 4k, -2.1 % at 16k, -4.2 % causal, -1.9 % GQA, -0.2 % D 256 against 1: rejected again. B_c
// 256 non-causal on the persistent grid: +2.3 % over 1 at S 4k (819), -0.4 % at 16k, -0.1 % GQA: not in every cell; a
// tile chosen by S_k would be its next test. The predictions: the uniform descriptors' part came out +1.3-1.5 % at D
// 128 (predicted 0-2), +0.3 % at D 256 (1-3), +3.0 % at D 64 (1-3); the persistent grid's under its earlier 0.6-3.3 %
// at S 4k (0.9 against 1-3), so +2.3 % over the previous default at S 4k where +3-6 % was predicted.
#ifndef LAB_FWD_FP8_PERSISTENT
#define LAB_FWD_FP8_PERSISTENT 1
#endif
// LAB_FWD_FP8_WARP_UNIFORM (1, default; 0: the kernel before): a warp's first query row (both kernels) and the
// warp-specialised kernel's warpgroup index are taken from lane 0 by a shuffle (uniform_in_warp). ptxas does not
// treat threadIdx.x / 32 as the same in every lane, so the mask test of each key tile (tile_needs_mask on the
// warp's first row) was a branch that might diverge, and in a loop around it the wgmma descriptors left the uniform
// datapath: ring stage, Q and K / V^T bases in vector registers, an R2UR pair and a 64-bit vector add per wgmma.
// The persistent grid's loop over tiles showed it (issue block of the ping-pong turn at D 128: 95 instructions,
// 25 R2UR; 122 at B_c 256); the default grid kept most descriptors uniform but not Q's.
// The persistent grid also keeps its three descriptor bases through an empty asm (the consumers' s_gemm / pv_gemm).
// SASS (sm_90a, nvcc 13.0; the main loop's issue block, from the turn's BAR.SYNC to its BAR.ARV; before -> after):
//   D 128 (B_c 192)  default 59 -> 42 instructions (9 R2UR -> 0), persistent 95 -> 46 (25 R2UR -> 0)
//   D 256 (B_c 128)  default 104 -> 61 (17 R2UR -> 0), persistent 113 -> 62 (35 -> 0)
//   D 128 (B_c 256)  default 81 -> 59 (9 R2UR -> 0), persistent 122 -> 56 (32 -> 0)
//   D 64 (one warpgroup): the kernel 4712 -> 4264 instructions, R2UR 26 -> 6, none between the wgmma fences.
// tests/fp8/test_uniform_descriptors.py holds the turns to no R2UR. WARP_UNIFORM 0 with PERSISTENT 0: the SASS of
// the default before, exactly.
// Prediction (written before the H200 run; lab.fp8.race in rounds, public call, against WARP_UNIFORM 0 = the
// previous default (PERSISTENT 0 then), SASS identical to it): the default +0-2 % at D 128 (a 17-instruction shorter turn per key
// tile), +1-3 % at D 256 and D 64; the static persistent grid (LAB_FWD_FP8_PERSISTENT 1) over the new default by
// its own measured margin, +1-3 % at D 128 S 4k, +0-1 % at 16k, -1 to +1 % causal, +1-2 % GQA, +0-1 % at D 256,
// so +3-6 % over the previous default at S 4k; the dynamic one (3) 1-3 % under the static one (the atomic and
// the hand-off; ptxas: 24 / 108 B of spill stores at D 128 / 256, 20 / 144 B before); B_c 256 persistent +0-4 %
// at S 4k and under the default at 16k (its non-overlapped order). Same O and LSE bit for bit in every B_c 192
// build.
#ifndef LAB_FWD_FP8_WARP_UNIFORM
#define LAB_FWD_FP8_WARP_UNIFORM 1
#endif

namespace {
using namespace lab::sm90;

constexpr bool kWarpUniform = LAB_FWD_FP8_WARP_UNIFORM != 0;  // uniform_in_warp (common/hopper/attn_fp8_sm90.cuh)

template <int D_, int BC_, int STAGES_, int MIN_BLOCKS_ = 1>
struct CfgFp8 {
  static constexpr int D = D_;
  static constexpr int kMinBlocks = MIN_BLOCKS_;  // __launch_bounds__' CTAs per SM: caps the registers
  static constexpr int BR = 64;  // one warpgroup, one m64 row block
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128;
  static constexpr int kRow = D < 128 ? D : 128;  // bytes per row of a Q / K column block: the swizzle span
  static constexpr int kQBytes = BR * D;
  static constexpr int kKBytes = BC * D;
  static constexpr int kVBytes = D * BC;  // V^T: D rows of BC keys
  static constexpr int kVRow = BC == 128 ? 128 : 64;  // bytes per row of a V^T column block: the swizzle span
  static constexpr int kSmem = kQBytes + kStages * (kKBytes + kVBytes) + 1024;
  static constexpr bool kWriteOnly = LAB_FWD_FP8_S_WRITE_ONLY != 0;
  static constexpr bool kMaskLimit = LAB_FWD_FP8_MASK_LIMIT != 0;
  static_assert(BC % kVRow == 0, "V^T: whole column blocks");
  static_assert(kSmem <= 227 * 1024, "shared memory budget exceeded");
};
// Per head dim: D 64 and 128 take B_c = 128 (half the barrier and max / sum shuffles per key of B_c = 64);
// D 256 B_c = 64, so that O (128 registers) and S (32) leave room for two CTAs per SM (81 KiB each).
using Cfg64 = CfgFp8<64, 128, 3>;
// LAB_FWD_FP8_D128_BC / _STAGES / _CTAS: D 128's one-warpgroup tile (B_c 64, 3 stages: 57 KiB, three CTAs per
// SM at <= 170 registers, twelve warps to hide MUFU and wgmma latency instead of eight).
#ifndef LAB_FWD_FP8_D128_BC
#define LAB_FWD_FP8_D128_BC 128
#endif
#ifndef LAB_FWD_FP8_D128_STAGES
#define LAB_FWD_FP8_D128_STAGES 3
#endif
#ifndef LAB_FWD_FP8_D128_CTAS
#define LAB_FWD_FP8_D128_CTAS 1
#endif
using Cfg128 = CfgFp8<128, LAB_FWD_FP8_D128_BC, LAB_FWD_FP8_D128_STAGES, LAB_FWD_FP8_D128_CTAS>;
using Cfg256 = CfgFp8<256, 64, 2>;

// The warp-specialised kernel's tiles: one CTA per SM (384 threads, 240-register consumers), so the ring is
// deeper: 4 stages at every D (D 64: 73 KiB, D 128: 145 KiB, D 256 (B_c 64): 161 KiB).
template <int D_, int BC_, int STAGES_>
struct CfgWs {
  static constexpr int D = D_;
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kRow = D < 128 ? D : 128;
  static constexpr int kKBytes = BC * D;
  static constexpr int kVBytes = D * BC;
  static constexpr int kVRow = BC == 128 ? 128 : 64;  // B_c 192 / 256: V^T in 64-key column blocks, 64-byte swizzle
  static constexpr int kConsumers = 2;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = 24;
  static constexpr int kRegsConsumer = 240;
  static constexpr int kQBytesWG = 64 * D_;
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kSmem = kQBytes + kStages * (kKBytes + kVBytes) + 1024;
  // The producer loads a V^T tile as BC / kVRow column blocks while the stage's barrier waits for all kVBytes: a key
  // tile of 64-key blocks plus a remainder (160, 224) compiled, left the barrier short by the remainder's bytes and
  // hung the first call on the GPU.
  static_assert(BC % kVRow == 0, "V^T: whole column blocks (B_c 128, or a multiple of 64)");
  // A 256-key tile takes the order without intra-warpgroup overlap (LAB_FWD_FP8_WS_OVERLAP 2), S's write-only first
  // step and the two-register mask: together the only way its 128 S + 64 O + 32 P registers fit 240 unspilled
  // (ptxas: 196-252 B of spills with any one of them missing); narrower tiles keep the switches' settings.
  static constexpr bool kWide = BC_ >= 256;
  // LAB_FWD_FP8_PV_PROMOTE at D 128 / 256 takes order 2 as well: a second accumulator for P V (64 registers) fits
  // beside O only when S and P are never live with it (B_c 192 under order 1 spilled 988 B).
  static constexpr int kOverlap = (kWide || (LAB_FWD_FP8_PV_PROMOTE != 0 && D_ == 128) ||
                                   (LAB_FWD_FP8_PV_PROMOTE_D256 != 0 && D_ == 256)) ? 2 : LAB_FWD_FP8_WS_OVERLAP;
  static constexpr bool kWriteOnly = kWide || LAB_FWD_FP8_S_WRITE_ONLY != 0 || (LAB_FWD_FP8_PV_PROMOTE_D256 != 0 && D_ == 256);
  static constexpr bool kMaskLimit = kWide || LAB_FWD_FP8_MASK_LIMIT != 0;
  static_assert(kSmem + 256 <= 227 * 1024, "shared memory budget exceeded");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
};
// B_c per head dim (LAB_FWD_FP8_WS_D*_BC, for sweeps): a wider key tile spreads the per-tile work (row max
// shuffles, alpha, O rescale, barriers) over more keys; S takes B_c / 2 registers of the consumers' 240.
#ifndef LAB_FWD_FP8_WS_D64_BC
#define LAB_FWD_FP8_WS_D64_BC 128
#endif
#ifndef LAB_FWD_FP8_WS_D128_BC
#define LAB_FWD_FP8_WS_D128_BC 192
#endif
#ifndef LAB_FWD_FP8_WS_STAGES
#define LAB_FWD_FP8_WS_STAGES 4
#endif
// D 128's ring depth apart (B_c 256 fits 3 stages: 16 + 3 * 64 KiB).
#ifndef LAB_FWD_FP8_WS_D128_STAGES
#define LAB_FWD_FP8_WS_D128_STAGES LAB_FWD_FP8_WS_STAGES
#endif
using Ws64 = CfgWs<64, LAB_FWD_FP8_WS_D64_BC, LAB_FWD_FP8_WS_STAGES>;
using Ws128 = CfgWs<128, LAB_FWD_FP8_WS_D128_BC, LAB_FWD_FP8_WS_D128_STAGES>;
// Causal calls at D 128 may take their own key tile (FA3's FP8 tile sizes do: 176 keys non-causal, 128 causal):
// LAB_FWD_FP8_WS_D128_CAUSAL_BC / _STAGES, by default the same as non-causal (B_c 256 non-causal with 192 causal
// measured 0.96-1.00x the default: outputs/driver_logs/20261129-h200-final-c4d12fc/X).
#ifndef LAB_FWD_FP8_WS_D128_CAUSAL_BC
#define LAB_FWD_FP8_WS_D128_CAUSAL_BC LAB_FWD_FP8_WS_D128_BC
#endif
#ifndef LAB_FWD_FP8_WS_D128_CAUSAL_STAGES
#define LAB_FWD_FP8_WS_D128_CAUSAL_STAGES LAB_FWD_FP8_WS_D128_STAGES
#endif
using Ws128c = CfgWs<128, LAB_FWD_FP8_WS_D128_CAUSAL_BC, LAB_FWD_FP8_WS_D128_CAUSAL_STAGES>;
constexpr bool kCausalTile128 = LAB_FWD_FP8_WS_D128_CAUSAL_BC != LAB_FWD_FP8_WS_D128_BC ||
                                LAB_FWD_FP8_WS_D128_CAUSAL_STAGES != LAB_FWD_FP8_WS_D128_STAGES;
// LAB_FWD_FP8_WS_D256_BC / _STAGES: FA3's FP8 tile at D 256 is 128 x 128 (hopper/tile_size.h); B_c 128 takes
// 2 stages (161 KiB) and 64 + 128 + 16 accumulator / fragment registers of the consumers' 240.
#ifndef LAB_FWD_FP8_WS_D256_BC
#define LAB_FWD_FP8_WS_D256_BC 128
#endif
#ifndef LAB_FWD_FP8_WS_D256_STAGES
#define LAB_FWD_FP8_WS_D256_STAGES 2
#endif
using Ws256 = CfgWs<256, LAB_FWD_FP8_WS_D256_BC, LAB_FWD_FP8_WS_D256_STAGES>;

template <class Cfg>
struct Ring {
  uint32_t q;
  __device__ __forceinline__ uint32_t k(int s) const { return q + Cfg::kQBytes + s * Cfg::kKBytes; }
  __device__ __forceinline__ uint32_t v(int s) const {
    return q + Cfg::kQBytes + Cfg::kStages * Cfg::kKBytes + s * Cfg::kVBytes;
  }
};

// S = Q K_stage^T from the step-0 descriptors of Q (dq) and of stage 0's K (dk0): desc_e4m3_step's one add per
// k32 step, the stage one more (LAB_FWD_FP8_DESC).
template <class Cfg>
__device__ __forceinline__ void issue_s_desc(float (&s)[Cfg::BC / 2], uint64_t dq, uint64_t dk0, int stage) {
  const uint64_t dk = dk0 + (uint64_t)(stage * (Cfg::kKBytes >> 4));
  if constexpr (Cfg::kWriteOnly) {
    WgmmaFp8Op<Cfg::BC>::ss0(s, dq, dk);  // S's old values (P of the tile before) are dead: no register keeps them
#pragma unroll
    for (int kk = 1; kk < Cfg::D / 32; ++kk)
      WgmmaFp8Op<Cfg::BC>::ss(s, desc_e4m3_step<Cfg::kRow, 64>(dq, kk), desc_e4m3_step<Cfg::kRow, Cfg::BC>(dk, kk),
                              1);
  } else {
#pragma unroll
    for (int kk = 0; kk < Cfg::D / 32; ++kk)
      WgmmaFp8Op<Cfg::BC>::ss(s, desc_e4m3_step<Cfg::kRow, 64>(dq, kk), desc_e4m3_step<Cfg::kRow, Cfg::BC>(dk, kk),
                              kk > 0);
  }
  wgmma_commit();
}

// S = Q K_stage^T; q: the warpgroup's Q tile (64 rows).
template <class Cfg>
__device__ __forceinline__ void issue_s(float (&s)[Cfg::BC / 2], uint32_t q, const Ring<Cfg>& ring, int stage) {
#if LAB_FWD_FP8_DESC
  issue_s_desc<Cfg>(s, desc_e4m3<Cfg::kRow>(q, 64, 0), desc_e4m3<Cfg::kRow>(ring.k(0), Cfg::BC, 0), stage);
#else
#pragma unroll
  for (int kk = 0; kk < Cfg::D / 32; ++kk)
    WgmmaFp8Op<Cfg::BC>::ss(s, desc_e4m3<Cfg::kRow>(q, 64, kk), desc_e4m3<Cfg::kRow>(ring.k(stage), Cfg::BC, kk),
                            kk > 0);
  wgmma_commit();
#endif
}

// O += P V_stage from stage 0's V^T descriptor dv0 (LAB_FWD_FP8_DESC).
// kFresh (LAB_FWD_FP8_PV_PROMOTE): o = P V, its first k32 step write-only (rs0), instead of o += P V. N: the columns
// of O it computes, from V^T row dv0's (all D, or one part of them at D 256: kPromotePart).
template <class Cfg, bool kFresh = false, int N = Cfg::D>
__device__ __forceinline__ void issue_pv_desc(float (&o)[N / 2], const uint32_t (&pa)[Cfg::BC / 32][4],
                                              uint64_t dv0, int stage) {
  const uint64_t dv = dv0 + (uint64_t)(stage * (Cfg::kVBytes >> 4));
#pragma unroll
  for (int kk = 0; kk < Cfg::BC / 32; ++kk) {
    if (kFresh && kk == 0)
      WgmmaFp8Op<N>::rs0(o, pa[kk], desc_e4m3_step<Cfg::kVRow, Cfg::D>(dv, kk));
    else
      WgmmaFp8Op<N>::rs(o, pa[kk], desc_e4m3_step<Cfg::kVRow, Cfg::D>(dv, kk), 1);
  }
  wgmma_commit();
}

template <class Cfg, bool kFresh = false>
__device__ __forceinline__ void issue_pv(float (&o)[Cfg::D / 2], const uint32_t (&pa)[Cfg::BC / 32][4],
                                         const Ring<Cfg>& ring, int stage) {
#if LAB_FWD_FP8_DESC
  issue_pv_desc<Cfg, kFresh>(o, pa, desc_e4m3<Cfg::kVRow>(ring.v(0), Cfg::D, 0), stage);
#else
  static_assert(!kFresh, "PV_PROMOTE takes the descriptor form (LAB_FWD_FP8_DESC)");
#pragma unroll
  for (int kk = 0; kk < Cfg::BC / 32; ++kk)
    WgmmaFp8Op<Cfg::D>::rs(o, pa[kk], desc_e4m3<Cfg::kVRow>(ring.v(stage), Cfg::D, kk), 1);
  wgmma_commit();
#endif
}

// Softmax of tile j, masked only where the tile needs it; O rescaled by alpha only when kRescale (the
// overlapped loop rescales after its P V wait).
template <class Cfg, bool kFold>
__device__ __forceinline__ void softmax_tile_as(float (&s)[Cfg::BC / 2], RowState& st, float (&alpha)[2], float c,
                                                float log2_ps, int row0, int wm0, int j, const AttnFp8Params& p) {
  constexpr int kChains = LAB_FWD_FP8_CHAINS;
  if (lab::tile_needs_mask(j * Cfg::BC, Cfg::BC, wm0, p.seqlen_k, p.causal))
    softmax_e4m3<Cfg::BC, true, LAB_FWD_FP8_POLY, kFold, kChains, Cfg::kMaskLimit>(s, st, alpha, c, log2_ps, row0, j * Cfg::BC,
                                                                  p.seqlen_k, p.causal);
  else
    softmax_e4m3<Cfg::BC, false, LAB_FWD_FP8_POLY, kFold, kChains>(s, st, alpha, c, log2_ps, row0, j * Cfg::BC,
                                                                   p.seqlen_k, p.causal);
}
template <class Cfg>
__device__ __forceinline__ void softmax_tile(float (&s)[Cfg::BC / 2], RowState& st, float (&alpha)[2], float c,
                                             float log2_ps, int row0, int wm0, int j, const AttnFp8Params& p) {
#if LAB_FWD_FP8_FOLD
  if (c > 0.f) {  // the same c in every thread of the CTA: no divergence
    softmax_tile_as<Cfg, true>(s, st, alpha, c, log2_ps, row0, wm0, j, p);
    return;
  }
#endif
  softmax_tile_as<Cfg, false>(s, st, alpha, c, log2_ps, row0, wm0, j, p);
}

// O *= alpha (rescale_o), or nothing where no row of the warp moved its max (LAB_FWD_FP8_SKIP_RESCALE).
template <int D, bool kWarpSpec>
__device__ __forceinline__ void rescale_o_fp8(float (&o)[D / 2], const float (&alpha)[2]) {
  if constexpr (LAB_FWD_FP8_SKIP_RESCALE == 1 || (LAB_FWD_FP8_SKIP_RESCALE == 2 && kWarpSpec))
    if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
  rescale_o<D>(o, alpha);
}

// LAB_FWD_FP8_PV_PROMOTE: a key tile's P V (ot, complete) added to O in float32.
template <int D>
__device__ __forceinline__ void promote_pv(float (&o)[D / 2], float (&ot)[D / 2]) {
  reg_fence(ot);
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] += ot[i];
}
template <int D>
constexpr bool kPromote = LAB_FWD_FP8_PV_PROMOTE != 0 && D <= 128;
// D 256: O holds 128 registers and a second one would not fit, so P V runs in parts of kPromotePart columns (V^T
// rows), each into its own accumulator, waited for and added to its columns of O. Parts of 128 (a 64-register
// accumulator) spill 424 B at B_c 128, 20 B at B_c 64 (LAB_FWD_FP8_WS_D256_BC 64, 4 stages); parts of 64 more.
template <int D>
constexpr bool kPromoteHalves = LAB_FWD_FP8_PV_PROMOTE_D256 != 0 && D == 256;
constexpr int kPromotePart = 128;

template <class Cfg>
__global__ void __launch_bounds__(128, Cfg::kMinBlocks) attn_fwd_v13_kernel(const __grid_constant__ CUtensorMap tq,
                                                           const __grid_constant__ CUtensorMap tk,
                                                           const __grid_constant__ CUtensorMap tv,
                                                           const AttnFp8Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages];
  uint8_t* smem = align1024(smem_raw);
  const Ring<Cfg> ring{smem_u32(smem)};

  // Prologue: which (b, h, Q_i) this CTA computes; causal query blocks of a head heaviest first.
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  const int bh = blockIdx.x / num_m;
  const int mb = p.causal ? num_m - 1 - (int)(blockIdx.x % num_m) : (int)(blockIdx.x % num_m);
  const int b = bh / p.heads_q, h = bh % p.heads_q, hkv = h / (p.heads_q / p.heads_kv), m0 = mb * Cfg::BR;
  const int kv_end = p.causal ? min(p.seqlen_k, m0 + Cfg::BR) : p.seqlen_k;
  const int n_tiles = (kv_end + BC - 1) / BC;
  const int tid = threadIdx.x;

  if (tid == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    fence_barrier_init();
  }
  __syncthreads();

  auto issue = [&](int j) {  // thread 0: K_j and V^T_j into stage j % kStages
    const int s = j % kStages;
    mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kKBytes);
    for (int cb = 0; cb < D / Cfg::kRow; ++cb)
      tma_load_4d(ring.k(s) + cb * BC * Cfg::kRow, &tk, smem_u32(&bar_k[s]), cb * Cfg::kRow, j * BC, hkv, b);
    mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kVBytes);
    for (int cb = 0; cb < BC / Cfg::kVRow; ++cb)
      tma_load_4d(ring.v(s) + cb * D * Cfg::kVRow, &tv, smem_u32(&bar_v[s]), j * BC + cb * Cfg::kVRow, 0, hkv, b);
  };
  if (tid == 0) {
    tma_prefetch_maps(&tq, &tk, &tv);
    mbar_arrive_expect_tx(smem_u32(&bar_q), Cfg::kQBytes);
    for (int cb = 0; cb < D / Cfg::kRow; ++cb)
      tma_load_4d(ring.q + cb * 64 * Cfg::kRow, &tq, smem_u32(&bar_q), cb * Cfg::kRow, m0, h, b);
    for (int j = 0; j < kStages && j < n_tiles; ++j) issue(j);
  }

  const auto descale = [&](const float* ptr, int which, int head) {
    return ptr == nullptr ? 1.f : ptr[b * p.descale_stride[which][0] + head * p.descale_stride[which][1]];
  };
  const float dq = descale(p.q_descale, 0, p.q_descale_by_kv ? hkv : h);
  const float dk = descale(p.k_descale, 1, hkv);
#ifdef LAB_FP8_BUG_NO_V_DESCALE
  const float dv = 1.f;  // wrong on purpose
#else
  const float dv = descale(p.v_descale, 2, hkv);
#endif
  const float c = p.scale * dq * dk * kLog2e;
  const float log2_ps = __log2f(p.p_scale);
  const int wm0 = uniform_in_warp<kWarpUniform>(m0 + (tid / 32) * 16);  // this warp's first row
  const int row0 = wm0 + (tid % 32) / 4;
  float o[D / 2];
  float ot[D / 2];  // LAB_FWD_FP8_PV_PROMOTE: a key tile's P V (unused otherwise)
  zero_acc(o);
  RowState st;
  float sacc[BC / 2];
  uint32_t pa[BC / 32][4];
  float alpha[2];
  mbar_wait(smem_u32(&bar_q), 0);

  // Main loop
#if LAB_FWD_FP8_OVERLAP
  if (n_tiles > 0) {
    mbar_wait(smem_u32(&bar_k[0]), 0);
    wgmma_fence();
    issue_s<Cfg>(sacc, ring.q, ring, 0);
    wgmma_wait<0>();
    reg_fence(sacc);
    softmax_tile<Cfg>(sacc, st, alpha, c, log2_ps, row0, wm0, 0, p);
    pack_p_e4m3<BC>(sacc, pa);
  }
  for (int j = 1; j < n_tiles; ++j) {
    const int s = j % kStages, sp = (j - 1) % kStages;
    mbar_wait(smem_u32(&bar_k[s]), (j / kStages) & 1);
    wgmma_fence();
    issue_s<Cfg>(sacc, ring.q, ring, s);  // S_j
    mbar_wait(smem_u32(&bar_v[sp]), ((j - 1) / kStages) & 1);
    issue_pv<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, ring, sp);  // O += P_{j-1} V_{j-1}, in flight during softmax j
    wgmma_wait<1>();                 // S_j is done (groups complete in order)
    reg_fence(sacc);
    softmax_tile<Cfg>(sacc, st, alpha, c, log2_ps, row0, wm0, j, p);
    wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and pa are ours again
    reg_fence(o);
    if constexpr (kPromote<D>) promote_pv<D>(o, ot);
    rescale_o_fp8<D, false>(o, alpha);
    pack_p_e4m3<BC>(sacc, pa);
    if (j - 1 + kStages < n_tiles) {
      named_barrier_sync(1, 128);  // every warp is done with stage sp
      if (tid == 0) issue(j - 1 + kStages);
    }
  }
  if (n_tiles > 0) {
    const int sp = (n_tiles - 1) % kStages;
    mbar_wait(smem_u32(&bar_v[sp]), ((n_tiles - 1) / kStages) & 1);
    wgmma_fence();
    issue_pv<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, ring, sp);
    wgmma_wait<0>();
    reg_fence(o);
    if constexpr (kPromote<D>) promote_pv<D>(o, ot);
  }
#else
  for (int j = 0; j < n_tiles; ++j) {
    const int s = j % kStages;
    const uint32_t phase = (j / kStages) & 1;
    mbar_wait(smem_u32(&bar_k[s]), phase);
    wgmma_fence();
    issue_s<Cfg>(sacc, ring.q, ring, s);
    wgmma_wait<0>();
    reg_fence(sacc);
    softmax_tile<Cfg>(sacc, st, alpha, c, log2_ps, row0, wm0, j, p);
    rescale_o_fp8<D, false>(o, alpha);
    pack_p_e4m3<BC>(sacc, pa);
    mbar_wait(smem_u32(&bar_v[s]), phase);
    wgmma_fence();
    issue_pv<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, ring, s);
    wgmma_wait<0>();
    reg_fence(o);
    if constexpr (kPromote<D>) promote_pv<D>(o, ot);
    if (j + kStages < n_tiles) {
      named_barrier_sync(1, 128);  // every warp is done with stage s
      if (tid == 0) issue(j + kStages);
    }
  }
#endif

  // Epilogue: O * dv (the V descale), then common epilogue_direct: O / l, LSE, bf16 rows < S_q.
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] *= dv;
  AttnFwdParams out{};
  out.o = p.o;
  out.lse = p.lse;
  for (int i = 0; i < 3; ++i) out.o_stride[i] = p.o_stride[i];
  out.heads_q = p.heads_q;
  out.seqlen_q = p.seqlen_q;
  out.head_dim = D;
  epilogue_direct<D, __nv_bfloat16>(o, st, out, b, h, m0);
#endif
}


// Bit s: whether a work tile of n key tiles fills stage s (key tiles s, s + kStages, ...) an odd number of times.
template <int kStages>
__device__ __forceinline__ uint32_t stage_flips(int n) {
  uint32_t bits = 0;
#pragma unroll
  for (int s = 0; s < kStages; ++s)
    if (n > s && (((n - 1 - s) / kStages) & 1) == 0) bits |= 1u << s;
  return bits;
}

// The warp-specialised kernel (LAB_FWD_FP8_WARPSPEC = 1): producer warpgroup 0, consumer warpgroups 1, 2. Work
// tile t (0 .. tiles - 1) is (b, h, 128 query rows); a CTA computes tiles blockIdx.x, + gridDim.x, ...: one each
// on the default grid (one CTA per tile), several on the persistent one (LAB_FWD_FP8_PERSISTENT). Key tile j of a
// work tile takes stage j % kStages, each stage's phase parity carried over from the tiles before (stage_flips);
// the producer fills the next tile's first stages as they free up, and loads its Q
// once both consumers' last S GEMM of the tile before has read it (empty_q), during their last P V and epilogue.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v13_ws_kernel(const __grid_constant__ CUtensorMap tq,
                                                                           const __grid_constant__ CUtensorMap tk,
                                                                           const __grid_constant__ CUtensorMap tv,
                                                                           const AttnFp8Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  extern __shared__ uint8_t smem_raw[];
  __shared__ __align__(8) uint64_t bar_q, bar_k[kStages], bar_v[kStages], empty_k[kStages], empty_v[kStages], empty_q;
  __shared__ int next_tile;  // LAB_FWD_FP8_PERSISTENT 3: the tile whose Q bar_q announces (>= tiles: the end)
  uint8_t* smem = align1024(smem_raw);
  const Ring<Cfg> ring{smem_u32(smem)};  // Cfg::kQBytes covers both warpgroups' Q

  // Prologue: the work tiles; tile t's (b, h, first query row, key tiles); causal query blocks of a head heaviest first.
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  const int tiles = num_m * p.batch * p.heads_q;
  struct Work {
    int b, h, hkv, m0, n_tiles;
  };
  const auto work = [&](int t) {
    const int bh = t / num_m;
    const int mb = p.causal ? num_m - 1 - t % num_m : t % num_m;
    Work w{bh / p.heads_q, bh % p.heads_q, 0, mb * Cfg::BR, 0};
    w.hkv = w.h / (p.heads_q / p.heads_kv);
    const int kv_end = p.causal ? min(p.seqlen_k, w.m0 + Cfg::BR) : p.seqlen_k;
    w.n_tiles = (kv_end + BC - 1) / BC;
    return w;
  };
  // the same in a warp: the descriptors of Q stay uniform
  const int wg = uniform_in_warp<kWarpUniform>(threadIdx.x / 128);
  constexpr bool dynamic = LAB_FWD_FP8_PERSISTENT == 3;  // the launcher makes sure of tile_counter
  constexpr bool kLoop = LAB_FWD_FP8_PERSISTENT != 0;    // else one tile per CTA: no loop (PERSISTENT 0)

  if (threadIdx.x == 0) {
    init_full_barriers<kStages>(&bar_q, bar_k, bar_v);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&empty_k[s]), 4 * Cfg::kConsumers);  // one arrival per consumer warp
      mbar_init(smem_u32(&empty_v[s]), 4 * Cfg::kConsumers);
    }
    mbar_init(smem_u32(&empty_q), 4 * Cfg::kConsumers);
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer: per tile Q, then K_j and V_j into a free stage each.
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      uint32_t flips = 0, used = 0;  // bit s: stage s's phases so far are odd / stage s has been filled before
      int t = blockIdx.x;
      for (int it = 0;; ++it) {
        if (t >= tiles) {
          if (dynamic) {  // the consumers wait on bar_q for a next tile: tell them there is none
            if (it > 0) mbar_wait(smem_u32(&empty_q), (it - 1) & 1);
            next_tile = t;
            mbar_arrive(smem_u32(&bar_q));
          }
          break;
        }
        const Work w = work(t);
        const int t_next = dynamic ? (int)gridDim.x + atomicAdd(p.tile_counter, 1) : t + (int)gridDim.x;
        // Q after the first kStages - 1 key tiles (from the second tile on): their stages free up while the
        // consumers still run the tile before, Q's only once both have issued its last S GEMM.
        const int q_after = it == 0 ? 0 : min(kStages - 1, w.n_tiles);
        for (int j = 0; j <= w.n_tiles; ++j) {
          if (j == q_after) {
            if (it > 0) mbar_wait(smem_u32(&empty_q), (it - 1) & 1);
            next_tile = t;  // read by the consumers after bar_q completes (the arrive releases this store)
            mbar_arrive_expect_tx(smem_u32(&bar_q), Cfg::kQBytes);
            for (int c = 0; c < Cfg::kConsumers; ++c)
              for (int cb = 0; cb < D / Cfg::kRow; ++cb)
                tma_load_4d(ring.q + c * Cfg::kQBytesWG + cb * 64 * Cfg::kRow, &tq, smem_u32(&bar_q), cb * Cfg::kRow,
                            w.m0 + 64 * c, w.h, w.b);
          }
          if (j == w.n_tiles) break;
          const int s = j % kStages;
          const uint32_t free_parity = (((flips >> s) ^ (j / kStages)) & 1) ^ 1;
          const bool refill = j >= kStages || ((used >> s) & 1);
          if (refill) mbar_wait(smem_u32(&empty_k[s]), free_parity);
          mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kKBytes);
          for (int cb = 0; cb < D / Cfg::kRow; ++cb)
            tma_load_4d(ring.k(s) + cb * BC * Cfg::kRow, &tk, smem_u32(&bar_k[s]), cb * Cfg::kRow, j * BC, w.hkv, w.b);
          if (refill) mbar_wait(smem_u32(&empty_v[s]), free_parity);
          mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kVBytes);
          for (int cb = 0; cb < BC / Cfg::kVRow; ++cb)
            tma_load_4d(ring.v(s) + cb * D * Cfg::kVRow, &tv, smem_u32(&bar_v[s]), j * BC + cb * Cfg::kVRow, 0, w.hkv,
                        w.b);
        }
        flips ^= stage_flips<kStages>(w.n_tiles);
        used |= w.n_tiles >= kStages ? (1u << kStages) - 1 : (1u << w.n_tiles) - 1;
        t = t_next;
        if constexpr (!kLoop) break;
      }
    }
  } else {
    // Consumers: warpgroup wg computes query rows m0 + 64 (wg - 1) .. + 63 of each tile with Q at qw.
    setmaxnreg_inc<Cfg::kRegsConsumer>();
    const int ct = threadIdx.x - 128 * wg;
    const uint32_t qw = ring.q + (wg - 1) * Cfg::kQBytesWG;
    const float log2_ps = __log2f(p.p_scale);
    float o[D / 2];
    float ot[D / 2];  // LAB_FWD_FP8_PV_PROMOTE: a key tile's P V (unused otherwise)
    float sacc[BC / 2];
    uint32_t pa[BC / 32][4];
    float alpha[2];
    // Key tile j of each work tile sits in stage j % kStages (a warp-uniform index: the descriptors stay on the
    // uniform datapath; a running index across tiles moved them to vector registers and cost ~4 % at D 128 and
    // 5 % at D 256 on the H200); flips carries each stage's phase parity from the tiles before.
    uint32_t flips = 0;
    auto parity = [&](int j) { return ((flips >> (j % kStages)) ^ (uint32_t)(j / kStages)) & 1u; };
    auto wait_k = [&](int j) { mbar_wait(smem_u32(&bar_k[j % kStages]), parity(j)); };
    auto wait_v = [&](int j) { mbar_wait(smem_u32(&bar_v[j % kStages]), parity(j)); };
    auto release_k = [&](int j) {
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_k[j % kStages]));
    };
    auto release_v = [&](int j) {
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[j % kStages]));
    };
    auto release_q = [&]() {
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_q));
    };
#if LAB_FWD_FP8_DESC && LAB_FWD_FP8_WARP_UNIFORM
    // In the loop over tiles ptxas recomputed these three bases (address masks and shifts, ~16 uniform-datapath
    // instructions) inside every turn's issue block rather than keep them; an empty asm that "changes" them per
    // key tile leaves nothing to recompute from, so they stay in uniform registers (D 128 turn: 62 -> 46
    // instructions, the default grid's 42). The default grid keeps them without it (with it: 42 -> 49).
    uint64_t dq0 = desc_e4m3<Cfg::kRow>(qw, 64, 0), dk0 = desc_e4m3<Cfg::kRow>(ring.k(0), BC, 0),
             dv0 = desc_e4m3<Cfg::kVRow>(ring.v(0), D, 0);
    auto s_gemm = [&](int j) {
      if constexpr (kLoop) {
        asm volatile("" : "+l"(dq0), "+l"(dk0));
        issue_s_desc<Cfg>(sacc, dq0, dk0, j % kStages);
      } else {
        issue_s<Cfg>(sacc, qw, ring, j % kStages);
      }
    };
    auto pv_gemm = [&](int j) {
      if constexpr (kLoop) {
        asm volatile("" : "+l"(dv0));
        issue_pv_desc<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, dv0, j % kStages);
      } else {
        issue_pv<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, ring, j % kStages);
      }
    };
#else
    auto s_gemm = [&](int j) { issue_s<Cfg>(sacc, qw, ring, j % kStages); };
    auto pv_gemm = [&](int j) { issue_pv<Cfg, kPromote<D>>(kPromote<D> ? ot : o, pa, ring, j % kStages); };
#endif
    auto pv_halves = [&](int j) {  // LAB_FWD_FP8_PV_PROMOTE at D 256 (kPromoteHalves): P V by parts, each added to O
      using Part = float[kPromotePart / 2];  // O's columns of one part: a contiguous run of its registers
      Part& oh = *reinterpret_cast<Part*>(ot);
      const uint64_t dv = desc_e4m3<Cfg::kVRow>(ring.v(0), D, 0);
#pragma unroll
      for (int h = 0; h < D / kPromotePart; ++h) {
        if (h > 0) wgmma_fence();
        issue_pv_desc<Cfg, true, kPromotePart>(oh, pa, dv + (uint64_t)((h * kPromotePart * Cfg::kVRow) >> 4),
                                               j % kStages);
        wgmma_wait<0>();
        promote_pv<kPromotePart>(*reinterpret_cast<Part*>(o + h * (kPromotePart / 2)), oh);
      }
    };
    // Ping-pong: turn() waits for this warpgroup's token, pass() hands it to the other. Each warpgroup takes
    // n_tiles + 1 turns per tile, the same count in both (the same tiles), so the token alternates across tiles;
    // the second hands out the first token, and the first takes one more turn at the end, which consumes the
    // second's last pass (no arrival left pending at exit). With S_k > 0 every tile has a key tile.
    const int next_wg = wg % Cfg::kConsumers + 1;
    auto turn = [&]() { named_barrier_sync(2 + wg, 256); };
    auto pass = [&]() { named_barrier_arrive(2 + next_wg, 256); };
    const bool turns = p.seqlen_k > 0 && (int)blockIdx.x < tiles;
    if (wg == Cfg::kConsumers && turns) named_barrier_arrive(2 + 1, 256);

    for (int t = blockIdx.x, it = 0;; t += gridDim.x, ++it) {
      if (dynamic) {
        mbar_wait(smem_u32(&bar_q), it & 1);
        t = *static_cast<volatile int*>(&next_tile);
      }
      if (t >= tiles) break;
      const Work w = work(t);
      const int n_tiles = w.n_tiles;
      const int m0w = w.m0 + 64 * (wg - 1);
      const auto descale = [&](const float* ptr, int which, int head) {
        return ptr == nullptr ? 1.f : ptr[w.b * p.descale_stride[which][0] + head * p.descale_stride[which][1]];
      };
      const float dq = descale(p.q_descale, 0, p.q_descale_by_kv ? w.hkv : w.h);
      const float dk = descale(p.k_descale, 1, w.hkv);
#ifdef LAB_FP8_BUG_NO_V_DESCALE
      const float dv = 1.f;  // wrong on purpose
#else
      const float dv = descale(p.v_descale, 2, w.hkv);
#endif
      const float c = p.scale * dq * dk * kLog2e;
      const int wm0 = uniform_in_warp<kWarpUniform>(m0w + (ct / 32) * 16);
      const int row0 = wm0 + (ct % 32) / 4;
      zero_acc(o);
      RowState st;
      if (!dynamic) mbar_wait(smem_u32(&bar_q), it & 1);
      if (n_tiles == 0) release_q();

      // Main loop
      if (n_tiles > 0) {
        wait_k(0);
        turn();
        wgmma_fence();
        s_gemm(0);
        pass();
        wgmma_wait<0>();
        reg_fence(sacc);
        release_k(0);
        if (n_tiles == 1) release_q();
        softmax_tile<Cfg>(sacc, st, alpha, c, log2_ps, row0, wm0, 0, p);
        pack_p_e4m3<BC>(sacc, pa);
      }
      for (int j = 1; j < n_tiles; ++j) {
        wait_k(j);
        wait_v(j - 1);
        turn();
        wgmma_fence();
        if constexpr (Cfg::kOverlap == 2) {
          // P_{j-1} V_{j-1} waited for before S_j is issued: P's and S's registers are never live together.
          if constexpr (kPromoteHalves<D>) {
            pv_halves(j - 1);
          } else {
            pv_gemm(j - 1);
            wgmma_wait<0>();
            reg_fence(o);
            if constexpr (kPromote<D>) promote_pv<D>(o, ot);
          }
          wgmma_fence();
          s_gemm(j);
          pass();
          wgmma_wait<0>();
        } else {
          s_gemm(j);
          pv_gemm(j - 1);
          pass();
          if constexpr (Cfg::kOverlap == 1)
            wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} runs on during softmax j
          else
            wgmma_wait<0>();  // both: the other warpgroup's softmax is the only overlap
        }
        reg_fence(sacc);
        release_k(j);
        if (j == n_tiles - 1) release_q();
        if constexpr (Cfg::kOverlap != 1) {
          reg_fence(o);
          release_v(j - 1);
          if constexpr (Cfg::kOverlap == 0 && kPromote<D>) promote_pv<D>(o, ot);
        }
        softmax_tile<Cfg>(sacc, st, alpha, c, log2_ps, row0, wm0, j, p);
        if constexpr (Cfg::kOverlap == 1) {
          wgmma_wait<0>();
          reg_fence(o);
          release_v(j - 1);
          if constexpr (kPromote<D>) promote_pv<D>(o, ot);
        }
        rescale_o_fp8<D, true>(o, alpha);
        pack_p_e4m3<BC>(sacc, pa);
      }
      if (n_tiles > 0) {
        wait_v(n_tiles - 1);
        turn();
        wgmma_fence();
        if constexpr (kPromoteHalves<D>) {
          pv_halves(n_tiles - 1);
          pass();
        } else {
          pv_gemm(n_tiles - 1);
          pass();
          wgmma_wait<0>();
          reg_fence(o);
          if constexpr (kPromote<D>) promote_pv<D>(o, ot);
        }
        release_v(n_tiles - 1);
      }

      // Epilogue
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] *= dv;
      AttnFwdParams out{};
      out.o = p.o;
      out.lse = p.lse;
      for (int i = 0; i < 3; ++i) out.o_stride[i] = p.o_stride[i];
      out.heads_q = p.heads_q;
      out.seqlen_q = p.seqlen_q;
      out.head_dim = D;
      epilogue_direct<D, __nv_bfloat16>(o, st, out, w.b, w.h, m0w);
      flips ^= stage_flips<kStages>(n_tiles);
      if constexpr (!kLoop) break;
    }
    if (wg == 1 && turns) turn();
  }
#endif
}

// kPersistent: the warp-specialised kernel, whose CTAs loop over work tiles, on at most one CTA per SM.
template <class Cfg, auto kKernel, bool kPersistent = false>
int launch(const AttnFp8Params& p, cudaStream_t stream, int dev) {
  if (const cudaError_t err = lab::allow_smem_once<kKernel>(Cfg::kSmem, dev)) return (int)err;
  CUtensorMap tq, tk, tv;
  const int Sk = p.seqlen_k > 0 ? p.seqlen_k : 1;  // S_k = 0: a map is still needed, never read
  const int64_t vt_stride[3] = {(int64_t)p.heads_kv * Cfg::D * p.vt_cols, (int64_t)Cfg::D * p.vt_cols, p.vt_cols};
  if (!make_fp8_map(&tq, p.q, Cfg::D, p.seqlen_q, p.heads_q, p.batch, p.q_stride, Cfg::kRow, 64) ||
      !make_fp8_map(&tk, p.k, Cfg::D, Sk, p.heads_kv, p.batch, p.k_stride, Cfg::kRow, Cfg::BC) ||
      !make_fp8_map(&tv, p.vt, p.vt_cols, Cfg::D, p.heads_kv, p.batch, vt_stride, Cfg::kVRow, Cfg::D))
    return LAB_E_SHAPE;
  int64_t blocks = (int64_t)((p.seqlen_q + Cfg::BR - 1) / Cfg::BR) * p.batch * p.heads_q;
  if (blocks > 0x7fffffff) return LAB_E_SHAPE;
  const bool persistent = kPersistent && !(LAB_FWD_FP8_PERSISTENT == 2 && p.causal);
  if (persistent && blocks > lab::num_sms(dev) && lab::num_sms(dev) > 0) blocks = lab::num_sms(dev);
  if (LAB_FWD_FP8_PERSISTENT == 3 && kPersistent) {  // the dynamic scheduler's counter, zeroed by the V^T pass
    if (p.tile_counter == nullptr) return LAB_E_SHAPE;
    if (p.seqlen_k == 0)  // no V^T pass ran
      if (const cudaError_t err = cudaMemsetAsync(p.tile_counter, 0, sizeof(int), stream)) return (int)err;
  }
  kKernel<<<(unsigned)blocks, Cfg::kThreads, Cfg::kSmem, stream>>>(tq, tk, tv, p);
  return (int)cudaGetLastError();
}

constexpr bool kWsPersistent = LAB_FWD_FP8_PERSISTENT != 0;

}  // namespace

// The V^T pass alone (lab.fp8.checks times it apart): vt from v.
extern "C" int attn_fp8_vt_v13(const AttnFp8Params* p, void* stream) {
  if (const int rc = check_fp8_params(p)) return rc < 0 ? rc : 0;
  return launch_fp8_vt(*p, static_cast<cudaStream_t>(stream));
}

// D 128 warp-specialised: the causal tile where it differs (Ws128c), else Ws128.
static int launch_ws128(const AttnFp8Params& p, cudaStream_t st, int dev) {
  if (kCausalTile128 && p.causal) return launch<Ws128c, attn_fwd_v13_ws_kernel<Ws128c>, kWsPersistent>(p, st, dev);
  return launch<Ws128, attn_fwd_v13_ws_kernel<Ws128>, kWsPersistent>(p, st, dev);
}

// The forward: the V^T pass, then the attention kernel, on one stream.
extern "C" int attn_fwd_v13(const AttnFp8Params* p, void* stream) {
  if (const int rc = check_fp8_params(p)) return rc < 0 ? rc : 0;
  int dev = 0;
  if (!device_is_sm90(&dev)) return (int)cudaErrorNoKernelImageForDevice;
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (const int rc = launch_fp8_vt(*p, st)) return rc;
#if LAB_FWD_FP8_WARPSPEC == 1
  if (p->head_dim == 64) return launch<Ws64, attn_fwd_v13_ws_kernel<Ws64>, kWsPersistent>(*p, st, dev);
  if (p->head_dim == 128) return launch_ws128(*p, st, dev);
  return launch<Ws256, attn_fwd_v13_ws_kernel<Ws256>, kWsPersistent>(*p, st, dev);
#elif LAB_FWD_FP8_WARPSPEC == 3  // per head dim, default (fwd v13's header: the H200 profile and race)
  if (p->head_dim == 64) return launch<Cfg64, attn_fwd_v13_kernel<Cfg64>>(*p, st, dev);
  if (p->head_dim == 128) return launch_ws128(*p, st, dev);
  return launch<Ws256, attn_fwd_v13_ws_kernel<Ws256>, kWsPersistent>(*p, st, dev);
#elif LAB_FWD_FP8_WARPSPEC == 2  // per head dim, before the profile (one warpgroup at D 64 / 128)
  if (p->head_dim == 64) return launch<Cfg64, attn_fwd_v13_kernel<Cfg64>>(*p, st, dev);
  if (p->head_dim == 128) return launch<Cfg128, attn_fwd_v13_kernel<Cfg128>>(*p, st, dev);
  return launch<Ws256, attn_fwd_v13_ws_kernel<Ws256>, kWsPersistent>(*p, st, dev);
#else
  if (p->head_dim == 64) return launch<Cfg64, attn_fwd_v13_kernel<Cfg64>>(*p, st, dev);
  if (p->head_dim == 128) return launch<Cfg128, attn_fwd_v13_kernel<Cfg128>>(*p, st, dev);
  return launch<Cfg256, attn_fwd_v13_kernel<Cfg256>>(*p, st, dev);
#endif
}
