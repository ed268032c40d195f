"""GPU tests of the backward pass (kernels/bwd/*, lab/backward/op.py): every `tests` case through the kernel in both
dQ modes and through the public op's autograd, judged against the float64 reference's gradients with SDPA's
own backward error as the yardstick (lab.check.check_backward); any finite scale; non-contiguous inputs; the
deterministic mode bit-identical across runs; the D-term self-test failing; the lse gradient; every forward's
LSE convention; torch.compile(fullgraph=True) of forward plus backward; a short training run against SDPA.

Marked `gpu`: skipped without CUDA. Run: .venv/bin/python -m pytest -q tests/bwd/test_backward_gpu.py
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lab import backward, build, cases, check, ops
from lab.backward import harness as backward_harness
from lab.cases import Case

pytestmark = pytest.mark.gpu

CASES = cases.tests_cases()
EXTRA = [Case("bwd-gqa-uneven", 2, 6, 2, 1025, 4097, 64, "bfloat16", True),
         Case("bwd-causal-sq>sk", 1, 4, 4, 4097, 1025, 128, "float16", True),
         Case("bwd-long", 1, 2, 1, 4097, 4097, 128, "bfloat16", False)]


def _ids(cs):
    return [c.name for c in cs]


def _assert_passed(results):
    assert check.backward_passed(results), "\n".join(repr(r) for r in results.values() if not r.passed)


# (version, deterministic): every registered backward in every dQ mode it has.
MODES = [(name, det) for name in sorted(backward.BWD) for det in (False, True)
         if not det or name in backward.DETERMINISTIC_BWD]


def _runs_here(version, table=backward.BWD, head_dim=None):
    kernel = table[version]
    if kernel.capabilities and tuple(torch.cuda.get_device_capability()) not in kernel.capabilities:
        pytest.skip(f"{version} needs compute capability {kernel.capabilities}")
    if head_dim is not None and head_dim not in kernel.head_dims:
        pytest.skip(f"{version} runs head dims {kernel.head_dims}")


@pytest.mark.parametrize("case", CASES + EXTRA, ids=_ids(CASES + EXTRA))
@pytest.mark.parametrize("version,deterministic", MODES, ids=[f"{v}-{'det' if d else 'atomic'}" for v, d in MODES])
def test_kernel_gradients_match_the_float64_reference(case, version, deterministic, session_dir):
    _runs_here(version, head_dim=case.D)
    run = backward_harness.bwd_runner(version, deterministic=deterministic)
    _assert_passed(check.check_backward(run, case, f"bwd-{version}-{'det' if deterministic else 'atomic'}",
                                        trials=1))


@pytest.mark.parametrize("case", CASES[::3], ids=_ids(CASES[::3]))
def test_public_op_autograd_forward_plus_backward(case, session_dir):
    _assert_passed(check.check_backward(backward_harness.autograd_runner(), case, "lab.ops.attention", trials=1,
                                        include_forward=True))


@pytest.mark.parametrize("version", sorted(backward.BWD))
@pytest.mark.parametrize("scale", [-0.125, 0.0, 0.3])
@pytest.mark.parametrize("causal", [False, True])
def test_any_finite_scale_against_sdpa_on_the_rewritten_problem(version, scale, causal, session_dir):
    _runs_here(version)
    case = Case("bwd-scale", 2, 4, 2, 130, 65, backward.BWD[version].head_dims[0], "bfloat16", causal)
    _assert_passed(check.check_backward(backward_harness.bwd_runner(version), case, f"bwd-{version}", trials=1,
                                        scale=scale, yardstick="default"))


@pytest.mark.parametrize("D", [64, 128])
def test_non_contiguous_bshd_views(D, session_dir):
    case = Case("bwd-bshd", 2, 4, 2, 65, 130, D, "float16", True)
    _assert_passed(check.check_backward(backward_harness.autograd_runner(), case, "lab.ops.attention", trials=1,
                                        layout="bshd"))


def _inputs(B=2, Hq=4, Hkv=2, Sq=300, Sk=257, D=128, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, Hq, Sq, D, generator=gen, device="cuda", dtype=dtype)
    k = torch.randn(B, Hkv, Sk, D, generator=gen, device="cuda", dtype=dtype)
    v = torch.randn(B, Hkv, Sk, D, generator=gen, device="cuda", dtype=dtype)
    do = torch.randn(B, Hq, Sq, D, generator=gen, device="cuda", dtype=dtype)
    return q, k, v, do


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("version", backward.DETERMINISTIC_BWD)
def test_deterministic_mode_is_bit_identical_across_runs(version, D, causal):
    _runs_here(version, head_dim=D)
    q, k, v, do = _inputs(Sq=1025, Sk=2049, D=D)
    run = backward_harness.bwd_runner(version, deterministic=True)
    first = run(q, k, v, causal, None, do)
    for _ in range(3):
        again = run(q, k, v, causal, None, do)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_torch_deterministic_algorithms_gives_bit_identical_gradients():
    capability = tuple(torch.cuda.get_device_capability())
    assert backward.backward_version(128, capability=capability, deterministic=True) == \
        ("v18" if capability == (9, 0) else "v01")  # v14's kernel with ordered dQ adds on Hopper, v01's dQ pass elsewhere
    q, k, v, do = _inputs(Sq=1025, Sk=2049)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.use_deterministic_algorithms(True)
    try:
        grads = [torch.autograd.grad(ops.attention(q, k, v, is_causal=True, enable_gqa=True), (q, k, v), do)
                 for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for g in grads[1:] for a, b in zip(grads[0], g))


@pytest.mark.parametrize("version", sorted(backward.BWD))
def test_forgetting_the_d_term_fails_the_check(version, session_dir):
    _runs_here(version)
    run = backward_harness.bwd_runner(version, defines={"LAB_BWD_BUG_NO_DELTA": None})
    case = Case("bwd-selftest", 1, 4, 4, 130, 130, backward.BWD[version].head_dims[0], "float16", False)
    res = check.check_backward(run, case, "bwd-no-delta",
                               trials=1, save=False)
    assert not res["dq"].passed and not res["dk"].passed
    assert res["dv"].passed  # dV has no D term


def test_gradient_of_lse_is_included():
    q, k, v, _ = _inputs(Sq=65, Sk=130, D=64, dtype=torch.float16)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = ops.attention(q, k, v, is_causal=True, enable_gqa=True, return_lse=True)
    w = torch.randn_like(lse)
    grads = torch.autograd.grad((out.float() ** 2).sum() + (lse * w).sum(), (q, k, v))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kk, vv = k64.repeat_interleave(2, 1), v64.repeat_interleave(2, 1)
    s = (q64 @ kk.transpose(-1, -2)) / math.sqrt(64)
    s = s.masked_fill(~torch.ones(65, 130, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    ref_lse = torch.logsumexp(s, -1)
    ref_out = torch.softmax(s, -1) @ vv
    ref = torch.autograd.grad((ref_out ** 2).sum() + (ref_lse * w.double()).sum(), (q64, k64, v64))
    for g, r in zip(grads, ref):
        assert torch.isfinite(g).all()
        assert float((g.double() - r).norm() / r.norm()) < 2e-2


@pytest.mark.parametrize("version", sorted(ops.FWD))
def test_every_forward_writes_natural_log_lse(version):
    kernel = ops.FWD[version]
    _runs_here(version, ops.FWD)
    q, k, v, _ = _inputs(Hq=4, Hkv=4, Sq=257, Sk=300, D=128 if 128 in kernel.head_dims else min(kernel.head_dims),
                         dtype=torch.float16)
    _, lse = ops.attention(q, k, v, is_causal=True, version=version, return_lse=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(257, 300, dtype=torch.bool, device="cuda").tril(), float("-inf"))
    assert float((lse.double() - torch.logsumexp(s, -1)).abs().max()) < 1e-3


def test_torch_compile_fullgraph_forward_plus_backward():
    q, k, v, do = _inputs(Sq=130, Sk=130, D=64, dtype=torch.float16)

    def step(q, k, v):
        out = ops.attention(q, k, v, is_causal=True, enable_gqa=True)
        return (out.float() * do.float()).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    leaves = [[t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2)]
    compiled(*leaves[0]).backward()
    step(*leaves[1]).backward()
    for a, b in zip(leaves[0], leaves[1]):
        assert torch.equal(a.grad, b.grad) or float((a.grad.float() - b.grad.float()).abs().max()) < 1e-2


def test_gradients_of_projection_views_keep_their_layout_compiled_and_eager():
    """A model's q_proj(x).view(B, S, H, D).transpose(1, 2): the gradients come back in the (B, S, H, D) memory of
    the leaves, compiled (the backward op's fake, lab.backward.op.grad_like, gives the real strides) and eager alike,
    and equal to the contiguous call's."""
    torch.manual_seed(3)
    x = [torch.randn(2, 130, h, 64, device="cuda", dtype=torch.bfloat16) for h in (4, 2, 2)]
    do = torch.randn(2, 4, 130, 64, device="cuda", dtype=torch.bfloat16)

    def step(q, k, v):
        out = ops.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return (out.float() * do.float()).sum()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    runs = []
    for fn in (compiled, step):
        leaves = [t.clone().requires_grad_() for t in x]
        fn(*leaves).backward()
        runs.append([t.grad for t in leaves])
    flat = [t.transpose(1, 2).contiguous().requires_grad_() for t in x]
    out = ops.attention(*flat, is_causal=True, enable_gqa=True)
    ref = [g.transpose(1, 2) for g in torch.autograd.grad(out, flat, do)]
    for grads in runs:
        for g, r in zip(grads, ref):
            assert float((g.float() - r.float()).abs().max()) <= 1e-2 * float(r.float().abs().max())
    views = [t.clone().requires_grad_().transpose(1, 2) for t in x]  # the op's own gradients: no autograd copy after it
    raw = torch.autograd.grad(ops.attention(*views, is_causal=True, enable_gqa=True), views, do)
    assert all(g.stride() == t.stride() for g, t in zip(raw, views))


def test_v02_refuses_the_deterministic_mode_by_name():
    _runs_here("v02")
    q, k, v, do = _inputs(Sq=65, Sk=65, D=64)
    out, lse = ops.attention(q, k, v, enable_gqa=True, return_lse=True)
    with pytest.raises(RuntimeError, match="deterministic"):
        build.binding().attn_bwd_call(ops.launcher(backward.BWD, "v02"), q, k, v, out, lse, None, do, 0.125, False,
                                      True)
    with pytest.raises(ValueError, match="no deterministic mode"):
        backward.backward_version(64, "v02", capability=(9, 0), deterministic=True)


def test_eager_training_path_matches_the_custom_op_path():
    q, k, v, do = _inputs(Sq=300, Sk=257, D=128)
    leaves = [[t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2)]
    eager = torch.autograd.grad(ops.attention(*leaves[0], is_causal=True, enable_gqa=True), leaves[0], do)
    from lab.fwd import op as fwd_op

    name = ops.attention_version(q, None, True)
    out, _ = fwd_op._attention_op(*leaves[1], True, fwd_op._scale(None, 128), name)  # the traced path's op
    traced = torch.autograd.grad(out, leaves[1], do)
    assert torch.equal(eager[1], traced[1]) and torch.equal(eager[2], traced[2])  # dK, dV: one CTA, fixed order
    # dQ: fp32 additions from many CTAs in whatever order they land, then rounded: equal up to that rounding
    assert float((eager[0].float() - traced[0].float()).abs().max()) <= 1e-2 * float(traced[0].float().abs().max())


def test_bad_input_raises_naming_the_argument():
    q, k, v, do = _inputs(Sq=65, Sk=65, D=64)
    out, lse = ops.attention(q, k, v, enable_gqa=True, return_lse=True)
    bind, address = build.binding(), ops.launcher(backward.BWD, "v01")
    with pytest.raises(RuntimeError, match="lse"):
        bind.attn_bwd_call(address, q, k, v, out, lse[:, :, :10].contiguous(), None, do, 0.125, False, False)
    with pytest.raises(RuntimeError, match="grad_out"):
        bind.attn_bwd_call(address, q, k, v, out, lse, None, do[:, :, :10], 0.125, False, False)
    with pytest.raises(RuntimeError, match="scale"):
        bind.attn_bwd_call(address, q, k, v, out, lse, None, do, float("nan"), False, False)
    q32 = q[..., :32].contiguous().requires_grad_()
    with pytest.raises(ValueError, match="head dim 32"):
        ops.attention(q32, k[..., :32].contiguous(), v[..., :32].contiguous(), enable_gqa=True,
                      version="v01").sum().backward()


def test_training_loss_curve_matches_sdpa():
    ours = backward_harness.train_losses(lambda q, k, v: ops.attention(q, k, v, is_causal=True))
    theirs = backward_harness.train_losses(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert ours[-1] < ours[0]
    assert all(abs(a - b) <= 0.02 * abs(b) for a, b in zip(ours, theirs)), (ours, theirs)
