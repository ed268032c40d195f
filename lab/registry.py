"""The kernel tables: which kernels exist, and the preference orders the default rules read.

Each family's table maps a version to its row (lab.kernels.Kernel: source file, extern "C" symbol, head dims,
compute capabilities); the tuples beside them (BEST_*, PAGED_*, SPLIT_RULE, the head dims) are the orders and
limits that lab.variants' one default rule, choose(family, shape, capability, deterministic), reads. The product's
named variants (VARIANTS), the versions no call reaches (HISTORY) and the default-rule wrappers live there; this
module re-exports every one of those names, so `from lab.registry import choose` keeps working.

No torch here, so the gates (a gate may name `default`), the standalone GPU scripts (`python -m lab.registry
drivers`) and the publishing side can read them; lab.ops re-exports every name. Adding a version is one
line in a table below (kernels/README.md, "Adding a version"; tests/product/test_add_version.py does it).
"""
from __future__ import annotations

import sys

from .kernels import Kernel

FWD = {
    "v01": Kernel("fwd/v01_scalar.cu", "attn_fwd_v01", (16, 32, 64, 128)),
    "v02": Kernel("fwd/v02_mma.cu", "attn_fwd_v02", (64, 128)),
    "v03": Kernel("fwd/v03_qsmem.cu", "attn_fwd_v03", (64, 128)),
    "v04": Kernel("fwd/v04_lazy.cu", "attn_fwd_v04", (64, 128)),
    "v05": Kernel("fwd/v05_wgmma.cu", "attn_fwd_v05", (64, 128), ((9, 0),)),
    "v06": Kernel("fwd/v06_warpspec.cu", "attn_fwd_v06", (64, 128), ((9, 0),)),
    "v07": Kernel("fwd/v07_overlap.cu", "attn_fwd_v07", (64, 128), ((9, 0),)),
    "v10": Kernel("fwd/v10_wide.cu", "attn_fwd_v10", (192, 256), ((9, 0),)),
}
# Decode head dims: v02 / v03 tile D in steps of 16 (kernels/common/decode_head_dim.cuh), v01's scalar tiles, v04's
# 8-head tiles and v07's swizzled ring take 64 and 128, v08 (v07's ring) 80 and 96 (lab.ops.decode falls back to v02 /
# v03 for 192 and 256).
DECODE_HEAD_DIMS = (64, 80, 96, 128, 192, 256)
DECODE = {
    "v01": Kernel("decode/v01_splitk.cu", "decode_splitk_v01", (64, 128)),
    "v02": Kernel("decode/v02_mma.cu", "decode_splitk_v02", DECODE_HEAD_DIMS),
    "v03": Kernel("decode/v03_paged.cu", "decode_paged_v03", DECODE_HEAD_DIMS),
    "v04": Kernel("decode/v04_pagerow.cu", "decode_pagerow_v04", (64, 128)),
    "v05": Kernel("decode/v05_bulkrow.cu", "decode_bulkrow_v05", DECODE_HEAD_DIMS, ((9, 0),)),
    "v06": Kernel("decode/v06_warpring.cu", "decode_warpring_v06", DECODE_HEAD_DIMS),
    "v07": Kernel("decode/v07_swizzle.cu", "decode_swizzle_v07", (64, 128)),
    "v08": Kernel("decode/v08_swizzle_narrow.cu", "decode_swizzle_narrow_v08", (80, 96)),
}
BWD = {
    "v01": Kernel("bwd/v01_mma.cu", "attn_bwd_v01", (64, 128)),
    "v02": Kernel("bwd/v02_wgmma.cu", "attn_bwd_v02", (64, 128), ((9, 0),)),
    "v03": Kernel("bwd/v03_pipe.cu", "attn_bwd_v03", (64, 128), ((9, 0),)),
    "v04": Kernel("bwd/v04_persist.cu", "attn_bwd_v04", (64, 128), ((9, 0),)),
    "v05": Kernel("bwd/v05_stagger.cu", "attn_bwd_v05", (64, 128), ((9, 0),)),
    "v06": Kernel("bwd/v06_convert.cu", "attn_bwd_v06", (64, 128), ((9, 0),)),
    "v07": Kernel("bwd/v07_dqcols.cu", "attn_bwd_v07", (64, 128), ((9, 0),)),
    "v09": Kernel("bwd/v09_wide.cu", "attn_bwd_v09", (192, 256)),
    "v10": Kernel("bwd/v10_regkv.cu", "attn_bwd_v10", (64, 128), ((9, 0),)),
    "v11": Kernel("bwd/v11_persist.cu", "attn_bwd_v11", (64, 128), ((9, 0),)),
    "v12": Kernel("bwd/v12_stage.cu", "attn_bwd_v12", (64, 128), ((9, 0),)),
    "v13": Kernel("bwd/v13_q128.cu", "attn_bwd_v13", (64, 128), ((9, 0),)),
    "v14": Kernel("bwd/v14_tail.cu", "attn_bwd_v14", (64, 128), ((9, 0),)),
    "v15": Kernel("bwd/v15_lastconv.cu", "attn_bwd_v15", (64, 128), ((9, 0),)),
    "v16": Kernel("bwd/v16_ringconv.cu", "attn_bwd_v16", (64, 128), ((9, 0),)),
    "v17": Kernel("bwd/v17_ordered.cu", "attn_bwd_v17", (64, 128), ((9, 0),)),
    "v18": Kernel("bwd/v18_signal.cu", "attn_bwd_v18", (64, 128), ((9, 0),)),
    "v19": Kernel("bwd/v19_wide.cu", "attn_bwd_v19", (192, 256), ((9, 0),)),
    "v20": Kernel("bwd/v20_narrow.cu", "attn_bwd_v20", (64, 128), ((9, 0),)),
}
# The masked forward (sliding window, softcap, sinks, packed sequences): its launcher takes AttnMaskParams
# (kernels/common/params.h), not AttnFwdParams, so it has a table of its own; lab.masks.op calls it. v08 is mma.sync;
# v09, the same masks on wgmma and TMA (sm_90a); v11, v09's mask steps in the default kernel's (fwd v07's) overlapped loop.
MASKED_FWD = {
    "v08": Kernel("fwd/v08_masks.cu", "attn_fwd_v08", (64, 128)),
    "v09": Kernel("fwd/v09_masks_wgmma.cu", "attn_fwd_v09", (64, 128), ((9, 0),)),
    "v11": Kernel("fwd/v11_masks_overlap.cu", "attn_fwd_v11", (64, 128), ((9, 0),)),
}
BEST_MASKED_FWD = ("v11", "v09", "v08")  # preference: the first that runs on the device's capability
# The masked backward (window, softcap, sinks; dense calls): its launcher takes MaskBwdParams (kernels/common/hopper/
# attn_bwd_mask_sm90.cuh); lab.masks.backward calls it. v08 is bwd v07's staggered loop with the masks' steps.
MASKED_BWD = {
    "v08": Kernel("bwd/v08_masks.cu", "attn_bwd_v08", (64, 128), ((9, 0),)),
}
BEST_MASKED_BWD = ("v08",)
BEST_BWD = ("v01", "v09")  # v09: head dims 192 and 256 (mma.sync, FA2's wide-head tiling)
# compute capability 9.0, non-deterministic mode (kernels/bwd/README.md, "Defaults"); v19: D 192 / 256 on wgmma, about
# twice v09 (outputs/experiments/20261126-bwd-v19-wide.json)
BEST_BWD_HOPPER = ("v14", "v13", "v12", "v10", "v07", "v05", "v02", "v01", "v19", "v09")
DETERMINISTIC_BWD = ("v01", "v17", "v18")  # versions with a deterministic dQ mode (the others refuse it: LAB_E_MODE)
# The deterministic mode's preference on compute capability 9.0, before BEST_BWD: v18 (v14 with dQ added in a fixed
# order, signalled by two producer warps: 0.64-0.99x SDPA-cuDNN's backward in GPU time on an H100, 1.7-2.8x v01's
# deterministic mode; outputs/experiments/20261126-bwd-v18-signal.json), then v17 (the same order signalled by the
# consumers: 0.46-0.72x; outputs/experiments/20261126-bwd-v17-ordered.json).
DETERMINISTIC_BWD_HOPPER = ("v18", "v17")
PAGED_DECODE = ("v03", "v04", "v05", "v06", "v07", "v08")  # decode versions with a block table (paged cache) and the bottom-right causal mask
# KV heads a paged version's block reads together: H_kv must be a multiple (v04: 8 heads, one 2 KiB run per key)
PAGED_HEADS = {"v04": 8}
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
SPLIT_RULE = {"v03": "v02", "v05": "v02", "v06": "v02", "v07": "v02", "v08": "v02"}  # v03's (and v05-v08's) pass 1 is v02's with another address: v02's one-block-per-SM split plan
# The contiguous decode where a KV head serves several query rows, in order of preference by head dim: v07 at D 64 /
# 128 (on the contiguous cache 0.989-1.018x SDPA-cuDNN against v02's 0.942-0.966 on the serving cells, H200, same
# evidence as BEST_PAGED), v08 at 80 / 96 (0.916-0.986x v02's GPU time on the 10 serving cells at those dims, H100,
# 0.914-1.067x SDPA-cuDNN against v02's 0.890-1.038; same evidence as v08 in BEST_PAGED), v02 at the others.
BEST_DECODE = ("v07", "v08", "v02")
BEST_FWD = ("v04", "v03", "v02", "v01")  # preference order for version=None
# Head dims with fast forward and backward kernels; lab.ops.attention pads every other D_qk, D_v up to the
# next of these (lab.fwd.head_dims), and runs them when the caller names no version.
FAST_HEAD_DIMS = (64, 128)
# Head dims whose forward runs on compute capability 9.0 only (fwd v10): D_qk, D_v from 129 to 256 pad up to these;
# their backward is bwd v19 (bwd v09 off compute capability 9.0), neither with a deterministic mode (a gradient under
# torch.use_deterministic_algorithms raises NotImplementedError).
WIDE_HEAD_DIMS = (192, 256)
FWD_HEAD_DIMS = FAST_HEAD_DIMS + WIDE_HEAD_DIMS
# Forward versions that also take D_qk = D_v, a multiple of 8 that is no kernel width, as it is: the next width's
# kernel (v05 / v07 up to 128, v10 above) through tensor maps over the true D (TMA's out-of-bounds fill gives the
# zero columns; lab.fwd.head_dims).
NARROW_FWD = ("v05", "v07", "v10")
# Backward versions that take a narrow head dim below 128 (D_qk = D_v, a multiple of 8, no kernel width) as it is:
# v20, v14 over tensor maps of the true D. The gradient of a narrow forward runs there, so a call that trains at
# D 32 / 80 / 96 makes no padded copies (kernels/bwd/v20_narrow.cu); at 64 and 128 v20 is v14.
NARROW_BWD = ("v20",)


def narrow_backward_dim(head_dim: int) -> bool:
    """A head dim that NARROW_BWD reads unpadded: a multiple of 8 below 128 that is no kernel width (common/hopper/
    attn_fwd_sm90.cuh's narrow_head_dim with narrow_width <= 128, which bwd v20's entry checks again). The forward's
    narrow path keeps a call that wants gradients unpadded at these dims only (lab.fwd.head_dims.narrow)."""
    return 0 < head_dim < FAST_HEAD_DIMS[-1] and head_dim % 8 == 0 and head_dim not in FAST_HEAD_DIMS


BEST_FWD_HOPPER = ("v07", "v06", "v05", "v10")  # preference on compute capability 9.0 (v10: D 192, 256 only)
# (head dim, causal) -> largest S_q that runs v05 on Hopper. H200 run 12 and H100 run 11, timed in rounds
# (outputs/driver_logs/20261123-{h200-v07-l2order-run12,h100-v07-l2order-run11}-*), TFLOP/s v05 vs v07: D=64 512
# 351 vs 337, 2k 406 vs 443; D=64 causal 512 259 vs 197, 2k 361 vs 348 (H100 341 vs 343), 8k 404 vs 446 (H100
# 406 vs 447); D=128 causal 512 274 vs 252 (H100 230 vs 241), 2k 363 vs 449. Between measured sizes the switch
# point is not measured.
# D = 128 causal 512 went to v07 once its few-keys config ran in PAIR order: 306 vs v05 286 (H200 run 4,
# outputs/driver_logs/20261123-h200-d128-cells-run4-b9a4b85/).
HOPPER_SMALL_MAX_SQ = {(64, False): 512, (64, True): 2048}
HOPPER_CAPABILITIES = ((9, 0),)
TABLES = {"fwd": FWD, "fwd_masked": MASKED_FWD, "bwd": BWD, "bwd_masked": MASKED_BWD, "decode": DECODE}


# ---------------------------------------------------------------- standalone drivers

# The C++ drivers (tools/gpu/*_main.cu) that test a kernel without torch, by family; the version's symbol
# goes in as -D<macro>=<symbol>. fwd v01 has a driver of its own (its debug switches).
DRIVERS = {"fwd": ("tools/gpu/fwd_mma_main.cu", "FWD_FN"), "decode": ("tools/gpu/decode_main.cu", "DECODE_FN"),
           "bwd": ("tools/gpu/bwd_main.cu", "BWD_FN")}
OWN_DRIVER = {("fwd", "v01"): "tools/gpu/fwd_v01_main.cu"}


def drivers(capability: tuple | None = None, defaults_only: bool = False) -> list[tuple[str, str, str, str]]:
    """(name, driver, kernel source, -D flag) for every registered kernel that runs on `capability` (None:
    all; defaults_only: only default_versions(capability)), e.g.
    ('fwd_v04', 'tools/gpu/fwd_mma_main.cu', 'kernels/fwd/v04_lazy.cu', '-DFWD_FN=attn_fwd_v04')."""
    wanted = default_versions(capability) if defaults_only and capability is not None else None
    rows = []
    for family, table in (("fwd", FWD), ("decode", DECODE), ("bwd", BWD)):
        main, macro = DRIVERS[family]
        for version, kernel in sorted(table.items()):
            if capability is not None and kernel.capabilities and tuple(capability) not in kernel.capabilities:
                continue
            if wanted is not None and version not in wanted[family]:
                continue
            own = OWN_DRIVER.get((family, version))
            if not own and not set(kernel.head_dims) & set(FAST_HEAD_DIMS):
                continue  # the shared drivers' cases are D 64 / 128; fwd v10 and bwd v09 / v19 run under the sanitizers
                # through lab.ops (their records: 20261126-head-dims-fwd-v10-wide, 20261126-bwd-v09-wide)

            flags = "" if own else f"-D{macro}={kernel.symbol}"
            if family == "bwd" and version not in DETERMINISTIC_BWD:
                flags += " -DBWD_MODES=1"  # the driver skips the deterministic mode this version refuses
            rows.append((f"{family}_{version}", own or main, f"kernels/{kernel.source}", flags))
    return rows


def main(argv: list[str]) -> int:
    """`python -m lab.registry drivers [MAJOR.MINOR] [--defaults]`: one tab-separated line per driver build;
    `python -m lab.registry defaults`: the defaults snapshot (defaults_snapshot) as JSON."""
    if argv[:1] == ["defaults"]:
        import json
        print("[\n" + ",\n".join(json.dumps(row) for row in defaults_snapshot()) + "\n]")  # a row a line: diffs read
        return 0
    defaults_only = "--defaults" in argv
    argv = [a for a in argv if a != "--defaults"]
    if not argv or argv[0] != "drivers":
        print("usage: python -m lab.registry drivers [capability, e.g. 9.0] [--defaults]", file=sys.stderr)
        return 2
    capability = tuple(int(x) for x in argv[1].split(".")) if len(argv) > 1 else None
    for row in drivers(capability, defaults_only):
        print("\t".join(row))
    return 0


# The product's variants and the default rules (lab.variants), re-exported: callers and tests name them here. At the
# bottom, after the tables that lab.variants reads (either module may be imported first).
from .variants import (HISTORY, SNAPSHOT_CAPABILITIES, VARIANTS, Variant, backward_preference,  # noqa: E402, F401
                       choose, default_attention_version, default_decode_version, default_for_row,
                       default_paged_version, default_versions, defaults_snapshot, paged_versions, variant_of)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
