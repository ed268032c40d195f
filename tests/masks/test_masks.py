"""lab.masks on the CPU: the emulated tiled algorithm (window tiles skipped, softcap in the exp2 step, sinks in the
normaliser, the varlen scheduler) against the float64 reference with the mask written out; the backward formulas
against float64 autograd of that reference; a variant that ignores the window must fail; the public calls'
argument checks under fake CUDA tensors (tests/product/test_ops.py's way)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from lab import ops
from lab.masks import emulate, op as mask_op, reference, spec

LENGTHS = [(1, 1), (63, 63), (65, 65), (63, 130), (130, 63), (1, 97)]
WINDOWS = [((0, 0), False), ((1, 0), False), ((0, -1), True), ((64, 0), False), ((200, -1), True),
           ((5, 7), False), ((-1, 3), False), ((-1, -1), True)]


def _draw(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    same_inf = np.isneginf(a) & np.isneginf(b)
    return float(np.abs(np.where(same_inf, 0, a - np.where(same_inf, 0, b))).max())


@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("window,causal", WINDOWS)
def test_emulation_matches_reference(sq, sk, window, causal):
    seed = sq * 1000 + sk
    mask = spec.make_mask(causal, window, 20.0 if sq % 2 else 0.0)
    q, k, v = _draw(2, 4, sq, 32, seed=seed), _draw(2, 2, sk, 32, seed=seed + 1), _draw(2, 2, sk, 32, seed=seed + 2)
    sinks = _draw(4, seed=seed + 3) if sk % 2 else None
    offset = sk - sq
    ref_out, ref_lse = reference.attend(q, k, v, mask, 0.3, offset, sinks)
    out, lse = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, 0.3, offset,
                               None if sinks is None else sinks.numpy(), block_m=32, block_n=16)
    assert _err(out, ref_out) < 2e-5 and _err(lse, ref_lse) < 2e-5
    assert np.isfinite(out).all()
    if sinks is None:  # rows that see nothing: O = 0, LSE = -inf in both
        assert (np.isneginf(lse) == torch.isneginf(ref_lse).numpy()).all()


def test_window_edges_written_out():
    m = spec.make_mask(True, (2, -1), 0.0)
    seen = spec.visible(torch.arange(5), torch.arange(5), 5, 0, m)
    assert seen.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 1, 0],
                                   [0, 0, 1, 1, 1]]
    # (0, 0): only the diagonal; bottom-right offset 2 moves it two keys right
    diag = spec.visible(torch.arange(3), torch.arange(5), 5, 2, spec.make_mask(False, (0, 0), 0.0))
    assert diag.int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]


def test_window_tiles_are_skipped_and_cost_is_linear():
    mask = spec.make_mask(True, (256, 0), 0.0)

    def tiles(seqlen):
        computed = sum(j1 - j0 for m0 in range(0, seqlen, 64)
                       for j0, j1 in [spec.tile_range(m0, min(m0 + 64, seqlen), seqlen, 0, mask, 64)])
        return computed, (-(-seqlen // 64)) ** 2

    (c1, all1), (c2, all2), (c4, all4) = tiles(4096), tiles(8192), tiles(16384)
    assert c4 - c2 == 2 * (c2 - c1)  # linear in S at a fixed window: a constant cost per query block
    assert c1 <= (4096 // 64) * (256 // 64 + 2) and c4 < all4 / 40
    stats = {}
    q = _draw(1, 1, 640, 16, seed=5).numpy()
    emulate.forward(q, q, q, mask, None, 0, stats=stats)
    assert stats["skipped"] > 0 and stats["skipped"] + stats["masked"] + stats.get("full", 0) == 10 * 10


def test_ignoring_the_window_fails():
    mask = spec.make_mask(True, (16, 0), 0.0)
    q, k, v = (_draw(1, 2, 130, 32, seed=s) for s in (7, 8, 9))
    ref, _ = reference.attend(q, k, v, mask)
    good, _ = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask)
    wrong, _ = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, ignore_window=True)
    assert _err(good, ref) < 1e-5 and _err(wrong, ref) > 1e-2


def _capped_rows(seed, scores):
    """q, k, v (1, 1, S, 32) whose every score is about `scores` (k's rows one direction u, q's rows along u
    times scores / (scale |u|^2)), plus a little noise: the rows the fixed offset of the softcap must survive."""
    u = _draw(32, seed=seed)
    k = u.expand(70, 32) + 0.01 * _draw(70, 32, seed=seed + 1)
    q = (scores / (0.3 * float(u @ u))) * u.expand(40, 32) + 0.01 * _draw(40, 32, seed=seed + 2)
    return q[None, None], k[None, None], _draw(1, 1, 70, 32, seed=seed + 3)


@pytest.mark.parametrize("cap", [5.0, 30.0, 51.0])
@pytest.mark.parametrize("scores", [-1e4, -3.0, 0.5, 1e4])  # saturated at -cap, mid-range, saturated at +cap
def test_softcap_fixed_offset_matches_the_online_max(cap, scores):
    # v09's softcap softmax without a running max (CAP_HEADROOM) agrees with float64 wherever the kernel takes it,
    # to the rounding of P to bf16 (2^-9 relative, as any 16-bit P V), with no row lost to the range
    assert cap * emulate.LOG2E <= emulate.CAP_MAX_LOG2
    mask = spec.make_mask(True, (-1, -1), cap)
    q, k, v = _capped_rows(17, scores)
    ref_out, ref_lse = reference.attend(q, k, v, mask, 0.3, 30, None)
    out, lse = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, 0.3, 30, bounded=True)
    assert _err(out, ref_out) < 2.0 ** -8 * float(v.abs().max()) and _err(lse, ref_lse) < 2.0 ** -8


def test_softcap_fixed_offset_normalises_with_the_rounded_p():
    # a row of one key gives O = V exactly once l sums the same 16-bit P that P V uses; with l from the fp32 P it
    # is off by up to 2^-9 (what the first GPU run of the fixed offset showed at S_q = S_k = 1)
    mask = spec.make_mask(True, (-1, -1), 30.0)
    q, k, v = (_draw(1, 8, 1, 32, seed=s) for s in (23, 24, 25))
    v = v.float().to(torch.bfloat16).double()  # the kernel's V is bf16: O = V is then exact
    worst = {}
    for rounded in (True, False):
        out, _ = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, 0.3, 0, bounded=True, rounded_l=rounded)
        worst[rounded] = float(np.abs(out - v.numpy()).max() / np.abs(v.numpy()).max())
    assert worst[True] < 1e-6 and worst[False] > 2.0 ** -12


def test_softcap_fixed_offset_fails_beyond_its_limit():
    # past CAP_MAX_LOG2 a row at -cap flushes every P to zero (why the kernel keeps the online max there)
    cap = 70.0
    assert cap * emulate.LOG2E > emulate.CAP_MAX_LOG2
    mask = spec.make_mask(False, (-1, -1), cap)
    q, k, v = _capped_rows(19, -1e4)
    ref_out, _ = reference.attend(q, k, v, mask, 0.3, 0, None)
    online, _ = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, 0.3, 0)
    bounded, _ = emulate.forward(q.numpy(), k.numpy(), v.numpy(), mask, 0.3, 0, bounded=True)
    assert _err(online, ref_out) < 2e-5 and _err(bounded, ref_out) > 0.1


def test_softcap_bound_constants_match_the_kernel():
    import re
    from pathlib import Path
    src = (Path(__file__).parents[2] / "kernels/common/hopper/attn_mask_sm90.cuh").read_text()
    for name, value in (("kCapHeadroom", emulate.CAP_HEADROOM), ("kCapMaxLog2", emulate.CAP_MAX_LOG2)):
        assert float(re.search(rf"constexpr float {name} = ([0-9.]+)f;", src).group(1)) == value


def _packed(lens_q, lens_k, heads_q, heads_kv, d, seed):
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32)
    q = _draw(int(cu_q[-1]), heads_q, d, seed=seed)
    k, v = _draw(int(cu_k[-1]), heads_kv, d, seed=seed + 1), _draw(int(cu_k[-1]), heads_kv, d, seed=seed + 2)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("window,causal,cap,sink", [((-1, -1), True, 0.0, False), ((8, 0), False, 0.0, True),
                                                    ((3, 3), False, 10.0, False), ((-1, -1), False, 0.0, True)])
def test_varlen_emulation_with_empty_sequences(window, causal, cap, sink):
    lens_q, lens_k = [5, 0, 70, 1, 33, 0], [5, 3, 64, 0, 40, 0]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 32, seed=11)
    mask = spec.make_mask(causal, window, cap)
    sinks = _draw(4, seed=12) if sink else None
    ref_out, ref_lse = reference.attend_varlen(q, k, v, cu_q, cu_k, mask, None, sinks)
    stats = {}
    out, lse = emulate.forward_varlen(q.numpy(), k.numpy(), v.numpy(), cu_q, cu_k, max(lens_q), mask, None,
                                      None if sinks is None else sinks.numpy(), block_m=32, block_n=16, stats=stats)
    assert _err(out, ref_out) < 2e-5 and _err(lse, ref_lse) < 2e-5
    # no padding: only blocks inside a sequence compute; the rest of the max_seqlen grid returns at once
    assert stats["ctas"] == 4 * sum(-(-n // 32) for n in lens_q)
    assert stats["ctas"] + stats["idle_ctas"] == 4 * len(lens_q) * (-(-max(lens_q) // 32))


def _backward_problem(window, causal, cap, sink, offset):
    """(mask, the emulation's array arguments, its sinks and dlse, float64 autograd's gradients) of one case:
    40 queries, 40 + offset keys, GQA 4/2, scale 0.4, a random gradient into the output and into the LSE."""
    mask = spec.make_mask(causal, window, cap)
    sq, sk = 40, 40 + offset
    q, k, v = (_draw(*s, seed=i).requires_grad_() for i, s in enumerate([(2, 4, sq, 16), (2, 2, sk, 16), (2, 2, sk, 16)]))
    sinks = _draw(4, seed=9).requires_grad_() if sink else None
    out, lse = reference.attend(q, k, v, mask, 0.4, offset, sinks)
    dout, dlse = _draw(*out.shape, seed=10), _draw(*lse.shape, seed=11)
    dlse = torch.where(torch.isfinite(lse), dlse, torch.zeros_like(dlse))
    inputs = [q, k, v] + ([sinks] if sink else [])
    grads = torch.autograd.grad((out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0) * dlse).sum(), inputs)
    args = tuple(t.detach().numpy() for t in (q, k, v, out, lse)) + (dout.numpy(),)
    return mask, args, None if sinks is None else sinks.detach().numpy(), dlse.numpy(), grads


@pytest.mark.parametrize("window,causal,cap,sink,offset", [((9, 0), False, 0.0, True, 0), ((-1, -1), True, 5.0, True, 7),
                                                           ((4, 6), False, 3.0, False, -5), ((-1, -1), False, 0.0, True, 0)])
def test_backward_formulas_match_autograd(window, causal, cap, sink, offset):
    mask, args, sinks, dlse, grads = _backward_problem(window, causal, cap, sink, offset)
    dq, dk, dv, dsinks = emulate.backward(*args, mask, 0.4, offset, sinks, dlse, 16, 16)
    for got, want in zip((dq, dk, dv), grads[:3]):
        assert _err(got, want) < 1e-9
    if sink:
        assert _err(dsinks, grads[3]) < 1e-9 and np.abs(dsinks).max() > 1e-3
    # the softcap's derivative is not optional: without it dq is wrong
    if cap:
        nocap = emulate.backward(*args, spec.Mask(mask.left, mask.right, 0.0), 0.4, offset, sinks, dlse)
        assert _err(nocap[0], grads[0]) > 1e-3


@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("window,causal", WINDOWS)
@pytest.mark.parametrize("offset_kind", ["top_left", "bottom_right"])
def test_backward_query_block_range_is_exact(sq, sk, window, causal, offset_kind):
    """bwd v08's key-major loop: a key block visits exactly the query blocks with some visible pair."""
    mask = spec.make_mask(causal, window, 0.0)
    offset = sk - sq if offset_kind == "bottom_right" else 0
    seen = spec.visible(torch.arange(sq), torch.arange(sk), sk, offset, mask)
    for bn in (16, 128):
        for n0 in range(0, sk, bn):
            n1 = min(n0 + bn, sk)
            for bm in (16, 64):
                blocks = {i // bm for i in range(sq) if seen[i, n0:n1].any()}
                first, last = spec.query_block_range(n0, n1, sq, offset, mask, bm)
                assert set(range(first, last)) == blocks, (n0, bm)


@pytest.mark.parametrize("window,causal,cap,sink,offset", [((9, 0), False, 0.0, True, 0), ((-1, -1), True, 5.0, True, 7),
                                                           ((4, 6), False, 3.0, False, -5), ((0, 0), False, 0.0, False, 0)])
def test_key_major_backward_matches_autograd(window, causal, cap, sink, offset):
    """The backward in the kernel's order (key blocks, their query-block range) against float64 autograd; the
    same loop that ignores the window (every query block, no per-element window) fails."""
    mask, args, sinks, dlse, grads = _backward_problem(window, causal, cap, sink, offset)
    tail = (0.4, offset, sinks, dlse, 16, 32)
    dq, dk, dv, dsinks = emulate.backward_by_keys(*args, mask, *tail)
    for got, want in zip((dq, dk, dv), grads[:3]):
        assert _err(got, want) < 1e-9
    if sink:
        assert _err(dsinks, grads[3]) < 1e-9
    wrong = emulate.backward_by_keys(*args, spec.Mask(-1, -1, mask.softcap), *tail)
    assert max(_err(w, g) for w, g in zip(wrong[:3], grads[:3])) > 1e-3



@pytest.mark.parametrize("window,causal,cap,sink", [((-1, -1), True, 0.0, True), ((8, 0), False, 5.0, True),
                                                    ((3, 3), False, 0.0, False), ((-1, -1), False, 10.0, True)])
def test_varlen_backward_matches_autograd_with_empty_sequences(window, causal, cap, sink):
    """Packed sequences through bwd v08's route (padded copies, each rule per sequence; lab.masks.varlen_bwd's
    pad / unpad) against float64 autograd of the packed reference, empty sequences and rows of no sequence
    included; the same route with the sequences' lengths ignored (one window over the whole padded row) fails."""
    lens_q, lens_k = [5, 0, 70, 1, 33, 0, 4], [5, 3, 64, 0, 40, 0, 9]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 16, seed=21)
    q, k, v = (torch.cat([t, _draw(3, *t.shape[1:], seed=22)]) for t in (q, k, v))  # rows of no sequence
    mask = spec.make_mask(causal, window, cap)
    sinks = (_draw(4, seed=23) * 2).requires_grad_() if sink else None
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = reference.attend_varlen(q, k, v, cu_q, cu_k, mask, 0.4, sinks)
    dout, dlse = _draw(*out.shape, seed=24), _draw(*lse.shape, seed=25)
    dlse = torch.where(torch.isfinite(lse), dlse, torch.zeros_like(dlse))
    inputs = [q, k, v] + ([sinks] if sink else [])
    want = torch.autograd.grad((out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0) * dlse).sum(), inputs)
    args = (q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), dout, cu_q, cu_k, max(lens_q), max(lens_k))
    got = emulate.backward_varlen(*args, mask, 0.4, None if sinks is None else sinks.detach().numpy(), dlse, 16, 32)
    for g, w in zip(got[:3], want[:3]):
        assert _err(g, w) < 1e-9 and np.abs(np.asarray(w)).max() > 1e-3
    assert float(got[0][-3:].abs().max()) == 0.0 and float(got[1][-3:].abs().max()) == 0.0  # rows of no sequence
    if sink:
        assert _err(got[3], want[3]) < 1e-9 and np.abs(got[3]).max() > 1e-3
    # one dense window over the padded buffers (the lengths forgotten) reads other sequences' padding: wrong
    one = torch.tensor([0, int(cu_q[-1])], dtype=torch.int32), torch.tensor([0, int(cu_k[-1])], dtype=torch.int32)
    wrong = emulate.backward_varlen(*args[:6], *one, int(cu_q[-1]), int(cu_k[-1]), mask, 0.4,
                                    None if sinks is None else sinks.detach().numpy(), dlse, 16, 32)
    assert max(_err(g, w) for g, w in zip(wrong[:3], want[:3])) > 1e-3


def test_varlen_backward_without_keys_needs_no_kernel():
    """Every key sequence empty (max_seqlen_k = 0): no kernel runs; dQ, dK, dV are zeros and d sink is the sum of
    dLSE over the rows of sequences (O = 0, LSE = sink there), as float64 autograd of the reference says."""
    from lab.masks import varlen_bwd
    cu_q, cu_k = torch.tensor([0, 3, 3, 7], dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    q, k = _draw(9, 2, 16, seed=41).requires_grad_(), _draw(2, 2, 16, seed=42).requires_grad_()
    sinks = _draw(2, seed=43).requires_grad_()
    out, lse = reference.attend_varlen(q, k, k, cu_q, cu_k, spec.Mask(), 0.3, sinks)
    dlse = torch.where(torch.isfinite(lse), _draw(*lse.shape, seed=44), 0.0)
    want = torch.autograd.grad((torch.where(torch.isfinite(lse), lse, 0) * dlse).sum(), sinks)[0]
    dq, dk, dv, ds = varlen_bwd.launch(torch.zeros_like(out), q.detach(), k.detach(), k.detach(), out.detach(),
                                       lse.detach(), dlse, cu_q, cu_k, sinks.detach(), True, 4, 0, -1, -1, 0.0, 0.3)
    assert float(dq.abs().max()) == float(dk.abs().max()) == float(dv.abs().max()) == 0.0
    assert _err(ds, want) < 1e-6 and float(want.abs().max()) > 1e-3  # d sinks is float32, as the kernel's

def test_pad_and_unpad_round_trip_without_host_lengths():
    """The copies into the padded buffers and back: each sequence's rows first, `fill` after; rows of no sequence
    come back as zeros; lengths past max_seqlen are clamped (unchecked cu_seqlens read nothing out of bounds)."""
    from lab.masks import varlen_bwd
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    x = torch.arange(9 * 2, dtype=torch.float64).view(9, 2, 1)
    dense = varlen_bwd.pad(x, cu, 4, fill=-1.0)
    assert dense.shape == (3, 2, 4, 1)
    assert dense[0, 0, :, 0].tolist() == [0, 2, 4, -1] and dense[1, 1, :, 0].tolist() == [-1] * 4
    assert dense[2, 1, :, 0].tolist() == [7, 9, 11, 13]
    back = varlen_bwd.unpad(dense, cu, 9)
    assert torch.equal(back[:7], x[:7]) and float(back[7:].abs().max()) == 0.0
    clipped = varlen_bwd.pad(x, torch.tensor([0, 9], dtype=torch.int32), 4)
    assert clipped[0, 0, :, 0].tolist() == [0, 2, 4, 6]
    assert varlen_bwd.unpad(clipped, torch.tensor([0, 9], dtype=torch.int32), 9)[4:].abs().max() == 0

# ------------------------------------------------------------------ the public calls' checks

F16, BF16 = torch.float16, torch.bfloat16


@pytest.fixture
def fake():
    with FakeTensorMode():
        yield lambda *shape, dtype=F16: torch.empty(*shape, dtype=dtype, device="cuda")


def test_masked_attention_checks(fake):
    q = fake(2, 4, 8, 64)
    sinks = torch.empty(4, dtype=torch.float32, device="cuda")
    out, lse = ops.attention(q, q, q, window_size=(3, 0), softcap=5.0, sinks=sinks, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 8)
    gqa = ops.attention(q, fake(2, 2, 9, 64), fake(2, 2, 9, 64), enable_gqa=True, window_size=(2, 2))
    assert gqa.shape == q.shape
    cases = [
        (lambda: ops.attention(q, q, q, window_size=(-2, 0)), ValueError, r"window_size entries must be >= -1"),
        (lambda: ops.attention(q, q, q, window_size=4), TypeError, r"window_size must be a pair of ints"),
        (lambda: ops.attention(q, q, q, window_size=(1.5, 0)), TypeError, r"window_size must be a pair"),
        (lambda: ops.attention(q, q, q, softcap=-1.0), ValueError, r"softcap must be >= 0"),
        (lambda: ops.attention(q, q, q, softcap=float("nan")), TypeError, r"softcap must be a finite float"),
        (lambda: ops.attention(q, q, q, sinks=fake(4, dtype=F16)), TypeError, r"sinks.dtype must be torch.float32"),
        (lambda: ops.attention(q, q, q, sinks=fake(3, dtype=torch.float32)), ValueError, r"sinks must have shape \(H_q,\) = \(4,\)"),
        (lambda: ops.attention(q, q, q, sinks=[0.0] * 4), TypeError, r"sinks must be a torch.Tensor"),
        (lambda: ops.attention(q, fake(2, 2, 8, 64), fake(2, 2, 8, 64), window_size=(1, 1)), ValueError,
         r"pass enable_gqa=True"),
        (lambda: ops.attention(q, q, q, window_size=(1, 1), version="v04"), ValueError, r"masked kernels \['v08', 'v09', 'v11', 'v12'\]"),
        (lambda: ops.attention(q, q, fake(2, 4, 8, 64, dtype=BF16), window_size=(1, 1)), TypeError, r"value.dtype"),
        (lambda: ops.attention(q, q, q, window_size=(1, 1), version="v09"), ValueError, r"runs on compute capability"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


def test_masked_backward_is_refused(fake):
    """Where no kernel computes these gradients (off Hopper, dense or packed) the op says so instead of running
    something slow."""
    q = fake(1, 2, 8, 64).requires_grad_()
    with pytest.raises(NotImplementedError, match=r"backward pass of window_size / softcap / sinks runs on compute"):
        ops.attention(q, q, q, window_size=(4, 0))
    sinks = torch.empty(2, dtype=torch.float32, device="cuda").requires_grad_()
    with pytest.raises(NotImplementedError, match=r"\(Hopper\) only"):
        ops.attention(fake(1, 2, 8, 64), fake(1, 2, 8, 64), fake(1, 2, 8, 64), sinks=sinks)
    packed, cu = fake(20, 2, 64).requires_grad_(), torch.empty(3, dtype=torch.int32, device="cuda")
    with pytest.raises(NotImplementedError, match=r"\(Hopper\) only"):
        ops.attention_varlen(packed, packed, packed, cu, cu, 10, 10)
    with torch.no_grad():  # without gradients the same calls run (here: their fake kernels)
        assert ops.attention(q, q, q, window_size=(4, 0)).shape == q.shape


def test_cpu_tensors_get_a_clear_error():
    q = torch.zeros(1, 2, 8, 64, dtype=F16)
    with pytest.raises(ValueError, match=r"query must be on a CUDA device, got cpu"):
        ops.attention(q, q, q, window_size=(4, 0))


def test_varlen_checks(fake):
    q, k = fake(20, 4, 64), fake(30, 2, 64)
    cu = torch.empty(3, dtype=torch.int32, device="cuda")
    out, lse = ops.attention_varlen(q, k, k, cu, cu, 12, 20, is_causal=True, window_size=(4, 0), return_lse=True)
    assert out.shape == q.shape and lse.shape == (4, 20)
    cases = [
        (lambda: ops.attention_varlen(q, k, k, fake(3, dtype=torch.int64), cu, 12, 20), TypeError, r"cu_seqlens_q.dtype must be torch.int32"),
        (lambda: ops.attention_varlen(q, k, k, cu, fake(2, dtype=torch.int32), 12, 20), ValueError, r"cu_seqlens_k has 2 entries"),
        (lambda: ops.attention_varlen(q, k, k, cu, torch.zeros(3, dtype=torch.int32), 12, 20), ValueError,
         r"cu_seqlens_k is on cpu"),
        (lambda: ops.attention_varlen(q, k, k, fake(3, 1, dtype=torch.int32), cu, 12, 20), ValueError, r"cu_seqlens_q must be 1-D"),
        (lambda: ops.attention_varlen(fake(1, 20, 4, 64), k, k, cu, cu, 12, 20), ValueError, r"query must be 3-D"),
        (lambda: ops.attention_varlen(q, k, k, cu, cu, 12.0, 20), TypeError, r"max_seqlen_q must be a non-negative"),
        (lambda: ops.attention_varlen(fake(20, 3, 64), k, k, cu, cu, 12, 20), ValueError, r"multiple of key heads"),
        (lambda: ops.attention_varlen(q, k, k, cu, cu, 12, 20, window_size=(-3, 0)), ValueError, r"window_size"),
        (lambda: ops.attention_varlen(fake(20, 4, 96), fake(30, 2, 96), fake(30, 2, 96), cu, cu, 12, 20),
         NotImplementedError, r"head dim 96 has no kernel"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize("values,message", [([1, 3, 5], r"\[0\] must be 0"), ([0, 5, 3], r"non-decreasing"),
                                            ([0, 5, 40], r"exceeds the 30 packed rows"),
                                            ([0, 25, 30], r"25 rows exceeds max_seqlen \(20\)")])
def test_cu_seqlens_values(values, message):
    cu = torch.tensor(values, dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        mask_op._check_cu(cu, "cu_seqlens_q", 30, cu.device, None, True, 20)


def test_params_layout_matches_the_c_struct():
    """lab.masks.op packs AttnMaskParams with struct.pack; ctypes lays the same fields out by C's alignment rules."""
    import ctypes
    i64x3 = ctypes.c_int64 * 3

    class Fwd(ctypes.Structure):
        _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "o", "lse")] + \
                   [(n, i64x3) for n in ("qs", "ks", "vs", "os")] + \
                   [(n, ctypes.c_int) for n in ("b", "hq", "hkv", "sq", "sk", "d")] + \
                   [("scale", ctypes.c_float), ("causal", ctypes.c_int), ("dtype", ctypes.c_int), ("debug", ctypes.c_void_p)]

    class Masked(ctypes.Structure):
        _fields_ = [("base", Fwd), ("left", ctypes.c_int), ("right", ctypes.c_int), ("off", ctypes.c_int),
                    ("softcap", ctypes.c_float), ("sinks", ctypes.c_void_p), ("cuq", ctypes.c_void_p),
                    ("cuk", ctypes.c_void_p), ("tq", ctypes.c_int), ("tk", ctypes.c_int),
                    ("table", ctypes.c_void_p), ("errors", ctypes.c_void_p), ("table_stride", ctypes.c_int64),
                    ("pages", ctypes.c_int), ("page_size", ctypes.c_int), ("max_pages", ctypes.c_int)]

    values = list(range(1, 6)) + list(range(10, 22)) + list(range(30, 36)) + [0.5, 40, 1] + [7, -1, 3, 2.5, 50, 51, 52, 60, 61] + \
        [70, 71, 72, 73, 74, 75]
    m = Masked()
    b = m.base
    b.q, b.k, b.v, b.o, b.lse = values[:5]
    b.qs, b.ks, b.vs, b.os = (i64x3(*values[5 + 3 * i:8 + 3 * i]) for i in range(4))
    b.b, b.hq, b.hkv, b.sq, b.sk, b.d = values[17:23]
    b.scale, b.causal, b.dtype, b.debug = values[23], values[24], values[25], 0
    m.left, m.right, m.off, m.softcap, m.sinks, m.cuq, m.cuk, m.tq, m.tk = values[26:35]
    m.table, m.errors, m.table_stride, m.pages, m.page_size, m.max_pages = values[35:]
    packed = mask_op.PARAMS.pack(*values[:26], 0, *values[26:])
    assert ctypes.sizeof(Masked) == mask_op.PARAMS.size and bytes(m) == packed


def test_backward_params_layout():
    """lab.masks.backward packs MaskBwdParams as ctypes lays the same fields out (the C side asserts 336 / 400)."""
    import ctypes as C

    from lab.masks import backward

    class Bwd(C.Structure):
        _fields_ = ([(n, C.c_void_p) for n in "q k v o dout lse dlse dq dk dv delta lse_log2 dq_accum".split()] +
                    [(f"s{i}", C.c_int64) for i in range(24)] + [(n, C.c_int) for n in "b hq hkv sq sk d".split()] +
                    [("scale", C.c_float)] + [(n, C.c_int) for n in "causal dtype det".split()])

    class MaskBwd(C.Structure):
        _fields_ = [("base", Bwd), ("left", C.c_int), ("right", C.c_int), ("off", C.c_int), ("cap", C.c_float),
                    ("sinks", C.c_void_p), ("dsinks", C.c_void_p), ("seqlens", C.c_void_p), ("cuq", C.c_void_p),
                    ("cuk", C.c_void_p), ("tq", C.c_int), ("tk", C.c_int)]
    assert C.sizeof(Bwd) == 336 and C.sizeof(MaskBwd) == backward.PARAMS.size == 400
    assert MaskBwd.left.offset == 336 and MaskBwd.sinks.offset == 352 and MaskBwd.cuq.offset == 376
    values = list(range(1, 14)) + list(range(20, 44)) + [2, 4, 2, 65, 70, 64, 0.5, 1, 1, 0, 7, -1, 3, 2.5, 80, 81, 0,
                                                          90, 91, 100, 101]
    m = MaskBwd(Bwd(*values[:13], *values[13:37], *values[37:47]), *values[47:])
    assert bytes(m) == backward.PARAMS.pack(*values)


@pytest.mark.parametrize("path", ["eager", "custom_op"])
def test_backward_autograd_plumbing(monkeypatch, path):
    """The autograd wiring of the masked op (the eager Function and the custom op's registered autograd) on the
    CPU, with the kernels replaced by the float64 reference (forward) and the key-major emulation (backward):
    every gradient reaches its input, d sinks only when sinks.requires_grad, a gradient into LSE included."""
    from lab.masks import backward, op as mop

    def fwd(q, k, v, sinks, left, right, offset, softcap, scale, version, want_lse=True):
        out, lse = reference.attend(q, k, v, spec.Mask(left, right, softcap), scale, offset, sinks)
        return out.to(q.dtype), lse

    def bwd(grad_out, q, k, v, out, lse, grad_lse, sinks, want_dsinks, left, right, offset, softcap, scale):
        got = emulate.backward_by_keys(*(t.detach().numpy() for t in (q, k, v, out, lse, grad_out)),
                                       spec.Mask(left, right, softcap), scale, offset,
                                       None if sinks is None else sinks.detach().numpy(),
                                       None if grad_lse is None else grad_lse.numpy(), 16, 32)
        ds = torch.from_numpy(got[3]) if want_dsinks else torch.zeros(0, dtype=torch.float64)
        return tuple(torch.from_numpy(g) for g in got[:3]) + (ds,)
    monkeypatch.setattr(mop, "_masked_impl", fwd)
    monkeypatch.setattr(backward, "launch_backward", bwd)
    mask = spec.make_mask(True, (7, 0), 4.0)
    for sink_grad in (True, False):
        q, k, v = (_draw(*s, seed=i).requires_grad_() for i, s in enumerate([(1, 4, 33, 16), (1, 2, 33, 16), (1, 2, 33, 16)]))
        sinks = _draw(4, seed=5).requires_grad_(sink_grad)
        args = (q, k, v, sinks, mask.left, mask.right, 0, mask.softcap, 0.3, "v09")
        out, lse = (backward.EagerMasked.apply(*args, fwd) if path == "eager" else mop._masked_op(*args))
        dout, dlse = _draw(*out.shape, seed=7), _draw(*lse.shape, seed=8)
        inputs = [q, k, v] + ([sinks] if sink_grad else [])
        got = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), inputs)
        r_out, r_lse = reference.attend(q, k, v, mask, 0.3, 0, sinks)
        want = torch.autograd.grad((r_out * dout).sum() + (r_lse * dlse).sum(), inputs)
        assert len(got) == len(want) and all(_err(g, w) < 1e-9 for g, w in zip(got, want))


def test_varlen_fills_only_the_rows_of_no_sequence(monkeypatch):
    """The packed forward's allocation: the kernel writes every row of every sequence, so the op fills only the rows
    past cu_seqlens_q[-1] (zeros, LSE -inf), and only when the host checked cu_seqlens; never a pass over the whole
    output. The kernel is replaced by one that writes its sequences' rows (CPU); aten ops before it are logged."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen, launched = [], []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not launched:
                seen.append((func.__name__, tuple(args[0].shape) if args and isinstance(args[0], torch.Tensor) else ()))
            return func(*args, **(kwargs or {}))

    def kernel(q, k, v, out, lse, mask, scale, offset, sinks, cu_q, cu_k, max_q, max_k, version):
        launched.append(True)
        for a, b in zip(cu_q.tolist(), cu_q.tolist()[1:]):
            out[a:b] = 1.0
            lse[:, a:b] = 0.5
    monkeypatch.setattr(mask_op, "launch", kernel)
    q = _draw(12, 2, 16, seed=3)
    cu = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    assert mask_op._check_cu(cu, "cu_seqlens_q", 12, q.device, None, True, 5) == [0, 3, 3, 8]
    assert mask_op._check_cu(cu, "cu_seqlens_q", 12, q.device, None, False, 5) is None
    for rows_q in (8, 12, None):
        seen.clear(), launched.clear()
        with Log():
            out, lse = mask_op._varlen_impl(q, q, q, cu, cu, None, 5, 5, -1, -1, 0.0, 0.3, "v09", rows_q=rows_q)
        fills = [shape for name, shape in seen if name.startswith(("zero_", "fill_", "zeros", "full"))]
        assert bool((out[:8] == 1).all()) and bool((lse[:, :8] == 0.5).all())
        if rows_q == 8:  # the 4 rows of no sequence, O and LSE, and nothing else
            assert fills == [(4, 2, 16), (2, 4)]
            assert float(out[8:].abs().max()) == 0.0 and bool(torch.isneginf(lse[:, 8:]).all())
        else:
            assert fills == []


@pytest.mark.parametrize("path", ["eager", "custom_op"])
def test_varlen_backward_autograd_plumbing(monkeypatch, path):
    """lab::attention_varlen's autograd (the eager Function and the custom op's registered autograd) on the CPU,
    the kernels replaced by the packed float64 reference (forward) and emulate.backward_varlen (backward)."""
    from lab.masks import op as mop, varlen_bwd

    def fwd(q, k, v, cu_q, cu_k, sinks, max_q, max_k, left, right, softcap, scale, version, want_lse=True):
        out, lse = reference.attend_varlen(q, k, v, cu_q, cu_k, spec.Mask(left, right, softcap), scale, sinks)
        return out.to(q.dtype), lse

    def bwd(grad_out, q, k, v, out, lse, grad_lse, cu_q, cu_k, sinks, want_dsinks, max_q, max_k, left, right,
            softcap, scale):
        got = emulate.backward_varlen(q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), grad_out, cu_q,
                                      cu_k, max_q, max_k, spec.Mask(left, right, softcap), scale,
                                      None if sinks is None else sinks.detach().numpy(), grad_lse, 16, 32)
        ds = torch.from_numpy(got[3]) if want_dsinks else torch.zeros(0, dtype=torch.float64)
        return got[:3] + (ds,)
    monkeypatch.setattr(mop, "_varlen_impl", fwd)
    monkeypatch.setattr(varlen_bwd, "launch", bwd)
    mask = spec.make_mask(True, (7, 0), 4.0)
    lens_q, lens_k = [9, 0, 30, 4], [12, 5, 30, 0]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 4, 2, 16, seed=31)
    for sink_grad in (True, False):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        sinks = _draw(4, seed=5).requires_grad_(sink_grad)
        args = (q, k, v, cu_q, cu_k, sinks, 30, 30, mask.left, mask.right, mask.softcap, 0.3, "v09")
        out, lse = varlen_bwd.EagerVarlen.apply(*args, fwd) if path == "eager" else mop._varlen_op(*args)
        dout, dlse = _draw(*out.shape, seed=7), _draw(*lse.shape, seed=8)
        used = torch.where(torch.isfinite(lse), lse, 0)
        inputs = [q, k, v] + ([sinks] if sink_grad else [])
        got = torch.autograd.grad((out * dout).sum() + (used * dlse).sum(), inputs)
        r_out, r_lse = reference.attend_varlen(q, k, v, cu_q, cu_k, mask, 0.3, sinks)
        r_used = torch.where(torch.isfinite(r_lse), r_lse, 0)
        want = torch.autograd.grad((r_out * dout).sum() + (r_used * dlse).sum(), inputs)
        assert len(got) == len(want) and all(_err(g, w) < 1e-9 for g, w in zip(got, want))

def test_the_kernels_read_a_copy_only_where_their_preconditions_fail():
    from lab.op_common import _readable

    dense = torch.zeros(2, 4, 8, 16)
    assert _readable(dense) is dense
    assert _readable(dense[..., :8]) is not None and _readable(dense[..., :8]).data_ptr() == dense.data_ptr()  # rows 16 apart
    odd_rows = torch.zeros(2, 4, 8, 17)[..., :16]  # rows 17 elements apart
    for view in (odd_rows, dense.transpose(2, 3), dense.view(-1)[1:1 + 2 * 4 * 8 * 8].view(2, 4, 8, 8)):
        fixed = _readable(view)
        assert fixed is not view and fixed.is_contiguous() and torch.equal(fixed, view)
