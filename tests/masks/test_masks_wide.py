"""The masked calls at head dims above 128 on the CPU (the device's capability set by hand, the kernel launch replaced
by a recorder): which kernel a call gets (masked v12 at D 192 / 256 on compute capability 9.0, NotImplementedError
elsewhere), the padding of the dims between (dense D_qk, D_v and packed D), and the refusal of gradients where no
masked backward takes the head dim. The kernel itself is checked on a GPU (lab.masks.gpu_wide.checks_wide;
tests/masks/test_masks_wide_gpu.py)."""
import pytest
import torch

from lab import ops, op_common, registry
from lab.fwd import head_dims
from lab.masks import fast, op as mop

BF16 = torch.bfloat16


@pytest.fixture
def device(monkeypatch):
    """CPU tensors taken for a GPU of the capability set (yields the setter): the device lookups answer it and the
    CUDA checks pass."""
    capability = [(9, 0)]
    monkeypatch.setattr(op_common, "_device", lambda device: (capability[0], 132))
    monkeypatch.setattr(mop, "_check_cuda", lambda *args: None)
    monkeypatch.setattr(head_dims, "_check_cuda", lambda *args: None)

    def set_capability(value):
        capability[0] = value
    yield set_capability


@pytest.fixture
def calls(monkeypatch):
    """The launches replaced by recorders: each call's (version, D of query, D of value, scale), outputs of the right
    shapes (zeros)."""
    seen = []

    def dense(query, key, value, sinks, left, right, offset, softcap, scale, version, want_lse=True):
        seen.append((version, query.shape[-1], value.shape[-1], scale))
        return torch.zeros_like(query), torch.zeros(query.shape[:3])

    def varlen(query, key, value, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version,
               want_lse=True, rows_q=None):
        seen.append((version, query.shape[-1], value.shape[-1], scale))
        return torch.zeros_like(query), torch.zeros(query.shape[1], query.shape[0])
    for name, fn in (("_masked_impl", dense), ("_masked_op", dense), ("_varlen_impl", varlen), ("_varlen_op", varlen)):
        monkeypatch.setattr(mop, name, fn)
    return seen


def _t(*shape):
    return torch.zeros(*shape, dtype=BF16)


CU = torch.tensor([0, 10, 20], dtype=torch.int32)


def test_choose_picks_v12_at_the_wide_head_dims_on_hopper_only():
    for d in (192, 256):
        assert registry.choose("fwd_masked", {"head_dim": d}, (9, 0)).version == "v12"
        for capability in ((8, 0), (8, 9)):
            with pytest.raises(NotImplementedError, match=rf"head dim {d} runs on compute capability 9.0 only \(v12\)"):
                registry.choose("fwd_masked", {"head_dim": d}, capability)
    assert registry.choose("fwd_masked", {"head_dim": 128}, (9, 0)).version == "v11"  # unchanged below
    assert registry.choose("fwd_masked", {"head_dim": 64}, (8, 0)).version == "v08"
    assert fast.masked_head_dims((9, 0)) == (64, 128, 192, 256) and fast.masked_head_dims((8, 0)) == (64, 128)


def test_masked_varlen_width():
    dims = (64, 128, 192, 256)
    assert [head_dims.masked_varlen_width(d, dims) for d in (64, 96, 128, 136, 160, 192, 200, 256, 264)] == \
        [64, None, 128, 192, 192, 192, 256, 256, None]
    assert head_dims.masked_varlen_width(200, (64, 128)) is None


@pytest.mark.parametrize("d_qk,d_v,width", [(256, 256, 256), (192, 192, 192), (200, 200, 256), (160, 160, 192),
                                            (192, 160, 192), (136, 256, 256), (128, 200, 256)])
def test_dense_dispatch_and_padding(device, calls, d_qk, d_v, width):
    q, k, v = (_t(2, h, 33, d) for h, d in ((8, d_qk), (4, d_qk), (4, d_v)))
    out = ops.attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(16, 0), softcap=50.0)
    assert out.shape == (2, 8, 33, d_v)
    assert calls == [("v12", width, width, pytest.approx(d_qk ** -0.5))]  # the true D_qk's scale, not the width's


def test_the_wide_dims_are_refused_off_hopper(device, calls):
    device((8, 0))
    for d in (256, 200):
        q = _t(1, 4, 17, d)
        with pytest.raises(NotImplementedError, match=r"window_size / softcap / sinks / attention_varlen: "
                                                      r"fwd_masked at head dim 256 runs on compute capability 9.0"):
            ops.attention(q, q, q, is_causal=True, softcap=50.0)
    packed = _t(20, 4, 256)
    with pytest.raises(NotImplementedError, match=r"head dim 256 has no kernel on this device \(kernels at \[64, 128\]"):
        ops.attention_varlen(packed, packed, packed, CU, CU, 10, 10, is_causal=True)
    assert calls == []


@pytest.mark.parametrize("d,width", [(256, 256), (192, 192), (200, 256), (136, 192)])
def test_varlen_dispatch_and_padding(device, calls, d, width):
    q, k = _t(20, 8, d), _t(30, 4, d)
    out = ops.attention_varlen(q, k, k, CU, torch.tensor([0, 15, 30], dtype=torch.int32), 10, 15, is_causal=True,
                               window_size=(8, 0))
    assert out.shape == q.shape
    assert calls == [("v12", width, width, pytest.approx(d ** -0.5))]


def test_gradients_above_128_follow_the_masked_backward_table(device, calls):
    """A masked call that wants gradients runs only where some MASKED_BWD row takes its kernel head dim; elsewhere it
    raises before the forward runs (the forward alone runs at any dim the forward kernels take)."""
    wide_backward = any(256 in row.head_dims for row in registry.MASKED_BWD.values())
    for d in (256, 200):
        q = _t(1, 4, 17, d).requires_grad_()
        if wide_backward:
            assert ops.attention(q, q, q, is_causal=True, softcap=50.0).shape == q.shape
        else:
            with pytest.raises(NotImplementedError, match=r"backward pass of window_size / softcap / sinks at "
                                                          r"head dim 256 has no kernel"):
                ops.attention(q, q, q, is_causal=True, softcap=50.0)
        with torch.no_grad():
            assert ops.attention(q, q, q, is_causal=True, softcap=50.0).shape == q.shape
    if not any(192 in row.head_dims for row in registry.MASKED_BWD.values()):
        packed = _t(20, 4, 192)
        with pytest.raises(NotImplementedError, match=r"at head dim 192 has no kernel"):
            ops.attention_varlen(packed.requires_grad_(), packed, packed, CU, CU, 10, 10, is_causal=True)
    q = _t(1, 4, 17, 128).requires_grad_()  # D 128 trains as before
    assert ops.attention(q, q, q, is_causal=True, softcap=50.0).shape == q.shape


def test_a_named_version_must_take_the_head_dim(device):
    with pytest.raises(ValueError, match=r"version='v11' takes head dims \[64, 128\], got 256"):
        fast.masked_version(torch.device("cuda", 0), "v11", 256)
    with pytest.raises(ValueError, match=r"version='v12' takes head dims \[192, 256\], got 128"):
        fast.masked_version(torch.device("cuda", 0), "v12", 128)
    assert fast.masked_version(torch.device("cuda", 0), None, 192) == "v12"
