"""lab.integrations.transformers: which calls the lab takes and which fall back to SDPA (with a warning naming
why), the fallback's masks, and, where transformers is installed, a model built with attn_implementation="lab"
(on the CPU every call falls back, so its logits must equal the SDPA implementation's)."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from lab.integrations import transformers as lab_hf


class Module:
    is_causal = True


def test_the_reasons_for_falling_back(monkeypatch):
    hopper = [(9, 0)]  # the capability unsupported() sees (no GPU here)
    monkeypatch.setattr(lab_hf, "_capability", lambda device: hopper[0])
    monkeypatch.setattr(lab_hf.transformers_masks, "_capability", lambda device: hopper[0])
    with FakeTensorMode():
        cuda = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="cuda")
        q, k = cuda(1, 8, 5, 128), cuda(1, 2, 9, 128)
        assert lab_hf.unsupported(q, k, k, None) is None
        assert lab_hf.unsupported(q, k, k, None, sliding_window=9) is None  # the window covers every key
        assert lab_hf.unsupported(cuda(1, 8, 5, 96), cuda(1, 2, 9, 96), cuda(1, 2, 9, 96), None) is None  # padded
        assert lab_hf.unsupported(q, k, k, None, softcap=50.0, sliding_window=4) is None  # the masked kernels
        cases = {"an explicit attention mask": dict(attention_mask=cuda(1, 1, 5, 9, dtype=torch.bool)),
                 "attention dropout 0.1": dict(dropout=0.1),
                 "a sliding window of 4 keys over 9 on a non-causal layer": dict(sliding_window=4, causal=False)}
        for reason, extra in cases.items():
            args = {"attention_mask": None, **extra}
            assert lab_hf.unsupported(q, k, k, **args).startswith(reason), reason
        g, g_kv = cuda(1, 8, 5, 256), cuda(1, 2, 9, 256)
        with torch.no_grad():  # Gemma-2's D = 256 with its softcap and window: masked v12 on compute capability 9.0
            assert lab_hf.unsupported(g, g_kv, g_kv, None, softcap=50.0, sliding_window=4) is None
            assert lab_hf.unsupported(g, g_kv, g_kv, None, sliding_window=4) is None  # Gemma-3's local layers
            assert lab_hf.unsupported(cuda(1, 8, 5, 200), cuda(1, 2, 9, 200), cuda(1, 2, 9, 200), None,
                                      softcap=50.0) is None  # padded to 256
            hopper[0] = (8, 0)  # off Hopper no masked kernel above 128, said so
            assert lab_hf.unsupported(g, g_kv, g_kv, None, softcap=50.0, sliding_window=4) == \
                "logit softcapping (50.0) at head dim 256 (the lab's masked kernels run head dims up to 128 on " \
                "this device; up to 256 on compute capability 9.0)"
            assert lab_hf.unsupported(g, g_kv, g_kv, None, sliding_window=4).startswith(
                "a sliding window of 4 keys over 9 at head dim 256")
            hopper[0] = (9, 0)
        # training Gemma-2's masked layers: the lab's only where a masked backward takes D 256 (lab.registry.MASKED_BWD)
        from lab.registry import MASKED_BWD
        reason = lab_hf.unsupported(g.clone().requires_grad_(), g_kv, g_kv, None, softcap=50.0)
        if any(256 in row.head_dims for row in MASKED_BWD.values()):
            assert reason is None
        else:
            assert reason.startswith("logit softcapping (50.0) with gradients at head dim 256 (the masked backward")
        assert lab_hf.unsupported(q.requires_grad_(), k, k, None, softcap=5.0) is None
        hopper[0] = (8, 0)  # the masked backward is Hopper-only
        assert lab_hf.unsupported(q, k, k, None, softcap=5.0).endswith(
            "with gradients off compute capability 9.0 (the masked backward runs on Hopper)")
        hopper[0] = (9, 0)
        q.requires_grad_(False)
        wide, wide_kv = cuda(1, 8, 5, 256), cuda(1, 2, 9, 256)
        with torch.no_grad():  # Gemma-2's D = 256 prefill: the lab's wide forward on compute capability 9.0 only
            assert lab_hf.unsupported(wide, wide_kv, wide_kv, None) is None
            assert lab_hf.unsupported(cuda(1, 8, 5, 200), cuda(1, 2, 9, 200), cuda(1, 2, 9, 200), None) is None
            hopper[0] = (8, 0)
            assert lab_hf.unsupported(wide, wide_kv, wide_kv, None) == \
                "head dim 256 on compute capability 8.0 (the lab's kernels above 128 run on 9.0)"
            hopper[0] = (9, 0)
        wide.requires_grad_()  # the wide backward (bwd v19, or v09 by name) has no deterministic mode
        assert lab_hf.unsupported(wide, wide_kv, wide_kv, None) is None
        torch.use_deterministic_algorithms(True)
        try:
            assert lab_hf.unsupported(wide, wide_kv, wide_kv, None).startswith(
                "head dim 256 with gradients in deterministic mode")
        finally:
            torch.use_deterministic_algorithms(False)
        with torch.no_grad():
            assert lab_hf.unsupported(cuda(1, 8, 5, 264), cuda(1, 2, 9, 264), cuda(1, 2, 9, 264), None) == \
                "head dim 264 (the lab runs up to 256)"
        assert lab_hf.unsupported(cuda(1, 8, 5, 64, dtype=torch.float32), cuda(1, 2, 9, 64, dtype=torch.float32),
                                  cuda(1, 2, 9, 64, dtype=torch.float32), None).startswith("dtype torch.float32")
    cpu = torch.zeros(1, 2, 3, 64, dtype=torch.bfloat16)
    assert lab_hf.unsupported(cpu, cpu, cpu, None) == "tensors not on a CUDA device"


def test_the_fallback_is_sdpa_with_a_bottom_right_mask_for_cached_keys_and_warns_once():
    lab_hf._warned.clear()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, s, 32, generator=gen, dtype=torch.float64) for s in (3, 7, 7))
    k, v = k[:, :2], v[:, :2]  # GQA 4/2
    with pytest.warns(UserWarning, match="lab attention: tensors not on a CUDA device; this call runs PyTorch SDPA"):
        out, weights = lab_hf.attention_forward(Module(), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (2, 3, 4, 32)
    scores = (q @ k.repeat_interleave(2, 1).transpose(-1, -2)) * 0.3
    allowed = torch.ones(3, 7, dtype=torch.bool).tril(4)  # query i sees keys <= i + 7 - 3
    want = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v.repeat_interleave(2, 1)
    torch.testing.assert_close(out, want.transpose(1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same reason does not warn twice
        one, _ = lab_hf.attention_forward(Module(), q[:, :, :1], k, v, None)
    want_one = F.scaled_dot_product_attention(q[:, :, :1], k, v, enable_gqa=True)  # one new token: every key
    torch.testing.assert_close(one, want_one.transpose(1, 2))


def test_a_transformers_model_runs_through_the_registered_name():
    transformers = pytest.importorskip("transformers")
    name = lab_hf.register()
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (2, 11))
    logits = {}
    for impl in ("sdpa", name):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()
        lab_hf._warned.clear()
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            logits[impl] = model(ids).logits
        ours = [w for w in caught if "lab attention" in str(w.message)]
        assert bool(ours) == (impl == name), impl  # the lab's adapter ran (and fell back: CPU tensors)
    torch.testing.assert_close(logits[name], logits["sdpa"])


def test_the_masked_fallback_applies_window_softcap_and_documents():
    """Where the lab cannot run a masked call, the fallback still applies all of it: the window (transformers'
    rule: i - W < j <= i), the documents of a packed row, the softcap (the eager formula)."""
    from lab.integrations import transformers_masks as tm
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 4, 12, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    cu, longest, doc = tm.documents(q, k, positions)
    assert cu.tolist() == [0, 5, 8, 12] and longest == 5 and doc.tolist() == [1] * 5 + [2] * 3 + [3] * 4
    assert tm.documents(q, k, torch.arange(12)[None]) is None  # one document: not packed
    out = tm.fallback(q, k, v, None, 0.0, 0.25, True, 3.0, 3, (cu, longest, doc))
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = 3.0 * torch.tanh((q @ kk.transpose(-1, -2)) * 0.25 / 3.0)
    i, j = torch.arange(12)[:, None], torch.arange(12)[None]
    ok = (j <= i) & (j > i - 3) & (doc[:, None] == doc[None])
    torch.testing.assert_close(out, torch.softmax(s.masked_fill(~ok, float("-inf")), -1) @ vv)
    assert tm.window(3, 12) == 2 and tm.window(12, 12) == -1 and tm.window(None, 12) == -1


def test_a_packed_row_reaches_the_varlen_op_with_its_documents(monkeypatch):
    """The lab's call of a packed row (the op replaced by the float64 reference, no GPU here): cu_seqlens from the
    restarting positions, the window and softcap handed on, and SDPA's 4-D mask accepted only when it is exactly
    the documents' mask."""
    from lab import ops
    from lab.integrations import transformers_masks as tm
    from lab.masks import reference, spec
    seen = {}

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale, window_size, softcap, sinks=None):
        seen.update(cu=cu_q.tolist(), max=max_q, window=window_size, softcap=softcap, sinks=sinks)
        out, _ = reference.attend_varlen(q, k, v, cu_q, cu_k, spec.make_mask(is_causal, window_size, softcap), scale,
                                         sinks)
        return out
    monkeypatch.setattr(ops, "attention_varlen", fake_varlen)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 4, 9, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    packed = tm.documents(q, k, torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]]))
    good = tm.allowed(packed[2], 9, 9, True, 1, "cpu")[None, None]
    out = tm.run(q, k, v, good, 0.25, True, 2.0, 2, packed)
    assert seen == dict(cu=[0, 4, 9], max=5, window=(1, 0), softcap=2.0, sinks=None)
    torch.testing.assert_close(out.transpose(1, 2), tm.fallback(q, k, v, None, 0.0, 0.25, True, 2.0, 2, packed))
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])  # and a packed row's sinks, through the same call
    out = tm.run(q, k, v, None, 0.25, True, 2.0, 2, packed, sinks)
    assert seen["sinks"] is sinks
    torch.testing.assert_close(out.transpose(1, 2),
                               tm.fallback(q, k, v, None, 0.0, 0.25, True, 2.0, 2, packed, sinks.double()))
    assert tm.run(q, k, v, torch.ones_like(good), 0.25, True, 2.0, 2, packed) is None  # another mask: not ours


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_window_and_softcap_models_agree_with_eager_on_the_fallback(family):
    """On the CPU every call falls back; the lab's mask function hands over no mask, so the fallback must apply the
    layer's window (Mistral) and softcap (Gemma-2) itself: the logits equal eager's."""
    transformers = pytest.importorskip("transformers")
    name = lab_hf.register()
    small = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, sliding_window=5)
    config = (transformers.MistralConfig(**small) if family == "mistral" else
              transformers.Gemma2Config(head_dim=16, attn_logit_softcapping=2.0, **small))
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))
    logits = {}
    for impl in ("eager", name):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits[impl] = model(ids).logits
    torch.testing.assert_close(logits[name], logits["eager"], atol=2e-5, rtol=2e-5)


def _sink_call(monkeypatch, seen, **kwargs):
    """One attention_forward call with GPT-OSS's s_aux, as if on a GPU the lab runs: lab.ops.attention replaced by
    the float64 reference that records what reached it (no GPU here)."""
    from lab import ops
    from lab.masks import reference, spec

    def fake_attention(q, k, v, is_causal=False, scale=None, enable_gqa=False, causal_variant="upper_left",
                       window_size=None, softcap=0.0, sinks=None):
        seen.update(sinks=sinks, window=window_size, causal_variant=causal_variant)
        group = q.shape[1] // k.shape[1]
        mask = spec.make_mask(is_causal, window_size, softcap)
        out, _ = reference.attend(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), mask, scale,
                                  k.shape[2] - q.shape[2], sinks)
        return out.to(q.dtype)
    monkeypatch.setattr(ops, "attention", fake_attention)
    monkeypatch.setattr(lab_hf, "unsupported", lambda *args, **kw: None)  # as if on a Hopper GPU
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, s, 16, generator=gen, dtype=torch.float64) for s in (6, 6, 6))
    k, v = k[:, :2], v[:, :2]
    s_aux = (2 * torch.randn(4, generator=gen, dtype=torch.float64)).requires_grad_()
    out, _ = lab_hf.attention_forward(Module(), q, k, v, None, scaling=0.25, sliding_window=3, s_aux=s_aux, **kwargs)
    return q, k, v, s_aux, out


def test_gpt_oss_sinks_reach_the_lab_call_with_their_gradient(monkeypatch):
    """s_aux (GPT-OSS's sinks) is handed to the kernels as float32 `sinks`, differentiably: the output equals the
    fallback's eager formula with the same sinks, differs from the call without them, and s_aux gets a gradient."""
    from lab.integrations import transformers_masks as tm
    seen = {}
    q, k, v, s_aux, out = _sink_call(monkeypatch, seen)
    assert seen["sinks"] is not None and seen["sinks"].dtype == torch.float32, "the sinks did not reach the call"
    torch.testing.assert_close(seen["sinks"].double(), s_aux.detach(), atol=1e-6, rtol=1e-6)
    assert seen["window"] == (2, 0) and seen["causal_variant"] == "lower_right"
    want = tm.fallback(q, k, v, None, 0.0, 0.25, True, None, 3, None, s_aux.float())
    torch.testing.assert_close(out.transpose(1, 2), want, atol=1e-6, rtol=1e-6)
    without = tm.fallback(q, k, v, None, 0.0, 0.25, True, None, 3, None)
    assert (without - want).abs().max() > 1e-2  # a dropped sink would be seen
    out.sum().backward()
    assert s_aux.grad is not None and s_aux.grad.abs().max() > 0


def test_every_keyword_is_honoured_or_bookkeeping_or_refused(monkeypatch):
    seen = {}
    _sink_call(monkeypatch, seen, position_ids=torch.arange(6)[None], use_cache=True, past_key_values=object(),
               output_hidden_states=False, cache_position=torch.arange(6), foo=None)  # None asks for nothing
    with pytest.raises(TypeError, match="'attention_bias', 'position_bias'.*does not understand"):
        _sink_call(monkeypatch, seen, position_bias=torch.zeros(1), attention_bias=torch.zeros(1))
    lab_hf._warned.discard("output_attentions")
    with pytest.warns(UserWarning, match="output_attentions=True.*returns None"):
        _sink_call(monkeypatch, seen, output_attentions=True)


def test_cu_seq_lens_are_honoured_as_packed_documents():
    from lab.integrations import transformers_masks as tm
    q = torch.zeros(1, 4, 9, 16)
    cu = torch.tensor([0, 4, 9])
    packed = tm.packed_documents(q, q, True, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 5})
    assert packed[0].tolist() == [0, 4, 9] and packed[1] == 5 and packed[2].tolist() == [1] * 4 + [2] * 5
    assert tm.packed_documents(q, q, True, {"cu_seq_lens_q": torch.tensor([0, 9]),
                                            "cu_seq_lens_k": torch.tensor([0, 9])}) is None  # one document
    with pytest.raises(ValueError, match="must be given together and be equal"):
        tm.packed_documents(q, q, True, {"cu_seq_lens_q": cu, "cu_seq_lens_k": torch.tensor([0, 3, 9])})
    with pytest.raises(ValueError, match="does not describe one packed row"):
        tm.packed_documents(q, q, True, {"cu_seq_lens_q": torch.tensor([0, 4, 8]),
                                         "cu_seq_lens_k": torch.tensor([0, 4, 8])})


def test_gpt_oss_through_the_lab_equals_eager_with_its_sinks_and_their_gradient():
    """A GPT-OSS model (sinks, a sliding window, random weights) on the CPU: every call falls back, and the fallback
    applies the sinks, so the logits and the sinks' gradients equal eager's; with the sinks zeroed they would not."""
    transformers = pytest.importorskip("transformers")
    name = lab_hf.register()
    config = transformers.GptOssConfig(vocab_size=97, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=5, max_position_embeddings=64)
    ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(3))
    logits, grads = {}, {}
    for impl in ("eager", name, "eager-no-sinks"):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl.split("-")[0])
        with torch.no_grad():
            for layer in model.model.layers:  # sinks large enough to matter
                layer.self_attn.sinks.copy_(2 * torch.randn(layer.self_attn.sinks.shape))
                if impl == "eager-no-sinks":
                    layer.self_attn.sinks.fill_(-1e4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logits[impl] = model(ids).logits
        logits[impl].square().mean().backward()
        grads[impl] = torch.cat([layer.self_attn.sinks.grad for layer in model.model.layers])
    torch.testing.assert_close(logits[name], logits["eager"], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(grads[name], grads["eager"], atol=1e-6, rtol=1e-4)
    assert grads[name].abs().max() > 0
    assert (logits["eager-no-sinks"] - logits["eager"]).abs().max() > 1e-3
