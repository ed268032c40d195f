// v07_overlap: v06 with the softmax overlapped with the tensor core inside
// each consumer warpgroup, and causal CTAs scheduled longest-first (sm_90a).
//
// What is new against v06:
// - Intra-warpgroup pipelining (FA3's "intra-warpgroup overlap"). v06 ran
//   S_j = Q K_j^T, waited, did the softmax, then P_j V_j, waited: the tensor
//   core idled during this warpgroup's softmax unless another warpgroup had
//   a GEMM ready. v07 issues S_{j+1} = Q K_{j+1}^T and O += P_j V_j back to
//   back (two commit groups), waits only for S_{j+1} (wait_group 1), runs the
//   softmax of S_{j+1} while P_j V_j is still in flight, then waits for it,
//   rescales O and packs P_{j+1}. The softmax is split for that
//   (common/hopper/attn_fwd_sm90.cuh: softmax_scores touches neither O nor
//   the P fragments; rescale_o and pack_p come after the wait).
//   Costs: S and the P fragments of the previous tile are live together
//   (+B_c/4 registers per thread).
// - K and V have separate `empty` barriers. First cut (one barrier per
//   stage, released after P_j V_j as in v06): with 2 stages the release
//   moved a whole iteration later, the next K load was exposed and v07 ran
//   at 0.81-0.85x v06 at D = 128 (run 2, H200: 427 vs 506 TFLOP/s at
//   S = 8192; 3 stages recovered it to 503). K_j is now released as soon
//   as S_j is done.
// - Causal CTAs in longest-first order over the whole grid (query block
//   slowest, heaviest first): the last wave holds the shortest CTAs, so
//   the tail is short (LPT scheduling). Non-causal keeps v06's order.
//   Since H200 runs 11-12 of 2026-11-23 (l2order) the order is longest-first within
//   groups of heads whose K/V fit 16 MiB of L2 (D = 128; see below).
// - Tile config knobs (compile-time, for sweeps): LAB_FWD_OVERLAP_D{64,128}_
//   {CONSUMERS,BC,STAGES}.
// - PINGPONG (on at D = 128): the consumer warpgroups take turns issuing
//   their GEMMs (named barriers 4.., a token passed round-robin), so one
//   warpgroup's wgmmas run while the others do their softmax (FA3's
//   inter-warpgroup schedule).
// - POLY (option, off): every N-th n8 column block of S takes exp2 on the
//   FMA pipe (exp2_poly, a cubic) instead of the MUFU unit (FA4's trick).
// - Softmax switches (2026-11-23, measured below): CHAINS (on, 2 independent row max / row sum
//   chains), FOLD (on for scale > 0: the scale folded into exp2's FFMA, the host picks the kernel),
//   PERSIST (off: one CTA per SM looping over work tiles); a lazy O rescale was tried and dropped;
//   LAZY (on since the lazy runs 1-2): FA4's conditional rescaling, the running max kept within 2^8.
//
// Tile sizes (defaults; why): D = 128: 2 consumers x 64 rows, B_c = 176,
// 2 stages (32 + 2 x 2 x 88 = 208 KiB): per thread O 64 + S 88 + P 44 +
// addressing, inside the 240 registers two consumers get; B_c = 176 halves
// the fixed cost per key (barrier round trips, row max / sum shuffles) against
// 128 where 3 stages of 176 do not fit. D = 64: 3 consumers, B_c = 128,
// 3 stages (120 KiB), O 32 + S 64 + P 32 for the 160 registers three
// consumers get (ptxas reports a 4-byte spill at this cap).
//
// Prediction (H200 bf16 bench-fwd): +10-15 % over v06 on the long cells
// (FA3 reports about that much for this step), i.e. ~560-590 TFLOP/s at
// D = 128 and ~430-450 at D = 64 non-causal; causal S = 512 +5 % from LPT.
// Outcome (H200, run 3, outputs/driver_logs/20261122-h200-hopper-run3-2ca041541f.log;
// TFLOP/s at S = 512/2048/8192/16384, non-causal | causal; kernel-only rows):
//   overlap alone (no ping-pong), D = 128: 376/449/492/502 | 213/354/472/469:
//     -1 to -8 % against v06 except causal 8k (+3 %): the prediction failed;
//     one warpgroup's S and P V back to back leave the tensor core the same
//     idle gaps when both warpgroups do it at the same time.
//   + PINGPONG (the default at D = 128): 402/512/539/537 | 249/399/466/483:
//     +3 to +9 % over v06 non-causal, 0.74-0.89x SDPA-cuDNN; causal -1 to +9 %.
//   D = 64 (no ping-pong): 260/356/419/429 | 152/291/357/388: +5 % over v06
//     at S >= 8192 non-causal (0.89-0.92x cuDNN), no gain elsewhere.
//   3 stages at D = 128: within -7/+3 % of 2 stages; B_c = 176 (D = 128) and
//     2 consumers x B_c = 192 (D = 64): -5 to -20 % (run 2). The LPT order
//     was not timed on its own.
//   Run 5 (outputs/driver_logs/20261122-h200-hopper-run5-373ef90414.log),
//   with the split barriers and ping-pong: B_c = 176 at D = 128 vs 128:
//   369/519/553/549 | 216/363/465/527 vs 353/499/514/523 | 233/394/435/488,
//   +4 to +8 % except causal 512 and 2048 (-7/-8 %; lab.ops sends causal
//   D = 128 up to 2k queries to v05): now the default. POLY at D = 64: every
//   4th block -5 to -10 %, every 8th 0 to -5 %: the MUFU unit is not what
//   bounds D = 64 here; off.
// Session of 2026-11-23 (H200; outputs/driver_logs/20261123-h200-v07-*): the softmax's instruction count
// and dependency chains. The ncu profile beside cuDNN (20261123-h200-ncu-0dccb32c0e/) at D = 128,
// S = 2048: tensor pipe 62 % (cuDNN 74 %), issue slots 40 %, top stalls wait (1.34 cycles/issue) and
// dispatch (0.94): the consumers' softmax, not the tensor core, sets the pace.
//   PERSIST (one CTA per SM over the work tiles; prediction +5-8 % from no CTA turnaround): non-causal
//     geomean 1.006x, causal 0.980x (-11/-14 % at causal 8k/16k D 128): off. The turnaround was not it.
//   CHAINS = 2 (row max and row sum as two independent chains): +1.7 %, +3.2 %, +4.2 % D 64 / +0.8 %
//     D 128 over three runs: on.
//   FOLD (scale > 0: max on raw scores, exp2(s c - m) by one FFMA; 2 of ~6 FP32 ops per score gone):
//     with CHAINS = 2, +8.1 % / +6.9 % at D 64 and +5.0 % / +5.0 % at D 128 (runs 1, 2): on. Geomean
//     0.80-0.81x SDPA-cuDNN on bench-fwd against v07's 0.75-0.76x in the same processes.
//   LAZY (a warp skips the O rescale when all its alphas are exactly 1): +0.2 % / -0.4 %: dropped
//     (the switch is gone; the run is outputs/driver_logs/20261123-h200-v07-lazy-run1-*).
// Runs of 2026-11-23, ablations and source counters (H200; outputs/driver_logs/20261123-h200-{v07-ablate,v07-lazy-run2,
// desc-run1}-*, ncu source counters in 20261123-h200-ncu-source-96b748d6d0/): what bounds the loop.
//   Ablations (diagnostic switches, wrong results: LAB_FWD_OVERLAP_ABLATE, LAB_SOFTMAX_ABLATE), D = 128, TFLOP/s at
//   S = 2048 / 8192 against the default's 552 / 569 (SDPA-cuDNN 609 / 601 in that process): no softmax
//   758 / 746 (+37 / +31 %); no row max (no FMNMX, shuffles or alpha) 687 / 678 (+24 / +19 %); exp2 by an
//   FMUL instead of MUFU 632 / 618 (+14 / +9 %); no K/V loads once the ring is full 497 / 579 (no gain).
//   So the softmax is not hidden under the other warpgroup's GEMMs, and the loads are not the bound.
//   ncu's per-instruction samples (S = 8192): ~35 % of all stall samples sit in the GEMM issue code,
//   where each HGMMA waited on ~15 instructions rebuilding its descriptor (mask, shift, R2UR), ~45 %
//   in the softmax (the FMNMX chains, then MUFU / FADD "wait" and "mio").
//   Descriptors (common desc_advance: one base per tile, a constant per wgmma; loop 1465 -> 1393 static
//     instructions): +2 to +5 % on v07 in 6 of 8 cells (D 128 S 512: 368 vs 409, the cell that moves
//     most between runs); v05 -3 to -5 % at D 128, +1 to +4 % at D 64. Kept: the same code for all.
//   LAZY (FA4's conditional rescaling, softmax_scores_lazy: keep the max unless a score beats it by 2^8;
//     one vote replaces the quad shuffles; no O rescale when kept; masked tiles take the full step):
//     run 2 (old descriptors) +5 % D 128 S 8192, -4 % S 2048, +1 to +4 % elsewhere; run with the new
//     descriptors +3 to +4 % at D 128 (S 2048 / 8192 / 16k causal) and D 64 (S 2048 / 8192). On: 55/55
//     checks, including keys planted far above the running max (hopper_run.planted_key_check).
//   Left off: B_c = 192 at D = 128 (+2 to +8 % at S >= 2048, -5 % at S 512, -12 % causal 8k), POLY at
//   D = 128 (every 8th / 4th n8 block: -1 to -10 %), 3 consumers at B_c = 96 (48 B of spills: -40 %).
// Runs of 2026-11-23, persistent grids (H200 runs 8-10, outputs/driver_logs/20261123-h200-v07-{persist-run8,
// config-run9,ab-run10}-*): the cells with few keys per query tile.
//   PERSIST reworked. The first cut's next Q waited for the epilogue, which staged O in the Q tile, so its
//     TMA round trip (~1 us) and the epilogue stayed exposed per tile. Now O goes straight from registers
//     (epilogue_direct) and each warp releases Q once its last S GEMM is done: the next Q and K_0 load under
//     the last P V and the epilogue. Prediction: +10-15 % at S = 512 (~1-1.5 of ~11 us per tile), ~0 at long S.
//     Outcome (run 8): D = 128 S = 512 +9 % (429 vs 394), with B_c = 128 +13 %, with B_c = 128 and 3 stages
//     +16 % (455); D = 64 S = 512 +25 % (346 vs 276), S = 2048 +3 %; long rows -4 to +1 % at D = 128.
//     Causal with a static snake order: D = 64 +23 % at 512 and +10 % at 2048, 0 at 16k; D = 128 -5 % at 16k
//     (runs 8, 10): the hardware's own longest-first dispatch balances long causal rows better.
//   Config per call (launch_cfg, below): D = 64 persistent (causal too); D = 128 with few keys (non-causal
//     S_k <= 1024, causal S_q <= 2048) B_c = 128, 3 stages (Q 32 + 3 x (K 32 + V 32) = 224 KiB), persistent when
//     non-causal; the long config otherwise. B_c = 128 for every causal size: -2 to -5 % at 8k / 16k (run 10).
//   Same-kernel spread in these runs: "v07 (public op)" and "lab.ops.attention" time the same code, and differ
//     by up to 10 % in causal cells (run 10): differences below that are not decisions. Since run 11 every
//     sweep times its rows in rounds (lab.bench.time_interleaved), so clock drift reaches all rows alike.
//   Causal order by L2 (runs 11-12). Longest-first over the whole grid put 132 different heads in the first
//     wave; each CTA then streams its K/V from DRAM at B_r = 128 FLOP per byte, ~4.8 TB/s at 600 TFLOP/s:
//     more than an H100 has (3.35), about all an H200 has. Prediction: H100 causal D = 128 up to v06's level
//     or better (+30-40 % at 2k), H200 +0-10 %. Now heads are grouped so a group's K and V fit 16 MiB
//     (FA3's L2 swizzle), longest first within the group. Outcome (D = 128 causal, TFLOP/s grid-wide / 16 MiB):
//     H100 2k 317 / 464 (+46 %), 8k 548 / 611 (+11 %), 16k 639 / 645, 512 211 / 241; H200 2k 426 / 449 (+5 %),
//     8k 566 / 569, 16k 625 / 612 (8 MiB: 460 / 579 / 620; 32 MiB: 449 / 579 / 625). D = 64 loses 0-7 % with
//     it (H200 16k 473 / 440): off there.
//   D = 128, S = 2048 (run 13, H200, rounds; the same code measured 631 / 643 at 8k, so +-2 % is noise):
//     default 560-562 TFLOP/s, PERSIST 573, long config at B_c = 128 584 (+4 %; -8 % at 16k in run 8), the
//     few-keys config 562; causal 2048: few-keys config 469-471, the long one with L2 order 454. Left as is.
// Runs of 2026-11-23: the cells with few keys, again (H200 run 14,
// outputs/driver_logs/20261123-h200-v07-fuse-run14-f82abe0/). ncu (20261123-h200-math-round-4596772/) at D = 128,
// S = 512 non-causal: ours 304 us, tensor pipe 51 %, issue slots 33 %, top stall wait; cuDNN 245 us, 63 % / 41 %.
// Per work tile of 4 key tiles, each warpgroup takes 5 turns, two of them half-empty (S_0 alone, the last
// P V alone), and the epilogue sits between them.
//   FUSE (persistent configs; [lab:fuse]): one stream of key tiles across work tiles, the last P V of a tile
//     in the same turn as the next tile's S_0, whose softmax runs under that P V; per-warpgroup Q barriers so
//     each warpgroup's next Q loads right after its own last S GEMM. Prediction: +8-12 % at S = 512 (one
//     half-empty turn of ~5 gone per tile), ~0 at long S. Outcome (kernel-only rows, rounds): D = 128
//     S = 512 387 vs 455 TFLOP/s (-15 %); the few-keys config with FUSE at S = 2048 441 vs 574 without it.
//     58/58 checks pass with it (tiles of 1 key block, many tiles per CTA, ragged tails, GQA). The prediction
//     failed; see run 18 for why.
//   Few-keys config up to S_k = 8192 (no FUSE): S = 2048 574 vs 583, S = 8192 599 vs 651: thresholds stay.
//   PREFETCH (run 17, outputs/driver_logs/20261123-h200-v07-prefetch-run17-3fb4a56/): if FUSE lost on the next
//     tile's Q (read from DRAM once its warpgroup's last S GEMM is done, ~1 us), a prefetch of that Q and of
//     K_0 / V_0 into L2 a work tile ahead should recover it. Outcome: FUSE with it 393 vs 465 TFLOP/s at
//     D = 128 S = 512 (58/58 checks): the Q load was not what FUSE lost on. PREFETCH alone: D = 64 +0.4 to
//     +1.5 % (2k, 8k causal, 16k), D = 128 S = 512 -0.8 %: inside the noise, dropped (the switch and its
//     tma_prefetch_l2_4d wrapper are gone; they are in the history at 3fb4a56). What FUSE lost on is not
//     known then.
//   FUSE, why it lost and fixed (run 18, outputs/driver_logs/20261123-h200-v07-fuse-run18-1804827/; ncu source
//     counters in 20261123-h200-v07-fuse-ncu-93774e8/): the first cut issued the next tile's S_0 under an `if`
//     between wgmma_fence and the commit, and ptxas serialized every wgmma of those kernels (C7520, "WG.AR in
//     divergent path"): a WARPGROUP.DEPBAR after each HGMMA of the main loop. Now each end of a work tile
//     issues its wgmmas unconditionally (last tile: P V alone; otherwise P V with the next S_0), and CI's
//     compile gate fails any kernel ptxas serializes (lab.build.parse_ptxas). Outcome: D = 128 S = 512 464 vs
//     437 TFLOP/s (+6.1 %, kernel-only rows in rounds), the prediction's lower end; S = 2048 with the few-keys
//     config and FUSE 597 vs 589 (+1.3 %, noise: thresholds stay). 58/58 checks; memcheck, racecheck and
//     synccheck clean. On at D = 128; D = 64 would spill (200 B of stack at its 160 registers): off there.
//   Long config at B_c = 128 (run 16, outputs/driver_logs/20261123-h200-v05-check-run16-bbb7b66/): S = 2048
//     574 vs 559 (+2.6 %; run 13: +4 %), 8192 618 vs 634, 16k 639 vs 654; with 3 stages 569 / 614 / 632. A
//     per-call B_c = 128 below ~4k keys would gain ~3 % in one cell, about the noise of one run: not taken.
// Runs of 2026-11-23, D = 128 cells (H200 runs 1-6, outputs/driver_logs/20261123-h200-d128-cells-run*): the four
// D = 128 cells below cuDNN. ncu beside SDPA-cuDNN (run 2): cuDNN runs one persistent kernel for every cell
// (132 CTAs, 1 producer + 2 consumer warpgroups, HGMMA 64x128x16: B_c = 128, 232 KiB), at S = 2048 1.42 M
// cycles against our 1.57 M, with more instructions (316 M vs 278 M) at a higher IPC (1.74 vs 1.38); our top
// stall is `wait` (MUFU, FMNMX), and our producer's try_wait / branch spin is 23 M of the 302 M instructions.
//   Producer wait with a suspend-time hint (mbarrier.try_wait's suspendTimeHint, 1 us / 10 ms; prediction
//     +2-5 % from the issue slots the spin takes beside two consumer warps): +0 to +1.3 % over 7 cells (run 3),
//     noise: dropped. The spin is not what bounds the consumers.
//   Persistent causal few-keys config with FUSE, snake order (run 1): causal 512 244 vs 256, 2048 366 vs 483:
//     the snake over L2 head groups is unbalanced (rounds are not longest-first across groups). See PAIR.
//   PAIR (run 4, outputs/driver_logs/20261123-h200-d128-cells-run4-b9a4b85/): persistent causal few-keys config,
//     units of two query tiles. Prediction: the persistence and FUSE gains of non-causal S = 512 (+15-20 % over
//     the non-persistent config, 256), ~295-307 at causal 512, just above v05 (286). Outcome (TFLOP/s, kernel-
//     only rows in rounds): causal 512 306 (non-persistent 255, snake 242, PAIR without FUSE 283, v05 286,
//     SDPA-cuDNN 323); causal 2048 505 (480, 363, 472; cuDNN 482); causal 8192 (long config) unchanged; 58/58
//     checks. Now the default, and lab.ops sends causal D = 128 at 512 queries here instead of v05.
//   ncu of the final few-keys kernels beside SDPA-cuDNN at S = 512 (outputs/driver_logs/20261123-h200-ncu-pair-
//     9ba6c81/): the same grid, shared memory and HGMMA count, 18-22 % more cycles; our top stall is `wait`
//     (MUFU 28 %, HGMMA 14 %, FMNMX 11 % of it at causal 512), cuDNN's is `barrier` (its consumers wait for
//     the tensor core). The softmax chain per key tile, not memory or the schedule, bounds these cells.
//   Static schedule (run 5, outputs/driver_logs/20261123-h200-d128-cells-run5-bd46d1e/): the few-keys config
//     loses ~5 % to the long one at S = 8192 (613 vs 648). If one CTA per SM over a static round-robin were the
//     cause (SMs of unequal speed wait for the slowest), hardware-scheduled CTAs of k tiles each should recover
//     it. Outcome: k = 2 / 4 / 8 at 8192 604 / 611 / 614, at 512 405 / 438 / 458 (one CTA per SM 477): no; the
//     loss is B_c = 128's per-tile cost (the long config at B_c = 128: 651 vs 673, run 1). The switch is gone.
//   Few-keys config up to S_k = 2048 non-causal (runs 1, 2, 5): 593 vs 583, 580 vs 572, 579 vs 564 TFLOP/s
//     (+1.4 to +2.7 %, the same sign in three runs): the threshold moves from 1024 to 2048.
//   Softmax micro-steps (run 6, outputs/driver_logs/20261123-h200-d128-cells-run6-c13c752/; TFLOP/s at 512 / 512
//     causal / 2048 / 2048 causal / 8192 against 497 / 304 / 593 / 498 / 647): the mask as one bound per row
//     (one compare per element, common softmax_scores) 504 / 315 / 603 / 511 / 652 (+1 to +3.4 %): kept, for
//     v05-v07 alike; the exponent arguments in a pass of their own 496 / 306 / 594 / 500 / 649 and CHAINS = 4
//     496 / 305 / 588 / 497 / 655: noise, not kept.
// Runs of 2026-11-23 (H200 sixth-runs 1-9, outputs/driver_logs/20261123-h200-sixth-*, README there): the
// work between two work tiles. ncu (ncu-pair-9ba6c81, S = 512) put 35 % of all stall samples in per-work-tile code,
// which cost about two key tiles per work tile of four. Kernel-only rows in rounds, D = 128 at 512 / 512 causal /
// 2048 / 2048 causal:
//   D = 64 masks per element again (kMaskRowBound): the row bound had cost v07 4-6 % at D = 64 in every cell,
//     masked or not (run 1), through the code around it, not the masked tiles.
//   NOZERO (FUSE): a tile's first P V overwrites O instead of O being zeroed after the epilogue, where the zeroing
//     waited for the epilogue's stores to release O's registers: +1.9 / +5.6 / +1.4 / +2.2 % (run 2). The same in
//     the D = 64 persistent path: 0 to -1.4 % (run 3), not kept.
//   Epilogue stores (common epilogue_direct, QUAD): lanes t and t ^ 1 swap words so each stores 8 bytes; a warp's
//     4-byte stores had touched 8 lines each, 32 per thread: +6.2 / +8.4 / +2.1 / +3.9 % (run 5), D = 64 -0.5 to
//     +3.1 %. 16-byte stores (a second swap) gained a little less. Packing every value before the first store:
//     -2 to -5 % (run 2).
//   FAST_INV: 1 / l by MUFU.RCP in that epilogue, +0.6 to +1.4 % (run 6).
//   Work-tile arithmetic: handed over by the producer in shared memory, +1.6 to +3.8 % (run 6), but racecheck
//     flags the plain handoff (it does not model mbarrier ordering), st.async needs a cluster (run 7) and atomics
//     ate the gain (run 8): dropped. FAST_DIV (common/fast_div.cuh, a wide multiply and a shift per division)
//     instead: +4.4 / +5.4 / +0.1 / +2.1 % (run 9).
//   FIRST_FULL (D = 128): a work tile's first key tile goes straight to the full softmax step; the lazy step's
//     row max and vote before it always chose the full step there: +2.0 / +4.1 / +1.8 / +2.2 % (run 12), D = 64
//     -1.4 %, off there.
// Runs of 2026-11-29 (H200, outputs/driver_logs/20261129-h200-batch6-ed9df1b/Z and 20261129-h200-final-c4d12fc/Z;
// record outputs/experiments/20261129-fwd-d128-s4096-key-tile.json): the last D = 128 non-causal cell below
// SDPA-cuDNN, B 4 x H 16 x S 4096 (0.99x through the public op). The long config's B_c = 176 runs 24 tiles there,
// 4224 keys of work for 4096. Kernel-level builds, three interleaved sessions a cell (time against the old default):
//   the few-keys config (B_c 128, 3 stages, persistent, FUSE): S_k 4096 -2.9 % (run 1), -3.2 % (run 2); 2560 -6.1 %,
//     3000 -4.4 %, 4608 -2.2 %; +0.1 to +0.7 % at 4224 (both pad alike), +1.3 / +1.6 % at 3500 / 4000 (176 pads
//     less), +1.8 / +2.1 / +3.4 % at 6144 / 8192 / 16384. Now taken where B_c = 128 pads S_k by 1 % less, up to
//     4608 keys (SHORT_PAD_MAX_SK). Run 2, public op / cuDNN time at S 4096: 1.003 (0.954-1.004 over sessions).
//   LAST_N (the last tile at wgmma N = 64 when it holds at most 64 keys): -1.2 % at 4096 but +1.6 % at 4224, where it
//     never runs: the extra branch cost the main loop more than the short tile saved. Dropped (in the history at
//     9d3eea0). Long config at B_c = 128 (2 stages): +-0.1 %; B_c = 192: +3.5 % (12 bytes of spills).
//   The last wave: B 2 x H 33 (16.0 waves of 132 CTAs against 15.5) cost both kernels alike (run 1: ours +2.1 %,
//     cuDNN +2.3 % for 3.1 % more work): the tail is not the gap.
// Final default of 2026-11-22 (its run 6, outputs/driver_logs/20261122-h200-hopper-run6-66063b4025.log):
// 50/50 checks (every tests case, strided, scale 0 / negative / 2, LSE);
// memcheck, racecheck (0 hazards) and synccheck clean on uneven shapes.
//
// Limits, algorithm, masking and epilogue: v05's.
// Build alone: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I kernels -c kernels/fwd/v07_overlap.cu
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "common/hopper/attn_fwd_sm90.cuh"

#ifndef LAB_FWD_OVERLAP_PINGPONG
#define LAB_FWD_OVERLAP_PINGPONG 0  // both head dims (a sweep switch); per head dim below
#endif
#ifndef LAB_FWD_OVERLAP_D64_PINGPONG
#define LAB_FWD_OVERLAP_D64_PINGPONG LAB_FWD_OVERLAP_PINGPONG  // D = 64: -1 to +2 % (run 3), off
#endif
#ifndef LAB_FWD_OVERLAP_D128_PINGPONG
#define LAB_FWD_OVERLAP_D128_PINGPONG 1  // D = 128: +5-14 % non-causal (run 3), on
#endif
#ifndef LAB_FWD_OVERLAP_D64_POLY
#define LAB_FWD_OVERLAP_D64_POLY 0  // every N-th n8 block of S takes exp2 on the FMA pipe (0: none); run 5: -0..-10 %
#endif
#ifndef LAB_FWD_OVERLAP_D128_POLY
#define LAB_FWD_OVERLAP_D128_POLY 0
#endif
#ifndef LAB_FWD_OVERLAP_D64_CONSUMERS
#define LAB_FWD_OVERLAP_D64_CONSUMERS 3
#endif
#ifndef LAB_FWD_OVERLAP_D64_BC
#define LAB_FWD_OVERLAP_D64_BC 128
#endif
#ifndef LAB_FWD_OVERLAP_D64_STAGES
#define LAB_FWD_OVERLAP_D64_STAGES 3
#endif
#ifndef LAB_FWD_OVERLAP_D128_CONSUMERS
#define LAB_FWD_OVERLAP_D128_CONSUMERS 2
#endif
#ifndef LAB_FWD_OVERLAP_D128_BC
#define LAB_FWD_OVERLAP_D128_BC 176  // run 5: +4-8 % over 128 on 6 of 7 cells lab.ops sends here (2048 causal -8 %)
#endif
#ifndef LAB_FWD_OVERLAP_D128_STAGES
#define LAB_FWD_OVERLAP_D128_STAGES 2
#endif
#ifndef LAB_FWD_OVERLAP_D64_CHAINS
#define LAB_FWD_OVERLAP_D64_CHAINS 2  // independent row max / row sum chains in the softmax (see CHAINS)
#endif
#ifndef LAB_FWD_OVERLAP_D128_CHAINS
#define LAB_FWD_OVERLAP_D128_CHAINS 2
#endif
#ifndef LAB_FWD_OVERLAP_FOLD
#define LAB_FWD_OVERLAP_FOLD 1  // a scale > 0 runs the kernel with the scale folded into exp2's FFMA (see FOLD)
#endif
#ifndef LAB_FWD_OVERLAP_D64_LAZY
#define LAB_FWD_OVERLAP_D64_LAZY 1  // FA4's conditional rescaling on unmasked tiles (softmax_scores_lazy; see LAZY)
#endif
#ifndef LAB_FWD_OVERLAP_D128_LAZY
#define LAB_FWD_OVERLAP_D128_LAZY 1
#endif
// Causal order: heads grouped so a group's K and V fit this much L2 (0: one group, the grid-wide order).
// Runs 11-12: D = 128 causal 2k +46 % (H100) / +5 % (H200) at 16 MiB; D = 64 -7 to 0 %: its B_r = 192 needs
// less bandwidth per FLOP and the grouping costs longest-first balance.
#ifndef LAB_FWD_OVERLAP_D64_L2_GROUP_MB
#define LAB_FWD_OVERLAP_D64_L2_GROUP_MB 0
#endif
#ifndef LAB_FWD_OVERLAP_D128_L2_GROUP_MB
#define LAB_FWD_OVERLAP_D128_L2_GROUP_MB 16
#endif
// FUSE: persistent configs run one stream of key tiles across their work tiles (see [lab:fuse] below).
// D = 64: its three consumers' 160 registers spill with it (200 / 64 bytes of stack).
#ifndef LAB_FWD_OVERLAP_D64_FUSE
#define LAB_FWD_OVERLAP_D64_FUSE 0
#endif
#ifndef LAB_FWD_OVERLAP_D128_FUSE
#define LAB_FWD_OVERLAP_D128_FUSE 1  // run 18: +6.1 % at D = 128 S = 512 (the few-keys config), 58/58 checks, sanitizers clean
#endif
// How masked tiles apply the mask (common softmax_scores' kRowBound): one bound per row, or the per-element
// predicate. H200 sixth-run 1: D = 64 +4.4 to +5.9 % per element in all five cells timed, none of
// them with a masked tile in most of its work; D = 128 +1 to +3.4 % with the row bound (d128-cells run 6).
#ifndef LAB_FWD_OVERLAP_D64_MASK_ROW_BOUND
#define LAB_FWD_OVERLAP_D64_MASK_ROW_BOUND 0
#endif
#ifndef LAB_FWD_OVERLAP_D128_MASK_ROW_BOUND
#define LAB_FWD_OVERLAP_D128_MASK_ROW_BOUND 1
#endif
// NOZERO: a work tile's first P V overwrites O (wgmma scale_d = 0) instead of O being zeroed after the last
// tile's epilogue: the zeroing waited for the epilogue's stores to release O's registers (long scoreboard).
// FUSE (the D = 128 few-keys config): H200 sixth-run 2, +1.4 to +5.6 % in its four cells. The
// same in the persistent path without FUSE (D = 64; run 3): 0 to -1.4 % in five cells, not kept.
#ifndef LAB_FWD_OVERLAP_FUSE_NOZERO
#define LAB_FWD_OVERLAP_FUSE_NOZERO 1
#endif
// FAST_DIV: the persistent kernels' work-tile arithmetic (work_at, locate) divides by num_m, the heads and
// PAIR's half through common/fast_div.cuh (a wide multiply and a shift) instead of signed divisions, which sat
// on the path between two work tiles. H200 sixth-run 9: D = 128 +4.4 / +5.4 / +0.1 / +2.1 % at
// 512 / 512 causal / 2048 / 2048 causal, D = 64 +0.8 / +1.0 % at 2048 / 8192 causal; 62/62 checks.
#ifndef LAB_FWD_OVERLAP_FAST_DIV
#define LAB_FWD_OVERLAP_FAST_DIV 1
#endif
// FIRST_FULL: a work tile's first key tile takes the full softmax step at once. With LAZY it first took the
// lazy step's row max and vote, which always votes for the full step there (the running max is -inf), so the
// row max was computed twice, on the path between two work tiles. H200 sixth-run 12: D = 128
// +2.0 / +4.1 / +1.8 / +2.2 % at 512 / 512 causal / 2048 / 2048 causal, D = 64 -1.4 % at 2048; 62/62 checks.
#ifndef LAB_FWD_OVERLAP_D64_FIRST_FULL
#define LAB_FWD_OVERLAP_D64_FIRST_FULL 0
#endif
#ifndef LAB_FWD_OVERLAP_D128_FIRST_FULL
#define LAB_FWD_OVERLAP_D128_FIRST_FULL 1
#endif
#ifndef LAB_FWD_OVERLAP_ABLATE
#define LAB_FWD_OVERLAP_ABLATE 0  // diagnostic only, wrong results: 1 no softmax math, 2 no K/V loads once the ring is full
#endif
// PERSIST: one CTA per SM looping over the work tiles, non-causal calls; PERSIST_CAUSAL: causal calls too
// (a snake over the longest-first list). Measured in run 8 (see PERSIST, persistent grids, above).
#ifndef LAB_FWD_OVERLAP_D64_PERSIST
#define LAB_FWD_OVERLAP_D64_PERSIST 1
#endif
#ifndef LAB_FWD_OVERLAP_D64_PERSIST_CAUSAL
#define LAB_FWD_OVERLAP_D64_PERSIST_CAUSAL 1
#endif
#ifndef LAB_FWD_OVERLAP_D128_PERSIST
#define LAB_FWD_OVERLAP_D128_PERSIST 0
#endif
#ifndef LAB_FWD_OVERLAP_D128_PERSIST_CAUSAL
#define LAB_FWD_OVERLAP_D128_PERSIST_CAUSAL 0
#endif
// D = 128, few keys per query tile: a second config (B_c 128, 3 stages, persistent; causal in PAIR order) for
// non-causal calls with S_k <= SHORT_MAX_SK and causal calls with S_q <= SHORT_MAX_SQ_CAUSAL (0: never).
#ifndef LAB_FWD_OVERLAP_D128_SHORT_BC
#define LAB_FWD_OVERLAP_D128_SHORT_BC 128
#endif
#ifndef LAB_FWD_OVERLAP_D128_SHORT_STAGES
#define LAB_FWD_OVERLAP_D128_SHORT_STAGES 3
#endif
#ifndef LAB_FWD_OVERLAP_D128_SHORT_PERSIST
#define LAB_FWD_OVERLAP_D128_SHORT_PERSIST 1
#endif
#ifndef LAB_FWD_OVERLAP_D128_SHORT_PERSIST_CAUSAL
#define LAB_FWD_OVERLAP_D128_SHORT_PERSIST_CAUSAL 1  // causal calls too, in PAIR order with FUSE (run 4: +7 % / +5 %)
#endif
#ifndef LAB_FWD_OVERLAP_D128_PAIR_CAUSAL
#define LAB_FWD_OVERLAP_D128_PAIR_CAUSAL 1  // persistent causal calls at D = 128 take query tiles in pairs (see PAIR)
#endif
#ifndef LAB_FWD_OVERLAP_D128_SHORT_MAX_SK
#define LAB_FWD_OVERLAP_D128_SHORT_MAX_SK 2048  // d128-cells runs 1, 2, 5: +1.9 / +1.4 / +2.7 % at S_k = 2048
#endif
#ifndef LAB_FWD_OVERLAP_D128_SHORT_MAX_SQ_CAUSAL
#define LAB_FWD_OVERLAP_D128_SHORT_MAX_SQ_CAUSAL 2048
#endif
// Non-causal calls up to this many keys (0: none) also take the few-keys config where its B_c = 128 pads S_k to at
// least 1 % fewer keys of work than the long config's B_c = 176 (S_k = 4096: 4096 against 24 x 176 = 4224). See
// "Runs of 2026-11-29" in the header: -3 % time at S_k 2560-4608 where it applies; above 4608 B_c = 128's per-tile
// cost grows (few-keys config +1.8 / +2.1 / +3.4 % at 6144 / 8192 / 16384).
#ifndef LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK
#define LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK 4608
#endif

// Measured and not adopted: the ring slot carried through the loops of the 3-stage rings (the few-keys config at
// D = 128, D = 64; common/hopper/attn_fwd_sm90.cuh RingSlot, which fwd v11's paged and packed kernels take). H200,
// against SDPA-cuDNN in the same rounds: +1.1-1.4 % on the non-causal few-keys cells (S 2048-4608), but -1.6 to -2.7 %
// on the causal few-keys cell (the same kernel) and -3.5 to -4 % at D 64 (outputs/driver_logs/20261130-h200-fwd-v07-
// ring-carry-dc2a65c; record 20261130-fwd-v07-ring-carry; the switch is in the history at dc2a65c).
namespace {
using namespace lab::sm90;

template <int D_, int BC_, int CONSUMERS_, int STAGES_, bool PINGPONG_, int POLY_, bool PERSIST_ = false,
          int CHAINS_ = 1, bool LAZY_ = false, bool PERSIST_CAUSAL_ = false, int L2_GROUP_MB_ = 0>
struct Cfg07 {
  static constexpr int kL2GroupMB = L2_GROUP_MB_;
  static constexpr bool kMaskRowBound = (D_ == 64 ? LAB_FWD_OVERLAP_D64_MASK_ROW_BOUND : LAB_FWD_OVERLAP_D128_MASK_ROW_BOUND) != 0;
  static constexpr bool kFirstFull = (D_ == 64 ? LAB_FWD_OVERLAP_D64_FIRST_FULL : LAB_FWD_OVERLAP_D128_FIRST_FULL) != 0;
  static constexpr bool kPersistentCausal = PERSIST_CAUSAL_;
  static constexpr bool kLazy = LAZY_;
  static constexpr int kChains = CHAINS_;
  static constexpr bool kPersistent = PERSIST_;
  static constexpr int kPolyEvery = POLY_;
  static_assert(kPolyEvery >= 0 && kPolyEvery <= BC_ / 8, "POLY: 0 (off) or every N-th of the B_c/8 column blocks");
  static constexpr bool kPingPong = PINGPONG_;
  // Named barriers: 0 (__syncthreads), 1..kConsumers (epilogues), then one turn barrier per consumer.
  static_assert(1 + CONSUMERS_ + (kPingPong ? CONSUMERS_ : 0) <= 16, "hardware has 16 named barriers");
  static constexpr int D = D_;
  static constexpr bool kNarrow = false;  // Narrow<Cfg07>: a head dim below D (common attn_fwd_sm90.cuh)
  static constexpr int kConsumers = CONSUMERS_;
  static constexpr int BR = 64 * kConsumers;
  static constexpr int BC = BC_;
  static constexpr int kStages = STAGES_;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kRegsProducer = 24;
  static constexpr int kRegsConsumer = kConsumers >= 3 ? 160 : 240;  // 128 * (24 + n * C) <= 65536
  static constexpr int kQBytesWG = 64 * D * 2;
  static constexpr int kQBytes = kConsumers * kQBytesWG;
  static constexpr int kTileBytes = BC * D * 2;
  static constexpr int kSmem = kQBytes + 2 * kStages * kTileBytes + 1024;
  static_assert(kSmem + 128 <= 227 * 1024, "shared memory budget exceeded");
  static_assert(128 * (kRegsProducer + kConsumers * kRegsConsumer) <= 65536, "register file exceeded");
  static_assert(BC % 16 == 0 && BC <= 256, "B_c: a wgmma N and a TMA box");
};
using Cfg64 = Cfg07<64, LAB_FWD_OVERLAP_D64_BC, LAB_FWD_OVERLAP_D64_CONSUMERS, LAB_FWD_OVERLAP_D64_STAGES, LAB_FWD_OVERLAP_D64_PINGPONG != 0,
                    LAB_FWD_OVERLAP_D64_POLY, LAB_FWD_OVERLAP_D64_PERSIST != 0, LAB_FWD_OVERLAP_D64_CHAINS, LAB_FWD_OVERLAP_D64_LAZY != 0,
                    LAB_FWD_OVERLAP_D64_PERSIST_CAUSAL != 0, LAB_FWD_OVERLAP_D64_L2_GROUP_MB>;
using Cfg128 = Cfg07<128, LAB_FWD_OVERLAP_D128_BC, LAB_FWD_OVERLAP_D128_CONSUMERS, LAB_FWD_OVERLAP_D128_STAGES,
                     LAB_FWD_OVERLAP_D128_PINGPONG != 0, LAB_FWD_OVERLAP_D128_POLY, LAB_FWD_OVERLAP_D128_PERSIST != 0,
                     LAB_FWD_OVERLAP_D128_CHAINS, LAB_FWD_OVERLAP_D128_LAZY != 0, LAB_FWD_OVERLAP_D128_PERSIST_CAUSAL != 0,
                     LAB_FWD_OVERLAP_D128_L2_GROUP_MB>;
using Cfg128Short = Cfg07<128, LAB_FWD_OVERLAP_D128_SHORT_BC, LAB_FWD_OVERLAP_D128_CONSUMERS, LAB_FWD_OVERLAP_D128_SHORT_STAGES,
                          LAB_FWD_OVERLAP_D128_PINGPONG != 0, LAB_FWD_OVERLAP_D128_POLY, LAB_FWD_OVERLAP_D128_SHORT_PERSIST != 0,
                          LAB_FWD_OVERLAP_D128_CHAINS, LAB_FWD_OVERLAP_D128_LAZY != 0, LAB_FWD_OVERLAP_D128_SHORT_PERSIST_CAUSAL != 0,
                          LAB_FWD_OVERLAP_D128_L2_GROUP_MB>;

template <class Cfg, class T, bool kFold, bool kPersist>
__global__ void __launch_bounds__(Cfg::kThreads, 1) attn_fwd_v07_kernel(const __grid_constant__ CUtensorMap tq,
                                                                        const __grid_constant__ CUtensorMap tk,
                                                                        const __grid_constant__ CUtensorMap tv,
                                                                        const AttnFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Cfg::D, BC = Cfg::BC, kStages = Cfg::kStages;
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool kFuse = kPersist && (D == 64 ? LAB_FWD_OVERLAP_D64_FUSE : LAB_FWD_OVERLAP_D128_FUSE) != 0;
  extern __shared__ uint8_t smem_raw[];
  // K and V have their own `empty` barriers: K_j is free once S_j is done, a whole softmax before
  // P_j V_j frees V_j, so the next K load is not held up by the overlapped P V (see the header).
  // FUSE: each consumer warpgroup's Q rows have their own pair (bar_q[w], empty_q[w]), so a warpgroup's next
  // Q loads once its own S GEMMs are done, not once the slowest one's are: it needs that Q one turn after its
  // last S GEMM, for the next tile's S_0. Otherwise one pair, bar_q[0] / empty_q[0], for all of Q.
  constexpr int kQBars = kFuse ? Cfg::kConsumers : 1;
  __shared__ __align__(8) uint64_t bar_q[kQBars], bar_k[kStages], bar_v[kStages], empty_k[kStages], empty_v[kStages];
  __shared__ __align__(8) uint64_t empty_q[kQBars];  // PERSIST: every S GEMM of this work tile has read Q
  uint8_t* smem = align1024(smem_raw);
  const SmemRing<Cfg> ring_ = smem_ring<Cfg>(smem);
  const uint32_t sQ = ring_.q;

  // Work tiles: (b, h, Q_i); causal: longest first (within L2-sized head groups, see locate). PERSIST: one
  // CTA per SM takes round `it`'s tile it * G + x (G = gridDim.x); causal rounds alternate direction (a snake
  // over the longest-first list) so each CTA's heavy and light tiles even out. The next tile's K_0 and Q load
  // under this one's last GEMMs and epilogue: no CTA launch, barrier setup or pipeline fill between two tiles.
  const int num_m = (p.seqlen_q + Cfg::BR - 1) / Cfg::BR;
  const int num_bh = p.batch * p.heads_q;
  // PAIR (persistent causal, D = 128): a unit is two query tiles of one head, num_m-1-u then u (longest
  // first), so every unit costs num_m + 1 key tiles and a static round-robin over units is balanced; a
  // unit's head neighbours its other units in the same round (L2). The snake over L2 head groups left CTAs
  // with 4 + 4 key tiles beside CTAs with 2 + 2 (run 1: -5 % at S = 512, -24 % at 2048 causal). lab/fwd/work_order.py
  // mirrors both orders (tests/fwd/test_work_order.py counts the key tiles per CTA): change them together.
  constexpr bool kPair = kPersist && D == 128 && LAB_FWD_OVERLAP_D128_PAIR_CAUSAL != 0;
  const bool pair = kPair && p.causal;
  const int half = (num_m + 1) / 2, num_units = num_bh * half;
  const int num_rounds = !kPersist ? 1
                         : pair    ? 2 * ((num_units + gridDim.x - 1) / gridDim.x)
                                   : (num_m * num_bh + gridDim.x - 1) / gridDim.x;
  // FAST_DIV (persistent kernels: a non-persistent CTA locates one tile, cheaper than building the divisors)
  constexpr bool kFastDiv = kPersist && LAB_FWD_OVERLAP_FAST_DIV != 0;
  const lab::FastDiv div_m(num_m), div_heads(p.heads_q), div_half(half), div_group(p.heads_q / p.heads_kv);
  auto quot = [&](int n, const lab::FastDiv& f, int d) { return kFastDiv ? f.div(n) : n / d; };
  auto rem = [&](int n, const lab::FastDiv& f, int d) { return kFastDiv ? f.mod(n) : n % d; };
  auto work_at = [&](int it) {  // this CTA's tile of round it (-1: none; PAIR: also an odd num_m's middle tile twice)
    if (!kPersist) return (int)blockIdx.x;
    if (kPair && pair) {
      const int u = (it >> 1) * (int)gridDim.x + (int)blockIdx.x, r = rem(u, div_half, half);
      const int mb = (it & 1) ? r : num_m - 1 - r;
      return u < num_units && !((it & 1) && mb == num_m - 1 - r) ? quot(u, div_half, half) * num_m + mb : -1;
    }
    const int x = (p.causal && (it & 1)) ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int w = it * (int)gridDim.x + x;
    return w < num_m * num_bh ? w : -1;
  };
  int b, h, hkv, m0, n_tiles;
  auto locate = [&](int work) {
    int bh, mb;
    if (p.causal && !pair) {
      // Longest first within a group of heads whose K and V fit in L2 (FA3's L2 swizzle): over the whole
      // grid, the first wave held 132 different heads and each CTA streamed its K/V from DRAM (B_r = 128
      // FLOP per byte: ~4.8 TB/s at 600 TFLOP/s, more than an H100 has).
      const int64_t kv_head = (int64_t)p.seqlen_k * D * 4;  // K and V of one head, 16-bit
      const int64_t fit = (int64_t)Cfg::kL2GroupMB * (1 << 20) / (kv_head > 0 ? kv_head : 1);
      const int group = Cfg::kL2GroupMB > 0 ? (int)max((int64_t)1, min((int64_t)num_bh, fit)) : num_bh;
      const int g = work / (group * num_m), r = work % (group * num_m);
      const int heads = min(group, num_bh - g * group);
      mb = num_m - 1 - r / heads;
      bh = g * group + r % heads;
    } else {
      mb = rem(work, div_m, num_m);
      bh = quot(work, div_m, num_m);
    }
    b = quot(bh, div_heads, p.heads_q);
    h = rem(bh, div_heads, p.heads_q);
    hkv = quot(h, div_group, p.heads_q / p.heads_kv);
    m0 = mb * Cfg::BR;
    const int kv_end = p.causal ? min(p.seqlen_k, min(p.seqlen_q, m0 + Cfg::BR)) : p.seqlen_k;
    n_tiles = (kv_end + BC - 1) / BC;
  };
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    init_full_barriers<kStages>(&bar_q[0], bar_k, bar_v);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(smem_u32(&empty_k[s]), 4 * Cfg::kConsumers);  // one arrival per consumer warp
      mbar_init(smem_u32(&empty_v[s]), 4 * Cfg::kConsumers);
    }
    for (int w = 0; w < kQBars; ++w) {
      if (w > 0) mbar_init(smem_u32(&bar_q[w]), 1);
      mbar_init(smem_u32(&empty_q[w]), 4 * Cfg::kConsumers / kQBars);  // its warpgroup's warps (all, if one)
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // Producer (v06's)
    setmaxnreg_dec<Cfg::kRegsProducer>();
    if (threadIdx.x == 0) {
      tma_prefetch_maps(&tq, &tk, &tv);
      int ring = 0;  // K/V tiles issued by this CTA so far: the ring position runs on across work tiles
      for (int it = 0, t = 0; it < num_rounds; ++it) {  // t: work tiles taken (only the last round skips)
        const int work = work_at(it);
        if (work < 0) continue;
        locate(work);
        auto load_q = [&]() {
          for (int w = 0; w < Cfg::kConsumers; ++w) {
            const int qb = kQBars > 1 ? w : 0;
            if (w == 0 || kQBars > 1) {
              if (t > 0) mbar_wait(smem_u32(&empty_q[qb]), (t - 1) & 1);  // the last tile's S GEMMs are done
              mbar_arrive_expect_tx(smem_u32(&bar_q[qb]), kQBars > 1 ? Cfg::kQBytesWG : Cfg::kQBytes);
            }
            for (int cb = 0; cb < D / 64; ++cb)
              tma_load_4d(sQ + w * Cfg::kQBytesWG + cb * 64 * 128, &tq, smem_u32(&bar_q[qb]), cb * 64, m0 + 64 * w, h,
                          b);
          }
        };
        if (!kPersist || n_tiles == 0) load_q();
        // [lab:producer] the producer thread: wait for a free stage, then one TMA per 64-column block of K_j and V_j
        for (int j = 0; j < n_tiles; ++j, ++ring) {
          const int s = ring % kStages;
          const uint32_t free_parity = ((ring / kStages) & 1) ^ 1;
          if (ring >= kStages) mbar_wait(smem_u32(&empty_k[s]), free_parity);
          if ((LAB_FWD_OVERLAP_ABLATE & 2) && ring >= kStages) {  // diagnostic: the math on stale tiles, no loads
            mbar_wait(smem_u32(&empty_v[s]), free_parity);
            mbar_arrive(smem_u32(&bar_k[s]));
            mbar_arrive(smem_u32(&bar_v[s]));
            continue;
          }
          mbar_arrive_expect_tx(smem_u32(&bar_k[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring_.k(s) + cb * BC * 128, &tk, smem_u32(&bar_k[s]), cb * 64, j * BC, hkv, b);
          if (kPersist && j == 0) load_q();  // K_0 first: it loads under the last tile's epilogue
          if (ring >= kStages) mbar_wait(smem_u32(&empty_v[s]), free_parity);
          mbar_arrive_expect_tx(smem_u32(&bar_v[s]), Cfg::kTileBytes);
          for (int cb = 0; cb < D / 64; ++cb)
            tma_load_4d(ring_.v(s) + cb * BC * 128, &tv, smem_u32(&bar_v[s]), cb * 64, j * BC, hkv, b);
        }
        // [/lab:producer]
        ++t;
      }
    }
  } else {
    // Consumers
    setmaxnreg_inc<Cfg::kRegsConsumer>();
    const int ct = threadIdx.x - 128 * wg;
    const uint32_t sQw = sQ + (wg - 1) * Cfg::kQBytesWG;
    const float c = p.scale * kLog2e;
    int wm0, row0;
    float o[D / 2];
    RowState st;
    float sacc[BC / 2], alpha[2];
    uint32_t pa[BC / 16][4];
    int ring = 0;  // the ring position of this work tile's K_0 / V_0 (the producer's count)
    // The mbarrier waits come before wgmma_fence: a spin loop between the fence and
    // the wgmma makes ptxas inject fences of its own.
    auto wait_k = [&](int j) { mbar_wait(smem_u32(&bar_k[(ring + j) % kStages]), ((ring + j) / kStages) & 1); };
    auto wait_v = [&](int j) { mbar_wait(smem_u32(&bar_v[(ring + j) % kStages]), ((ring + j) / kStages) & 1); };
    auto issue_s = [&](int j) {
      issue_qk<D, BC, kBf16, qk_steps<Cfg>::value>(sacc, sQw, ring_.k((ring + j) % kStages));
    };
    auto issue_o = [&](int j, bool overwrite = false) {
      issue_pv<D, BC, kBf16>(o, pa, ring_.v((ring + j) % kStages), overwrite);
    };
    // Returns whether O needs rescale_o (LAZY: an unmasked tile that kept the max does not).
    auto softmax = [&](int j) -> bool {
      if constexpr ((LAB_FWD_OVERLAP_ABLATE & 1) != 0) {  // diagnostic: P = raw scores, no max, exp or sum
        alpha[0] = alpha[1] = 1.f;
        return true;
      }
      // common/mask.cuh's tile_needs_mask, written out: the call form moves v07's integer code (sass_guard)
      const bool mask = (j + 1) * BC > p.seqlen_k || (p.causal && (j + 1) * BC - 1 > wm0);
      if (mask)
        softmax_scores<BC, true, Cfg::kPolyEvery, Cfg::kChains, kFold, Cfg::kMaskRowBound>(sacc, st, alpha, c,
                                                                                           row0, j * BC, p.seqlen_k,
                                                                                           p.causal);
      else if (Cfg::kLazy && kFold && !(Cfg::kFirstFull && j == 0))
        return softmax_scores_lazy<BC, Cfg::kChains>(sacc, st, alpha, c);
      else
        softmax_scores<BC, false, Cfg::kPolyEvery, Cfg::kChains, kFold>(sacc, st, alpha, c, row0, j * BC,
                                                                        p.seqlen_k, p.causal);
      return true;
    };
    // PINGPONG: turn() waits for this warpgroup's token, pass() hands it to the next one. Every
    // warpgroup takes n_tiles + 1 turns per work tile, so the token runs on across work tiles; the
    // last warpgroup hands out the first turn, and warpgroup 1 takes one more after the last work
    // tile, which consumes the last warpgroup's last pass, so no arrival is left pending at exit.
    constexpr bool kPing = Cfg::kPingPong && Cfg::kConsumers > 1;
    const int next_wg = wg % Cfg::kConsumers + 1;
    auto turn = [&]() {
      if constexpr (kPing) named_barrier_sync(3 + wg, 256);
    };
    auto pass = [&]() {
      if constexpr (kPing) named_barrier_arrive(3 + next_wg, 256);
    };
    auto release_k = [&](int j) {
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_k[(ring + j) % kStages]));
    };
    auto release_v = [&](int j) {
      if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[(ring + j) % kStages]));
    };
    const int qb = kQBars > 1 ? wg - 1 : 0;  // this warpgroup's Q barriers
    auto release_q = [&]() {  // PERSIST: this warp's S GEMMs of the work tile are done; Q may be reloaded
      if (kPersist && ct % 32 == 0) mbar_arrive(smem_u32(&empty_q[qb]));
    };
    // Every work tile has n_tiles > 0 exactly when S_k > 0 (causal: m0 < S_q, so kv_end > 0).
    if (kPing && wg == Cfg::kConsumers && p.seqlen_k > 0) named_barrier_arrive(3 + 1, 256);  // the first turn
    bool fused = false;
    if constexpr (kFuse) {
      // [lab:fuse] FUSE: one stream of key tiles over this CTA's work tiles. A work tile's last P V goes out in
      // the same turn as the next work tile's S_0, and the next tile's first softmax runs under that P V; the
      // epilogue follows. Every work tile has n_tiles >= 1 here (S_k > 0).
      fused = p.seqlen_k > 0;
      int it = 0, t = 0;
      int work = fused && num_rounds > 0 ? work_at(0) : -1;
      auto begin = [&](int w) {  // the row state and Q of work tile t
        locate(w);
        wm0 = m0 + 64 * (wg - 1);
        row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
        st = RowState{};
        mbar_wait(smem_u32(&bar_q[qb]), t & 1);
      };
      // The head and main loop below are the plain path's, written out again: sharing them as lambdas renames
      // registers in these kernels and changes the D = 64 kernels' SASS (tools/sass/sass_guard.sh, 2026-11-23),
      // which the GPU checks, sanitizers and sessions of this code did not cover.
      if (work >= 0) {
        begin(work);
        zero_acc(o);
        wait_k(0);
        turn();
        wgmma_fence();
        issue_s(0);
        pass();
        wgmma_wait<0>();
        reg_fence(sacc);
        release_k(0);
        if (n_tiles == 1) release_q();
        softmax(0);
        pack_p<BC, T>(sacc, pa);
      }
      while (work >= 0) {
        for (int j = 1; j < n_tiles; ++j) {  // as the main loop below
          wait_k(j);
          wait_v(j - 1);
          turn();
          wgmma_fence();
          issue_s(j);
          issue_o(j - 1, LAB_FWD_OVERLAP_FUSE_NOZERO && j == 1);
          pass();
          wgmma_wait<1>();
          reg_fence(sacc);
          release_k(j);
          if (j == n_tiles - 1) release_q();
          const bool rescale = softmax(j);
          wgmma_wait<0>();
          reg_fence(o);
          release_v(j - 1);
          if (rescale) rescale_o<D>(o, alpha);
          pack_p<BC, T>(sacc, pa);
        }
        // This tile's last P V (stage sv) and what its epilogue needs, then the next tile's head. Each of the
        // two ends below issues its wgmmas unconditionally after its fence: a wgmma issued under a condition
        // between fence and commit made ptxas serialize every wgmma of the kernel (C7520, runs 14 and 17).
        const int sv = (ring + n_tiles - 1) % kStages, pv = ((ring + n_tiles - 1) / kStages) & 1;
        const bool pv_first = LAB_FWD_OVERLAP_FUSE_NOZERO && n_tiles == 1;  // this P V is the tile's only one
        RowState done = st;
        const int db = b, dh = h, dwm0 = wm0;
        ring += n_tiles;
        ++t;
        work = ++it < num_rounds ? work_at(it) : -1;
        if constexpr (kPair)  // PAIR skips inside the rounds too, not only past the last unit
          while (work < 0 && pair && ++it < num_rounds) work = work_at(it);
        if (work < 0) {  // the CTA's last work tile: its P V alone
          mbar_wait(smem_u32(&bar_v[sv]), pv);
          turn();
          wgmma_fence();
          issue_pv<D, BC, kBf16>(o, pa, ring_.v(sv), pv_first);
          pass();
          wgmma_wait<0>();
          reg_fence(o);
          if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[sv]));
          epilogue_direct<D, T, Cfg::kNarrow>(o, done, p, db, dh, dwm0);
          break;
        }
        begin(work);
        wait_k(0);
        mbar_wait(smem_u32(&bar_v[sv]), pv);
        turn();
        wgmma_fence();
        issue_s(0);
        issue_pv<D, BC, kBf16>(o, pa, ring_.v(sv), pv_first);
        pass();
        wgmma_wait<1>();  // S_0 of the next tile (committed first)
        reg_fence(sacc);
        release_k(0);
        if (n_tiles == 1) release_q();
        softmax(0);  // touches neither O nor the P fragments, which the P V still reads
        wgmma_wait<0>();
        reg_fence(o);
        if (ct % 32 == 0) mbar_arrive(smem_u32(&empty_v[sv]));
        epilogue_direct<D, T, Cfg::kNarrow>(o, done, p, db, dh, dwm0);
        if constexpr (!LAB_FWD_OVERLAP_FUSE_NOZERO) zero_acc(o);
        pack_p<BC, T>(sacc, pa);
      }
      // [/lab:fuse]
    }
    for (int it = 0, t = 0; !fused && it < num_rounds; ++it) {
      const int work = work_at(it);
      if (work < 0) continue;
      locate(work);
      wm0 = m0 + 64 * (wg - 1);
      row0 = wm0 + (ct / 32) * 16 + (ct % 32) / 4;
      zero_acc(o);
      st = RowState{};
      mbar_wait(smem_u32(&bar_q[qb]), t & 1);

      if (n_tiles > 0) {
        wait_k(0);
        turn();
        wgmma_fence();
        issue_s(0);
        pass();
        wgmma_wait<0>();
        reg_fence(sacc);
        release_k(0);
        if (n_tiles == 1) release_q();
        softmax(0);  // O is still 0: alpha needs no rescale
        pack_p<BC, T>(sacc, pa);
      }
      // Main loop: S_j and P_{j-1} V_{j-1} in flight together.
      // [lab:inner-loop] one key tile per consumer warpgroup: S_j and P_{j-1} V_{j-1} together, softmax under P V
      for (int j = 1; j < n_tiles; ++j) {
        wait_k(j);
        wait_v(j - 1);
        turn();
        wgmma_fence();  // P fragments and rescaled O written before the wgmmas read them
        issue_s(j);
        issue_o(j - 1);
        pass();
        wgmma_wait<1>();  // S_j is done (groups complete in order)
        reg_fence(sacc);
        release_k(j);
        if (j == n_tiles - 1) release_q();
        const bool rescale = softmax(j);
        wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and the P fragments are ours again
        reg_fence(o);
        release_v(j - 1);
        if (rescale) rescale_o<D>(o, alpha);
        pack_p<BC, T>(sacc, pa);
      }
      // [/lab:inner-loop]
      if (n_tiles > 0) {
        wait_v(n_tiles - 1);
        turn();
        wgmma_fence();
        issue_o(n_tiles - 1);
        pass();
        wgmma_wait<0>();
        reg_fence(o);
        release_v(n_tiles - 1);
      }

      // Epilogue (PERSIST: straight from registers, so the Q tile is not needed for staging)
      if constexpr (kPersist) {
        if (n_tiles == 0) release_q();
        epilogue_direct<D, T, Cfg::kNarrow>(o, st, p, b, h, wm0);
      } else {
        epilogue<D, T, Cfg::kNarrow>(o, st, p, smem + (wg - 1) * Cfg::kQBytesWG, b, h, wm0, wg);
      }
      ring += n_tiles;
      ++t;
    }
    if (kPing && wg == 1 && p.seqlen_k > 0) turn();
  }
#endif
}

// Config selection, in one place: per call, from (D, S_q, S_k, causal). Rejected options and
// their numbers are in the header (B_c 192, POLY, 3 consumers at D = 128, persistent causal at D = 128).
template <class C, class T>
int launch_cfg(const AttnFwdParams& p, cudaStream_t stream, int dev) {
  auto go = [&](auto persist) {
    constexpr bool kPersist = decltype(persist)::value;
    return launch_fwd_sm90_fold<C, attn_fwd_v07_kernel<C, T, true, kPersist>,
                                attn_fwd_v07_kernel<C, T, false, kPersist>, LAB_FWD_OVERLAP_FOLD != 0, kPersist>(p, stream,
                                                                                                        dev);
  };
  if constexpr (C::kPersistent && C::kPersistentCausal) {
    return go(std::true_type{});
  } else {
    if constexpr (C::kPersistent || C::kPersistentCausal)
      if (p.causal ? C::kPersistentCausal : C::kPersistent) return go(std::true_type{});
    return go(std::false_type{});
  }
}

template <class Cfg, class T>
struct Launch {
  static int run(const AttnFwdParams& p, cudaStream_t stream, int dev) {
    if constexpr (Cfg::D == 128) {
      // Few keys per query tile: the long config's B_c = 176 leaves 3 tiles at S_k = 512 (the last one masked)
      // and its fill and epilogue are not hidden; B_c = 128 with 3 stages and a persistent grid (run 8).
      // Non-causal up to SHORT_PAD_MAX_SK keys: also where B_c = 128 pads S_k less than 176 does, by 1 % or more
      // (full-width D = 128 only: the narrow head dims were not timed with it).
      constexpr int64_t kShortBC = Cfg128Short::BC, kLongBC = Cfg::BC;
      const int64_t pad_short = (p.seqlen_k + kShortBC - 1) / kShortBC * kShortBC,
                    pad_long = (p.seqlen_k + kLongBC - 1) / kLongBC * kLongBC;
      const bool few_keys = p.causal ? p.seqlen_q <= LAB_FWD_OVERLAP_D128_SHORT_MAX_SQ_CAUSAL
                                     : p.seqlen_k <= LAB_FWD_OVERLAP_D128_SHORT_MAX_SK ||
                                           (!Cfg::kNarrow && p.seqlen_k <= LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK &&
                                            pad_short * 100 <= pad_long * 99);
      if (few_keys) return launch_cfg<NarrowLike<Cfg, Cfg128Short>, T>(p, stream, dev);
    }
    return launch_cfg<Cfg, T>(p, stream, dev);
  }
};

}  // namespace

extern "C" int attn_fwd_v07(const AttnFwdParams* p, void* stream) {
  return fwd_sm90_entry<Cfg64, Cfg128, Launch, /*kNarrowToo=*/true>(p, stream);
}
