"""lab.ops.attention_varlen's dense route (lab.masks.dense_route) and D_v != D_qk in packed calls, on the CPU.

The decision (one length, from the checked host copy of cu_seqlens only; the masks whose dense meaning is the packed
one), its guard (an unchecked call, an untruthful max_seqlen, rows of no sequence, a named version), and the plumbing
(the (n, H, S, D) views over the packed rows, the LSE copied to (H, total) and back, the dense backward on those
views with its gradients as the packed rows) with the kernels replaced by the float64 reference. The kernels themselves: lab.masks.gpu_varlen
(checks_route, checks_dv) on a GPU."""
import pytest
import torch

from lab import op_common, ops
from lab.fwd import head_dims
from lab.masks import dense_route, emulate, op as mop, reference, spec, varlen_bwd

F16 = torch.float16


def _draw(*shape, seed, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def test_uniform_shape_reads_every_boundary():
    assert dense_route.uniform_shape([0, 4, 8, 12], [0, 6, 12, 18]) == (3, 4, 6)
    assert dense_route.uniform_shape([0, 7], [0, 7]) == (1, 7, 7)
    for host_q, host_k in (([0, 4, 8, 11], [0, 4, 8, 12]),  # the last sequence shorter (rows of no sequence after)
                           ([0, 4, 7, 12], [0, 4, 8, 12]),  # one in the middle
                           ([0, 4, 8], [0, 4, 8, 12]),  # batch mismatch
                           ([0, 0, 0], [0, 3, 6]),  # S_q = 0
                           ([0, 3, 6], [0, 0, 0]),  # S_k = 0 (the dense op refuses an empty key)
                           ([0], [0]), ([], [])):
        assert dense_route.uniform_shape(host_q, host_k) is None


def test_route_takes_only_the_masks_whose_dense_meaning_is_the_packed_one():
    q, k = [0, 5, 10], [0, 9, 18]
    causal, full = spec.make_mask(True, None, 0.0), spec.make_mask(False, None, 0.0)
    assert dense_route.route(q, q, causal, None, None) == (2, 5, 5)
    assert dense_route.route(q, k, full, None, None) == (2, 5, 9)
    assert dense_route.route(q, k, causal, None, None) is None  # packed causal is bottom-right, the dense top-left
    for mask in (spec.make_mask(True, (3, 0), 0.0), spec.make_mask(False, (3, 3), 0.0), spec.make_mask(True, None, 5.0)):
        assert dense_route.route(q, q, mask, None, None) is None
    assert dense_route.route(q, q, causal, torch.zeros(2), None) is None  # sinks
    assert dense_route.route(q, q, causal, None, "v11") is None  # a named kernel runs as named
    assert dense_route.route([], [], causal, None, None) is None  # unchecked: no host copy, no route


def _reference_dense(qd, kd, vd, od, lse_dense, causal, scale):
    """The dense kernel's contract in float64: O into od (the packed rows' view), LSE (n, H, S) into lse_dense."""
    out, lse = reference.attend(qd, kd, vd, spec.make_mask(causal, None, 0.0), scale, 0)
    od.copy_(out.to(od.dtype))
    if lse_dense is not None:
        lse_dense.copy_(lse)


def _reference_packed(q, k, v, out, lse, mask, scale, offset, sinks, cu_q, cu_k, max_q, max_k, version):
    """The packed kernel's contract in float64: every row of every sequence written, no other."""
    o, l_ = reference.attend_varlen(q, k, v, cu_q.tolist(), cu_k.tolist(), mask, scale, sinks)
    rows = int(cu_q[-1])
    out[:rows] = o[:rows].to(out.dtype)
    if lse is not None:
        lse[:, :rows] = l_[:, :rows].float()


@pytest.mark.parametrize("n,sq,sk,hq,hkv,causal,stray_q,stray_k", [(3, 5, 5, 4, 2, True, 0, 0),
                                                                   (2, 4, 9, 4, 1, False, 3, 2),
                                                                   (1, 17, 17, 2, 2, True, 1, 0)])
def test_dense_impl_is_the_packed_answer(n, sq, sk, hq, hkv, causal, stray_q, stray_k):
    """The views, the LSE layout and the rows of no sequence; a route taken on lengths that are not one (the guard
    removed) must give a different answer, so this test can fail."""
    q, k, v = _draw(n * sq + stray_q, hq, 16, seed=1), _draw(n * sk + stray_k, hkv, 16, seed=2), \
        _draw(n * sk + stray_k, hkv, 16, seed=3)
    cu_q, cu_k = _cu([sq] * n), _cu([sk] * n)
    mask = spec.make_mask(causal, None, 0.0)
    shape = dense_route.route(cu_q.tolist(), cu_k.tolist(), mask, None, None)
    assert shape == (n, sq, sk)
    args = (q, k, v, cu_q, cu_k, None, sq, sk, mask.left, mask.right, 0.0, 0.3, "v11")
    out, lse = dense_route.dense_impl(*args, rows_q=n * sq, shape=shape, run=_reference_dense)
    want, want_lse = reference.attend_varlen(q, k, v, cu_q, cu_k, mask, 0.3)
    assert float((out - want).abs().max()) < 1e-12
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite) and float((lse - want_lse)[finite].abs().max()) < 1e-5
    assert not out[n * sq:].any() and bool(torch.isneginf(lse[:, n * sq:]).all())  # rows of no sequence
    if n > 1:  # the last sequence one key shorter: the dense route's answer is not the packed one
        bad_k = _cu([sk] * (n - 1) + [sk - 1])
        wrong, _ = dense_route.dense_impl(q, k, v, cu_q, bad_k, None, sq, sk, mask.left, mask.right, 0.0, 0.3, "v11",
                                          shape=shape, run=_reference_dense)
        right, _ = reference.attend_varlen(q, k, v, cu_q, bad_k, mask, 0.3)
        assert float((wrong - right)[:n * sq].abs().max()) > 1e-3


@pytest.fixture
def gpu(monkeypatch):
    """CPU tensors taken for an H200's (compute capability 9.0): the device lookups answer it, the CUDA checks pass,
    the kernels are the float64 references (dense and packed); returns the list of routes taken."""
    monkeypatch.setattr(op_common, "_device", lambda device: ((9, 0), 132))
    monkeypatch.setattr(mop, "_check_cuda", lambda *args: None)
    monkeypatch.setattr(head_dims, "_check_cuda", lambda *args: None)
    monkeypatch.setattr(dense_route, "run_dense", _reference_dense)
    monkeypatch.setattr(mop, "launch", _reference_packed)
    routes = []
    real = dense_route.dense_impl

    def spy(*args, shape=None, **kwargs):
        routes.append(shape)
        return real(*args, shape=shape, **kwargs)
    monkeypatch.setattr(dense_route, "dense_impl", spy)
    return routes


def test_the_public_call_routes_a_checked_call_of_one_length(gpu):
    q, k, v = (_draw(12, 4, 64, seed=s, dtype=F16) for s in (1, 2, 3))
    cu = _cu([4, 4, 4])
    want, _ = reference.attend_varlen(q, k, v, cu, cu, spec.make_mask(True, None, 0.0), 0.125)
    out = ops.attention_varlen(q, k, v, cu, cu, 4, 4, is_causal=True)
    assert gpu == [(3, 4, 4)] and float((out.double() - want).abs().max()) < 2e-3
    out = ops.attention_varlen(q, k, v, cu, cu, 64, 64, is_causal=True)  # a loose (truthful) max: the same route
    assert gpu == [(3, 4, 4)] * 2 and float((out.double() - want).abs().max()) < 2e-3
    with pytest.raises(ValueError, match=r"a sequence of 4 rows exceeds max_seqlen \(3\)"):  # an untruthful max
        ops.attention_varlen(q, k, v, cu, cu, 3, 3, is_causal=True)
    out = ops.attention_varlen(q, k, v, cu, cu, 4, 4, is_causal=True, check_cu_seqlens=False)  # no host copy
    assert len(gpu) == 2 and float((out.double() - want).abs().max()) < 2e-3
    ops.attention_varlen(q, k, v, cu, cu, 4, 4, is_causal=True, window_size=(2, 0))
    ops.attention_varlen(q, k, v, cu, cu, 4, 4, is_causal=True, version="v11")
    uneven = _cu([4, 4, 3])  # 12 rows, 3 x max_seqlen: a row of no sequence at the end, so no route
    out = ops.attention_varlen(q, k, v, uneven, uneven, 4, 4)
    assert len(gpu) == 2 and float(out[11:].abs().max()) == 0.0


def _reference_dense_backward(calls):
    """default_backward in float64, the kernels' formulation: P from the LSE it is given, Delta from the O it is
    given (so a wrong LSE or O layout shows), dK and dV summed over each KV head's group; the gradients in the
    views' layout, as the kernels' grad_like gives them."""
    def run(dod, qd, kd, vd, od, lse_dense, dlse, causal, scale):
        calls.append((tuple(qd.shape), causal))
        q, k, v, do, o = (t.double() for t in (qd, kd, vd, dod, od))
        group = q.shape[1] // k.shape[1]
        kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = scale * q @ kr.transpose(-1, -2)
        if causal:
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        p = torch.exp(s - lse_dense.double()[..., None])
        delta = (do * o).sum(-1) - (dlse.double() if dlse is not None else 0.0)
        ds = p * (do @ vr.transpose(-1, -2) - delta[..., None])
        dq, dk, dv = scale * ds @ kr, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do
        fold = lambda x: x.view(k.shape[0], k.shape[1], group, *x.shape[2:]).sum(2)  # noqa: E731
        return tuple(torch.empty_like(t).copy_(g) for g, t in zip((dq, fold(dk), fold(dv)), (qd, kd, vd)))
    return run


@pytest.mark.parametrize("stray", [0, 3])
def test_a_routed_call_takes_the_dense_backward(gpu, monkeypatch, stray):
    """Gradients through the route: the dense backward on the (n, H, S, D) views of the packed rows, fed the dense
    forward's O and its LSE copied to (H, total) and back, its gradients the packed rows (zero for rows of no
    sequence), against float64 autograd of the packed reference; an unchecked call keeps the packed backward."""
    dense_calls, packed_calls = [], []
    monkeypatch.setattr(dense_route, "default_backward", _reference_dense_backward(dense_calls))

    def packed(grad_out, q, k, v, *rest):
        packed_calls.append(q.shape)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros(0)
    monkeypatch.setattr(varlen_bwd, "launch", packed)
    cu = _cu([6, 6])
    q = _draw(12 + stray, 4, 64, seed=4, dtype=F16).requires_grad_()
    k, v = (_draw(12 + stray, 2, 64, seed=s, dtype=F16).requires_grad_() for s in (5, 6))
    out, lse = ops.attention_varlen(q, k, v, cu, cu, 6, 6, is_causal=True, return_lse=True)
    assert gpu == [(2, 6, 6)]
    dout, dlse = _draw(12 + stray, 4, 64, seed=7, dtype=F16), _draw(4, 12 + stray, seed=8).float()
    finite = torch.isfinite(lse)
    loss = (out.double() * dout.double()).sum() + (torch.where(finite, lse, 0.0).double() * dlse.double()).sum()
    got = torch.autograd.grad(loss, (q, k, v))
    assert dense_calls == [((2, 4, 6, 64), True)] and packed_calls == []
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    r_out, r_lse = reference.attend_varlen(*ref, cu, cu, spec.make_mask(True, None, 0.0), 0.125)
    r_loss = (r_out * dout.double()).sum() + (torch.where(finite, r_lse, 0.0) * dlse.double()).sum()
    want = torch.autograd.grad(r_loss, ref)
    for g, w, t in zip(got, want, (q, k, v)):
        assert g.shape == t.shape and float((g.double() - w).abs().max()) < 2e-2 * float(w.abs().max())
        assert not g[12:].any()  # rows of no sequence
    out = ops.attention_varlen(q, k, v, cu, cu, 6, 6, is_causal=True, check_cu_seqlens=False)
    torch.autograd.grad((out.double() * dout.double()).sum(), (q, k, v))
    assert len(packed_calls) == 1 and len(dense_calls) == 1


def test_to_packed_is_a_view_in_the_gradients_own_layout():
    """The dense backward's gradient of dense_views of a contiguous packed tensor lies in (n, S, H, D) order: its
    packed rows are a view of it, with no copy."""
    packed = torch.zeros(12, 4, 16)
    g = torch.empty_like(dense_route.dense_views(packed, 2, 6)).normal_()
    rows = dense_route._to_packed(g, packed, 2, 6)
    assert rows.data_ptr() == g.data_ptr() and rows.shape == packed.shape
    assert torch.equal(rows.view(2, 6, 4, 16).transpose(1, 2), g)


@pytest.mark.parametrize("d_qk,d_v,width", [(192, 128, 192), (136, 256, 256), (256, 192, 256), (64, 128, 128),
                                            (128, 64, 128)])
def test_value_head_dim_of_its_own(gpu, d_qk, d_v, width):
    """D_v != D_qk: every tensor padded to the kernel width of the larger, the scale the true D_qk's, O cut back."""
    lens_q, lens_k = [3, 0, 7], [5, 2, 7]
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    q, k, v = _draw(10, 4, d_qk, seed=1, dtype=F16), _draw(14, 2, d_qk, seed=2, dtype=F16), \
        _draw(14, 2, d_v, seed=3, dtype=F16)
    seen = []

    def packed(q_, k_, v_, out, lse, mask, scale, *rest):
        seen.append((q_.shape[-1], k_.shape[-1], v_.shape[-1], scale))
        _reference_packed(q_, k_, v_, out, lse, mask, scale, *rest)
    mop.launch, real = packed, mop.launch
    try:
        out = ops.attention_varlen(q, k, v, cu_q, cu_k, 7, 7, is_causal=True, softcap=20.0)
    finally:
        mop.launch = real
    assert seen == [(width, width, width, pytest.approx(d_qk ** -0.5))] and out.shape == (10, 4, d_v)
    want, _ = reference.attend_varlen(q, k, v, cu_q, cu_k, spec.make_mask(True, None, 20.0), d_qk ** -0.5)
    assert float((out.double() - want).abs().max()) < 2e-3


def test_value_head_dim_checks(gpu):
    q, k = _draw(10, 4, 192, seed=1, dtype=F16), _draw(14, 2, 192, seed=2, dtype=F16)
    cu_q, cu_k = _cu([10]), _cu([14])
    with pytest.raises(ValueError, match=r"key and value must agree in \(total_k, H\)"):
        ops.attention_varlen(q, k, _draw(13, 2, 128, seed=3, dtype=F16), cu_q, cu_k, 10, 14)
    with pytest.raises(NotImplementedError, match=r"head dim 264 \(query/key 192, value 264\) has no kernel"):
        ops.attention_varlen(q, k, _draw(14, 2, 264, seed=3, dtype=F16), cu_q, cu_k, 10, 14)
    with pytest.raises(TypeError, match=r"value.dtype"):
        ops.attention_varlen(q, k, _draw(14, 2, 128, seed=3), cu_q, cu_k, 10, 14)


def test_one_host_copy_serves_both_when_cu_seqlens_k_is_cu_seqlens_q(gpu, monkeypatch):
    """The same tensor for both: one device-to-host copy, and cu_seqlens_k's own rules (its max) still checked."""
    q = _draw(12, 2, 64, seed=1, dtype=F16)
    cu = _cu([6, 6])
    copies = []
    real = mop._check_cu

    def counting(cu_, *args, **kwargs):
        copies.append(kwargs.get("host") if "host" in kwargs else (args[6] if len(args) > 6 else None))
        return real(cu_, *args, **kwargs)
    monkeypatch.setattr(mop, "_check_cu", counting)
    ops.attention_varlen(q, q, q, cu, cu, 6, 6, is_causal=True)
    assert copies[0] is None and copies[1] == [0, 6, 12]  # the second check reads the first one's copy
    with pytest.raises(ValueError, match=r"exceeds max_seqlen \(5\) for cu_seqlens_k"):
        ops.attention_varlen(q, q, q, cu, cu, 6, 5, is_causal=True)
    copies.clear()
    ops.attention_varlen(q, q, q, cu, cu.clone(), 6, 6, is_causal=True)
    assert copies == [None, None]


def test_cu_seqlens_on_the_host_take_the_route_with_no_device_copy(gpu, monkeypatch):
    """Both cu_seqlens on the CPU with a CUDA query (forced here: the tensors are CPU ones taken for a GPU's): their
    values are checked whatever check_cu_seqlens says (reading them costs no sync), the route is taken, and the
    kernels get device copies (here: the pin and the copy are the identity)."""
    q = _draw(12, 2, 64, seed=1, dtype=F16)
    cu = _cu([6, 6])
    assert not mop._on_host(cu, cu, q) and not mop._on_host(cu.to("meta"), cu, q)  # a CPU query: not this case
    monkeypatch.setattr(mop, "_on_host", lambda *args: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *args: self)
    want, _ = reference.attend_varlen(q, q, q, cu, cu, spec.make_mask(True, None, 0.0), 0.125)
    out = ops.attention_varlen(q, q, q, cu, cu, 6, 6, is_causal=True, check_cu_seqlens=False)
    assert gpu == [(2, 6, 6)] and float((out.double() - want).abs().max()) < 2e-3
    with pytest.raises(ValueError, match=r"a sequence of 6 rows exceeds max_seqlen \(5\)"):
        ops.attention_varlen(q, q, q, cu, cu, 5, 6, is_causal=True, check_cu_seqlens=False)
