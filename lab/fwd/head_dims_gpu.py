"""The head-dim checks and races on the GPU (chapter n14 calls them): lab.ops.attention's forward and gradients at head
dims without a kernel of their own (zero-padded to the next kernel head dim) and above 128 (fwd v10, bwd v19 / v09;
160 and 200 padded), checked through lab.check against float64 with SDPA's error as the yardstick, value head dims
other than the query's checked the same way, and the races against SDPA's backends over lab.cases.head_dim_cases and
wide_head_dim_cases. Needs CUDA.
"""
from __future__ import annotations

import torch

from .. import cases, check, ops, record, sweep
from ..backward import harness, race
from ..cases import Case
from ..publish import tables


def checks(quick: bool) -> int:
    dims = (32, 48, 80, 96, 120)
    grid = [Case(f"hd-{D}-{i}", *shape, D, dtype, causal)
            for D in dims
            for i, (shape, dtype, causal) in enumerate([((2, 4, 2, 65, 130), "bfloat16", True),
                                                       ((1, 6, 2, 1025, 63), "float16", False),
                                                       ((2, 2, 2, 1, 1025), "bfloat16", True),
                                                       ((1, 4, 4, 4097, 4097), "bfloat16", True)][: 2 if quick else 4])]

    def forward(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]))

    fails = total = 0
    for case in grid:
        for scale in (None, -0.3):
            res = {"out": check.check_forward(forward, case, "lab.ops.attention", trials=2, scale=scale)}
            res.update(check.check_backward(harness.autograd_runner(), case, "lab.ops.attention", trials=1, scale=scale))
            ok = all(r.passed for r in res.values())
            fails, total = fails + (not ok), total + 1
            print("PASS" if ok else "FAIL", case.label, scale, "" if ok else [repr(r) for r in res.values()])
    for d_qk, d_v in ((64, 128), (128, 64), (96, 64), (80, 32)):
        ok = value_head_dim_check(d_qk, d_v)
        fails, total = fails + (not ok), total + 1
    print(f"head-dim checks: {total - fails}/{total} pass")
    return fails


def value_head_dim_check(d_qk: int, d_v: int, grads: bool = True) -> bool:
    """D_v != D_qk, causal, GQA: output and gradients (grads=False: the output) against float64 autograd, SDPA's
    error as the yardstick."""
    gen = torch.Generator(device="cuda").manual_seed(d_qk * 1000 + d_v)
    shape = lambda h, s, d: torch.randn(2, h, s, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v, dout = shape(8, 333, d_qk), shape(2, 517, d_qk), shape(2, 517, d_v), shape(8, 333, d_v)
    results = []
    for name, fn in (("lab", lambda a, b, c: ops.attention(a, b, c, is_causal=True, enable_gqa=True)),
                     ("sdpa", lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
                         a, b, c, is_causal=True, enable_gqa=True)),
                     ("ref", lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(
                         a, b, c, is_causal=True, enable_gqa=True))):
        dt = torch.float64 if name == "ref" else torch.bfloat16
        a, b, c = (t.to(dt).detach().requires_grad_(grads) for t in (q, k, v))
        out = fn(a, b, c)
        results.append((out, *torch.autograd.grad(out, (a, b, c), dout.to(dt))) if grads else (out,))
    ok = True
    for i, label in enumerate(("out", "dq", "dk", "dv")[: 4 if grads else 1]):
        verdict = check.compare(results[0][i], results[2][i], results[1][i])
        ok &= bool(verdict["passed"])
        record.append({"kind": "check", "impl": "lab.ops.attention", "case": {"name": f"dv-{d_qk}-{d_v}", "D": d_qk,
                       "D_v": d_v}, "tensor": label, "check": {key: verdict[key] for key in verdict if key != "worst"}})
    print("PASS" if ok else "FAIL", f"D_qk {d_qk} D_v {d_v} causal GQA 8/2, Sq 333, Sk 517")
    return ok


WIDE_SHAPES = [((2, 4, 2, 65, 130), "bfloat16", True), ((1, 6, 2, 1025, 63), "float16", False),
               ((2, 2, 2, 1, 1025), "bfloat16", True), ((1, 4, 4, 4097, 4097), "bfloat16", True),
               ((1, 4, 1, 63, 4097), "float16", False), ((1, 2, 2, 4097, 65), "float16", True)]


def wide_alt() -> dict:
    """$WIDE_ALT (e.g. LAB_FWD_WIDE_OVERLAP=1, space-separated NAME=VALUE): a second build of fwd v10 that the wide
    checks and the race run beside the default one."""
    import os

    return dict(item.split("=", 1) for item in os.environ.get("WIDE_ALT", "").split())


def bwd_alt() -> dict:
    """$BWD_ALT (e.g. LAB_BWD_WIDE_SM80_KEY_TILES=2, space-separated NAME=VALUE): a second build of bwd v09 that the gradient
    checks run beside the default one."""
    import os

    return dict(item.split("=", 1) for item in os.environ.get("BWD_ALT", "").split())


def wide_checks(quick: bool) -> int:
    """D = 160, 192, 200, 256 forward (no gradients) through lab.check at uneven lengths, GQA, causal and not,
    fp16 / bf16, scales default and negative; D_v != D_qk; LSE; a wrong scale must fail; then wide_grad_checks."""
    def forward(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]))

    fails = total = 0
    with torch.no_grad():
        for D in (160, 192, 200, 256):
            for i, (shape, dtype, causal) in enumerate(WIDE_SHAPES[: 3 if quick else None]):
                case = Case(f"hdw-check-{D}-{i}", *shape, D, dtype, causal)
                for scale in (None, -0.3):
                    runs = {"lab.ops.attention": forward}
                    if wide_alt() and D in (192, 256):
                        runs["v10 " + " ".join(f"{k}={v}" for k, v in wide_alt().items())] = ops.fwd_writer("v10", wide_alt())
                    for impl, run in runs.items():
                        res = check.check_forward(run, case, impl, trials=2, scale=scale)
                        fails, total = fails + (not res.passed), total + 1
                        print("PASS" if res.passed else "FAIL", impl, case.label, scale, "" if res.passed else repr(res))
        # A wrong kernel must fail the same check: the scale off by 20 % at D = 256.
        wrong = check.check_forward(lambda q, k, v, c, s, out: forward(q, k, v, c, 1.2 / 16, out),
                                    Case("hdw-wrong-scale", 1, 4, 2, 1025, 1025, 256, "bfloat16", True),
                                    "lab.ops.attention (scale x1.2)", trials=1, save=False)
        print("wrong-scale variant", "FAILS (as it must)" if not wrong.passed else "PASSES: the check is blind", repr(wrong))
        fails, total = fails + wrong.passed, total + 1
        for d_qk, d_v in ((192, 128), (256, 64), (128, 256), (200, 160)):
            ok = value_head_dim_check(d_qk, d_v, grads=False)
            fails, total = fails + (not ok), total + 1
        for D in (192, 256):
            ok = lse_check(D)
            fails, total = fails + (not ok), total + 1
    fails_g, total_g = wide_grad_checks(quick)
    fails, total = fails + fails_g, total + total_g
    print(f"wide head-dim checks: {total - fails}/{total} pass")
    return fails


def wide_bwd_versions() -> list[str]:
    """The registered backward versions for the head dims above 128 that run on this GPU (bwd v09 everywhere, bwd
    v19 on compute capability 9.0): the gradient checks run each of them by name besides the public op."""
    from ..registry import BWD, WIDE_HEAD_DIMS

    capability = torch.cuda.get_device_capability()
    return [v for v, kernel in sorted(BWD.items()) if set(kernel.head_dims) == set(WIDE_HEAD_DIMS) and
            (not kernel.capabilities or tuple(capability) in kernel.capabilities)]


def wide_grad_checks(quick: bool) -> tuple[int, int]:
    """Gradients above 128 (160 and 200 padded) through lab.check against float64, SDPA's error as the
    yardstick: the public op's autograd over WIDE_SHAPES, each of wide_bwd_versions by name at 192 / 256, strided
    (B, S, H, D) views, a negative scale, D_v != D_qk; each version's build that forgets the D term must fail;
    deterministic mode must refuse."""
    fails = total = 0

    def tally(ok: bool, *label):
        nonlocal fails, total
        fails, total = fails + (not ok), total + 1
        print("PASS" if ok else "FAIL", *label)

    for D in (160, 192, 200, 256):
        for i, (shape, dtype, causal) in enumerate(WIDE_SHAPES[: 3 if quick else None]):
            case = Case(f"hdw-grad-{D}-{i}", *shape, D, dtype, causal)
            runs = {"lab.ops.attention": harness.autograd_runner()}
            if D in (192, 256):
                for version in wide_bwd_versions():
                    runs[f"bwd {version}"] = harness.bwd_runner(version)
                if bwd_alt():
                    runs["bwd v09 " + " ".join(f"{k}={v}" for k, v in bwd_alt().items())] = \
                        harness.bwd_runner("v09", defines=bwd_alt())
            for impl, run in runs.items():
                res = check.check_backward(run, case, impl, trials=1)
                tally(check.backward_passed(res), impl, "grads", case.label,
                      "" if check.backward_passed(res) else [repr(r) for r in res.values()])
    for D in (192, 256):
        case = Case(f"hdw-grad-bshd-{D}", 2, 4, 2, 65, 130, D, "float16", True)
        res = check.check_backward(harness.autograd_runner(), case, "lab.ops.attention", trials=1, layout="bshd")
        tally(check.backward_passed(res), "grads (B, S, H, D) views", case.label)
        case = Case(f"hdw-grad-scale-{D}", 2, 4, 2, 130, 65, D, "bfloat16", False)
        res = check.check_backward(harness.autograd_runner(), case, "lab.ops.attention", trials=1, scale=-0.3)
        tally(check.backward_passed(res), "grads scale -0.3", case.label)
    for d_qk, d_v in ((192, 128), (256, 64), (128, 256), (200, 160), (96, 256)):
        tally(value_head_dim_check(d_qk, d_v, grads=True), "grads D_qk", d_qk, "D_v", d_v)
    for version in wide_bwd_versions():
        wrong = check.check_backward(harness.bwd_runner(version, defines={"LAB_BWD_BUG_NO_DELTA": None}),
                                     Case("hdw-grad-no-delta", 1, 4, 4, 130, 130, 256, "float16", False),
                                     f"bwd {version} (D term forgotten)", trials=1, save=False)
        print(f"bwd {version} forgotten-D-term build",
              "FAILS (as it must)" if not check.backward_passed(wrong) else "PASSES: blind")
        fails, total = fails + check.backward_passed(wrong), total + 1
    q = torch.randn(1, 2, 8, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.use_deterministic_algorithms(True)
    try:
        ops.attention(q, q, q)
        ok = False
    except NotImplementedError as err:
        ok = "no deterministic backward" in str(err)
    finally:
        torch.use_deterministic_algorithms(False)
    tally(ok, "a gradient through D = 256 in deterministic mode raises NotImplementedError")
    return fails, total


def lse_check(D: int) -> bool:
    """return_lse at D against float64's logsumexp, within float32 accumulation of the bf16 inputs' scores."""
    gen = torch.Generator(device="cuda").manual_seed(D)
    q = torch.randn(2, 8, 333, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(2, 2, 1025, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    out, lse = ops.attention(q, k, k, is_causal=True, enable_gqa=True, return_lse=True)
    s = (q.double() @ k.double().repeat_interleave(4, 1).transpose(-1, -2)) / D ** 0.5
    s = s.masked_fill(torch.ones(333, 1025, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref = torch.logsumexp(s, -1)
    err = float((lse.double() - ref).abs().max())
    ok = bool(torch.isfinite(lse).all()) and err <= 1e-4 * float(ref.abs().max())
    print("PASS" if ok else "FAIL", f"LSE D {D}: max abs err {err:.3g} (|lse| up to {float(ref.abs().max()):.3g})")
    return ok


def wide_bwd_race(quick: bool, modes=("bwd",)):
    """The public op's backward (bwd v19 on Hopper; 200 padded) against SDPA's backends over wide_head_dim_cases."""
    grid = cases.wide_head_dim_cases()
    if quick:
        grid = [c for c in grid if "s2048" in c.name or "gqa" in c.name]
    rows = race.race(grid, modes=modes, flex=False, progress=False)
    for kind in modes:
        print(kind, tables.race([r for r in rows if r["kind"] == kind], backends=("flash", "cudnn", "efficient")))


# bwd v09 with one of its choices turned back, each a compile-time switch: the fixed-row-step tile load, phase B's
# 32-key tiling, the 16-byte dQ reductions, the second Q / dO buffer (kernels/bwd/v09_wide.cu's header).
V09_ABLATIONS = ("v09:LAB_BWD_WIDE_SM80_ROW_LOAD=0", "v09:LAB_BWD_WIDE_SM80_KEY_TILES=1", "v09:LAB_BWD_WIDE_SM80_RED=1", "v09:LAB_BWD_WIDE_SM80_STAGES=1")
ABLATION_CELLS = ("hdw-d256-s8192", "hdw-d192-s2048-c", "hdw-d256-s512")


def wide_bwd_ablation(names=V09_ABLATIONS) -> list[dict]:
    """GPU time of bwd v09's builds and of the other wide versions (wide_bwd_versions: bwd v19 on Hopper) at a few
    cells (lab.backward.race.versions: kernel-level, in rounds with the public op's backward and SDPA-cuDNN's);
    rows of kind 'bwd-kernel'."""
    grid = [c for c in cases.wide_head_dim_cases() if c.name in ABLATION_CELLS]
    return race.versions(grid, [*wide_bwd_versions(), *names], progress=False)


def wide_race(quick: bool):
    grid = cases.wide_head_dim_cases()
    if quick:
        grid = [c for c in grid if "s2048" in c.name or "gqa" in c.name]
    native = [c for c in grid if c.D in (192, 256)]
    kernels = {"lab.ops.attention": sweep.public_attention()}
    if wide_alt():  # kernel-level rows of both builds, timed in the same rounds
        kernels["v10"] = ops.fwd_call_factory("v10")
        kernels["v10 " + " ".join(f"{k}={v}" for k, v in wide_alt().items())] = ops.fwd_call_factory("v10", wide_alt())
    backends = ("flash", "cudnn", "efficient")
    with torch.no_grad():
        rows = sweep.fwd_sweep(native, kernels, backends=backends, progress=False)
        rows += sweep.fwd_sweep([c for c in grid if c not in native], {"lab.ops.attention": sweep.public_attention()},
                                backends=backends, progress=False)
    for impl in kernels:
        print("forward", impl, tables.race(rows, impl=impl, backends=backends))


def head_dim_race(quick: bool):
    """The padded head dims (lab.cases.head_dim_cases): forward, backward and forward + backward against SDPA's
    backends."""
    grid = cases.head_dim_cases()
    if quick:
        grid = [c for c in grid if "s2048" in c.name]
    backends = ("flash", "cudnn", "efficient")
    with torch.no_grad():
        rows = sweep.fwd_sweep(grid, {"lab.ops.attention": sweep.public_attention()}, backends=backends,
                               progress=False)
    print("forward", tables.race(rows, backends=backends))
    rows = race.race(grid, flex=False, progress=False)
    for kind in ("bwd", "fwd+bwd"):
        print(kind, tables.race([r for r in rows if r["kind"] == kind], backends=backends))
