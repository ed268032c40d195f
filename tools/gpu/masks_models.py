"""The masks through lab.integrations.transformers on the GPU, random weights, bf16:
- prefill logits and greedy tokens of Mistral (sliding window), Gemma-2 at D = 256 (softcap + window: no masked
  kernel there, so the adapter must fall back and say why) and Gemma-2 with 27B's D = 128 (softcap + window on the
  lab's masked kernels), each built with "eager", "sdpa" and "lab"; errors against eager beside SDPA's;
- a packed training step: several documents in one row (position ids restart) through the lab (varlen forward and
  backward), against the same documents run one by one: logits, loss and every parameter's gradient, beside eager
  and SDPA doing the same packed step.
One JSON line per check to stdout and $OUT/masks_models.jsonl.
Usage: python3 tools/gpu/masks_models.py (transformers importable: carry .whl-tf alone).
"""
import json
import os
import warnings

import torch
import transformers

from lab.integrations import transformers as lab_hf

SMALL = dict(vocab_size=4096, num_hidden_layers=2, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1,
             eos_token_id=None)
CONFIGS = {
    "mistral (D=128, GQA 16/4, window 256)": lambda: transformers.MistralConfig(
        hidden_size=2048, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=4, sliding_window=256,
        **SMALL),
    "gemma-2 (D=256, softcap 50, window 256)": lambda: transformers.Gemma2Config(
        hidden_size=2048, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=256, **SMALL),
    "gemma-2 (D=128 as 27B, softcap 50, window 256)": lambda: transformers.Gemma2Config(
        hidden_size=2048, intermediate_size=4096, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=256, **SMALL),
}
ENV = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
       "commit": os.environ.get("LAB_COMMIT", "")}


def emit(row):
    row["env"] = ENV
    print(json.dumps(row), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "masks_models.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


def build(config, impl):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.bfloat16)
    return model.cuda()


def lab_warnings(caught):
    return sorted({str(x.message) for x in caught if "lab attention" in str(x.message)})


def prefill_and_generate(name):
    ids = torch.randint(0, SMALL["vocab_size"], (2, 333), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(1))
    for label, make in CONFIGS.items():
        logits, tokens, forced, caught, refused = {}, {}, {}, [], {}
        for impl in ("eager", "sdpa", name):
            try:
                model = build(make(), impl).eval()
            except ValueError as err:
                refused[impl] = str(err).split(".")[0]
                continue
            lab_hf._warned.clear()
            with torch.no_grad(), warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                logits[impl] = model(ids).logits.float()
                tokens[impl] = model.generate(ids[:, :300], max_new_tokens=24, do_sample=False, pad_token_id=0)[:, 300:]
                # eager's generated sequence fed whole: each position's argmax against eager's next token, so one
                # flipped near-tie does not change every later token (random weights make near-ties common)
                forced[impl] = model(torch.cat([ids[:, :300], tokens["eager"]], 1)).logits[:, 299:323].argmax(-1)
            if impl == name:
                caught = lab_warnings(w)
            del model
        ref = logits["eager"]
        err = {impl: {"max_abs": float((logits[impl] - ref).abs().max()),
                      "rel_l2": float((logits[impl] - ref).norm() / ref.norm()),
                      "greedy_tokens_equal_eager": int((tokens[impl] == tokens["eager"]).sum()),
                      "greedy_tokens": int(tokens["eager"].numel()),
                      "first_divergence": [int((row != ref_row).nonzero()[0]) if (row != ref_row).any() else len(row)
                                           for row, ref_row in zip(tokens[impl], tokens["eager"])],
                      "forced_tokens_equal_eager": int((forced[impl] == tokens["eager"]).sum()),
                      "eager_forced_equal_its_greedy": int((forced["eager"] == tokens["eager"]).sum())}
               for impl in ("sdpa", name) if impl in logits}
        emit({"kind": "transformers-mask-model", "model": label, "prefill": list(ids.shape), "prompt_for_generate": 300,
              "errors_vs_eager": err, "lab_fallback_warnings": caught, "refused_by_transformers": refused})


def packed_step(name):
    """Loss (sum of next-token cross entropy inside each document) and gradients: one packed row vs one by one."""
    lengths = [100, 37, 1, 150, 64]
    gen = torch.Generator(device="cuda").manual_seed(2)
    docs = [torch.randint(0, SMALL["vocab_size"], (n,), device="cuda", generator=gen) for n in lengths]
    config = CONFIGS["mistral (D=128, GQA 16/4, window 256)"]()
    config.sliding_window = 64  # narrower than the long documents: the window and the documents both bite

    def loss_of(logits, ids):
        return torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:], reduction="sum")

    def step(model, packed: bool):
        model.zero_grad(set_to_none=True)
        if packed:
            ids = torch.cat(docs)[None]
            pos = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
            parts = torch.split(logits, lengths)
        else:
            parts = [model(input_ids=d[None], position_ids=torch.arange(len(d), device="cuda")[None],
                           use_cache=False).logits[0] for d in docs]
        loss = sum(loss_of(p, d) for p, d in zip(parts, docs))
        loss.backward()
        grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
        return torch.cat(parts).float().detach(), float(loss), grads

    results, caught = {}, {}
    for impl in ("eager", "sdpa", name):
        model = build(config, impl).train()
        lab_hf._warned.clear()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            results[impl] = {mode: step(model, mode == "packed") for mode in ("packed", "one_by_one")}
        caught[impl] = lab_warnings(w)
        del model
    ref_logits, ref_loss, ref_grads = results["eager"]["one_by_one"]

    def errors(got):
        logits, loss, grads = got
        rel = {n: float((grads[n] - g).norm() / max(float(g.norm()), 1e-30)) for n, g in ref_grads.items()}
        return {"logits_rel_l2": float((logits - ref_logits).norm() / ref_logits.norm()),
                "loss_rel": abs(loss - ref_loss) / abs(ref_loss), "grad_rel_l2_max": max(rel.values()),
                "grad_rel_l2_max_param": max(rel, key=rel.get), "params_with_grad": len(grads),
                "params_expected": len(ref_grads)}
    emit({"kind": "transformers-packed-step", "model": "mistral (D=128, GQA 16/4, window 64)", "lengths": lengths,
          "reference": "eager, documents one by one",
          "errors": {f"{impl} {mode}": errors(results[impl][mode]) for impl in results for mode in results[impl]
                     if (impl, mode) != ("eager", "one_by_one")},
          "lab_fallback_warnings": caught[name]})


if __name__ == "__main__":
    lab_name = lab_hf.register()
    prefill_and_generate(lab_name)
    packed_step(lab_name)
