"""The masked backward at D 192 / 256 (bwd v21) on a Hopper GPU: gradients through the public op (the masked wide
forward, then autograd) and through the backward alone (the forward's output and LSE from the float64 reference)
within lab.masks.gpu_bwd's rule, d sinks within 3x the flash formulation's own error; the build without the
softcap's derivative fails; D_v != D_qk and a D between the kernels' pad; deterministic mode raises. Skipped without
CUDA or off compute capability 9.0."""
from __future__ import annotations

import pytest
import torch

from lab import ops
from lab.masks import backward, gpu_bwd, grad_yardstick, spec

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                                 reason="masked bwd v21 runs on compute capability 9.0")]


@pytest.mark.parametrize("forward", ["eager", "public"])
@pytest.mark.parametrize("D,name,B,Hq,Hkv,Sq,Sk,causal,window,cap,sink,lower_right", [
    (256, "gemma-local", 1, 16, 8, 300, 300, True, (64, 0), 50.0, False, False),
    (256, "sink-lr", 1, 4, 2, 65, 300, True, (100, 0), 0.0, True, True),
    (192, "all", 2, 4, 2, 300, 300, True, (128, 0), 50.0, True, False),
    (192, "sym-tall", 1, 4, 4, 300, 65, False, (20, 10), 0.0, True, True),
])
def test_wide_gradients(forward, D, name, B, Hq, Hkv, Sq, Sk, causal, window, cap, sink, lower_right):
    assert gpu_bwd.check_bwd(name, B, Hq, Hkv, Sq, Sk, D, torch.bfloat16, causal, window, cap, sink, lower_right,
                             forward=forward, sink_rule=True)


def test_wide_build_without_the_softcap_derivative_fails():
    assert gpu_bwd.check_bwd("no-softcap-grad", 1, 4, 2, 300, 300, 256, torch.bfloat16, True, (128, 0), 10.0, False,
                             defines={"LAB_BWD_MASK_BUG_NO_SOFTCAP_GRAD": 1}, expect_fail=True, forward="eager")


def test_a_head_dim_between_pads_to_the_next_kernel():
    assert backward.masked_bwd_version(torch.device("cuda"), head_dim=256) == "v21"
    assert gpu_bwd.check_bwd("pad200", 1, 4, 2, 130, 130, 200, torch.bfloat16, True, (50, 0), 50.0, True,
                             forward="eager")


def test_value_head_dim_other_than_query_s():
    """D_qk 256, D_v 192 through the public op (the forward pads value): gradients against float64 autograd within
    3x the same attention done eagerly in bf16 (lab.masks.grad_yardstick.eager_grads, which takes D_v != D_qk)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 4, 200, 256, generator=g).cuda().bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(1, 4, 200, 192, generator=g).cuda().bfloat16().requires_grad_()
    dout, dlse = torch.randn(1, 4, 200, 192, generator=g).cuda().bfloat16(), torch.zeros(1, 4, 200).cuda()
    mask, scale = spec.make_mask(True, (64, 0), 50.0), 256 ** -0.5
    out = ops.attention(q, k, v, is_causal=True, window_size=(64, 0), softcap=50.0)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    from lab.masks import reference
    want = torch.autograd.grad(reference.attend(*ref, mask, scale)[0], ref, dout.double())
    eager = grad_yardstick.eager_grads(q, k, v, dout, dlse, None, mask, scale, 0)
    for g_, w, e in zip(got, want, eager):
        assert float((g_.double() - w).abs().max()) <= 3 * float((e - w).abs().max()) + 2.0 ** -14


def test_deterministic_mode_raises_before_the_forward():
    q = torch.randn(1, 4, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(NotImplementedError, match="deterministic"):
            ops.attention(q, q, q, is_causal=True, window_size=(16, 0))
    finally:
        torch.use_deterministic_algorithms(previous)
