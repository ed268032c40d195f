"""The narrow head dims on the GPU (lab.fwd.head_dims.narrow: fwd v05 / v07 read D_qk = D_v, a multiple of 8 below
128, unpadded): lab.ops.attention's forward checked through lab.check against float64 with padding made impossible
(a call that pads fails the check), LSE, the build that leaves O's last 8-column block unwritten (which must
fail), and the forward race of the narrow call against the same call padded (head_dims.padded, the path it
replaces) and SDPA's backends over lab.cases.head_dim_cases, in one process (evidence:
outputs/driver_logs/20261126-h100-narrow-*). Needs CUDA.
"""
from __future__ import annotations

import contextlib

import torch

from .. import cases, check, ops, sweep
from ..cases import Case
from ..publish import tables
from . import head_dims
from .head_dims_gpu import lse_check

# Each shape reaches another instantiation: at width 64 v05 (65 x 130 causal; 1 x 1025 causal and 63 x 4097, its
# B_c = 128 config) and v07 (1025 x 63, 4097 causal); at width 128 v07's few-keys config (S_k <= 2048 or causal
# S_q <= 2048) and its long one (4097 causal, 63 x 4097). fp16 and bf16, GQA, a partial tile on both sides.
SHAPES = [((2, 4, 2, 65, 130), "bfloat16", True), ((1, 6, 2, 1025, 63), "float16", False),
          ((2, 2, 2, 1, 1025), "bfloat16", True), ((1, 4, 4, 4097, 4097), "bfloat16", True),
          ((1, 4, 1, 63, 4097), "float16", False)]
DIMS = (8, 32, 56, 72, 80, 96, 120)
WIDE_DIMS = (136, 160, 200, 248)  # fwd v10 at width 192 (136, 160) and 256
BUG = {"LAB_FWD_BUG_NARROW_SHORT": None}  # common/hopper/attn_fwd_sm90.cuh's narrow_stores, wrong on purpose


@contextlib.contextmanager
def unpadded():
    """Within it a call that takes the padded path raises, so a check passes only through the narrow kernels."""
    saved = head_dims.padded

    def refuse(*args, **kwargs):
        raise AssertionError("lab.fwd.head_dims.padded was called: the narrow path was not taken")

    head_dims.padded = refuse
    try:
        yield
    finally:
        head_dims.padded = saved


def narrow_checks(quick: bool = False, dims=DIMS, bugs=(("v07", 80), ("v05", 32))) -> int:
    """Forward checks at every shape of SHAPES and `dims`, the default scale in (B, H, S, D) and -0.3 in (B, S, H, D)
    views (the unfolded kernels, strides that are not the shape's); LSE at the first two dims; the bug builds of
    `bugs` (version, D) must fail. Returns the number of failures. Wide: dims=WIDE_DIMS, bugs=(("v10", 200),)."""
    def forward(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]))

    fails = total = 0

    def tally(ok: bool, *label):
        nonlocal fails, total
        fails, total = fails + (not ok), total + 1
        print("PASS" if ok else "FAIL", *label)

    with torch.no_grad(), unpadded():
        for D in dims[::3] if quick else dims:
            for i, (shape, dtype, causal) in enumerate(SHAPES):
                case = Case(f"hdn-{D}-{i}", *shape, D, dtype, causal)
                for scale, layout in ((None, "bhsd"), (-0.3, "bshd")):
                    res = check.check_forward(forward, case, "lab.ops.attention", trials=2, scale=scale,
                                              layout=layout)
                    tally(res.passed, case.label, scale, layout, "" if res.passed else repr(res))
        for D in dims[1:3]:
            tally(lse_check(D), "LSE", D)
    for version, D in bugs:
        case = Case(f"hdn-bug-{version}", 1, 4, 2, 65, 130, D, "bfloat16", True)
        wrong = check.check_forward(ops.fwd_writer(version, BUG), case, f"{version} LAB_FWD_BUG_NARROW_SHORT",
                                    trials=1, save=False)
        print(f"{version} build without O's last column block", "FAILS (as it must)" if not wrong.passed
              else "PASSES: the check is blind", repr(wrong))
        fails, total = fails + wrong.passed, total + 1
    print(f"narrow head-dim checks: {total - fails}/{total} pass")
    return fails


def padded_attention(scale=None):
    """make(q, k, v, is_causal) -> the call as lab.ops.attention made it before the narrow path: F.pad to the
    kernel's width, the kernel, the slice (head_dims.padded with the op's own attend); the call returns (out, lse)
    and carries gradients as autograd does through F.pad. scale: the caller's (None: 1/sqrt(D_qk))."""
    def make(q, k, v, is_causal):
        gqa = q.shape[1] != k.shape[1]

        def attend(qp, kp, vp, padded_scale):
            return ops.attention(qp, kp, vp, is_causal=is_causal, scale=padded_scale, enable_gqa=gqa, return_lse=True)
        return lambda: head_dims.padded(attend, q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)
    return make


def narrow_race(quick: bool = False, wide: bool = False, dims=(32, 80, 96)) -> list[dict]:
    """The public op (narrow) and the padded call against SDPA's backends over lab.cases.head_dim_cases at `dims`;
    wide: wide_head_dim_cases at D 160 and 200 instead (fwd v10 at widths 192 and 256), against flash and cuDNN."""
    grid = cases.head_dim_cases(head_dims=dims)
    backends = ("flash", "cudnn", "efficient")
    if wide:
        grid = [c for c in {c.name: c for c in cases.wide_head_dim_cases(head_dims=(160, 200))}.values()
                if c.D in (160, 200)]
        backends = ("flash", "cudnn")  # SDPA-efficient takes 10-20x longer at these widths (chapter n14)
    if quick:
        grid = [c for c in grid if "s2048" in c.name]
    kernels = {"lab.ops.attention": sweep.public_attention(), "lab.ops.attention (padded)": padded_attention()}
    with torch.no_grad():
        rows = sweep.fwd_sweep(grid, kernels, backends=backends, progress=False)
    for impl in kernels:
        print("forward", impl, tables.race(rows, impl=impl, backends=backends))
    return rows


def candidate(defines: dict, version: str = "v07", dims=(80, 96), grid=None, exact: bool | dict = False,
              shapes=SHAPES) -> int:
    """A build of `version` other than the default (e.g. LAB_FWD_NARROW_QK_STEPS=1) at narrow head dims: its forward
    checked at every shape of `shapes` (the default scale and -0.3), then its kernel-level call timed in rounds beside
    the default build's, the public op's and SDPA-cuDNN's over `grid` (default: head_dim_cases at `dims`). exact:
    also its output against the default build's (a dict: the build with those defines) on the same inputs, which
    must be equal bit for bit (a build that only drops work on zero terms, or only reorders work). Returns the
    number of failed checks."""
    label = f"{version} " + " ".join(f"{k}={v}" for k, v in defines.items())
    run, fails, total = ops.fwd_writer(version, defines), 0, 0
    with torch.no_grad():
        for D in dims:
            for i, (shape, dtype, causal) in enumerate(shapes):
                for scale in (None, -0.3):
                    res = check.check_forward(run, Case(f"hdn-cand-{D}-{i}", *shape, D, dtype, causal), label,
                                              trials=1, scale=scale)
                    fails, total = fails + (not res.passed), total + 1
                    print("PASS" if res.passed else "FAIL", label, D, i, scale, "" if res.passed else repr(res))
                    if exact:
                        same = same_as_default(run, version, shape, D, dtype, causal, scale,
                                               exact if isinstance(exact, dict) else None)
                        fails, total = fails + (not same), total + 1
                        print("EQUAL" if same else "DIFFERENT", label, "and", exact if isinstance(exact, dict)
                              else "the default", D, i, scale)
        grid = grid or cases.head_dim_cases(head_dims=dims)
        kernels = {version: ops.fwd_call_factory(version), label: ops.fwd_call_factory(version, defines),
                   "lab.ops.attention": sweep.public_attention()}
        rows = sweep.fwd_sweep(grid, kernels, backends=("cudnn",), progress=False)
    for impl in kernels:
        print("forward, kernel-level", impl, tables.race(rows, impl=impl, backends=("cudnn",)))
    base = {r["case"]["name"]: r["timing"]["median_ms"] for r in rows if r["impl"] == version and "timing" in r}
    for r in rows:
        if r["impl"] == label and "timing" in r:
            print(f"{r['case']['name']:18s} {label} / {version} time {r['timing']['median_ms'] / base[r['case']['name']]:.3f}")
    print(f"candidate checks: {total - fails}/{total} pass")
    return fails


def same_as_default(run, version: str, shape, D: int, dtype: str, causal: bool, scale, defines=None) -> bool:
    """run (a writer) and the default build of `version` (or the build with `defines`) on one set of fresh inputs:
    equal bit for bit, no NaN."""
    B, Hq, Hkv, Sq, Sk = shape
    dt = getattr(torch, dtype)
    q = torch.randn(B, Hq, Sq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, Hkv, Sk, D, device="cuda", dtype=dt) for _ in range(2))
    out, ref = torch.full_like(q, float("nan")), torch.full_like(q, float("nan"))
    run(q, k, v, causal, scale, out)
    ops.fwd_writer(version, defines)(q, k, v, causal, scale, ref)
    return bool(torch.equal(out, ref)) and not bool(out.isnan().any())


def aligned_race(dims=(80, 96), wide_dims=(160, 200)) -> list[dict]:
    """Whether the narrow kernels lose to rows that start off 128-byte lines (head_dims.aligned_rows): the public op
    on the caller's contiguous K and V, on K and V copied to aligned rows inside the timed call, and on aligned
    copies made before it (the kernel's own gain), against SDPA-cuDNN, over head_dim_cases at `dims` and
    wide_head_dim_cases at `wide_dims`. Each case first checks that the aligned calls equal the plain one bit for
    bit (the same kernel on the same values)."""
    grid = cases.head_dim_cases(head_dims=dims) + [c for c in {c.name: c for c in cases.wide_head_dim_cases(
        head_dims=wide_dims)}.values() if c.D in wide_dims]

    def copied(q, k, v, is_causal):
        gqa = q.shape[1] != k.shape[1]
        return lambda: ops.attention(q, head_dims.aligned_rows(k), head_dims.aligned_rows(v), is_causal=is_causal,
                                     enable_gqa=gqa)

    def prepared(q, k, v, is_causal):
        gqa, ka, va = q.shape[1] != k.shape[1], head_dims.aligned_rows(k), head_dims.aligned_rows(v)
        with torch.no_grad():
            same = torch.equal(ops.attention(q, ka, va, is_causal=is_causal, enable_gqa=gqa),
                               ops.attention(q, k, v, is_causal=is_causal, enable_gqa=gqa))
        print("aligned rows, the same output bit for bit:", same, tuple(q.shape), is_causal)
        if not same:
            raise AssertionError("the aligned-rows call differs from the plain one")
        return lambda: ops.attention(q, ka, va, is_causal=is_causal, enable_gqa=gqa)

    kernels = {"lab.ops.attention": sweep.public_attention(), "K/V aligned in the call": copied,
               "K/V aligned before": prepared}
    with torch.no_grad():
        rows = sweep.fwd_sweep(grid, kernels, backends=("cudnn",), progress=False)
    for impl in kernels:
        print("forward", impl, tables.race(rows, impl=impl, backends=("cudnn",)))
    return rows
