"""The masked calls' one-crossing path (lab.masks.fast) on a GPU: it is taken, and its outputs are bit for bit the
full path's (lab.masks.op, reached by naming the version), which chapter n13 checks against float64; sinks and
cu_seqlens that are not contiguous are read as the values they hold. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from lab import kernels, ops
from lab.masks import op as mop, reference, spec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device="cuda", dtype=dtype)


def _masked_plans():
    return sum(1 for key in kernels.plans if isinstance(key, tuple) and key[:1] == ("masked",))


@pytest.mark.parametrize("dtype,D,causal,window,cap,sink,variant,layout", [
    (torch.bfloat16, 128, True, (64, 0), 20.0, True, "upper_left", "bhsd"),
    (torch.bfloat16, 128, True, (100, 0), 0.0, False, "lower_right", "bshd"),
    (torch.float16, 64, False, (30, 40), 5.0, True, "upper_left", "bhsd"),
    (torch.bfloat16, 64, False, None, 30.0, False, "upper_left", "bshd"),
])
def test_dense_fast_path_matches_the_full_path(dtype, D, causal, window, cap, sink, variant, layout):
    B, Hq, Hkv, Sq, Sk = 2, 8, 2, 257, 300
    if layout == "bshd":  # (B, S, H, D) buffers seen as (B, H, S, D)
        q, k, v = (_randn(B, S, H, D, dtype=dtype).transpose(1, 2) for S, H in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv)))
    else:
        q, k, v = _randn(B, Hq, Sq, D, dtype=dtype), _randn(B, Hkv, Sk, D, dtype=dtype), _randn(B, Hkv, Sk, D, dtype=dtype)
    sinks = torch.randn(Hq, device="cuda") if sink else None
    args = dict(is_causal=causal, enable_gqa=True, window_size=window, softcap=cap, sinks=sinks, return_lse=True,
                causal_variant=variant)
    before = _masked_plans()
    out, lse = ops.attention(q, k, v, **args)
    assert _masked_plans() == before + 1 or before > 0  # a plan was made (or this key's already was)
    full_out, full_lse = ops.attention(q, k, v, version=mop.masked_version(q.device), **args)
    assert torch.equal(out, full_out) and torch.equal(lse, full_lse)
    ref, _ = reference.attend(q, k, v, spec.make_mask(causal, window, cap), D ** -0.5,
                              Sk - Sq if variant == "lower_right" else 0, sinks)
    assert float((out.double() - ref).abs().max()) < 0.05  # (the chapter's checks hold the tolerance; this, sanity)


def test_strided_sinks_are_read_as_their_values():
    q, k = _randn(1, 4, 65, 128), _randn(1, 4, 65, 128)
    wide = torch.randn(8, device="cuda")
    strided, packed = wide[::2], wide[::2].contiguous()
    for window in ((16, 0), [16, 0]):  # the fast path (a tuple) and the full path (a list)
        got = ops.attention(q, k, k, is_causal=True, window_size=window, sinks=strided)
        assert torch.equal(got, ops.attention(q, k, k, is_causal=True, window_size=(16, 0), sinks=packed))


def test_packed_fast_path_matches_the_full_path():
    lens_q, lens_k = [0, 5, 300, 63, 0, 130], [0, 5, 300, 63, 7, 130]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, k, v = _randn(int(cu_q[-1]) + 3, 8, 128), _randn(int(cu_k[-1]), 2, 128), _randn(int(cu_k[-1]), 2, 128)
    sinks = torch.randn(8, device="cuda")
    args = dict(is_causal=True, window_size=(50, 0), softcap=20.0, sinks=sinks, return_lse=True)
    rows = int(cu_q[-1])  # rows of no sequence past it: unwritten on both paths without a host check
    out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, check_cu_seqlens=False, **args)
    full_out, full_lse = ops.attention_varlen(q, k, v, cu_q, cu_k, 300, 300, check_cu_seqlens=False,
                                              version=mop.masked_version(q.device), **args)
    assert torch.equal(out[:rows], full_out[:rows]) and torch.equal(lse[:, :rows], full_lse[:, :rows])
    strided = torch.stack([cu_q, cu_q], 1)[:, 0]  # not contiguous: the full path reads a contiguous copy
    again, _ = ops.attention_varlen(q, k, v, strided, cu_k, 300, 300, check_cu_seqlens=False, **args)
    assert torch.equal(again[:rows], out[:rows])
