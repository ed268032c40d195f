"""The masked calls in one crossing (lab.masks.fast, binding.cpp's attn_mask_auto / attn_varlen_packed), on the CPU:
the C++ checks through the binding's CPU check build (tests/product/test_binding_checks.py's fixture: CPU tensors stand for
the device, nothing is launched), and the Python plumbing with the plan replaced by a recorder: a plan is made once
per key, only exact argument types reach it, and every refusal or error takes the full path (lab.masks.op), which
raises the Python error. tests/masks/test_masks_gpu.py compares the fast path's outputs with the full path's on a GPU."""
from __future__ import annotations

import pytest
import torch

from lab import kernels, ops
from lab.masks import fast

F16 = torch.float16


def _qkv(B=2, Hq=4, Hkv=2, Sq=8, Sk=9, D=64):
    return (torch.randn(B, Hq, Sq, D, dtype=F16), torch.randn(B, Hkv, Sk, D, dtype=F16),
            torch.randn(B, Hkv, Sk, D, dtype=F16))


def test_dense_checks_in_cpp(cpu_binding):  # noqa: F811
    auto = cpu_binding.module.attn_mask_auto
    q, k, v = _qkv()
    sinks = torch.zeros(4)
    error, out, lse = auto(0, 3, 0, 0, 5.0, q, k, v, sinks, True, True, None)
    assert error == "" and out.shape == q.shape and out.dtype == F16 and lse.shape == (2, 4, 8)
    assert lse.dtype == torch.float32
    error, out, lse = auto(0, -1, -1, 1, 0.0, q, k, v, None, True, False, 0.5)
    assert error == "" and lse is None
    refused = {
        "grad": lambda: auto(0, 3, 0, 0, 0.0, q.clone().requires_grad_(), k, v, None, True, False, None),
        "sinks grad": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, torch.zeros(4, requires_grad=True), True, False, None),
        "gqa": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, None, False, False, None),
        "last stride": lambda: auto(0, 3, 0, 0, 0.0, q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None, True,
                                    False, None),
        "3-D": lambda: auto(0, 3, 0, 0, 0.0, q[0], k[0], v[0], None, True, False, None),
    }
    for what, call in refused.items():
        assert call()[0] == "refused", what
    named = {
        "sinks must be float32": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, torch.zeros(4, dtype=F16), True, False, None),
        "sinks must have 4 elements": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, torch.zeros(3), True, False, None),
        "sinks must be contiguous": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, torch.zeros(8)[::2], True, False, None),
        "does not fit": lambda: auto(0, 2 ** 40, 0, 0, 0.0, q, k, v, None, True, False, None),
        "softcap must be": lambda: auto(0, 3, 0, 0, float("nan"), q, k, v, None, True, False, None),
        "value has dtype": lambda: auto(0, 3, 0, 0, 0.0, q, k, v.bfloat16(), None, True, False, None),
        "scale must be": lambda: auto(0, 3, 0, 0, 0.0, q, k, v, None, True, False, float("inf")),
    }
    for pattern, call in named.items():
        error = call()[0]
        assert pattern in error, (pattern, error)


def test_packed_checks_in_cpp(cpu_binding):  # noqa: F811
    auto = cpu_binding.module.attn_varlen_packed
    q, k, v = torch.randn(20, 4, 64, dtype=F16), torch.randn(30, 2, 64, dtype=F16), torch.randn(30, 2, 64, dtype=F16)
    cu_q, cu_k = torch.tensor([0, 5, 20], dtype=torch.int32), torch.tensor([0, 10, 30], dtype=torch.int32)
    error, out, lse = auto(0, 3, 0, 5.0, q, k, v, cu_q, cu_k, 15, 20, torch.zeros(4), True, None)
    assert error == "" and out.shape == q.shape and lse.shape == (4, 20)
    assert auto(0, -1, -1, 0.0, q[None], k, v, cu_q, cu_k, 15, 20, None, False, None)[0] == "refused"
    assert auto(0, -1, -1, 0.0, q.clone().requires_grad_(), k, v, cu_q, cu_k, 15, 20, None, False, None)[0] == \
        "refused"
    named = {
        "cu_seqlens_q must be int32": dict(cu_q=cu_q.long()),
        "cu_seqlens_k must be 1-D": dict(cu_k=torch.tensor([0, 30], dtype=torch.int32)),
        "cu_seqlens_q must be contiguous": dict(cu_q=torch.tensor([0, 9, 5, 9, 20, 9], dtype=torch.int32)[::2]),
        "max_seqlen": dict(max_q=-1),
        "sinks must have 4 elements": dict(sinks=torch.zeros(2)),
        "key has head dim": dict(k=torch.randn(30, 2, 32, dtype=F16), v=torch.randn(30, 2, 32, dtype=F16)),
    }
    for pattern, change in named.items():
        a = dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=15, max_k=20, sinks=None) | change
        error = auto(0, -1, -1, 0.0, a["q"], a["k"], a["v"], a["cu_q"], a["cu_k"], a["max_q"], a["max_k"], a["sinks"],
                     False, None)[0]
        assert pattern in error, (pattern, error)


def test_packed_crossing_launches_the_full_paths_fields(cpu_binding, monkeypatch):  # noqa: F811
    """attn_varlen_packed's AttnMaskParams (the CPU check build keeps the last) are lab.masks.op.launch's for the same
    call, field for field: the packed strides {0, head, token}, sizes, the mask, cu_seqlens and the totals; a head
    stride the kernels would refuse on a single head becomes the contiguous one, as copy_strides() makes it for the
    (1, H, total, D) view; a query the kernels cannot read runs on a copy (its own pointer and strides)."""
    from lab.masks import op, spec
    packed = []
    monkeypatch.setattr(op, "masked_version", lambda device, version=None, head_dim=128: "v11")
    monkeypatch.setattr(op, "kernel_call", lambda version, defines=None: None)
    monkeypatch.setattr(op, "run_packed_launcher", lambda call, params, device, what: packed.append(params))
    cu_q, cu_k = torch.tensor([0, 5, 20], dtype=torch.int32), torch.tensor([0, 10, 30], dtype=torch.int32)
    base = torch.randn(20, 8, 64, dtype=F16)
    cases = {"contiguous": (torch.randn(20, 4, 64, dtype=F16), 2, (3, 0), 5.0, torch.zeros(4), 0.125),
             "strided heads, one kv head": (base[:, ::2], 1, (-1, -1), 0.0, None, None)}
    for what, (q, hkv, window, cap, sinks, scale) in cases.items():
        k, v = torch.randn(30, hkv, 64, dtype=F16), torch.randn(30, hkv, 64, dtype=F16)
        mask = spec.make_mask(window != (-1, -1), None if window == (-1, -1) else window, cap)
        error, out, lse = cpu_binding.module.attn_varlen_packed(0, mask.left, mask.right, mask.softcap, q, k, v, cu_q,
                                                                cu_k, 15, 20, sinks, True, scale)
        assert error == "", what
        launched = op.PARAMS.unpack(cpu_binding.module.packed_params_cpu_last())
        op.launch(q, k, v, out, lse, mask, scale if scale is not None else 64 ** -0.5, 0, sinks, cu_q, cu_k, 15, 20)
        assert launched == op.PARAMS.unpack(packed[-1]), what
    # a single key head whose head stride the kernels would refuse: the (1, H, total, D) view's rule, H 1
    odd = torch.randn(30, 3, 64, dtype=F16)[:, 1:2]  # head stride 64: fine; token stride 192
    k1 = torch.randn(30, 1, 65, dtype=F16)[..., :64]  # token stride 65: not a multiple of 8, a copy
    error, out, lse = cpu_binding.module.attn_varlen_packed(0, -1, 0, 0.0, torch.randn(20, 2, 64, dtype=F16), k1, odd,
                                                            cu_q, cu_k, 15, 20, None, False, None)
    launched = op.PARAMS.unpack(cpu_binding.module.packed_params_cpu_last())
    assert error == "" and launched[1] != k1.data_ptr() and launched[2] == odd.data_ptr()
    assert launched[8:11] == (0, 64, 64)  # the copy's (unused, head, token) strides: contiguous (30, 1, 64)
    assert launched[11:14] == (0, 64, 192)


@pytest.fixture
def recorder(monkeypatch):
    """Plans replaced by a recorder that answers `answer` (a fresh plan table for each test)."""
    made, calls, answer = [], [], {"error": ""}

    def plan(*args):
        calls.append(args)
        return (answer["error"], "out", "lse")

    def factory(*args):
        made.append(args)
        return plan
    monkeypatch.setattr(fast, "_dense_plan", factory)
    monkeypatch.setattr(fast, "_varlen_plan", factory)
    monkeypatch.setattr(fast, "plans", {})
    monkeypatch.setattr(kernels, "plans", fast.plans)
    return made, calls, answer


def test_a_plan_is_made_once_per_key_and_called_through_the_public_op(recorder):
    made, calls, _ = recorder
    q, k, v = _qkv()
    sinks = torch.zeros(4)
    for _ in range(3):
        assert ops.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(3, 0), softcap=5.0, sinks=sinks,
                             return_lse=True) == ("out", "lse")
    assert len(made) == 1 and len(calls) == 3
    assert calls[0] == (q, k, v, sinks, True, True, None)
    assert ops.attention(q, k, v, enable_gqa=True, softcap=2.0, scale=0.25) == "out"  # a new key, a new plan
    assert len(made) == 2 and calls[-1][-1] == 0.25
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    p = torch.randn(8, 4, 64, dtype=F16)
    assert ops.attention_varlen(p, p, p, cu, cu, 5, 5, is_causal=True, check_cu_seqlens=False) == "out"
    assert len(made) == 3 and calls[-1] == (p, p, p, cu, cu, 5, 5, None, False, None)


def test_arguments_that_do_not_key_a_plan_take_the_full_path(recorder):
    made, calls, answer = recorder
    q, k, v = _qkv(Hkv=4)
    full_path = [  # each reaches lab.masks.op's checks, which raise for CPU tensors or the argument itself
        (lambda: ops.attention(q, k, v, window_size=[3, 0]), ValueError, "CUDA"),  # a list: not a plan key
        (lambda: ops.attention(q, k, v, window_size=(True, 0)), TypeError, "window_size must be a pair"),
        (lambda: ops.attention(q, k, v, softcap=True), TypeError, "softcap must be a finite float"),
        (lambda: ops.attention(q, k, v, window_size=(3, 0), version="v09"), ValueError, "CUDA"),
        (lambda: ops.attention(q, k, v, window_size=(3, 0), scale=1), ValueError, "CUDA"),
    ]
    for call, error, pattern in full_path:
        with pytest.raises(error, match=pattern):
            call()
    assert made == [] and calls == []
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    p = torch.randn(8, 4, 64, dtype=F16)
    for checked in (True, None):  # the host check of cu_seqlens stays on the full path
        with pytest.raises((ValueError, TypeError)):
            ops.attention_varlen(p, p, p, cu, cu, 5, 5, check_cu_seqlens=checked)
    assert made == []


def test_an_error_in_cpp_takes_the_full_path_and_its_python_error(recorder):
    made, calls, answer = recorder
    q, k, v = _qkv(Hkv=4)
    answer["error"] = "some check failed"  # (the recorder's plan takes any window: the full path refuses this one)
    with pytest.raises(ValueError, match=r"window_size entries must be >= -1"):
        ops.attention(q, k, v, window_size=(-2, 0))
    answer["error"] = "refused"
    with pytest.raises(ValueError, match="CUDA"):  # the full path's checks run, on CPU tensors
        ops.attention(q, k, v, window_size=(3, 0))
    assert len(calls) == 2
