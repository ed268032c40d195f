"""lab.ops.attention_varlen's dense route (lab.masks.dense_route) and D_v != D_qk packed calls on the GPU.

checks_route(): packed calls of one length through the public op (checked, so the route is taken: each check
asserts it was) against the float64 packed reference, the yardstick SDPA's error on each sequence as its own dense
call (lab.masks.gpu.sdpa_error); the gradients through the route by lab.masks.gpu_varlen.check_varlen_bwd (the
dense backward on the route's views, dense_route.dense_backward); and the route forced onto lengths that are not one
(a last sequence one key short), which must fail. checks_dv(): D_v != D_qk forward and gradients against float64
autograd of the reference, the yardstick SDPA's error on the same sequences (SDPA takes D_v != D_qk). race_dv(): what
the padding costs, against the same call at D_v = D_qk.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import bench, check, ops
from . import dense_route, reference, spec
from .gpu import GEN, draw, sdpa_error
from .gpu_varlen import check_varlen_bwd


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")


def check_route(name, n, sq, sk, Hq, Hkv, D, dtype, causal, stray=0, wrong=False, host=False) -> bool:
    """One forward check; wrong: the route forced with the last sequence one key short (must fail); host: the
    public call given cu_seqlens on the CPU."""
    mask = spec.make_mask(causal, None, 0.0)
    GEN.manual_seed(hash(("route", name, D)) % 2**31)
    q, k, v = draw(n * sq + stray, Hq, D, dtype=dtype), draw(n * sk + stray, Hkv, D, dtype=dtype), \
        draw(n * sk + stray, Hkv, D, dtype=dtype)
    lens_k = [sk] * (n - 1) + [sk - 1] if wrong else [sk] * n
    cu_q, cu_k = _cu([sq] * n), _cu(lens_k)
    scale = D ** -0.5
    before = dense_route.taken[0]
    if host:  # cu_seqlens on the CPU: read with no sync, copied over by the op
        cu_q, cu_k = cu_q.cpu(), cu_k.cpu()
    if wrong:
        out, lse = dense_route.dense_impl(q, k, v, cu_q, cu_k, None, sq, sk, mask.left, mask.right, 0.0, scale, None,
                                          rows_q=n * sq, shape=(n, sq, sk))
    else:
        out, lse = ops.attention_varlen(q, k, v, cu_q, cu_k, sq, sk, is_causal=causal, scale=scale, return_lse=True)
    took = dense_route.taken[0] == before + 1
    ref, ref_lse = reference.attend_varlen(q, k, v, cu_q.tolist(), cu_k.tolist(), mask, scale)
    err = torch.zeros_like(ref)
    for b in range(n):
        rq, rk = slice(b * sq, (b + 1) * sq), slice(int(cu_k[b]), int(cu_k[b + 1]))
        err[rq] = sdpa_error(*(t[r].transpose(0, 1)[None] for t, r in ((q, rq), (k, rk), (v, rk))), mask, scale,
                             rk.stop - rk.start - sq)[0].transpose(0, 1)
    metrics = check.compare(out, ref, ref + err)
    finite = torch.isfinite(ref_lse)
    lse_err = float((lse.double() - ref_lse)[finite].abs().max()) if finite.any() else 0.0
    passed = metrics["passed"] and lse_err < 1e-2 and bool(torch.equal(torch.isfinite(lse), finite))
    ok = took and passed != wrong
    print(("ok  " if ok else "BAD ") + f"route {name} n {n} S_q {sq} S_k {sk} H {Hq}/{Hkv} D {D} {dtype} causal "
          f"{causal} stray {stray}{' (forced on uneven keys: must fail)' if wrong else ''}: took the route {took}, "
          f"max_abs {metrics['max_abs']:.3g} tol {metrics['tol_max_abs']:.3g} lse {lse_err:.3g} passed={passed}",
          flush=True)
    return ok


def checks_route() -> int:
    bf16, fp16 = torch.bfloat16, torch.float16
    bad = 0
    for args in (("causal-gqa", 4, 1024, 1024, 8, 2, 128, bf16, True, 5), ("cross", 3, 100, 300, 4, 4, 64, fp16, False, 0),
                 ("odd", 2, 65, 65, 4, 1, 128, fp16, True, 3), ("one", 1, 1, 1, 4, 2, 64, bf16, True, 0),
                 ("wide", 2, 300, 300, 4, 2, 256, bf16, True, 0), ("wide192", 3, 129, 129, 4, 2, 192, bf16, False, 2)):
        bad += not check_route(*args)
    bad += not check_route("host", 4, 512, 512, 8, 2, 128, bf16, True, 5, host=True)
    bad += not check_route("wrong", 3, 200, 200, 4, 2, 128, bf16, True, wrong=True)
    bad += not check_route("wrong-cross", 3, 100, 8, 4, 4, 64, fp16, False, wrong=True)  # one of 8 keys missing
    for name, lens, Hkv, D, dtype in (("route-bwd", [512] * 4, 2, 128, bf16), ("route-bwd-mqa", [300] * 3, 1, 64, fp16)):
        before = dense_route.taken[0]
        ok = check_varlen_bwd(name, lens, lens, 4, Hkv, D, dtype, True, None, 0.0, False, trials=1)
        took = dense_route.taken[0] > before
        print(f"  {name}: took the route {took}", flush=True)
        bad += not (ok and took)
    bad += not check_host_cu()
    print(f"checks route done: {bad} bad", flush=True)
    return bad


def check_host_cu() -> bool:
    """cu_seqlens on the host against the same call with them on the device: the same kernels, so the same bits in
    O and LSE; the gradients within 1 % of their largest (dQ is added by atomics in no fixed order)."""
    bf16 = torch.bfloat16
    cu = _cu([512] * 4)
    q, k, v = (draw(2048 + 3, 8, 128, dtype=bf16).requires_grad_() for _ in range(3))
    dout = draw(2048 + 3, 8, 128, dtype=bf16)
    runs = []
    for c in (cu, cu.cpu()):
        o, lse = ops.attention_varlen(q, k, v, c, c, 512, 512, is_causal=True, return_lse=True)
        runs.append((o, lse) + torch.autograd.grad(o, (q, k, v), dout))
    same = all(torch.equal(a, b) for a, b in zip(runs[0][:2], runs[1][:2])) and all(
        float((a.float() - b.float()).abs().max()) <= 0.01 * float(a.float().abs().max())
        for a, b in zip(runs[0][2:], runs[1][2:]))
    print(("ok  " if same else "BAD ") + "route host cu_seqlens: out, lse equal to those with device cu_seqlens, "
          f"dq, dk, dv within 1 %: {same}", flush=True)
    return same


def check_dv(name, lens_q, lens_k, Hq, Hkv, d_qk, d_v, dtype, causal, window=None) -> bool:
    """D_v != D_qk: forward and gradients of the public op (packed kernel) against float64 autograd of the packed
    reference; the yardstick SDPA's forward and gradient errors on each sequence (bottom-right as an explicit mask)."""
    mask = spec.make_mask(causal, window, 0.0)
    cu_q, cu_k = _cu(lens_q), _cu(lens_k)
    GEN.manual_seed(hash(("dv", name)) % 2**31)
    q, k = draw(sum(lens_q), Hq, d_qk, dtype=dtype).requires_grad_(), draw(sum(lens_k), Hkv, d_qk, dtype=dtype).requires_grad_()
    v, dout = draw(sum(lens_k), Hkv, d_v, dtype=dtype).requires_grad_(), draw(sum(lens_q), Hq, d_v, dtype=dtype)
    scale = d_qk ** -0.5
    out = ops.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), is_causal=causal, window_size=window,
                               scale=scale)
    got = (out,) + torch.autograd.grad(out, (q, k, v), dout)
    ins = [t.detach().double().requires_grad_() for t in (q, k, v)]
    r_out, _ = reference.attend_varlen(*ins, cu_q.tolist(), cu_k.tolist(), mask, scale)
    want = (r_out.detach(),) + torch.autograd.grad(r_out, ins, dout.double())
    errs = [torch.zeros_like(w) for w in want]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(lens_q)):
        rq, rk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        if not (lens_q[b] and lens_k[b]):
            continue
        sl = [t.detach()[r].transpose(0, 1)[None].requires_grad_() for t, r in ((q, rq), (k, rk), (v, rk))]
        allowed = spec.visible(torch.arange(lens_q[b], device="cuda"), torch.arange(lens_k[b], device="cuda"),
                               lens_k[b], lens_k[b] - lens_q[b], mask)
        y = F.scaled_dot_product_attention(*sl, attn_mask=allowed, scale=scale, enable_gqa=Hq != Hkv)
        d16 = dout[rq].transpose(0, 1)[None]
        g16 = torch.autograd.grad(y, sl, d16)
        s64 = [t.detach().double().requires_grad_() for t in sl]
        y64, _ = reference.attend(*s64, mask, scale, lens_k[b] - lens_q[b])
        g64 = torch.autograd.grad(y64, s64, d16.double())
        for e, a, r64, r in zip(errs, (y,) + g16, (y64,) + g64, (rq, rq, rk, rk)):
            e[r] += (a.double().nan_to_num(0.0) - r64)[0].transpose(0, 1).abs()
    metrics = {label: check.compare(g, w, w + e) for label, g, w, e in zip(("out", "dq", "dk", "dv"), got, want, errs)}
    ok = all(m["passed"] for m in metrics.values())
    print(("ok  " if ok else "BAD ") + f"dv {name} D_qk {d_qk} D_v {d_v} H {Hq}/{Hkv} {dtype} causal {causal} window "
          f"{window}: " + " ".join(f"{g} {m['max_abs']:.3g}/{m['tol_max_abs']:.3g}" for g, m in metrics.items()),
          flush=True)
    return ok


def checks_dv() -> int:
    bf16, fp16 = torch.bfloat16, torch.float16
    docs = [1, 0, 63, 65, 200, 130]
    bad = 0
    for args in (("mla", docs, docs, 4, 2, 192, 128, bf16, True), ("wide-v", docs, [3, 7, 63, 65, 200, 97], 4, 2, 136,
                 256, fp16, True, (40, 0)), ("narrow-v", docs, docs, 4, 4, 256, 192, bf16, False),
                 ("small", docs, docs, 4, 2, 64, 128, bf16, True)):
        bad += not check_dv(*args)
    print(f"checks dv done: {bad} bad", flush=True)
    return bad


def race_dv(lens=(2048,) * 4, H=16, shapes=((192, 128), (192, 192), (256, 128), (256, 256))) -> list:
    """GPU time of the packed call (causal, bf16) at D_v != D_qk against D_v = D_qk: forward, forward + backward,
    and the padding's two copies alone (V to the width, O cut back)."""
    timer, rows = bench.GpuTimeTimer(), []
    cu, mx, total = _cu(list(lens)), max(lens), sum(lens)
    for d_qk, d_v in shapes:
        GEN.manual_seed(d_qk * 1000 + d_v)
        q, k = (draw(total, H, d_qk, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
        v, dout = draw(total, H, d_v, dtype=torch.bfloat16).requires_grad_(), draw(total, H, d_v, dtype=torch.bfloat16)

        def fwd():
            return ops.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, check_cu_seqlens=False)

        def fwd_nograd():
            with torch.no_grad():
                return fwd()
        calls = {"fwd": (fwd_nograd, None), "fwd+bwd": (lambda: torch.autograd.grad(fwd(), (q, k, v), dout), None)}
        if d_v != d_qk:  # diagnostics: the two copies the padding adds, each alone
            o_wide = torch.empty(total, H, d_qk, dtype=torch.bfloat16, device="cuda")
            calls["pad_v"] = (lambda: F.pad(v.detach(), (0, d_qk - d_v)), None)
            calls["cut_o"] = (lambda: o_wide[..., :d_v].contiguous(), None)
        times = bench.time_interleaved(calls, timer=timer, budget_s=0.3, max_reps=15, min_reps=5)
        row = {"d_qk": d_qk, "d_v": d_v, "lens": list(lens), "H": H,
               "median_ms": {key: getattr(t, "median_ms", str(t)) for key, t in times.items()},
               "q1_q3_n": {key: [t.q1_ms, t.q3_ms, t.n] for key, t in times.items() if hasattr(t, "q1_ms")}}
        rows.append(row)
        print(f"race-dv D_qk {d_qk} D_v {d_v}: {row['median_ms']} (q1, q3, n: {row['q1_q3_n']})", flush=True)
    return rows


def sanitize_small() -> None:
    """Small calls for compute-sanitizer memcheck: the dense route (GQA, rows of no sequence on both sides) and a
    D_v != D_qk packed call, forward and backward through the public op."""
    for lens, Hq, Hkv, d_qk, d_v, stray in (([100] * 3, 4, 2, 128, 128, 3), ([1, 63, 65], 4, 2, 192, 128, 0)):
        cu = _cu(lens)
        q = draw(sum(lens) + stray, Hq, d_qk, dtype=torch.bfloat16).requires_grad_()
        k = draw(sum(lens) + stray, Hkv, d_qk, dtype=torch.bfloat16).requires_grad_()
        v = draw(sum(lens) + stray, Hkv, d_v, dtype=torch.bfloat16).requires_grad_()
        before = dense_route.taken[0]
        out = ops.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), is_causal=True)
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        torch.cuda.synchronize()
        print(f"sanitize: lens {lens} D_qk {d_qk} D_v {d_v} stray {stray}: route taken "
              f"{dense_route.taken[0] > before}", flush=True)


if __name__ == "__main__":
    sanitize_small()
