"""Head dims without a kernel of their own, on the GPU in one process: lab.ops.attention's forward and
gradients (zero-padded to the next kernel head dim) checked through lab.check against float64, value head dims
other than the query's checked the same way by hand, then forward and backward timed against SDPA's backends
over lab.cases.head_dim_cases. Usage: python3 tools/gpu/head_dims.py [--quick] [--checks-only]. Records go to $LAB_OUTPUTS.
"""
import sys

import torch

from lab import cases, check, ops, record, sweep
from lab.backward import harness, race
from lab.cases import Case
from lab.publish import tables


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


def value_head_dim_check(d_qk: int, d_v: int) -> bool:
    """D_v != D_qk, causal, GQA: output and gradients against float64 autograd, SDPA's error as the yardstick."""
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
        a, b, c = (t.to(dt).detach().requires_grad_() for t in (q, k, v))
        out = fn(a, b, c)
        results.append((out, *torch.autograd.grad(out, (a, b, c), dout.to(dt))))
    ok = True
    for i, label in enumerate(("out", "dq", "dk", "dv")):
        verdict = check.compare(results[0][i], results[2][i], results[1][i])
        ok &= bool(verdict["passed"])
        record.append({"kind": "check", "impl": "lab.ops.attention", "case": {"name": f"dv-{d_qk}-{d_v}", "D": d_qk,
                       "D_v": d_v}, "tensor": label, **{key: verdict[key] for key in verdict if key != "worst"}})
    print("PASS" if ok else "FAIL", f"D_qk {d_qk} D_v {d_v} causal GQA 8/2, Sq 333, Sk 517")
    return ok


def main(argv):
    torch.backends.cuda.matmul.allow_tf32 = False
    quick = "--quick" in argv
    fails = checks(quick)
    if "--checks-only" in argv:
        return 1 if fails else 0
    grid = cases.head_dim_cases()
    if quick:
        grid = [c for c in grid if "s2048" in c.name]
    rows = sweep.fwd_sweep(grid, {"lab.ops.attention": sweep.public_attention()}, backends=("flash", "cudnn", "efficient"),
                           progress=False)
    print("forward", tables.race(rows, backends=("flash", "cudnn", "efficient")))
    rows = race.race(grid, flex=False, progress=False)
    for kind in ("bwd", "fwd+bwd"):
        print(kind, tables.race([r for r in rows if r["kind"] == kind], backends=("flash", "cudnn", "efficient")))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
