"""lab.ops.attention_varlen with block_table (lab.masks.paged) on the CPU: the argument checks (all before the
device check), the host check of the table, and the NumPy emulation (lab.masks.emulate_paged) against float64:
a shuffled table read right, read wrongly (the table ignored) it must fail, bad tables zeroed and flagged.
The kernel's own checks are lab.masks.gpu_paged's (GPU only)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lab import ops
from lab.decode.plan import PAGE_E_INDEX, PAGE_E_SHORT
from lab.masks import emulate, emulate_paged, paged, reference, spec

BF16 = torch.bfloat16


def _cache(lens_k, page_size, Hkv, D, seed, spare=3):
    """Packed keys/values (float32 of bf16 values), a cache holding them in shuffled pages (NaN elsewhere) and the
    table (entries past a sequence's pages far outside the cache)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).to(BF16).float()
    v = torch.randn(sum(lens_k), Hkv, D, generator=g).to(BF16).float()
    needed = [-(-n // page_size) for n in lens_k]
    num_pages = sum(needed) + spare
    perm = torch.randperm(num_pages, generator=g).tolist()
    kc = torch.full((num_pages, page_size, Hkv, D), float("nan"))
    vc = kc.clone()
    table = torch.full((len(lens_k), max(needed)), 1 << 30, dtype=torch.int32)
    at = row = 0
    for b, n in enumerate(lens_k):
        for i in range(needed[b]):
            rows = min(page_size, n - i * page_size)
            kc[perm[at], :rows] = k[row + i * page_size:row + i * page_size + rows]
            vc[perm[at], :rows] = v[row + i * page_size:row + i * page_size + rows]
            table[b, i] = perm[at]
            at += 1
        row += n
    return k, v, kc, vc, table


def _cu(lens):
    return [0] + np.cumsum(lens).tolist()


def test_gather_reads_the_shuffled_table():
    lens_k = [40, 0, 100, 16]
    k, v, kc, vc, table = _cache(lens_k, 16, 2, 8, 1)
    gk, gv, cu = emulate_paged.gather(kc.numpy(), vc.numpy(), _cu(lens_k), table.numpy())
    assert cu == _cu(lens_k)
    np.testing.assert_array_equal(gk, k.numpy())
    np.testing.assert_array_equal(gv, v.numpy())
    wrong, _, _ = emulate_paged.gather(kc.numpy(), vc.numpy(), _cu(lens_k), table.numpy(), ignore_table=True)
    assert not np.array_equal(wrong, k.numpy(), equal_nan=True)


def _eager_bf16_error(q, k, v, cq, ck, mask, scale, sinks, ref):
    """The same math eagerly in bf16 (scores, softmax in float32, P and V in bf16) minus float64: the yardstick."""
    out = torch.zeros_like(ref)
    for b in range(len(cq) - 1):
        sq, sk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if not sq or not sk:
            continue
        qb = q[cq[b]:cq[b + 1]].transpose(0, 1).to(BF16)
        kb, vb = (t[ck[b]:ck[b + 1]].transpose(0, 1).to(BF16) for t in (k, v))
        group = qb.shape[0] // kb.shape[0]
        kb, vb = kb.repeat_interleave(group, 0), vb.repeat_interleave(group, 0)
        s = (qb @ kb.transpose(-1, -2)).float() * scale
        if mask.softcap:
            s = mask.softcap * torch.tanh(s / mask.softcap)
        seen = spec.visible(torch.arange(sq), torch.arange(sk), sk, sk - sq, mask)
        s = s.masked_fill(~seen, float("-inf"))
        if sinks is not None:
            s = torch.cat([s, sinks.float().view(-1, 1, 1).expand(-1, sq, 1)], -1)
        p = torch.softmax(s, -1).nan_to_num(0.0)[..., :sk]
        out[cq[b]:cq[b + 1]] = (p.to(BF16) @ vb).float().transpose(0, 1).double()
    return (out - ref).abs()


CASES = [  # (lens_q, lens_k, H_q, H_kv, page_size, causal, window, softcap, sinks)
    ([5, 1, 64, 0], [300, 33, 64, 7], 4, 2, 16, True, None, 0.0, False),
    ([17, 40, 3], [200, 90, 130], 2, 1, 48, True, (50, 0), 0.0, True),
    ([64, 9], [129, 500], 4, 4, 64, True, None, 30.0, False),
    ([30, 7, 12], [30, 100, 1], 2, 2, 32, False, (20, 10), 5.0, True),
]


@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, ps, causal, window, cap, sink", CASES)
def test_emulation_against_float64(lens_q, lens_k, Hq, Hkv, ps, causal, window, cap, sink):
    D = 16
    k, v, kc, vc, table = _cache(lens_k, ps, Hkv, D, hash((ps, Hq)) % 1000)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens_q), Hq, D, generator=g).to(BF16).float()
    sinks = torch.randn(Hq, generator=g) if sink else None
    mask, scale = spec.make_mask(causal, window, cap), D ** -0.5
    cq, ck = _cu(lens_q), _cu(lens_k)
    out, lse, flags = emulate_paged.forward_varlen_paged(q.numpy(), kc.numpy(), vc.numpy(), cq, ck, table.numpy(),
                                                         max(lens_q), mask, scale,
                                                         None if sinks is None else sinks.numpy())
    assert not flags.any()
    ref, ref_lse = reference.attend_varlen(q, k, v, cq, ck, mask, scale, sinks)
    err = (torch.from_numpy(out).double() - ref).abs()
    yard = _eager_bf16_error(q, k, v, cq, ck, mask, scale, sinks, ref)
    assert not torch.isnan(err).any()
    assert float(err.max()) <= 4 * float(yard.max()) + 1e-4
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isneginf(torch.from_numpy(lse)), torch.isneginf(ref_lse))
    assert float((torch.from_numpy(lse).double() - ref_lse)[finite].abs().max()) < 1e-3
    # the same packed keys give the same bits: the paged path is the gather and nothing else
    plain, _ = emulate.forward_varlen(q.numpy(), k.numpy(), v.numpy(), cq, ck, max(lens_q), mask, scale,
                                      None if sinks is None else sinks.numpy())
    np.testing.assert_array_equal(out, plain)


def test_table_ignored_fails():
    """The deliberately wrong reading (page j // page_size of the cache, not the table's) must fail the check."""
    lens_q, lens_k = [8, 8], [100, 70]
    k, v, kc, vc, table = _cache(lens_k, 16, 1, 16, 3)
    q = torch.randn(16, 2, 16, generator=torch.Generator().manual_seed(2)).to(BF16).float()
    mask = spec.make_mask(True, None, 0.0)
    out, _, _ = emulate_paged.forward_varlen_paged(q.numpy(), kc.numpy(), vc.numpy(), _cu(lens_q), _cu(lens_k),
                                                   table.numpy(), 8, mask, 0.25, ignore_table=True)
    ref, _ = reference.attend_varlen(q, k, v, _cu(lens_q), _cu(lens_k), mask, 0.25)
    bad = torch.from_numpy(out).double() - ref
    assert torch.isnan(bad).any() or float(bad.abs().max()) > 0.1


def test_bad_tables_zeroed_and_flagged():
    lens_q, lens_k, ps = [4, 4, 4, 4], [60, 60, 60, 70], 16
    k, v, kc, vc, table = _cache(lens_k, ps, 2, 16, 4)
    table = table[:, :4].clone()  # 64 keys a row: sequence 3 (70 keys) is too long
    table[1, 0] = -1
    table[2, 3] = kc.shape[0]
    q = torch.randn(16, 2, 16, generator=torch.Generator().manual_seed(3)).to(BF16).float()
    sinks = np.array([0.5, -1.0], np.float32)
    mask = spec.make_mask(True, None, 0.0)
    out, lse, flags = emulate_paged.forward_varlen_paged(q.numpy(), kc.numpy(), vc.numpy(), _cu(lens_q),
                                                         _cu(lens_k), table.numpy(), 4, mask, 0.25, sinks)
    assert flags.tolist() == [0, PAGE_E_INDEX, PAGE_E_INDEX, PAGE_E_SHORT]
    assert (out[4:] == 0).all() and np.isneginf(lse[:, 4:]).all()
    ref, _ = reference.attend_varlen(q[:4], k[:60], v[:60], [0, 4], [0, 60], mask, 0.25, torch.from_numpy(sinks))
    assert float((torch.from_numpy(out[:4]).double() - ref).abs().max()) < 2e-2


# ------------------------------------------------------------------ argument checks (CPU tensors: before the device)

def _args(**over):
    q = torch.zeros(10, 4, 64, dtype=BF16)
    kc = torch.zeros(6, 16, 2, 64, dtype=BF16)
    a = dict(query=q, key=kc, value=kc, cu_seqlens_q=torch.tensor([0, 4, 10], dtype=torch.int32),
             cu_seqlens_k=torch.tensor([0, 20, 50], dtype=torch.int32), max_seqlen_q=6, max_seqlen_k=30,
             is_causal=True, block_table=torch.tensor([[0, 1, 9], [2, 3, 4]], dtype=torch.int32))
    a.update(over)
    return a


def _table(rows):
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("over, error, message", [
    (dict(block_table=torch.zeros(2, 3)), TypeError, "block_table must be an int32"),
    (dict(block_table=_table([[0, 1, 2]])), ValueError, r"block_table must have shape \(2, max_pages"),
    (dict(block_table=torch.zeros(2, 0, dtype=torch.int32)), ValueError, "max_pages >= 1"),
    (dict(key=torch.zeros(6, 24, 2, 64, dtype=BF16), value=torch.zeros(6, 24, 2, 64, dtype=BF16)), ValueError,
     "multiple of 16"),
    (dict(key=torch.zeros(6, 16, 3, 64, dtype=BF16), value=torch.zeros(6, 16, 3, 64, dtype=BF16)), ValueError,
     "multiple of key_cache heads"),
    (dict(value=torch.zeros(6, 32, 2, 64, dtype=BF16)), ValueError, "shapes differ"),
    (dict(key=torch.zeros(6, 16, 2, 64, dtype=torch.float16)), TypeError, "key_cache.dtype"),
    (dict(key=torch.zeros(60, 2, 64, dtype=BF16)), ValueError, "key_cache must be 4-D"),
    (dict(key=torch.zeros(0, 16, 2, 64, dtype=BF16), value=torch.zeros(0, 16, 2, 64, dtype=BF16)), ValueError,
     "no pages"),
    (dict(key=torch.zeros(6, 16, 2, 128, dtype=BF16)[..., ::2]), ValueError, "strides"),
    (dict(page_errors=torch.zeros(3, dtype=torch.int32)), ValueError, r"page_errors must be a contiguous \(2,\)"),
    (dict(page_errors=torch.zeros(2)), TypeError, "page_errors must be an int32"),
    (dict(block_table=None, page_errors=torch.zeros(2, dtype=torch.int32)), ValueError, "goes with block_table"),
    (dict(block_table=_table([[0, 7, 9], [2, 3, 4]])), ValueError, r"sequence\(s\) \[0\]: a page index outside"),
    (dict(block_table=_table([[0, 1, 9], [2, -1, 4]])), ValueError, r"sequence\(s\) \[1\]"),
    (dict(cu_seqlens_k=torch.tensor([0, 20, 70], dtype=torch.int32), max_seqlen_k=50), ValueError, "too short"),
    (dict(cu_seqlens_k=torch.tensor([0, 20, 50], dtype=torch.int64)), TypeError, "cu_seqlens_k.dtype"),
    (dict(window_size=(1, 2, 3)), (TypeError, ValueError), "window_size"),
    (dict(version="v08"), ValueError, "masked v11 only"),
    (dict(query=torch.zeros(10, 4, 96, dtype=BF16), key=torch.zeros(6, 16, 2, 96, dtype=BF16),
          value=torch.zeros(6, 16, 2, 96, dtype=BF16)), NotImplementedError, r"head dims \(64, 128\)"),
    (dict(), ValueError, "must be on a CUDA device"),  # every argument good: the device check comes last
    (dict(check_cu_seqlens=False, block_table=_table([[0, 7, 9], [2, 3, 4]])), ValueError, "CUDA device"),
])
def test_paged_checks(over, error, message):
    with pytest.raises(error, match=message):
        ops.attention_varlen(**_args(**over))


def test_paged_forward_only():
    q = torch.zeros(10, 4, 64, dtype=BF16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="forward only"):
        ops.attention_varlen(**_args(query=q))
    with torch.no_grad():  # no gradient wanted: it goes on to the device check
        with pytest.raises(ValueError, match="CUDA device"):
            ops.attention_varlen(**_args(query=q))


def test_host_table_check_reads_only_used_pages():
    """Entries past a sequence's pages are never read (here far outside the cache); a short row is named."""
    paged.check_table_on_host([0, 16, 16, 48], _table([[3, 1 << 30, -5], [-1, -1, -1], [0, 1, 1 << 30]]), 16, 4)
    with pytest.raises(ValueError, match=r"too short for sequence\(s\) \[1\]"):
        paged.check_table_on_host([0, 17, 82], _table([[3, 2, 0, 0], [0, 1, 2, 3]]), 16, 4)


class _Done:
    """A completed CUDA event's stand-in (the deferred queue only queries and synchronizes it)."""
    def query(self):
        return True

    def synchronize(self):
        pass


class _Running(_Done):
    def query(self):
        return False


def test_deferred_flags_raise_once_the_call_completed(monkeypatch):
    """Flags of a finished call with a bad sequence raise (naming the call and the sequence, once); a call still
    running stays queued until waited for."""
    monkeypatch.setattr(paged, "_pending", [])
    paged._pending.append((_Done(), torch.tensor([0, PAGE_E_INDEX, 0], dtype=torch.int32), 7, "cuda:0"))
    paged._pending.append((_Running(), torch.tensor([PAGE_E_SHORT], dtype=torch.int32), 8, "cuda:0"))
    with pytest.raises(ValueError, match=r"call 7 on cuda:0: block_table is bad for sequence\(s\) 1 \(a page index"):
        paged.poll()
    assert [entry[2] for entry in paged._pending] == [8]
    with pytest.raises(ValueError, match=r"call 8 .* sequence\(s\) 0 \(more keys"):
        ops.check_varlen_page_errors()
    assert paged._pending == []
    ops.check_varlen_page_errors()  # nothing left: no error


def test_fake_tensors_trace_the_custom_op(monkeypatch):
    """Under fake tensors (torch.compile's tracing) the call is lab::attention_varlen_paged with its fake shapes; off
    compute capability 9.0 it raises NotImplementedError after every argument check."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    monkeypatch.setattr(paged, "_capability", lambda device: (9, 0))
    with FakeTensorMode():
        def fake(*shape, dtype=BF16):
            return torch.empty(*shape, dtype=dtype, device="cuda")
        q, kc = fake(10, 8, 128), fake(6, 64, 2, 128)
        cu, table = fake(3, dtype=torch.int32), fake(2, 3, dtype=torch.int32)
        out, lse = ops.attention_varlen(q, kc, kc, cu, cu, 6, 190, is_causal=True, window_size=(100, 0),
                                        return_lse=True, block_table=table)
        assert out.shape == (10, 8, 128) and out.dtype == BF16 and lse.shape == (8, 10) and lse.dtype == torch.float32
        monkeypatch.setattr(paged, "_capability", lambda device: (8, 0))
        with pytest.raises(NotImplementedError, match="compute capability 9.0"):
            ops.attention_varlen(q, kc, kc, cu, cu, 6, 190, block_table=table)


class _Stream:
    cuda_stream = 0


def _serving_args(**over):
    """_args as the serving call makes them: page_errors given, no host check."""
    return _args(**{"check_cu_seqlens": False, "page_errors": torch.zeros(2, dtype=torch.int32), **over})


def test_serving_checks_in_cpp(cpu_binding):
    """binding.cpp's attn_varlen_paged_auto on CPU tensors (the check build launches nothing): the AttnMaskParams it
    would launch are pack's, field for field, for its own output and LSE; whatever the full path would copy answers
    "refused", whatever it would raise answers a message (either way lab.masks.paged then takes the full path)."""
    auto = cpu_binding.module.attn_varlen_paged_auto
    a = _serving_args()
    q, kc, cu_q, cu_k, table, errors = (a[n] for n in ("query", "key", "cu_seqlens_q", "cu_seqlens_k", "block_table",
                                                          "page_errors"))
    sinks = torch.zeros(4)

    def call(q=q, k=kc, v=kc, cu_q=cu_q, cu_k=cu_k, table=table, errors=errors, max_q=6, max_k=30, sinks=sinks,
             want_lse=True, scale=0.125, left=5, right=0, softcap=30.0):
        return auto(0, left, right, softcap, q, k, v, cu_q, cu_k, table, errors, max_q, max_k, sinks, want_lse, scale)
    error, out, lse = call()
    assert error == "" and out.shape == q.shape and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == (4, 10) and lse.dtype == torch.float32
    launched = paged.op.PARAMS.unpack(cpu_binding.module.paged_params_cpu_last())
    assert launched == paged.op.PARAMS.unpack(paged.pack(q, kc, kc, out, lse, sinks, cu_q, cu_k, table, errors, 6, 30,
                                                         5, 0, 30.0, 0.125))
    error, out, lse = call(sinks=None, want_lse=False, scale=None, left=-1, right=-1, softcap=0.0)
    assert error == "" and lse is None
    assert paged.op.PARAMS.unpack(cpu_binding.module.paged_params_cpu_last()) == paged.op.PARAMS.unpack(
        paged.pack(q, kc, kc, out, None, None, cu_q, cu_k, table, errors, 6, 30, -1, -1, 0.0, 64 ** -0.5))
    wide = torch.zeros(2, 8, dtype=torch.int32)
    refused = {  # the full path copies these, or has nothing to launch
        "grad": dict(q=q.clone().requires_grad_()),
        "sinks grad": dict(sinks=torch.zeros(4, requires_grad=True)),
        "2-D query": dict(q=q[0]),
        "query strides": dict(q=torch.zeros(10, 4, 68, dtype=BF16)[..., :64]),
        "query offset": dict(q=torch.zeros(2561, dtype=BF16)[1:].view(10, 4, 64)),
        "table rows": dict(table=wide[:, ::2]),
        "max_q 0": dict(max_q=0),
        "no sequence": dict(cu_q=cu_q[:1], cu_k=cu_k[:1], table=table[:0], errors=errors[:0]),
    }
    for what, change in refused.items():
        assert call(**change)[0] == "refused", what
    named = {  # each a rule lab.masks.paged's full path raises for
        "multiple of 16": dict(k=torch.zeros(6, 24, 2, 64, dtype=BF16), v=torch.zeros(6, 24, 2, 64, dtype=BF16)),
        "multiple of key_cache heads": dict(k=torch.zeros(6, 16, 3, 64, dtype=BF16),
                                            v=torch.zeros(6, 16, 3, 64, dtype=BF16)),
        "shapes differ": dict(v=torch.zeros(6, 32, 2, 64, dtype=BF16)),
        "value_cache has dtype": dict(v=kc.half()),
        "head dims 64 / 128": dict(q=torch.zeros(10, 4, 96, dtype=BF16), k=torch.zeros(6, 16, 2, 96, dtype=BF16),
                                   v=torch.zeros(6, 16, 2, 96, dtype=BF16)),
        "block_table must be an int32": dict(table=table.long()),
        "(2, max_pages >= 1)": dict(table=table[:1]),
        "page_errors must be": dict(errors=torch.zeros(3, dtype=torch.int32)),
        "cu_seqlens_k must be int32": dict(cu_k=cu_k.long()),
        "cu_seqlens_q must be contiguous": dict(cu_q=torch.tensor([0, 9, 4, 9, 10, 9], dtype=torch.int32)[::2]),
        "max_seqlen": dict(max_k=-1),
        "sinks must have shape": dict(sinks=torch.zeros(4, 1)),
        "sinks must be float32": dict(sinks=torch.zeros(4, dtype=BF16)),
        "scale must be": dict(scale=float("inf")),
        "does not fit": dict(left=2 ** 40),
    }
    for pattern, change in named.items():
        error = call(**change)[0]
        assert pattern in error, (pattern, error)


@pytest.fixture
def serving_plans(cpu_binding, monkeypatch):
    """The serving plans made from the CPU check build (CPU tensors stand for the device): returns the list of plans
    made."""
    made = []

    def plan(query, is_causal, window_size, softcap):
        mask = spec.make_mask(is_causal, window_size, softcap)
        made.append((query.shape[-1], mask))
        return __import__("functools").partial(cpu_binding.module.attn_varlen_paged_auto, 0, mask.left, mask.right,
                                               mask.softcap)
    monkeypatch.setattr(paged, "_serving_plan", plan)
    monkeypatch.setattr(paged, "_plans", {})
    return made


def test_serving_call_crosses_once(cpu_binding, serving_plans):
    """The public serving call: one plan per (head dim, device, mask), then each call is one crossing whose
    AttnMaskParams are pack's for its tensors (its own output); a new mask is a new plan."""
    args = _serving_args(window_size=(8, 0), sinks=torch.zeros(4), return_lse=True)
    with torch.no_grad():
        outs = [ops.attention_varlen(**args) for _ in range(3)]
    assert len(serving_plans) == 1 and len(paged._plans) == 1
    (out, lse), launched = outs[-1], paged.op.PARAMS.unpack(cpu_binding.module.paged_params_cpu_last())
    assert out.shape == (10, 4, 64) and lse.shape == (4, 10)
    assert launched == paged.op.PARAMS.unpack(paged.pack(
        args["query"], args["key"], args["value"], out, lse, args["sinks"], args["cu_seqlens_q"], args["cu_seqlens_k"],
        args["block_table"], args["page_errors"], 6, 30, 8, 0, 0.0, 64 ** -0.5))
    assert launched[27:31] == (8, 0, 0, 0.0) and launched[-3:] == (6, 16, 3)  # window, offset, softcap; pages
    with torch.no_grad():
        ops.attention_varlen(**_serving_args(softcap=5.0))
        ops.attention_varlen(**_serving_args(is_causal=False, query=torch.zeros(12, 4, 64, dtype=BF16),
                                             cu_seqlens_q=torch.tensor([0, 5, 12], dtype=torch.int32)))
    assert len(serving_plans) == 3


# The argument checks above whose answer does not depend on the host check of cu_seqlens and the table's values
SERVING_CASES = [case for case in test_paged_checks.pytestmark[0].args[1]
                 if case[2] not in ("must be on a CUDA device", "CUDA device", "too short")
                 and "sequence" not in case[2]]


@pytest.mark.parametrize("over, error, message", SERVING_CASES)
def test_serving_call_raises_as_the_full_path(serving_plans, over, error, message):
    """Bad arguments of a serving call raise where and as they did before the crossing (the C++ answer sends the
    call to the full path); a good call with a bad table's values does not raise: its flags go to page_errors."""
    with torch.no_grad(), pytest.raises(error, match=message):
        ops.attention_varlen(**_serving_args(**over))
    with torch.no_grad():
        ops.attention_varlen(**_serving_args(block_table=_table([[0, 7, 9], [2, -1, 1 << 30]])))


def test_pack_matches_op_launch(monkeypatch):
    """lab.masks.op.launch(paged=) hands the mask, scale and table to lab.masks.op.paged_fields in the order
    lab.masks.paged.pack does."""
    got = []
    monkeypatch.setattr(paged.op, "masked_version", lambda *a, **k: "v11")
    monkeypatch.setitem(paged.op._calls, ("v11", ()), lambda params, stream: got.append(params) or 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    a = _args()
    q, kc = a["query"], a["key"].transpose(0, 0)
    out, lse, sinks = torch.empty_like(q), torch.empty(4, 10), torch.zeros(4)
    errors = torch.zeros(2, dtype=torch.int32)
    paged.op.launch(q, kc, kc, out, lse, spec.Mask(5, 0, 30.0), 0.125, 0, sinks, a["cu_seqlens_q"],
                    a["cu_seqlens_k"], 6, 30, "v11", paged=(a["block_table"], errors))
    assert got == [paged.pack(q, kc, kc, out, lse, sinks, a["cu_seqlens_q"], a["cu_seqlens_k"], a["block_table"],
                              errors, 6, 30, 5, 0, 30.0, 0.125)]


_PAGED_SWITCHES = {"LAB_FWD_MASK_PAGED_D128_STAGES": 2, "LAB_FWD_MASK_PAGED_D64_STAGES": 4, "LAB_FWD_MASK_PAGED_VOTE": 0,
                   "LAB_FWD_MASK_PAGED_CONSUMER_SCAN": 0}


def _v11_entries(defines) -> dict:
    """{kernel entry: PTX code} of fwd v11 for sm_90a with the given defines (nvcc only, no GPU). The default's PTX
    is the compile gate's own (lab.build.ptx keeps it beside the gate's cubin); the line table is left out."""
    import re

    from lab import build
    entries = build.ptx_entries(build.ptx_code(build.ptx("fwd/v11_masks_overlap.cu", "sm_90a", defines)))
    labels = r"(\$L__BB|__local_depot)\d+"  # numbered by the kernel's place in the file
    return {name: re.sub(labels, r"\1", code) for name, code in entries.items()}


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not on PATH")
def test_paged_switches_leave_the_dense_and_packed_kernels():
    """The paged switches (ring depths, the table check's warp vote, where the table is scanned) change the kPaged
    kernels only: each other v11 kernel's PTX is the default's, instruction for instruction; each default paged
    kernel holds the CTA scan's vote and the consumers' scan (its named-barrier OR and its vote)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        base, cand = pool.map(_v11_entries, (None, _PAGED_SWITCHES))
    kernels = [n for n in base if "attn_fwd_v11_kernel" in n]  # (the packed persistent kernels: their own name)
    plain = [n for n in kernels if n.endswith("Lb0EEEv14CUtensorMap_stS4_S4_14AttnMaskParams")]
    paged = [n for n in kernels if n not in plain]
    packed = [n for n in base if "attn_fwd_v11_packed_kernel" in n]
    assert len(plain) == 14 and len(paged) == 14 and len(packed) == 14
    assert all(n in cand and cand[n] == base[n] for n in plain + packed)
    vote = "vote.sync.any.pred"  # the CTA scan's and the consumers' scan's: two more in each paged kernel
    import re
    depth = lambda name: re.sub(r"(Cfg11ILi\d+E)Li\d+E", r"\1", name)  # noqa: E731 (the ring depth differs)
    cand_paged = {depth(n): c for n, c in cand.items() if n not in plain and n not in packed}
    assert all(base[n].count(vote) == cand_paged[depth(n)].count(vote) + 2 for n in paged)
    red = "bar.red.or.pred"  # __syncthreads_or's, and the consumers' OR on a named barrier: one more by default
    assert all(base[n].count(red) == cand_paged[depth(n)].count(red) + 1 for n in paged)
