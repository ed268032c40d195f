"""The product: its named variants, the versions no call reaches, and the orders the default rule prefers them in.

Each family's product is a table of named variants (VARIANTS: what it is, its axes, the version row of lab.registry's
tables that implements it); the versions no call reaches are HISTORY (taught by the chapters, still built and
checked). The orders of preference (BEST_*) carry the evidence that put each version where it is. The one default
rule that reads them, choose(family, shape, capability, deterministic), is lab.registry's, beside the tables it
resolves against; lab.registry re-exports every name here, and lab.ops in turn.

Plain data, no import from the rest of lab (lab.registry imports it) and no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

# ---------------------------------------------------------------- orders of preference: the first that takes a call runs

# preference: the first that runs on the device's capability and takes the head dim (v12: D 192 / 256 only)
BEST_MASKED_FWD = ("v11", "v09", "v08", "v12")
BEST_FP8_FWD = ("v13",)  # the FP8 forward (lab.ops.attention_fp8): one kernel, sm_90a
# the FP8 backward (attention_fp8_train's backward="fp8" / "auto"): one kernel, sm_90a, D 64 / 128
BEST_FP8_BWD = ("v22",)
BEST_MASKED_BWD = ("v08", "v21")  # v21: D 192 / 256 only (bwd v19's wide loop with v08's mask steps)
BEST_BWD = ("v01", "v09")  # v09: head dims 192 and 256 (mma.sync, FA2's wide-head tiling)
# compute capability 9.0, non-deterministic mode (kernels/bwd/README.md, "Defaults"); v19: D 192 / 256 on wgmma, about
# twice v09 (outputs/experiments/20261126-bwd-v19-wide.json)
BEST_BWD_HOPPER = ("v14", "v13", "v12", "v10", "v07", "v05", "v02", "v01", "v19", "v09")
# The deterministic mode's preference on compute capability 9.0, before BEST_BWD: v18 (v14 with dQ added in a fixed
# order, signalled by two producer warps: 0.64-0.99x SDPA-cuDNN's backward in GPU time on an H100, 1.7-2.8x v01's
# deterministic mode; outputs/experiments/20261126-bwd-v18-signal.json), then v17 (the same order signalled by the
# consumers: 0.46-0.72x; outputs/experiments/20261126-bwd-v17-ordered.json).
DETERMINISTIC_BWD_HOPPER = ("v18", "v17")
# The paged versions in lab.ops.decode's order of preference, where H_kv allows (PAGED_HEADS). v04 (8 heads a block)
# ran first where its blocks filled a wave with no split: on an H100 it was 1.5-2.5 % faster than v03 at 128 x 2048
# (one split) and 1-12 % slower with 2-127 splits (outputs/experiments/20261126-paged-v04-pagerow.json). It is last
# now (see v07 below), which keeps it in the checks of every paged version while no call reaches it by default.
# v05 (v03 with whole-row bulk copies, sm_90) is on no default list: 0.984-0.999x v03's GPU time on the serving cells
# (outputs/experiments/20261126-paged-v05-bulkrow.json); a call that names it runs it.
# v06 (v03 with warp-private rings: no block barrier in the main loop) is on none either: v03's GPU time over v06's
# 0.992-1.011 on the paged serving cells, DRAM throughput unchanged
# (outputs/experiments/20261126-paged-v06-warpring.json).
# v07 (v06 with an unpadded, swizzled ring; D 64 / 128) comes before v03: on an H200 its copies move cuDNN's crossbar
# sectors (v03 / v06 1.5x), pass 1 reads DRAM at 88 % (v03 82.5 %), and the public op takes 2.5-6.2 % less GPU time
# than v03 on the 15 paged serving cells (outputs/driver_logs/20261127-h200-decode-v07-555d8ce/). It also takes v04's
# cells (128 x 2048, where v04's blocks fill a wave): in two H100 runs v07 / v04 GPU time 0.978-0.991 at pages 16 /
# 64 / 256 (6 of 6), graph replays 0.977-0.990 in 5 of 6 and 1.013 in one (outputs/driver_logs/
# 20261127-h100-decode-v07-sessions-6299973/, 20261127-h100-decode-v08-cee9b7f/ab_v04.log).
# v08 (v07's ring at D 80 / 96) before v03 there: on an H100 0.955-0.984x v03's GPU time at D 80 on all 15 paged
# serving cells, 0.917-1.006x at D 96 (level at 8 x 16384, up to 0.6 % slower at 32 x 4096, 1.4 % in graph replays),
# its copies at cuDNN's crossbar sectors where v03's move 1.46-1.52x (outputs/driver_logs/20261127-h100-decode-v08-cee9b7f/).
BEST_PAGED = ("v07", "v08", "v03", "v04")
# The contiguous decode where a KV head serves several query rows, in order of preference by head dim: v07 at D 64 /
# 128 (on the contiguous cache 0.989-1.018x SDPA-cuDNN against v02's 0.942-0.966 on the serving cells, H200, same
# evidence as BEST_PAGED), v08 at 80 / 96 (0.916-0.986x v02's GPU time on the 10 serving cells at those dims, H100,
# 0.914-1.067x SDPA-cuDNN against v02's 0.890-1.038; same evidence as v08 in BEST_PAGED), v02 at the others.
BEST_DECODE = ("v07", "v08", "v02")
BEST_FWD = ("v04", "v03", "v02", "v01")  # preference order for version=None
BEST_FWD_HOPPER = ("v07", "v06", "v05", "v10")  # preference on compute capability 9.0 (v10: D 192, 256 only)
# (head dim, causal) -> largest S_q that runs v05 on Hopper. H200 run 12 and H100 run 11, timed in rounds
# (outputs/driver_logs/20261123-{h200-v07-l2order-run12,h100-v07-l2order-run11}-*), TFLOP/s v05 vs v07: D=64 512
# 351 vs 337, 2k 406 vs 443; D=64 causal 512 259 vs 197, 2k 361 vs 348 (H100 341 vs 343), 8k 404 vs 446 (H100
# 406 vs 447); D=128 causal 512 274 vs 252 (H100 230 vs 241), 2k 363 vs 449. Between measured sizes the switch
# point is not measured.
# D = 128 causal 512 went to v07 once its few-keys config ran in PAIR order: 306 vs v05 286 (H200 run 4,
# outputs/driver_logs/20261123-h200-d128-cells-run4-b9a4b85/).
# D = 64 causal 4096 went to v05 once the race had S 4096: kernel-only 1.262 vs v07 1.348 / 1.351 ms in two H200
# sessions (20261129-131824-h200-67f551d, 20261129-160050-h200-6fedec1), where v07 left the public op at 0.973-0.978x
# SDPA-cuDNN; at 8192 the two tie (2.381 / 2.384, 2.396 / 2.393 ms) and at 16384 v07 leads by 2 %. Five interleaved
# rounds between (outputs/experiments/20261129-fwd-d64-causal-v05-switch.json): v05 leads by 9.8 / 2.4 / 5.8 % at
# 2048 / 3072 / 4096, v07 by 2.1 / 1.7 % at 6144 / 8192.
HOPPER_SMALL_MAX_SQ = {(64, False): 512, (64, True): 4096}


# ---------------------------------------------------------------- variants: the product, named for what it is

@dataclass(frozen=True)
class Variant:
    """One product instantiation: a name that says what it is, its named axes, and the version (a row of its
    family's table in lab.registry, hence the file: lab.registry.kernel_of) that implements it today."""
    name: str
    family: str  # a key of lab.registry.TABLES
    version: str  # the table row: source file and extern "C" symbol
    template: str  # the kernel template and the trait that differs from its neighbours'
    tile: str  # tile config (B_r x B_c, warpgroups, per head dim where it differs)
    mask_steps: str  # the mask steps the kernel composes
    sink: str  # where dQ (backward) or the partials (decode) go; "-" for a forward's O
    pipeline: str  # stages of the load ring, or the order of work
    arch: str = "sm_80"  # the oldest target it runs on (sm_90a: compute capability 9.0 only)


_STAGGER = "bwd_dkdv_stagger<StagedCfg<D>, T, {sink}, {steps}> (common/hopper/attn_bwd_stagger.cuh)"
VARIANTS = {v.name: v for v in (
    Variant("fwd_sm80_scalar", "fwd", "v01", "attn_fwd_v01_kernel<T, D> (scalar fp32, FA1 order)", "scalar tiles (fwd/v01_scalar.cu)",
            "causal", "-", "none"),
    Variant("fwd_sm80_mma_lazy", "fwd", "v04", "FwdConfig<D, warps, m-tiles, B_c, stages, ...> on mma.sync",
            "FwdConfig<64,4,2,64,4,2> / <128,4,2,64,2,2>, small-grid Cfg*s", "causal, last partial tile", "-", "cp.async, 2-4 stages"),
    Variant("fwd_sm90_wgmma_small", "fwd", "v05", "Cfg05<D, B_c, stages>: one warpgroup, wgmma SS + TMA",
            "B_r 64, B_c per LAB_FWD_WGMMA_D*_BC", "causal, last partial tile", "-", "TMA ring", "sm_90a"),
    Variant("fwd_sm90_overlap", "fwd", "v07", "Cfg07<D, B_c, consumers, stages, pingpong, ...>: producer + 2 consumer warpgroups",
            "B_r 128 (2 x 64), B_c per LAB_FWD_OVERLAP_D*_BC", "causal, last partial tile", "-",
            "TMA ring, intra-warpgroup overlap, causal longest first", "sm_90a"),
    Variant("fwd_sm90_wide", "fwd", "v10", "Cfg10<D, B_c, stages>: v06's warp-specialised kernel at D 192 / 256",
            "B_r 128, B_c per LAB_FWD_WIDE_D*_BC", "causal, last partial tile", "-", "TMA ring, persistent snake order", "sm_90a"),
    Variant("fwd_sm80_masks", "fwd_masked", "v08", "v04's FwdConfig with the mask steps (common/mask.cuh)", "v04's",
            "window (tiles skipped), softcap, sinks, packed sequences", "-", "cp.async"),
    Variant("fwd_sm90_masks_overlap", "fwd_masked", "v11", "v07's Cfg07 loop with v09's mask steps (common/hopper/attn_mask_sm90.cuh)",
            "v07's", "window, softcap, sinks, packed sequences", "-", "v07's", "sm_90a"),
    Variant("fwd_sm90_masks_wide", "fwd_masked", "v12", "Cfg12<D, B_c>: v10's wide tiles with v11's mask steps",
            "B_r 128 (2 x 64), B_c 112 / 80 at D 192 / 256", "window, softcap, sinks, packed sequences", "-",
            "TMA ring, intra-warpgroup overlap, longest first", "sm_90a"),
    Variant("fwd_sm90_fp8", "fwd_fp8", "v13", "CfgFp8<D, B_c, stages> (one warpgroup, D 64); CfgWs (producer + 2 "
            "consumers, D 128 / 256), wgmma k32 e4m3, V^T pass", "D 64: B_r 64, B_c 128; D 128: B_r 128, B_c 192; "
            "D 256: B_r 128, B_c 128", "causal, last partial tile", "-",
            "TMA ring, intra-warpgroup overlap (D 128 / 256: ping-pong, persistent grid)", "sm_90a"),
    Variant("bwd_sm90_fp8", "bwd_fp8", "v22", "the five GEMMs on wgmma k32 e4m3 (AttnBwdFp8Params, "
            "common/hopper/attn_bwd_fp8_params.h): e4m3 Q, K, V, dO per tensor, P as e4m3(P * 448), dS per key row "
            "(dK) and per 64 x 64 tile (dQ) with power-of-two scales", "D 64 / 128: 128 keys a CTA, 64-query steps",
            "causal, last partial tile", "dQ in a float32 workspace (dq_accum), then bf16", "Q^T, K^T, dO^T "
            "written to workspaces before the main loop", "sm_90a"),
    Variant("bwd_sm80_mma", "bwd", "v01", "FA2's backward on mma.sync (m16n8k16)", "per head dim (bwd/v01_mma.cu)", "causal", "dQ atomics or "
            "a fixed-order dQ pass (deterministic)", "none"),
    Variant("bwd_sm80_wide", "bwd", "v09", "FA2's wide-head backward on mma.sync", "per LAB_BWD_WIDE_SM80_*", "causal",
            "dQ atomics", "cp.async"),
    Variant("bwd_sm90_stagger_tail", "bwd", "v14", _STAGGER.format(sink="AddPartial", steps="TailSteps"),
            "StagedCfg: D 64 Cfg<64,2,..,128>, D 128 Cfg<128,2,..>", "causal", "AddPartial (dQ reductions)",
            "causal grid ends on short key blocks", "sm_90a"),
    Variant("bwd_sm90_stagger_narrow", "bwd", "v20", _STAGGER.format(sink="AddPartial", steps="TailSteps").replace(
            "StagedCfg<D>", "Narrow<StagedCfg<W>>"), "v14's at the next width W, tensor maps over the true D", "causal",
            "AddPartial (dQ reductions)", "v14's", "sm_90a"),
    Variant("bwd_sm90_stagger_ordered", "bwd", "v18", _STAGGER.format(sink="SignalSink", steps="OrderedSteps"),
            "v14's StagedCfg", "causal", "SignalSink (dQ added in a fixed order: deterministic)", "v14's, counters", "sm_90a"),
    Variant("bwd_sm90_wide", "bwd", "v19", "wide::bwd_wide<wide::Cfg<D, dq_under_dp>, T> (common/hopper/attn_bwd_wide.cuh)",
            "D 192 / 256", "causal", "dQ reductions", "TMA, producer warpgroup", "sm_90a"),
    Variant("bwd_sm90_stagger_masks", "bwd_masked", "v08", _STAGGER.format(sink="AddPartial", steps="Steps (masks)").replace(
            "StagedCfg<D>", "Cfg8<D>"), "Cfg<D, 2, true, stage, stage>", "window, softcap, sinks", "AddPartial", "v07's", "sm_90a"),
    Variant("bwd_sm90_wide_masks", "bwd_masked", "v21", "wide::bwd_wide<wide::Cfg<D>, T, WindowWideSteps> "
            "(common/hopper/attn_bwd_wide_mask_sm90.cuh)", "v19's: D 192 / 256", "window, softcap, sinks",
            "dQ reductions", "TMA, producer warpgroup, head-major", "sm_90a"),
    Variant("decode_split_mma", "decode", "v02", "split-K decode on mma.sync (contiguous cache)", "common/decode_tile_step.cuh's",
            "none (q_len 1) or bottom-right causal", "partials + combine pass", "one block per SM split plan"),
    Variant("decode_paged_split", "decode", "v03", "v02 through a block table", "v02's",
            "bottom-right causal", "partials + combine pass", "v02's split plan, ragged splits"),
    Variant("decode_swizzled_ring", "decode", "v07", "paged_entry_at_dims<SwizzledRingPartial, 64, 128>",
            "warp-private unpadded ring, XOR swizzle", "bottom-right causal", "SwizzledRingPartial", "v02's split plan"),
    Variant("decode_swizzled_ring_narrow", "decode", "v08", "paged_entry_at_dims<SwizzledRingPartial, 80, 96>",
            "v07's ring at 10 / 12 chunks a row", "bottom-right causal", "SwizzledRingPartial", "v02's split plan"),
)}
# The versions the chapters teach that no default call reaches: buildable, checked, named by a call that asks for them
# (version="v06"), never chosen. Every row of a family's table is a variant's or history's (tests/product/test_registry.py).
HISTORY = {
    "fwd": ("v02", "v03", "v06"),
    "fwd_masked": ("v09",),  # v11 takes its shapes and capability: BEST_MASKED_FWD never reaches it
    "bwd": ("v02", "v03", "v04", "v05", "v06", "v07", "v10", "v11", "v12", "v13", "v15", "v16", "v17"),
    "bwd_masked": (),
    "fwd_fp8": (),
    "bwd_fp8": (),
    "decode": ("v01", "v04", "v05", "v06"),  # v04 stays last in BEST_PAGED, after v03 that takes every call
}


def variant_of(family: str, version: str) -> Variant:
    """The product variant a family's version implements (KeyError for history)."""
    table = "decode" if family == "decode_paged" else family
    return next(v for v in VARIANTS.values() if v.family == table and v.version == version)
