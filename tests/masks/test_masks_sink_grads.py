"""lab.masks.gpu_bwd's gradient yardsticks on the CPU: the flash formulation's own error (Delta from a 16-bit O) and
the eager one beside SDPA's, with the kernel's output faked: a 16-bit emulation of the flash backward (fp32 math,
P and dS rounded to the dtype before their GEMMs, O from a forward that rounds P) must pass on the shapes that
failed an outside probe (S_q 300 / S_k 1000 bottom-right with a sink, rows that see one key); the same emulation
with a wrong d sinks or dq, and with the two deliberately wrong builds' bugs, must fail."""
from __future__ import annotations

import pytest
import torch

from lab import check
from lab.masks import emulate, gpu_bwd, grad_yardstick, reference, spec


def _problem(B, Hq, Hkv, Sq, Sk, D, causal, window, cap, lower_right, sink=True, magnitude=1.0, seed=0,
             dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, Hq, Sq, D, generator=g) * magnitude).to(dtype)
    k = (torch.randn(B, Hkv, Sk, D, generator=g) * magnitude).to(dtype)
    v, dout = torch.randn(B, Hkv, Sk, D, generator=g).to(dtype), torch.randn(B, Hq, Sq, D, generator=g).to(dtype)
    sinks = torch.randn(Hq, generator=g) * 2 if sink else None
    mask, offset, scale = spec.make_mask(causal, window, cap), Sk - Sq if lower_right else 0, D ** -0.5
    _, lse = reference.attend(q, k, v, mask, scale, offset, sinks)
    dlse = torch.where(torch.isfinite(lse), torch.randn(B, Hq, Sq, generator=g), 0.0)
    return q, k, v, dout, dlse, sinks, mask, scale, offset


def _kernel_like(q, k, v, dout, dlse, sinks, mask, scale, offset, seen=None, softcap_grad=True, sink_in_lse=True,
                 dsinks_dlse=True):
    """The flash backward as a 16-bit kernel computes it; the keyword arguments plant the bugs."""
    dt, group = q.dtype, q.shape[1] // k.shape[1]
    kr, vr = (t.float().repeat_interleave(group, 1) for t in (k, v))
    s, dcap = scale * (q.float() @ kr.transpose(-1, -2)), 1.0
    if mask.softcap > 0:
        t = torch.tanh(s / mask.softcap)
        s, dcap = mask.softcap * t, (1 - t * t) if softcap_grad else 1.0
    truth = spec.visible(torch.arange(q.shape[2]), torch.arange(k.shape[2]), k.shape[2], offset, mask)
    cols = [s.masked_fill(~truth, float("-inf"))]
    if sinks is not None:
        sink_col = sinks.float().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        cols.append(sink_col)
    lse = torch.logsumexp(torch.cat(cols, -1), -1)  # the forward's, the sink included
    safe = torch.where(torch.isfinite(lse), lse, 0.0)
    p_fwd = torch.where(truth, torch.exp(s - safe[..., None]), 0.0)
    out = (p_fwd.to(dt).float() @ vr).to(dt)
    lse_bwd = torch.logsumexp(cols[0], -1) if sinks is not None and not sink_in_lse else safe
    lse_bwd = torch.where(torch.isfinite(lse_bwd), lse_bwd, 0.0)
    p = torch.where(truth if seen is None else seen, torch.exp(s - lse_bwd[..., None]), 0.0)
    delta = (dout.float() * out.float()).sum(-1) - dlse
    ds = (p * (dout.float() @ vr.transpose(-1, -2) - delta[..., None]) * dcap).to(dt).float()

    def per_kv(t):
        return t.view(t.shape[0], k.shape[1], group, *t.shape[2:]).sum(2).to(dt)
    got = [(scale * ds @ kr).to(dt), per_kv(scale * ds.transpose(-1, -2) @ q.float()),
           per_kv(p.to(dt).float().transpose(-1, -2) @ dout.float())]
    if sinks is not None:
        d = delta + (0.0 if dsinks_dlse else dlse)
        got.append(-(torch.exp(sinks.float()[None, :, None] - safe) * d).sum((0, 2)))
    return got


def _tile_seen(mask, Sq, Sk, offset, block=64):
    """LAB_BWD_MASK_BUG_NO_WINDOW's pairs: on a tile that some row sees, every pair in it."""
    truth = spec.visible(torch.arange(Sq), torch.arange(Sk), Sk, offset, mask)
    tiles = torch.nn.functional.max_pool2d(truth[None].float(), block, block, ceil_mode=True)[0] > 0
    return tiles.repeat_interleave(block, 0).repeat_interleave(block, 1)[:Sq, :Sk]


# (B, H_q, H_kv, S_q, S_k, D, causal, window, softcap, lower_right): lab.masks.gpu.GRID_BWD_SINKS's kinds, smaller
SINK_SHAPES = [(1, 4, 2, 300, 1000, 128, True, None, 0.0, True),
               (1, 4, 2, 300, 1000, 64, True, (256, 0), 0.0, True),
               (2, 4, 2, 150, 500, 128, True, (0, 0), 0.0, True),
               (1, 4, 1, 257, 257, 64, False, (0, 0), 30.0, False),
               (1, 4, 2, 300, 1000, 128, False, (0, -1), 0.0, True),
               (1, 4, 2, 500, 150, 64, True, (1, 0), 0.0, True)]


@pytest.mark.parametrize("shape,magnitude", [(SINK_SHAPES[0], 2.0)] + [(s, 1.0 + i % 2)
                                                                        for i, s in enumerate(SINK_SHAPES)])
def test_a_16_bit_flash_backward_passes_and_records_both_yardsticks(shape, magnitude):
    problem = _problem(*shape, magnitude=magnitude)
    metrics = gpu_bwd.judge(_kernel_like(*problem), *problem)
    assert set(metrics) == {"dq", "dk", "dv", "dsinks"}
    for label, m in metrics.items():
        assert m["passed"], (label, m["max_abs"], m["tol_max_abs"])
        assert m["tol_max_abs"] == pytest.approx(
            check.MULTIPLIER * max(m["sdpa_max_abs"], m["flash_max_abs"]) + check.ABS_FLOOR)
        assert m["eager_max_abs"] > 0
    # Delta's 16-bit O is an error of its own in dq, dk and d sinks; dv does not read Delta
    assert min(metrics[g]["flash_max_abs"] for g in ("dq", "dk")) > 1e-5 and metrics["dsinks"]["flash_max_abs"] > 0
    assert metrics["dv"]["flash_max_abs"] < 1e-9


def test_the_float64_reference_rounded_to_bf16_passes():
    problem = _problem(1, 4, 2, 300, 1000, 128, True, None, 0.0, True)
    q, k, v, dout, dlse, sinks, mask, scale, offset = problem
    ref_in = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = reference.attend(*ref_in[:3], mask, scale, offset, ref_in[3])
    want = torch.autograd.grad((out * dout.double()).sum() + (lse * dlse.double()).sum(), ref_in)
    metrics = gpu_bwd.judge([w.to(torch.bfloat16) for w in want[:3]] + [want[3].float()], *problem)
    assert all(m["passed"] for m in metrics.values())


def test_the_flash_formulation_is_exact_without_the_16_bit_output():
    """In float64 (O not rounded) the flash equations are autograd's: the yardstick's error is the 16-bit O's."""
    q, k, v, dout, dlse, sinks, mask, scale, offset = _problem(1, 4, 2, 40, 90, 32, False, (0, 3), 7.0, True,
                                                               dtype=torch.float64)
    ref_in = [t.double().requires_grad_() for t in (q, k, v, sinks)]
    out, lse = reference.attend(*ref_in[:3], mask, scale, offset, ref_in[3])
    want = torch.autograd.grad((out * dout).sum() + (lse * dlse).sum(), ref_in)
    flash = grad_yardstick.flash_grads(q, k, v, dout, dlse, sinks, mask, scale, offset, out.detach(), lse.detach())
    assert max(float((f - w).abs().max()) for f, w in zip(flash, want)) < 1e-9


@pytest.mark.parametrize("shape", [(1, 4, 2, 70, 130, 32, True, None, 0.0, True, True),
                                   (2, 6, 3, 65, 63, 64, False, (5, 2), 15.0, False, True),
                                   (1, 2, 1, 90, 40, 32, True, (0, 0), 0.0, True, True),
                                   (1, 4, 4, 33, 97, 48, False, None, 0.0, False, False)])
def test_the_whole_matrix_yardstick_is_the_tiled_emulation(shape):
    """flash_grads computes the flash equations on whole score matrices (fast on the GPU's float64); the tiled
    emulation (lab.masks.emulate.backward, 16 x 16 tiles here) is their statement. In float64 the two agree to
    rounding, with GQA, windows, softcap, bottom-right offsets, sinks and dLSE, and with rows that see no key."""
    q, k, v, dout, dlse, sinks, mask, scale, offset = _problem(*shape)
    ref_in = [t.double() for t in (q, k, v)]
    out, lse = reference.attend(*ref_in, mask, scale, offset, None if sinks is None else sinks.double())
    fast = grad_yardstick.flash_grads(q, k, v, dout, dlse, sinks, mask, scale, offset, out, lse)

    def host(t):
        return None if t is None else t.detach().double().numpy()
    tiled = emulate.backward(*map(host, (q, k, v, out.to(q.dtype), lse, dout)), mask, scale, offset, host(sinks),
                             host(dlse), block_m=16, block_n=16)
    assert len(fast) == 3 + (sinks is not None)
    for f, t in zip(fast, tiled):
        t = torch.from_numpy(t)
        assert f.shape == t.shape and float(t.abs().max()) > 0
        assert float((f - t).abs().max()) <= 1e-12 * max(1.0, float(t.abs().max()))
    # a wrong Delta (dO . O from the exact O, not the rounded one) is seen
    wrong = emulate.backward(*map(host, (q, k, v, out, lse, dout)), mask, scale, offset, host(sinks), host(dlse))
    assert float((fast[0] - torch.from_numpy(wrong[0])).abs().max()) > 1e-6


@pytest.mark.parametrize("shape,bug,caught", [(SINK_SHAPES[0], dict(dsinks_dlse=False), "dsinks"),
                                              (SINK_SHAPES[2], dict(dsinks_dlse=False), "dsinks"),
                                              (SINK_SHAPES[2], dict(sink_in_lse=False), "dq"),
                                              (SINK_SHAPES[5], dict(sink_in_lse=False), "dq")])
def test_a_wrong_sink_gradient_fails(shape, bug, caught):
    """d sinks without the dLSE term, and dq from P normalised without the sink (on rows of one or two keys, where
    the sink holds a real share; beside a thousand keys its share is below bf16's resolution), are caught."""
    problem = _problem(*shape)
    metrics = gpu_bwd.judge(_kernel_like(*problem, **bug), *problem)
    assert not metrics[caught]["passed"], (metrics[caught]["max_abs"], metrics[caught]["tol_max_abs"])


def test_a_perturbed_sink_gradient_fails():
    """A d sinks off by a tenth of its size (one head) fails; the tolerance is far below that."""
    problem = _problem(*SINK_SHAPES[2])
    got = _kernel_like(*problem)
    m = gpu_bwd.judge(got, *problem)["dsinks"]
    assert m["passed"]
    got[3] = got[3].clone()
    got[3][1] += 0.1 * float(got[3].abs().max()) + 4 * m["tol_max_abs"]
    assert not gpu_bwd.judge(got, *problem)["dsinks"]["passed"]


@pytest.mark.parametrize("name,window,cap", [("no-softcap-grad", (256, 0), 10.0), ("no-window", (64, 0), 0.0)])
def test_the_wrong_builds_still_fail(name, window, cap):
    """lab.masks.gpu_bwd.checks()'s expect_fail cases, same shapes: their bugs, planted in the 16-bit emulation."""
    problem = _problem(1, 4, 2, 1025, 1025, 128, True, window, cap, False, sink=False, magnitude=2.0)
    mask, offset = problem[6], problem[8]
    bug = dict(softcap_grad=False) if name == "no-softcap-grad" else dict(seen=_tile_seen(mask, 1025, 1025, offset))
    metrics = gpu_bwd.judge(_kernel_like(*problem, **bug), *problem)
    assert not metrics["dq"]["passed"] and not metrics["dk"]["passed"]


def test_the_chapter_table_shows_both_yardsticks_beside_ours():
    problem = _problem(*SINK_SHAPES[2])
    metrics = gpu_bwd.judge(_kernel_like(*problem), *problem)
    case = dict(name="sink-lr-w0", Sq=150, Sk=500, D=128, window=[0, 0])
    old = {"case": dict(case, name="sink-lr"), "check": {"dq": {"max_abs": 1.0, "tol_max_abs": 2.0, "passed": True}}}
    packed = {"case": dict(case, packed=True), "check": metrics}
    table = gpu_bwd.table([{"case": case, "check": {g: {k: m[k] for k in grad_yardstick._FIELDS} for g, m in metrics.items()}},
                           old, packed])
    assert [line[4] for line in table.rows] == ["dq", "dk", "dsinks"]
    assert table.rows[0][5:10] == [metrics["dq"][k] for k in ("max_abs", "sdpa_max_abs", "flash_max_abs",
                                                              "eager_max_abs", "tol_max_abs")]
    assert "flash formulation" in table.markdown()
    assert gpu_bwd.table([old]) is None


def test_the_grid_holds_the_probe_shapes():
    """GRID_BWD_SINKS keeps S_q 300 over S_k 1000 bottom-right causal with and without a window, rows that see one
    key (every row; the first of S_q > S_k bottom-right), and GQA; checks() runs each at D 128 and 64."""
    from lab.masks.gpu import GRID_BWD_SINKS, GRID_MASKS
    assert len({c[0] for c in GRID_BWD_SINKS}) == len(GRID_BWD_SINKS)
    kinds = set()
    for name, B, Hq, Hkv, Sq, Sk, causal, window, cap, lower_right in GRID_BWD_SINKS:
        mask = spec.make_mask(causal, window, cap)
        keys = spec.visible(torch.arange(Sq), torch.arange(Sk), Sk, Sk - Sq if lower_right else 0, mask).sum(-1)
        if (Sq, Sk, causal, lower_right) == (300, 1000, True, True):
            kinds.add(("probe", mask.left >= 0))
        kinds |= {"one key, every row" if bool((keys == 1).all()) else None,
                  "one key" if bool((keys == 1).any()) else None, "gqa" if Hq > Hkv else None}
    assert {("probe", False), ("probe", True), "one key, every row", "one key", "gqa"} <= kinds
    assert any(w == (0, 0) and sink for _, _, w, _, sink in GRID_MASKS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_rounding_spread_of_d_sinks_matches_rounding_many_outputs(dtype):
    """grad_yardstick.rounding_var: the standard deviation it gives for d sinks' rounding share (sum over rows of
    p_sink dO . (round(O) - O)) matches the spread over 400 different O rounded to the dtype, within 15 %."""
    g = torch.Generator().manual_seed(3)
    rows, D = 200, 64
    p = torch.rand(rows, generator=g, dtype=torch.float64) * 0.2
    dout = torch.randn(rows, D, generator=g).to(dtype)
    shares, sigmas = [], []
    for _ in range(400):
        out = torch.randn(rows, D, generator=g, dtype=torch.float64) * 0.3
        shares.append(float((p[:, None] * dout.double() * (out.to(dtype).double() - out)).sum()))
        sigmas.append(float((p ** 2 * grad_yardstick.rounding_var(out, dout, dtype).sum(-1)).sum().sqrt()))
    spread = torch.tensor(shares).std().item()
    assert spread == pytest.approx(sum(sigmas) / len(sigmas), rel=0.15)
