"""The binding's own argument checks (lab/binding.cpp), on CPU: the real C++ source, built with
LAB_BINDING_CPU_CHECKS (CPU tensors accepted as the kernels' device, nothing launched), called with every bad
direct call of tests/binding_cases.py. The same cases run through the CUDA build in tests/product/test_gpu.py.

The first run compiles the binding (~20 s on the CPU box); later runs load it from the cache (LAB_CACHE_DIR).
"""
from __future__ import annotations

import math
import re

import pytest
import torch

import binding_cases
from lab import kernels


def _cases(table):
    return sorted(name for name in table("cpu") if name not in binding_cases.GPU_ONLY)


FAMILIES = {"fwd": (binding_cases.fwd_bad, binding_cases.fwd_args, binding_cases.call_fwd),
            "decode": (binding_cases.decode_bad, binding_cases.dec_args, binding_cases.call_decode)}


@pytest.mark.parametrize("family, what", [(f, w) for f, (bad, _, _) in FAMILIES.items() for w in _cases(bad)])
def test_bad_input_is_named(cpu_binding, family, what):
    bad, make_args, call = FAMILIES[family]
    change, pattern = bad("cpu")[what]
    args = make_args("cpu")
    args.update(change(args))
    with pytest.raises(RuntimeError, match=pattern):
        call(cpu_binding, 0, args)


def test_good_calls_pass_every_check(cpu_binding):
    """A good call, and the layouts the binding copies instead of refusing (expanded K/V, a size-1 dim with
    an odd stride, an odd data offset, an out with rows 65 elements apart), get through the checks."""
    binding_cases.call_fwd(cpu_binding, 0, binding_cases.fwd_args("cpu"))
    binding_cases.call_decode(cpu_binding, 0, binding_cases.dec_args("cpu"))
    a = binding_cases.fwd_args("cpu", B=3, Sq=1)
    a["k"], a["v"] = a["k"][:1].expand(3, 2, 70, 64), a["v"][:1].expand(3, 2, 70, 64)
    a["q"] = torch.as_strided(a["q"].clone(), (3, 4, 1, 64), (4 * 64, 64, 7, 1))
    a["o"] = torch.empty(3, 4, 1, 65, dtype=torch.float16)[..., :64]
    binding_cases.call_fwd(cpu_binding, 0, a)
    flat = torch.randn(1 + 2 * 4 * 65 * 64, dtype=torch.float16)
    b = binding_cases.fwd_args("cpu")
    b["q"] = flat[1:].view(2, 4, 65, 64)
    binding_cases.call_fwd(cpu_binding, 0, b)


def test_every_message_names_an_argument():
    """Each pattern names the argument it is about, so a failing direct call says what to fix."""
    names = ("query", "key", "value", "out", "lse", "scale", "num_splits", "partial_o", "partial_lse",
             "cache_seqlens", "head dim")
    for table in (binding_cases.fwd_bad, binding_cases.decode_bad):
        for what, (_, pattern) in table("cpu").items():
            assert any(re.search(re.escape(n), pattern) for n in names), (what, pattern)


# ------------------------------------------------------------------ attn_auto: lab.ops.attention's eager call

def _auto_call(binding, a, causal=False, gqa=True, want_lse=False, scale=None):
    return binding.module.attn_auto(0, a["q"], a["k"], a["v"], causal, gqa, want_lse, scale)


def _changed(change):
    a = binding_cases.fwd_args("cpu")
    a.update(change(a))
    return a


# What lab.ops' Python layer raises on that the binding's own checks would let through (a copy, a launch with
# nothing to read, an autograd call): attn_auto must answer "refused", so the full path raises the right error.
# (A bad dtype or device is check_call's: see the next test.)
PYTHON_RULES = {
    "gqa_not_asked": (lambda a: {}, dict(gqa=False)),  # Hq 4, Hkv 2 without enable_gqa
    "empty_key": (lambda a: {"k": torch.randn(2, 2, 0, 64, dtype=torch.float16),
                             "v": torch.randn(2, 2, 0, 64, dtype=torch.float16)}, {}),
    "last_dim_strided": (lambda a: {"q": torch.randn(2, 4, 65, 128, dtype=torch.float16)[..., ::2]}, {}),
    "rank": (lambda a: {"q": a["q"][0]}, {}),
    "grad_wanted": (lambda a: {"k": a["k"].clone().requires_grad_()}, {}),
}


@pytest.mark.parametrize("rule", sorted(PYTHON_RULES))
def test_attn_auto_refuses_what_the_python_layer_raises_on(cpu_binding, rule):
    change, kwargs = PYTHON_RULES[rule]
    error, out, lse = _auto_call(cpu_binding, _changed(change), **kwargs)
    assert error == "refused" and out is None and lse is None


@pytest.mark.parametrize("what", [w for w in _cases(binding_cases.fwd_bad)
                                  if not w.startswith(("out", "lse", "debug", "scale"))])
def test_attn_auto_answers_every_bad_input_of_the_binding(cpu_binding, what):
    """The binding's own checks (check_call) still run behind attn_auto: each bad q/k/v case answers an error."""
    change, _ = binding_cases.fwd_bad("cpu")[what]
    error, _, _ = _auto_call(cpu_binding, _changed(change))
    assert error, what


def test_attn_auto_good_call_allocates_out_and_lse(cpu_binding):
    a = binding_cases.fwd_args("cpu")
    error, out, lse = _auto_call(cpu_binding, a, want_lse=True)
    assert error == "" and out.shape == a["q"].shape and out.dtype == a["q"].dtype
    assert lse.shape == a["q"].shape[:3] and lse.dtype == torch.float32
    assert _auto_call(cpu_binding, a)[2] is None
    with torch.no_grad():  # no gradient wanted: a leaf that requires grad is fine
        assert _auto_call(cpu_binding, _changed(PYTHON_RULES["grad_wanted"][0]))[0] == ""
    assert _auto_call(cpu_binding, a, scale=0.5)[0] == ""
    for bad in (math.nan, math.inf, 1e39):  # a given scale meets check_scale
        assert "scale" in _auto_call(cpu_binding, a, scale=bad)[0]


def test_ops_attention_hands_its_arguments_to_attn_auto_in_order(cpu_binding, monkeypatch):
    """lab.ops.attention's fast path on a memoised plan: the arguments reach attn_auto in its order, the answer
    comes back as SDPA's (out) or (out, lse), and a refusal falls through to the full path's own error."""
    from lab import ops

    a = binding_cases.fwd_args("cpu")
    seen = []

    def plan(*args):
        seen.append(args[3:])
        return cpu_binding.module.attn_auto(0, *args)

    monkeypatch.setitem(kernels.plans, (65, 64, True, a["q"].get_device(), False), plan)
    out, lse = ops.attention(a["q"], a["k"], a["v"], is_causal=True, enable_gqa=True, return_lse=True, scale=0.25)
    assert seen == [(True, True, True, 0.25)] and out.shape == a["q"].shape and lse.shape == a["q"].shape[:3]
    assert ops.attention(a["q"], a["k"], a["v"], is_causal=True, enable_gqa=True).shape == a["q"].shape
    # refused by attn_auto; the full path raises, naming the argument before the device (here: CPU)
    with pytest.raises(ValueError, match="query has 4 heads but key has 2"):
        ops.attention(a["q"], a["k"], a["v"], is_causal=True)
    assert seen[-1] == (True, False, False, None)


def test_ops_attention_hands_a_gradient_call_to_the_node_in_order(cpu_binding, monkeypatch):
    """The same for a call that wants gradients: its own plan (the key's last element), attn_auto_grad's order,
    and an output whose gradient runs the node's backward (lab.backward.node)."""
    from lab import ops

    a = binding_cases.fwd_args("cpu", Hkv=4)
    q, k, v = (a[name].detach().requires_grad_() for name in ("q", "k", "v"))
    seen = []

    def plan(*args):
        seen.append(args[3:])
        return cpu_binding.module.attn_auto_grad(0, 0, *args)

    monkeypatch.setitem(kernels.plans, (65, 64, False, q.get_device(), True), plan)
    out = ops.attention(q, k, v, scale=0.25)
    assert seen == [(False, False, 0.25)] and "AttentionNode" in out.grad_fn.name()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape
    with torch.no_grad():  # no gradient wanted: the inference plan's key, not this one
        with pytest.raises(ValueError, match="CUDA device"):
            ops.attention(q, k, v)
    assert len(seen) == 1


# ------------------------------------------------------------------ decode_auto: lab.ops.decode's eager call

def _decode_auto(binding, a, scale=None):
    return binding.module.decode_auto(0, a["q"], a["k"], a["v"], a["lens"], scale, a["splits"])


def _dec_changed(change):
    a = binding_cases.dec_args("cpu")
    a.update(change(a))
    return a


# Per-call rules of lab.ops.decode's Python layer that decode_call would let through (a copy, an autograd call):
# decode_auto answers "refused", so the full path raises the right error. (The shape rules, q_len and heads, are
# the plan key's: a plan exists only for shapes the full path accepted.)
DECODE_PYTHON_RULES = {
    "last_dim_strided": lambda a: {"k": torch.randn(2, 2, 300, 256, dtype=torch.bfloat16)[..., ::2]},
    "rank": lambda a: {"q": a["q"][0]},
    "grad_wanted": lambda a: {"q": a["q"].clone().requires_grad_()},
}


@pytest.mark.parametrize("rule", sorted(DECODE_PYTHON_RULES))
def test_decode_auto_refuses_what_the_python_layer_raises_on(cpu_binding, rule):
    error, out = _decode_auto(cpu_binding, _dec_changed(DECODE_PYTHON_RULES[rule]))
    assert error == "refused" and out is None


def test_decode_auto_good_call_allocates_out(cpu_binding):
    a = binding_cases.dec_args("cpu")
    error, out = _decode_auto(cpu_binding, a)
    assert error == "" and out.shape == a["q"].shape and out.dtype == a["q"].dtype
    with torch.no_grad():  # no gradient wanted: a leaf that requires grad is fine
        assert _decode_auto(cpu_binding, _dec_changed(DECODE_PYTHON_RULES["grad_wanted"]))[0] == ""
    assert _decode_auto(cpu_binding, a, scale=0.5)[0] == ""
    for bad in (math.nan, math.inf, 1e39):  # a given scale meets check_scale
        assert "scale" in _decode_auto(cpu_binding, a, scale=bad)[0]
    # lengths the full path converts (int64) are the binding's error here, so the full path runs
    assert "cache_seqlens" in _decode_auto(cpu_binding, _dec_changed(lambda a: {"lens": a["lens"].long()}))[0]


@pytest.mark.parametrize("what", [w for w in _cases(binding_cases.decode_bad)
                                  if not w.startswith(("out", "lse", "partial", "po", "pl", "scale", "splits"))])
def test_decode_auto_answers_every_bad_input_of_the_binding(cpu_binding, what):
    """decode_call's own checks still run behind decode_auto: each bad q/k/v/lengths case answers an error."""
    change, _ = binding_cases.decode_bad("cpu")[what]
    error, _ = _decode_auto(cpu_binding, _dec_changed(change))
    assert error, what


# ------------------------------------------------------------------ the backward's gradients take their inputs' layout

def _bshd(B, H, S, D, offset=0):
    """A (B, H, S, D) view of (B, S, H, D) memory: what q_proj(x).view(B, S, H, D).transpose(1, 2) gives."""
    return torch.randn(B * S * H * D + offset, dtype=torch.float16)[offset:].view(B, S, H, D).transpose(1, 2)


def test_gradients_take_the_layout_of_their_inputs(cpu_binding):
    """attn_bwd_call (checks on CPU, nothing launched) gives dq, dk, dv the strides of q, k, v where the kernels write
    through them, so autograd hands a (B, S, H, D)-memory gradient back to a projection without a transposing copy;
    inputs they cannot write that way (a head dim that is no multiple of 8 elements apart) get contiguous gradients.
    lab.backward.op.grad_like, the op's fake under torch.compile, gives the same layouts."""
    from lab.backward.op import grad_like

    def call(q, k, v):
        o, dout = torch.empty_like(q), torch.randn(q.shape, dtype=q.dtype)
        lse = torch.zeros(q.shape[:3], dtype=torch.float32)
        error, dq, dk, dv = cpu_binding.module.attn_bwd_call(0, q, k, v, o, lse, None, dout, 0.125, True, False)
        assert error == ""
        return dq, dk, dv

    bshd = (_bshd(2, 4, 65, 64), _bshd(2, 2, 70, 64), _bshd(2, 2, 70, 64))
    contiguous = tuple(t.contiguous() for t in bshd)
    for ins in (bshd, contiguous):
        for t, g in zip(ins, call(*ins)):
            assert g.shape == t.shape and g.stride() == t.stride() == grad_like(t).stride()
    assert not bshd[0].is_contiguous()  # the case above is the strided one
    odd = torch.randn(2 * 65 * 4 * 68, dtype=torch.float16).view(2, 65, 4, 68)[..., :64].transpose(1, 2)  # rows 68 apart
    k, v = torch.randn(2, 2, 70, 64, dtype=torch.float16), torch.randn(2, 2, 70, 64, dtype=torch.float16)
    dq, _, _ = call(odd, k, v)
    assert dq.is_contiguous() and grad_like(odd).is_contiguous()
