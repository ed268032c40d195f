"""lab.fwd.head_dims on the CPU: the padding is exact in float64 (forward, lse and the three gradients against
SDPA on the unpadded tensors, D_v != D_qk included), a padding that took the padded width's scale fails, and
the kernel head dim chosen for each (D_qk, D_v)."""
import math

import pytest
import torch
import torch.nn.functional as F

from lab.fwd import head_dims


def reference(q, k, v, scale, is_causal=False):
    """(out, lse) in float64 with the mask written out: what a kernel returns."""
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


@pytest.mark.parametrize("d_qk,d_v", [(80, 80), (96, 96), (32, 32), (8, 8), (24, 40), (128, 64), (64, 128), (96, 40),
                                      (160, 160), (200, 200), (192, 128), (129, 64), (256, 192)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_padding_is_exact(d_qk, d_v, is_causal):
    gen = torch.Generator().manual_seed(d_qk * 1000 + d_v)
    q = torch.randn(2, 3, 65, d_qk, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(2, 3, 63, d_qk, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(2, 3, 63, d_v, dtype=torch.float64, generator=gen, requires_grad=True)
    scale = 1 / math.sqrt(d_qk)
    widths = []

    def attend(qp, kp, vp, s):
        widths.append((qp.shape[-1], vp.shape[-1]))
        return reference(qp, kp, vp, s, is_causal)

    out, lse = head_dims.padded(attend, q, k, v, scale)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale)
    assert out.shape == want.shape and out.is_contiguous()
    assert widths == [(head_dims.kernel_head_dim(d_qk, d_v),) * 2]
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, reference(q, k, v, scale, is_causal)[1], rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref = torch.autograd.grad(want, (q, k, v), grad)
    for name, a, b in zip("qkv", got, ref):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"d{name}")


def test_the_padded_widths_scale_would_be_wrong():
    """The check above can fail: 1/sqrt(padded width) instead of 1/sqrt(D_qk) changes the output."""
    q, k, v = (torch.randn(1, 2, 17, 80, dtype=torch.float64) for _ in range(3))
    out, _ = head_dims.padded(reference, q, k, v, 1 / math.sqrt(128))
    want = F.scaled_dot_product_attention(q, k, v)
    assert (out - want).abs().max() > 1e-3


def test_kernel_head_dims():
    for d in (64, 128, 192, 256):
        assert head_dims.kernel_head_dim(d, d) is None
    assert [head_dims.kernel_head_dim(d, d) for d in (8, 32, 48, 65, 80, 96, 120)] == [64, 64, 64, 128, 128, 128, 128]
    assert [head_dims.kernel_head_dim(d, d) for d in (129, 160, 176, 200, 248)] == [192, 192, 192, 256, 256]
    assert head_dims.kernel_head_dim(128, 64) == 128 and head_dims.kernel_head_dim(40, 96) == 128
    assert head_dims.kernel_head_dim(192, 128) == 192 and head_dims.kernel_head_dim(64, 129) == 192
    assert head_dims.kernel_head_dim(256, 64) == 256 and head_dims.kernel_head_dim(192, 256) == 256
    assert not head_dims.no_deterministic_backward(128, 64) and not head_dims.no_deterministic_backward(96, 96)
    assert all(head_dims.no_deterministic_backward(*d) for d in ((192, 128), (160, 160), (256, 256)))
    for d_qk, d_v in ((264, 264), (257, 256), (64, 320)):
        with pytest.raises(ValueError, match=f"head dims query/key {d_qk}, value {d_v}"):
            head_dims.kernel_head_dim(d_qk, d_v)


@pytest.mark.parametrize("d_qk,d_v", [(256, 256), (160, 160), (192, 128), (64, 200)])
def test_gradients_above_128_raise_only_in_deterministic_mode(d_qk, d_v):
    from lab import ops

    q, k = torch.randn(1, 2, 5, d_qk, dtype=torch.bfloat16), torch.randn(1, 2, 7, d_qk, dtype=torch.bfloat16)
    v = torch.randn(1, 2, 7, d_v, dtype=torch.bfloat16)
    q.requires_grad_()
    with pytest.raises(ValueError) as err:  # gradients wanted: past the head-dim rule (CPU tensors: device error)
        ops.attention(q, k, v)
    assert "backward" not in str(err.value)
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(NotImplementedError, match=f"query/key {d_qk}, value {d_v}: lab.ops.attention has no "
                                                      f"deterministic backward above D = 128"):
            ops.attention(q, k, v)
        with torch.no_grad():  # no gradient wanted: no refusal
            with pytest.raises(ValueError):
                ops.attention(q, k, v)
    finally:
        torch.use_deterministic_algorithms(False)


def test_every_head_dim_has_a_backward_kernel():
    """The backward's version rule takes every kernel head dim, on Hopper and off it; v09 and v19 have no
    deterministic mode."""
    from lab import registry
    from lab.backward.op import backward_version

    for capability in ((9, 0), (8, 0)):
        got = {d: backward_version(d, capability=capability) for d in registry.FWD_HEAD_DIMS}
        assert got == {d: registry.choose("bwd", {"head_dim": d}, capability).version for d in got}
        assert registry.BWD[got[192]].head_dims == registry.WIDE_HEAD_DIMS and got[192] == got[256], got
    assert registry.BWD["v09"].head_dims == registry.WIDE_HEAD_DIMS and not registry.BWD["v09"].capabilities
    assert "v09" not in registry.DETERMINISTIC_BWD and "v19" not in registry.DETERMINISTIC_BWD
    assert registry.BWD["v19"].head_dims == registry.WIDE_HEAD_DIMS and registry.BWD["v19"].capabilities == ((9, 0),)
    with pytest.raises(ValueError, match="no deterministic mode"):
        backward_version(256, "v09", (9, 0), deterministic=True)
    assert "v09" in registry.default_versions((9, 0))["bwd"] and "v09" in registry.default_versions((8, 0))["bwd"]


def test_the_wide_forward_is_hopper_only_and_says_so():
    from lab import registry

    for d, s, causal in ((256, 4096, True), (192, 1, False)):
        assert registry.FWD[registry.default_attention_version(d, s, causal, (9, 0))].head_dims == registry.WIDE_HEAD_DIMS
    assert 128 in registry.FWD[registry.default_attention_version(128, 4096, False, (9, 0))].head_dims
    with pytest.raises(ValueError, match="head dim 256: .* compute capability 9.0 only, this GPU is 8.0"):
        registry.default_attention_version(256, 4096, False, (8, 0))
    assert "v10" in registry.default_versions((9, 0))["fwd"] and "v10" not in registry.default_versions((8, 0))["fwd"]
