"""lab.fwd.causal: bottom-right causal from top-left kernels, checked on the CPU with the float64 reference as
the kernel; the same decomposition runs lab.ops.attention(causal_variant="lower_right") on GPUs
(tests/product/test_ops_gpu.py)."""
import numpy as np
import pytest
import torch

from lab.fwd import causal
from lab.decode import paged
from lab.ring.attention import reference_attend


def lower_right_reference(q, k, v):
    """float64 softmax with lab.decode.paged's bottom-right mask (key j visible to query i iff j <= i + S_k - S_q), the
    rule decode v03 is checked against; rows with no visible key: out 0, lse -inf."""
    heads_q, heads_kv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads_q // heads_kv, dim=1).double()
    v = v.repeat_interleave(heads_q // heads_kv, dim=1).double()
    s = (q.double() @ k.transpose(-1, -2)) / np.sqrt(q.shape[-1])
    visible = paged.visible(k.shape[2], q.shape[2], True, q.device)  # the decode kernels' bottom-right rule
    s = s.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return p @ v, lse


@pytest.mark.parametrize("sq,sk", [(1, 1), (1, 65), (7, 63), (63, 65), (65, 63), (65, 7), (16, 16), (5, 1025)])
@pytest.mark.parametrize("heads", [(4, 4), (4, 1), (8, 2)])
def test_lower_right_matches_the_written_out_mask(sq, sk, heads):
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    q = torch.randn(2, heads[0], sq, 32, generator=gen, dtype=torch.float64)
    k = torch.randn(2, heads[1], sk, 32, generator=gen, dtype=torch.float64)
    v = torch.randn(2, heads[1], sk, 32, generator=gen, dtype=torch.float64)
    calls = []

    def attend(q_, k_, v_, top_left):
        calls.append((q_.shape[2], k_.shape[2], top_left))
        return reference_attend(q_, k_, v_, top_left)
    out, lse = causal.lower_right(attend, q, k, v)
    ref_out, ref_lse = lower_right_reference(q, k, v)
    assert torch.allclose(out, ref_out, atol=1e-12, rtol=1e-12)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = ~torch.isneginf(ref_lse)
    assert torch.allclose(lse[finite].double(), ref_lse[finite], atol=1e-5)  # lse comes back float32
    if sk > sq:  # prefix whole, suffix top-left causal: two kernel calls
        assert calls == [(sq, sk - sq, False), (sq, sq, True)]
    elif sk < sq:  # the rows that see a key, top-left over all keys; the blind rows are zeros
        assert calls == [(sk, sk, True)] and torch.all(out[:, :, : sq - sk] == 0)
    else:
        assert calls == [(sq, sk, True)]


def test_the_variant_names_are_torchs():
    from torch.nn.attention.bias import CausalVariant
    assert {v.name.lower() for v in CausalVariant} == set(causal.VARIANTS)


def test_lower_right_is_differentiable_through_the_merge():
    q = torch.randn(1, 2, 3, 16, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 9, 16, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 9, 16, dtype=torch.float64, requires_grad=True)

    def attend(q_, k_, v_, top_left):  # differentiable float64 attention with the top-left mask
        s = (q_ @ k_.transpose(-1, -2)) / 4.0
        if top_left:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        return torch.softmax(s, -1) @ v_, lse
    out, _ = causal.lower_right(attend, q, k, v)
    ref, _ = lower_right_reference(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.sum(), (q, k, v))
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-10)
