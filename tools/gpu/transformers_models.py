"""lab.integrations.transformers on the GPU: three decoder configs with random weights (Llama, D = 128; Phi-3-mini,
D = 96; Gemma-2, D = 256, softcapping off) in bf16, each built with attn_implementation "eager", "sdpa" and "lab".
Per model: prefill logits of "sdpa" and "lab" against "eager" (max abs and relative L2), 24 greedy tokens of each
against eager's, a training step's gradients of layer 0's attention weights against eager's (relative L2), the lab's fallback warnings, and any implementation transformers refuses for the model. One JSON line per model to stdout and $OUT/transformers.jsonl.
Usage: python3 tools/gpu/transformers_models.py (transformers importable; carry its wheels).
"""
import json
import os
import subprocess
import warnings

import torch
import transformers

from lab import record
from lab.integrations import transformers as lab_hf

SMALL = dict(vocab_size=4096, num_hidden_layers=2, max_position_embeddings=2048, pad_token_id=0, bos_token_id=1,
             eos_token_id=None)
CONFIGS = {
    "llama (D=128, GQA 16/4)": lambda: transformers.LlamaConfig(hidden_size=2048, intermediate_size=4096,
                                                                 num_attention_heads=16, num_key_value_heads=4, **SMALL),
    "phi-3-mini (D=96)": lambda: transformers.Phi3Config(hidden_size=3072, intermediate_size=4096,
                                                          num_attention_heads=32, num_key_value_heads=32, **SMALL),
    "gemma-2 (D=256, softcap off)": lambda: transformers.Gemma2Config(
        hidden_size=2048, intermediate_size=4096, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        attn_logit_softcapping=None, final_logit_softcapping=None, sliding_window=4096, **SMALL),
}


def build(config, impl):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.bfloat16)
    return model.cuda().eval()


def main():
    name = lab_hf.register()
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "commit": os.environ.get("LAB_COMMIT") or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                                                    capture_output=True, text=True).stdout.strip()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 333), device="cuda", generator=gen)
    for label, make in CONFIGS.items():
        logits, tokens, grads, caught, refused = {}, {}, {}, [], {}
        for impl in ("eager", "sdpa", name):
            try:
                model = build(make(), impl)
            except ValueError as err:  # transformers refuses SDPA for some architectures (Gemma-2)
                refused[impl] = str(err).split(".")[0]
                continue
            lab_hf._warned.clear()
            with torch.no_grad(), warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                logits[impl] = model(ids).logits.float()
                tokens[impl] = model.generate(ids[:, :64], max_new_tokens=24, do_sample=False,
                                              pad_token_id=0)[:, 64:]
            if impl == name:
                caught = sorted({str(x.message) for x in w if "lab attention" in str(x.message)})
            with warnings.catch_warnings(record=True) as w:  # a training step: the gradients of layer 0's attention
                warnings.simplefilter("always")
                loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).logits.float().flatten(0, 1),
                                                         ids[:, 1:].flatten())
                loss.backward()
            grads[impl] = torch.cat([p.grad.float().flatten() for n, p in model.named_parameters()
                                     if "layers.0.self_attn" in n])
            if impl == name:
                caught += sorted({"backward: " + str(x.message) for x in w if "lab attention" in str(x.message)})
            del model
        ref = logits["eager"]
        err = {impl: {"max_abs": float((logits[impl] - ref).abs().max()),
                      "rel_l2": float((logits[impl] - ref).norm() / ref.norm()),
                      "greedy_tokens_equal_eager": int((tokens[impl] == tokens["eager"]).sum()),
                      "greedy_tokens": int(tokens["eager"].numel()),
                      "layer0_attn_grad_rel_l2": float((grads[impl] - grads["eager"]).norm() / grads["eager"].norm())}
               for impl in ("sdpa", name) if impl in logits}
        row = {"kind": "transformers-model", "model": label, "prefill": list(ids.shape), "errors_vs_eager": err,
               "lab_fallback_warnings": caught, "refused_by_transformers": refused, "env": env}
        print(json.dumps(row))
        record.append({k: v for k, v in row.items() if k != "env"})  # the session's records (chapter n14 shows them)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "transformers.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
