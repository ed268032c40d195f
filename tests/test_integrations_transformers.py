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
    with FakeTensorMode():
        cuda = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device="cuda")
        q, k = cuda(1, 8, 5, 128), cuda(1, 2, 9, 128)
        assert lab_hf.unsupported(q, k, k, None) is None
        assert lab_hf.unsupported(q, k, k, None, sliding_window=9) is None  # the window covers every key
        assert lab_hf.unsupported(cuda(1, 8, 5, 96), cuda(1, 2, 9, 96), cuda(1, 2, 9, 96), None) is None  # padded
        cases = {"an explicit attention mask": dict(attention_mask=cuda(1, 1, 5, 9, dtype=torch.bool)),
                 "attention dropout 0.1": dict(dropout=0.1), "logit softcapping (50.0)": dict(softcap=50.0),
                 "a sliding window of 4 keys over 9": dict(sliding_window=4)}
        for reason, extra in cases.items():
            args = {"attention_mask": None, **extra}
            assert lab_hf.unsupported(q, k, k, **args).startswith(reason), reason
        wide, wide_kv = cuda(1, 8, 5, 256), cuda(1, 2, 9, 256)
        with torch.no_grad():  # Gemma-2's D = 256 prefill: the lab's wide forward on compute capability 9.0 only
            assert lab_hf.unsupported(wide, wide_kv, wide_kv, None) is None
            assert lab_hf.unsupported(cuda(1, 8, 5, 200), cuda(1, 2, 9, 200), cuda(1, 2, 9, 200), None) is None
            hopper[0] = (8, 0)
            assert lab_hf.unsupported(wide, wide_kv, wide_kv, None) == \
                "head dim 256 on compute capability 8.0 (the lab's kernels above 128 run on 9.0)"
            hopper[0] = (9, 0)
        wide.requires_grad_()  # the wide backward (bwd v09) has no deterministic mode
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
