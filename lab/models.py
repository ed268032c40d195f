"""The real-model matrix: today's open decoder families, small and with random weights, through the lab's
transformers adapter (attn_implementation="lab"), beside "eager" and "sdpa" in the same dtype.

Per model: prefill logits, greedy generation with the KV cache, and one training step's gradients of every
parameter. The reference is the eager formula in float32 on the same weights; each implementation in bf16 (fp32 on
a CPU) is measured against it, so the lab's distance stands beside eager's and SDPA's own in that dtype. A model
passes when the lab's logits and gradients are within 2x the larger of those peers' distances (+ a floor), its greedy
tokens agree as often, every parameter that gets a gradient under eager gets one under the lab, and the adapter
fell back nowhere. On a CPU every lab call falls back (said by a warning, recorded), so the matrix there checks the
adapter's plumbing and the fallback's formula, not the kernels.

    python -m lab.models            # every model; rows appended to the run's records (kind "model-matrix")
    python -m lab.models gemma2 gpt_oss --device cpu
"""
from __future__ import annotations

import json
import warnings

import torch

# name -> (transformers config class, keyword arguments at GPU size). Head dims: the families' own.
FAMILIES = {
    "llama": ("LlamaConfig", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2)),  # D 128
    "qwen2": ("Qwen2Config", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2)),  # D 128
    "qwen3": ("Qwen3Config", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128)),
    "mistral": ("MistralConfig", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2,
                                      sliding_window=256)),
    "phi3": ("Phi3Config", dict(hidden_size=768, num_attention_heads=8, num_key_value_heads=8)),  # D 96
    "gemma2": ("Gemma2Config", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                    attn_logit_softcapping=50.0, sliding_window=256)),
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                        sliding_window=256)),
    "gpt_oss": ("GptOssConfig", dict(hidden_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                     sliding_window=128, num_local_experts=4, num_experts_per_tok=2)),
}
COMMON = dict(vocab_size=4096, num_hidden_layers=2, intermediate_size=1024, max_position_embeddings=4096,
              pad_token_id=0, bos_token_id=1, eos_token_id=None)
# CPU size: the same families, every dimension small (head dims 16), so the matrix runs in CI in seconds.
TINY = dict(vocab_size=97, hidden_size=64, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=128)
SHAPES = {"gpu": dict(batch=2, prefill=333, prompt=64, new_tokens=24),
          "cpu": dict(batch=2, prefill=13, prompt=7, new_tokens=5)}


def config(name: str, tiny: bool):
    import transformers

    cls, sizes = FAMILIES[name]
    kwargs = {**COMMON, **sizes}
    if tiny:
        kwargs.update(TINY)
        if "sliding_window" in kwargs:
            kwargs["sliding_window"] = 5
    if name == "gpt_oss" and not tiny:  # GPT-OSS keeps its config's own expert width at GPU size
        del kwargs["intermediate_size"]
    return getattr(transformers, cls)(**kwargs)


def _build(cfg, impl: str, dtype, device):
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl, dtype=torch.float32)
    with torch.no_grad():  # sinks large enough to matter (their init is near zero); the same for every impl
        gen = torch.Generator().manual_seed(1)
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                module.sinks.copy_(torch.randn(module.sinks.shape, generator=gen))
    return model.to(device=device, dtype=dtype).train(False)


def _run(model, ids, shape):
    """(logits float32, greedy tokens, {parameter: gradient float32}, lab fallback warnings)."""
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = model(ids).logits.float()
        tokens = model.generate(ids[:, :shape["prompt"]], max_new_tokens=shape["new_tokens"], do_sample=False,
                                pad_token_id=0)[:, shape["prompt"]:]
    with warnings.catch_warnings(record=True) as late:
        warnings.simplefilter("always")
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).logits.float().flatten(0, 1),
                                                 ids[:, 1:].flatten())
        loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    said = sorted({str(w.message) for w in caught + late if "lab attention" in str(w.message)})
    return logits, tokens, grads, said


def _distance(ours, ref) -> float:
    return float((ours - ref).norm() / ref.norm().clamp_min(1e-30))


def compare(name: str, device: str = "cuda", tiny: bool | None = None, lab_name: str = "lab") -> dict:
    """One row of the matrix: each implementation's distance from float32 eager, and the verdict."""
    from .integrations import transformers as lab_hf

    lab_hf.register(lab_name)
    tiny = device == "cpu" if tiny is None else tiny
    shape = SHAPES["cpu" if tiny else "gpu"]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cfg = config(name, tiny)
    ids = torch.randint(1, cfg.vocab_size, (shape["batch"], shape["prefill"]),
                        generator=torch.Generator().manual_seed(2)).to(device)
    ref_logits, ref_tokens, ref_grads, _ = _run(_build(cfg, "eager", torch.float32, device), ids, shape)
    row = {"kind": "model-matrix", "model": name, "dtype": str(dtype).replace("torch.", ""),
           "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
           "impls": {}, "refused": {}}
    for impl in ("eager", "sdpa", lab_name):
        lab_hf._warned.clear()
        try:
            model = _build(cfg, impl, dtype, device)
        except ValueError as err:  # transformers refuses SDPA for some families (GPT-OSS)
            row["refused"][impl] = str(err).split(".")[0]
            continue
        logits, tokens, grads, said = _run(model, ids, shape)
        common = [n for n in ref_grads if n in grads]
        row["impls"][impl] = {
            "logits": _distance(logits, ref_logits),
            "tokens_equal": float((tokens == ref_tokens).float().mean()),
            "grads": _distance(torch.cat([grads[n].flatten() for n in common]),
                               torch.cat([ref_grads[n].flatten() for n in common])),
            "grads_missing": sorted(set(ref_grads) - set(grads)),
            "fallbacks": said}
        del model
    row.update(verdict(row, lab_name))
    return row


def verdict(row: dict, lab_name: str = "lab", factor: float = 2.0, floor: float = 1e-3) -> dict:
    """Pass rule: the lab within factor x the worse peer's distance (+ floor), as often on greedy tokens (less one
    token per sequence of slack for ties that round differently), no missing gradient, no fallback on a GPU."""
    lab = row["impls"].get(lab_name)
    peers = [v for k, v in row["impls"].items() if k != lab_name]
    if lab is None or not peers:
        return {"pass": False, "why": "the lab or every peer did not run"}
    why = []
    for key in ("logits", "grads"):
        bound = factor * max(p[key] for p in peers) + floor
        if not lab[key] <= bound:
            why.append(f"{key} {lab[key]:.3g} > {bound:.3g}")
    if lab["tokens_equal"] < min(p["tokens_equal"] for p in peers) - 0.05:
        why.append(f"greedy tokens equal {lab['tokens_equal']:.3f}")
    if lab["grads_missing"]:
        why.append(f"no gradient for {lab['grads_missing'][:3]}")
    if lab["fallbacks"] and row["dtype"] != "float32":
        why.append("fell back: " + "; ".join(lab["fallbacks"]))
    return {"pass": not why, "why": "; ".join(why)}


def main(names=None, device: str | None = None) -> list[dict]:
    from tqdm.std import tqdm

    from . import record

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name in tqdm(list(names or FAMILIES), desc="model matrix", mininterval=5):
        row = compare(name, device)
        record.append(row)
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("model", "pass", "why")}))
    return rows


def cli(argv: list[str] | None = None) -> int:
    """`python -m lab.models [MODEL ...] [--device cpu|cuda]`: exit status 1 when a model fails."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lab.models", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help=f"families to run (default: all of {', '.join(FAMILIES)})")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda when torch sees a GPU, else cpu")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in FAMILIES]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; the families are {', '.join(FAMILIES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    rows = main(args.models or None, args.device)
    return 0 if all(row["pass"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(cli())
