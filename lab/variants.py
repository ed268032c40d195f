"""The product's variants and the default rules: which kernel a call gets.

Each family's product is a table of named variants (VARIANTS: what it is, its axes, the version row of lab.registry
that implements it); choose(family, shape, capability, deterministic) is the one default rule, and the versions no
call reaches are HISTORY (taught by the chapters, still built and checked). default_attention_version & co. are
choose's wrappers, default_versions the versions some default call reaches (the sanitizer's list).

No torch here (the gates, the standalone GPU scripts and the publishing side read it); lab.registry re-exports every
public name, and lab.ops in turn.
"""
from __future__ import annotations

from dataclasses import dataclass

from .kernels import Kernel
from .kernels import resolve_version as _version


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


# ---------------------------------------------------------------- variants: the product, named for what it is

@dataclass(frozen=True)
class Variant:
    """One product instantiation: a name that says what it is, its named axes, and the version (a row of its
    family's table in lab.registry, hence the file) that implements it today."""
    name: str
    family: str  # a key of lab.registry.TABLES
    version: str  # the table row: source file and extern "C" symbol
    template: str  # the kernel template and the trait that differs from its neighbours'
    tile: str  # tile config (B_r x B_c, warpgroups, per head dim where it differs)
    mask_steps: str  # the mask steps the kernel composes
    sink: str  # where dQ (backward) or the partials (decode) go; "-" for a forward's O
    pipeline: str  # stages of the load ring, or the order of work
    arch: str = "sm_80"  # the oldest target it runs on (sm_90a: compute capability 9.0 only)

    @property
    def kernel(self) -> Kernel:
        return TABLES[self.family][self.version]

    @property
    def head_dims(self) -> tuple:
        return self.kernel.head_dims


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
    "decode": ("v01", "v04", "v05", "v06"),  # v04 stays last in BEST_PAGED, after v03 that takes every call
}


def variant_of(family: str, version: str) -> Variant:
    """The product variant a family's version implements (KeyError for history)."""
    table = "decode" if family == "decode_paged" else family
    return next(v for v in VARIANTS.values() if v.family == table and v.version == version)


def choose(family: str, shape: dict, capability: tuple = (9, 0), deterministic: bool = False) -> Variant:
    """The variant a call gets: family "fwd" (shape: head_dim, seqlen_q, causal), "bwd" (head_dim), "decode"
    (head_dim, heads_kv; paged=True for a block table or a causal call), "fwd_masked" / "bwd_masked" (head_dim).
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
        if not runs:
            raise NotImplementedError(f"{family} runs on compute capability {table[best[0]].capabilities} only")
        version = _version(None, table, head_dim, runs)
    else:
        raise ValueError(f"family {family!r}: one of {sorted(TABLES)}")
    return variant_of(family, version)


SNAPSHOT_CAPABILITIES = ((8, 0), (8, 9), (9, 0))


def defaults_snapshot() -> list[dict]:
    """What choose returns over a grid of shapes and capabilities (an error as its type): tests/fixtures/defaults.json,
    regenerated on purpose by `python -m lab.registry defaults > tests/fixtures/defaults.json`."""
    grid = [("fwd", {"head_dim": d, "seqlen_q": s, "causal": c}, False) for d in (16, 32, 64, 128, 192, 256)
            for s in (1, 512, 513, 2048, 2049, 8192) for c in (False, True)]
    grid += [("bwd", {"head_dim": d}, det) for d in (32, 64, 80, 96, 128, 192, 256) for det in (False, True)]
    grid += [("decode", {"head_dim": d, "heads_kv": h, **paged}, False) for d in DECODE_HEAD_DIMS for h in (1, 2, 8)
             for paged in ({}, {"paged": True})]
    grid += [(family, {"head_dim": d}, False) for family in ("fwd_masked", "bwd_masked") for d in (64, 128)]
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


# The tables this module reads. Imported last: lab.registry re-exports this module's names from its own last line, so
# either module may be imported first and each finds the other's names defined.
from .registry import (BEST_BWD, BEST_BWD_HOPPER, BEST_DECODE, BEST_FWD, BEST_FWD_HOPPER,  # noqa: E402
                       BEST_MASKED_BWD, BEST_MASKED_FWD, BEST_PAGED, BWD, DECODE, DECODE_HEAD_DIMS,
                       DETERMINISTIC_BWD_HOPPER, FWD, FWD_HEAD_DIMS, HOPPER_CAPABILITIES, HOPPER_SMALL_MAX_SQ,
                       MASKED_BWD, MASKED_FWD, NARROW_BWD, PAGED_HEADS, TABLES, WIDE_HEAD_DIMS, narrow_backward_dim)
