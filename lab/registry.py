"""The kernel tables and the default rule: which kernels exist and which one a call gets.

Each family's table maps a version to its row (lab.kernels.Kernel: source, extern "C" symbol, head dims, compute
capabilities); choose(family, shape, capability, deterministic) is the one default rule over them, returning the
product's named variant. The variants, HISTORY and the orders of preference the rule reads are lab.variants';
this module re-exports every one of those names.

No torch here, so the gates (a gate may name `default`), the standalone GPU scripts (`python -m lab.registry
drivers`) and the publishing side can read them; lab.ops re-exports every name. Adding a version is one
line in a table below (kernels/README.md, "Adding a version"; tests/product/test_add_version.py does it).
"""
from __future__ import annotations

import sys

from .kernels import Kernel
from .kernels import resolve_version as _version
from .variants import (BEST_BWD, BEST_FP8_BWD, BEST_FP8_FWD, BEST_BWD_HOPPER, BEST_DECODE, BEST_FWD, BEST_FWD_HOPPER,  # noqa: F401 (re-exported)
                       BEST_MASKED_BWD, BEST_MASKED_FWD, BEST_PAGED, DETERMINISTIC_BWD_HOPPER, HISTORY,
                       HOPPER_SMALL_MAX_SQ, VARIANTS, Variant, variant_of)


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
# v09, the same masks on wgmma and TMA (sm_90a); v11, v09's mask steps in the default kernel's (fwd v07's) overlapped loop;
# v12, v11's mask steps on fwd v10's wide tiles (D 192 / 256, sm_90a).
MASKED_FWD = {
    "v08": Kernel("fwd/v08_masks.cu", "attn_fwd_v08", (64, 128)),
    "v09": Kernel("fwd/v09_masks_wgmma.cu", "attn_fwd_v09", (64, 128), ((9, 0),)),
    "v11": Kernel("fwd/v11_masks_overlap.cu", "attn_fwd_v11", (64, 128), ((9, 0),)),
    "v12": Kernel("fwd/v12_masks_wide.cu", "attn_fwd_v12", (192, 256), ((9, 0),)),
}
# The masked backward (window, softcap, sinks; dense calls): its launcher takes MaskBwdParams (kernels/common/hopper/
# attn_bwd_mask_sm90.cuh); lab.masks.backward calls it. v08 is bwd v07's staggered loop with the masks' steps; v21,
# the same steps on bwd v19's wide loop (D 192 / 256).
MASKED_BWD = {
    "v08": Kernel("bwd/v08_masks.cu", "attn_bwd_v08", (64, 128), ((9, 0),)),
    "v21": Kernel("bwd/v21_masks_wide.cu", "attn_bwd_v21", (192, 256), ((9, 0),)),
}
# The FP8 forward (e4m3 Q, K, V with FlashAttention-3's descales, bf16 O): its launcher takes AttnFp8Params
# (kernels/common/hopper/attn_fp8_sm90.cuh), so it has a table of its own; lab.fp8.op (lab.ops.attention_fp8) calls it.
FP8_FWD = {
    "v13": Kernel("fwd/v13_fp8.cu", "attn_fwd_v13", (64, 128, 256), ((9, 0),)),
}
# The FP8 backward (all five GEMMs on e4m3 wgmma: the forward's e4m3 Q, K, V, dO quantised per tensor, P and dS
# rounded in registers; bf16 dQ, dK, dV): its launcher takes AttnBwdFp8Params (kernels/common/hopper/
# attn_bwd_fp8_params.h), so it has a table of its own; lab.fp8.kernel_bwd (attention_fp8_train's backward) calls it.
FP8_BWD = {
    "v22": Kernel("bwd/v22_fp8.cu", "attn_bwd_v22", (64, 128), ((9, 0),)),
}
DETERMINISTIC_BWD = ("v01", "v17", "v18")  # versions with a deterministic dQ mode (the others refuse it: LAB_E_MODE)
PAGED_DECODE = ("v03", "v04", "v05", "v06", "v07", "v08")  # decode versions with a block table (paged cache) and the bottom-right causal mask
# KV heads a paged version's block reads together: H_kv must be a multiple (v04: 8 heads, one 2 KiB run per key)
PAGED_HEADS = {"v04": 8}
SPLIT_RULE = {"v03": "v02", "v05": "v02", "v06": "v02", "v07": "v02", "v08": "v02"}  # v03's (and v05-v08's) pass 1 is v02's with another address: v02's one-block-per-SM split plan
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


HOPPER_CAPABILITIES = ((9, 0),)
TABLES = {"fwd": FWD, "fwd_masked": MASKED_FWD, "bwd": BWD, "bwd_masked": MASKED_BWD, "decode": DECODE,
          "fwd_fp8": FP8_FWD, "bwd_fp8": FP8_BWD}


def kernel_of(variant: Variant) -> Kernel:
    """The table row (source file, symbol, head dims, capabilities) that implements a variant today."""
    return TABLES[variant.family][variant.version]


# ---------------------------------------------------------------- defaults

def default_attention_version(head_dim: int, seqlen_q: int, is_causal: bool, capability: tuple) -> str:
    """The default forward kernel's version for a shape on a GPU of this compute capability (choose's)."""
    return choose("fwd", {"head_dim": head_dim, "seqlen_q": seqlen_q, "causal": is_causal}, capability).version


def _choose_fwd(head_dim: int, seqlen_q: int, is_causal: bool, capability: tuple) -> str:
    if head_dim in WIDE_HEAD_DIMS and capability not in HOPPER_CAPABILITIES:
        raise ValueError(f"head dim {head_dim}: the forward kernel for D_qk, D_v above 128 (fwd v10, wgmma) runs on "
                         f"compute capability 9.0 only, this GPU is {'.'.join(map(str, capability))}; "
                         f"use F.scaled_dot_product_attention for heads wider than 128 here")
    preference = _hopper_preference(head_dim, seqlen_q, is_causal) if capability in HOPPER_CAPABILITIES else ()
    return _version(None, FWD, head_dim, preference + BEST_FWD)


def _hopper_preference(head_dim: int, seqlen_q: int, is_causal: bool) -> tuple:
    """wgmma + TMA kernels (sm_90a) on compute capability 9.0: v05's many small CTAs (one warpgroup, several
    CTAs per SM hide each other's prologue and the causal tail) win at D=64 for 512 queries and causal up to
    2k; v07 (warp-specialised, ping-pong at D=128, its config picked per call in kernels/fwd/v07_overlap.cu)
    everywhere else (HOPPER_SMALL_MAX_SQ's numbers)."""
    if seqlen_q <= HOPPER_SMALL_MAX_SQ.get((head_dim, bool(is_causal)), 0):
        return ("v05",) + BEST_FWD_HOPPER
    return BEST_FWD_HOPPER




def backward_preference(capability: tuple, deterministic: bool = False) -> tuple:
    """The backward's order of preference on a GPU of this capability: the first that takes a head dim runs."""
    hopper = tuple(capability) in BWD[BEST_BWD_HOPPER[0]].capabilities
    if deterministic:  # BEST_BWD after the Hopper ones: v01, and v09 for the wide head dims (which refuses the mode)
        return (DETERMINISTIC_BWD_HOPPER if hopper else ()) + BEST_BWD
    return BEST_BWD_HOPPER if hopper else BEST_BWD


def default_decode_version(heads_q: int, heads_kv: int, q_len: int, head_dim: int = 128) -> str:
    """The first of BEST_DECODE with the head dim, one query row per KV head included. v01 (scalar, two blocks per SM)
    measured up to 10 % faster than v02 there and was its default; v07 is 2.5-5 % faster than v01 in all six MHA
    cells timed (H100, GPU time, 0.995-1.005x SDPA-cuDNN against v01's 0.953-0.974;
    outputs/driver_logs/20261127-h100-decode-mha-72ec60c/)."""
    return choose("decode", {"heads_q": heads_q, "heads_kv": heads_kv, "q_len": q_len, "head_dim": head_dim}).version


def paged_versions(heads_kv: int) -> tuple:
    """The paged decode versions that take H_kv KV heads, in lab.ops.decode's order of preference."""
    return tuple(v for v in BEST_PAGED if heads_kv % PAGED_HEADS.get(v, 1) == 0)


def _default_paged() -> set:
    """The paged versions some call gets by default: BEST_PAGED up to the first that takes every H_kv and head dim."""
    upto = next(i for i, v in enumerate(BEST_PAGED) if v not in PAGED_HEADS and DECODE[v].head_dims == DECODE_HEAD_DIMS)
    return set(BEST_PAGED[:upto + 1])


def default_paged_version(heads_kv: int, head_dim: int = 128) -> str:
    """What lab.ops.decode runs for a block table (or a causal call) with H_kv KV heads at a head dim (choose's)."""
    return choose("decode", {"heads_kv": heads_kv, "head_dim": head_dim, "paged": True}).version


def default_for_row(row: dict) -> str | None:
    """The default version for a record's shape and GPU (what lab.ops would have run), or None when the row
    does not say enough: forward rows need D, Sq, causal and env.capability; decode rows Hq, Hkv, q_len."""
    case = row.get("case") or {}
    try:
        if "page_size" in case:
            return default_paged_version(int(case["Hkv"]), int(case.get("D", 128)))
        if "q_len" in case:
            return default_decode_version(int(case["Hq"]), int(case["Hkv"]), int(case["q_len"]), int(case.get("D", 128)))
        if "Sq" in case:
            capability = tuple(int(x) for x in str(row.get("env", {}).get("capability", "")).split("."))
            return default_attention_version(int(case["D"]), int(case["Sq"]), bool(case.get("causal")), capability)
    except (KeyError, TypeError, ValueError):
        return None
    return None


def choose(family: str, shape: dict, capability: tuple = (9, 0), deterministic: bool = False) -> Variant:
    """The variant a call gets: family "fwd" (shape: head_dim, seqlen_q, causal), "bwd" (head_dim), "decode"
    (head_dim, heads_kv; paged=True for a block table or a causal call), "fwd_masked" / "bwd_masked" / "fwd_fp8" /
    "bwd_fp8" (head_dim).
    The one place the default rules live; default_attention_version & co. are its wrappers."""
    capability, head_dim = tuple(capability), int(shape.get("head_dim", 128))
    if family == "fwd":
        version = _choose_fwd(head_dim, int(shape.get("seqlen_q", 1)), bool(shape.get("causal")), capability)
    elif family == "bwd":
        if narrow_backward_dim(head_dim) and capability in HOPPER_CAPABILITIES and not deterministic:
            version = NARROW_BWD[0]
        else:
            version = _version(None, BWD, head_dim, backward_preference(capability, deterministic))
    elif family == "decode" and shape.get("paged"):
        version = _version(None, DECODE, head_dim, paged_versions(int(shape.get("heads_kv", 1))))
    elif family == "decode":  # one query row per KV head included (see default_decode_version)
        version = next((v for v in BEST_DECODE if head_dim in DECODE[v].head_dims), BEST_DECODE[-1])
    elif family in ("fwd_masked", "bwd_masked"):
        table, best = (MASKED_FWD, BEST_MASKED_FWD) if family == "fwd_masked" else (MASKED_BWD, BEST_MASKED_BWD)
        runs = [v for v in best if not table[v].capabilities or capability in table[v].capabilities]
        wide = [v for v in best if head_dim in table[v].head_dims]
        if wide and not any(v in runs for v in wide):  # a head dim only Hopper kernels take (fwd_masked v12: 192, 256)
            caps = ", ".join(".".join(map(str, c)) for c in table[wide[0]].capabilities)
            raise NotImplementedError(f"{family} at head dim {head_dim} runs on compute capability {caps} only "
                                      f"({wide[0]}); this GPU is {'.'.join(map(str, capability))}")
        if not runs:
            raise NotImplementedError(f"{family} runs on compute capability {table[best[0]].capabilities} only")
        version = _version(None, table, head_dim, runs)
    elif family == "fwd_fp8":
        if capability not in HOPPER_CAPABILITIES:
            raise NotImplementedError(f"fwd_fp8 (the FP8 forward, wgmma e4m3) runs on compute capability 9.0 only, this "
                                      f"GPU is {'.'.join(map(str, capability))}")
        version = _version(None, FP8_FWD, head_dim, BEST_FP8_FWD)
    elif family == "bwd_fp8":
        if capability not in HOPPER_CAPABILITIES:
            raise NotImplementedError(f"bwd_fp8 (the FP8 backward, wgmma e4m3) runs on compute capability 9.0 only, "
                                      f"this GPU is {'.'.join(map(str, capability))}")
        if deterministic:  # the kernel runs base.deterministic = 0 only
            raise NotImplementedError("bwd_fp8 (the FP8 backward) has no deterministic mode")
        version = _version(None, FP8_BWD, head_dim, BEST_FP8_BWD)
    else:
        raise ValueError(f"family {family!r}: one of {sorted(TABLES)}")
    return variant_of(family, version)


SNAPSHOT_CAPABILITIES = ((8, 0), (8, 9), (9, 0))


def defaults_snapshot() -> list[dict]:
    """What choose returns over a grid of shapes and capabilities (an error as its type): tests/fixtures/defaults.json,
    regenerated on purpose by `python -m lab.registry defaults > tests/fixtures/defaults.json`."""
    grid = [("fwd", {"head_dim": d, "seqlen_q": s, "causal": c}, False) for d in (16, 32, 64, 128, 192, 256)
            for s in (1, 512, 513, 2048, 2049, 4096, 4097, 8192) for c in (False, True)]
    grid += [("bwd", {"head_dim": d}, det) for d in (32, 64, 80, 96, 128, 192, 256) for det in (False, True)]
    grid += [("decode", {"head_dim": d, "heads_kv": h, **paged}, False) for d in DECODE_HEAD_DIMS for h in (1, 2, 8)
             for paged in ({}, {"paged": True})]
    grid += [(family, {"head_dim": d}, False) for family in ("fwd_masked", "bwd_masked") for d in (64, 128)]
    grid += [("fwd_fp8", {"head_dim": d}, False) for d in (64, 128, 256)]
    grid += [("bwd_fp8", {"head_dim": d}, det) for d in (64, 128) for det in (False, True)]
    grid += [("fwd_masked", {"head_dim": d}, False) for d in WIDE_HEAD_DIMS]
    grid += [("bwd_masked", {"head_dim": d}, False) for d in WIDE_HEAD_DIMS]
    rows = []
    for capability in SNAPSHOT_CAPABILITIES:
        for family, shape, deterministic in grid:
            try:
                variant = choose(family, shape, capability, deterministic)
                got = {"variant": variant.name, "version": variant.version}
            except (ValueError, NotImplementedError) as error:
                got = {"variant": type(error).__name__}
            rows.append({"family": family, "shape": shape, "capability": list(capability),
                         "deterministic": deterministic, **got})
    return rows


# ---------------------------------------------------------------- standalone drivers

# The C++ drivers (tools/gpu/*_main.cu) that test a kernel without torch, by family; the version's symbol
# goes in as -D<macro>=<symbol>. fwd v01 has a driver of its own (its debug switches).
DRIVERS = {"fwd": ("tools/gpu/fwd_mma_main.cu", "FWD_FN"), "decode": ("tools/gpu/decode_main.cu", "DECODE_FN"),
           "bwd": ("tools/gpu/bwd_main.cu", "BWD_FN")}
OWN_DRIVER = {("fwd", "v01"): "tools/gpu/fwd_v01_main.cu"}


def default_versions(capability: tuple) -> dict[str, set]:
    """Every version some call gets by default on a GPU of this capability, per family: the kernels whose
    sanitizer runs cover what users run."""
    head_dims = sorted({d for kernel in FWD.values() for d in kernel.head_dims})
    head_dims = [d for d in head_dims if d not in WIDE_HEAD_DIMS or tuple(capability) in HOPPER_CAPABILITIES]
    fwd = {default_attention_version(d, s, c, tuple(capability)) for d in head_dims for c in (False, True)
           for s in (1, *HOPPER_SMALL_MAX_SQ.values(), *(v + 1 for v in HOPPER_SMALL_MAX_SQ.values()))}
    decode = {default_decode_version(hq, 1, 1, d) for hq in (1, 2) for d in DECODE_HEAD_DIMS} | _default_paged()
    bwd = {_version(None, BWD, d, backward_preference(capability, det)) for d in FWD_HEAD_DIMS for det in (False, True)}
    return {"fwd": fwd, "decode": decode, "bwd": bwd}


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
