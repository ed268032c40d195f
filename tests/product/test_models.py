"""lab.models, the real-model matrix, in its CPU part: every family builds at its tiny size, runs through the lab's
adapter (falling back on the CPU, as it says), and agrees with float32 eager; a wrong adapter fails the verdict."""
import pytest

from lab import models

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", sorted(models.FAMILIES))
def test_every_family_agrees_with_eager_through_the_lab(name):
    row = models.compare(name, "cpu")
    assert row["pass"], row["why"]
    lab = row["impls"]["lab"]
    assert lab["fallbacks"] and all("not on a CUDA device" in w for w in lab["fallbacks"])  # the CPU says so
    assert lab["logits"] < 1e-5 and lab["grads"] < 1e-5 and not lab["grads_missing"]


def test_a_dropped_sink_fails_the_matrix(monkeypatch):
    from lab.integrations import transformers as lab_hf
    real = lab_hf.attention_forward

    def drops_sinks(*args, s_aux=None, **kwargs):
        return real(*args, **kwargs)
    monkeypatch.setattr(lab_hf, "attention_forward", drops_sinks)
    row = models.compare("gpt_oss", "cpu")
    assert not row["pass"] and "logits" in row["why"] and "no gradient for" in row["why"]


def test_the_verdict_rule():
    peer = {"logits": 1e-2, "grads": 2e-2, "tokens_equal": 0.9, "grads_missing": [], "fallbacks": []}
    row = {"dtype": "bfloat16", "impls": {"eager": peer, "lab": dict(peer, logits=2e-2)}}
    assert models.verdict(row)["pass"]
    row["impls"]["lab"] = dict(peer, logits=3e-2)
    assert models.verdict(row)["why"].startswith("logits 0.03 > 0.021")
    row["impls"]["lab"] = dict(peer, fallbacks=["lab attention: x"], grads_missing=["w"])
    assert "fell back" in models.verdict(row)["why"] and "no gradient for ['w']" in models.verdict(row)["why"]
    assert not models.verdict({"dtype": "bfloat16", "impls": {"lab": peer}})["pass"]  # no peer: no pass


def test_the_command_line_runs_the_named_models_and_refuses_what_it_cannot_honour(monkeypatch, capsys):
    """`python -m lab.models gemma2 --device cpu` runs that family on that device; an unknown family or a device
    torch cannot see is an error, never a run of everything in its place; a failing model exits 1."""
    seen = []
    verdicts = {"gemma2": True, "llama": False}
    monkeypatch.setattr(models, "main", lambda names, device: seen.append((names, device)) or
                        [{"pass": verdicts[n]} for n in names or models.FAMILIES if n in verdicts])
    assert models.cli(["gemma2", "--device", "cpu"]) == 0 and seen == [(["gemma2"], "cpu")]
    assert models.cli(["gemma2", "llama"]) == 1 and seen[-1] == (["gemma2", "llama"], None)
    with pytest.raises(SystemExit) as stop:
        models.cli(["nonesuch"])
    assert stop.value.code == 2 and "unknown model nonesuch" in capsys.readouterr().err
    monkeypatch.setattr(models.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        models.cli(["--device", "cuda"])
    assert "torch sees no CUDA device" in capsys.readouterr().err and len(seen) == 2
