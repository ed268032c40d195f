"""Chapter n16 (real models): every attention call of today's open models on the lab's kernels, with gates.

The measurements belong to other modules (lab.models, lab.masks.gpu_wide / gpu_bwd / gpu_paged / gpu_varlen,
lab.decode.mask_checks / mask_bench); this one calls them per section (``run_gpu``), normalises what they return
into rows of one kind, and builds the chapter's tables, plot and findings from those rows:

    {"kind": "real-models", "section": "wide-fwd", "stage": "fwd vs flex", "cell": "gemma2-local S8192",
     "ratio": 2.36, "op": ">=", "target": 1.0, "what": "Flex ms / lab ms"}

A ratio row carries its own target (chapters/gates.json gates the same numbers); a model row carries the matrix's
verdict and the count of the adapter's fallbacks; a checks row the number of failed checks.
"""
from __future__ import annotations

import operator
import time

from . import record
from .publish.tables import Table

CHAPTER, KIND = "n16_real_models", "real-models"
SECTIONS = ("models", "wide-fwd", "wide-fwd+bwd", "decode", "paged", "varlen")
_OPS = {">=": operator.ge, "<=": operator.le}

# The cells each section times on a GPU (the check modules' own grids are larger; these are the model-shaped ones).
WIDE_FWD = [(1, 16, 8, 8192, "local"), (1, 16, 8, 8192, "softcap"), (1, 16, 8, 8192, "window")]  # Gemma-2 D 256
WIDE_BWD = [("gemma2-local", 1, 8192, 4096, 50.0), ("gemma2-global", 1, 8192, None, 50.0),
            ("gemma3-local", 1, 8192, 1024, 0.0)]
DECODE = [(8, 16384, 128, 0), (8, 16384, 128, 64), (32, 4096, 64, 64)]  # (B, S, D, page): Gemma / GPT-OSS shapes
VARLEN = ("docs12", "one-length")  # lab.masks.gpu_varlen.RACE_CELLS at D 128


def ratio_row(section, stage, cell, ratio, op=None, target=None, what="", **extra) -> dict:
    return {"kind": KIND, "section": section, "stage": stage, "cell": cell,
            "ratio": ratio if isinstance(ratio, (int, float)) else None, "op": op, "target": target, "what": what,
            **extra}


# ------------------------------------------------------------------ normalisers (pure: tested on a CPU)

def model_rows(matrix: list[dict], lab_name: str = "lab") -> list[dict]:
    """lab.models rows -> one row per model: the verdict, the lab's fallbacks, each impl's distances."""
    out = []
    for r in matrix:
        lab = r["impls"].get(lab_name, {})
        out.append({"kind": KIND, "section": "models", "stage": "model", "cell": r["model"], "dtype": r["dtype"],
                    "head_dim": r["head_dim"], "pass": bool(r["pass"]), "why": r["why"],
                    "fallbacks": len(lab.get("fallbacks", [])), "refused": sorted(r.get("refused", {})),
                    "impls": {k: {m: v[m] for m in ("logits", "tokens_equal", "grads")}
                              for k, v in r["impls"].items()}})
    return out


def wide_fwd_rows(cells, ratios) -> list[dict]:
    """lab.masks.gpu_wide.race_wide's cells and the Flex / lab ratios it returned (None where a cell was skipped)."""
    return [ratio_row("wide-fwd", "fwd vs flex", f"{feature} B{B} H{H}/{Hkv} S{S} D256", ratio, ">=", 1.0,
                      "Flex ms / lab ms") for (B, H, Hkv, S, feature), ratio in zip(cells, ratios)]


def wide_bwd_rows(rows) -> list[dict]:
    """lab.masks.gpu_bwd.wide_race's rows (forward + backward, GPU time)."""
    return [ratio_row("wide-fwd+bwd", "fwd+bwd vs flex", f"{r['case']['name']} B{r['case']['B']} S{r['case']['S']} "
                      f"D{r['case']['D']}", r["flex_over_lab"], ">=", 1.0, "Flex ms / lab ms") for r in rows]


def decode_rows(rows, variants=None) -> list[dict]:
    """lab.decode.mask_bench.run's rows: each masked call against plain decode on the same cache, per timer."""
    from .decode.mask_bench import VARIANTS

    out = []
    for r in rows:
        if r["call"] not in (variants or VARIANTS):
            continue
        cell = f"{r['call']} B{r['B']} S{r['S']} D{r['D']} " + (f"page{r['page']}" if r["page"] else "contiguous")
        gated = r["timer"] == "gpu"  # the cold timer's host time is shown, not gated
        out.append(ratio_row("decode", f"masked vs plain ({r['timer']})", cell, r.get("ratio"),
                             ">=" if gated else None, 0.95 if gated else None, "plain ms / masked ms",
                             error=r.get("error")))
    return out


def paged_rows(rows) -> list[dict]:
    """lab.masks.gpu_paged.race's tuples (D, page, paged ms, packed ms, packed / paged, launch-only ratio)."""
    out = []
    for D, page, paged_ms, packed_ms, ratio, kernel in rows:
        cell = f"page{page} D{D} (chunked prefill: B 4, 512 queries after 7680 cached keys)"
        out.append(ratio_row("paged", "paged vs contiguous", cell, ratio, ">=", 0.95, "contiguous ms / paged ms",
                             median_ms={"paged": paged_ms, "contiguous": packed_ms}))
        out.append(ratio_row("paged", "paged vs contiguous (launch only)", cell, kernel, what="contiguous / paged"))
    return out


def varlen_rows(rows) -> list[dict]:
    """lab.masks.gpu_varlen.race's rows: the packed op against Flex's document mask, and one length against dense.
    The gates take the unchecked call (check_cu_seqlens=False, no host copy of cu_seqlens); at one length the rows
    of the call given cu_seqlens on the host, which takes lab.masks.dense_route forward and backward, stand beside
    them ungated."""
    out = []
    for r in rows:
        cell = f"{r['cell']} D{r['D']} ({r['tokens']} tokens)"
        for key, stage in (("_fwd", "fwd"), ("", "bwd"), ("+fwd", "fwd+bwd")):
            gated = stage == "bwd"
            out.append(ratio_row("varlen", f"{stage} vs flex", cell, r["flex_over_lab"].get(key),
                                 ">=" if gated else None, 1.5 if gated else None, "Flex ms / lab ms"))
        for key, stage in (("_fwd", "fwd"), ("", "bwd"), ("+fwd", "fwd+bwd")):
            if r["lab_over_dense"].get(key) is not None:
                gated = stage == "fwd+bwd"
                out.append(ratio_row("varlen", f"one-length {stage} vs dense", cell, r["lab_over_dense"][key],
                                     "<=" if gated else None, 1.05 if gated else None, "packed ms / dense ms"))
        ms, host = r.get("median_ms") or {}, r.get("host_cu_over_dense") or {}
        for key, stage in (("_fwd", "fwd"), ("", "bwd"), ("+fwd", "fwd+bwd")):
            flex, lab = ms.get("flex" + key), ms.get("labhost" + key)
            if isinstance(flex, float) and isinstance(lab, float):
                out.append(ratio_row("varlen", f"{stage} vs flex, cu_seqlens on the host", cell, flex / lab,
                                     what="Flex ms / lab ms"))
            if host.get(key) is not None:
                out.append(ratio_row("varlen", f"one-length {stage} vs dense, cu_seqlens on the host", cell,
                                     host[key], what="packed ms / dense ms"))
    return out


def bound_row(name: str, D: int, tokens: int, bound: dict, ceilings: dict) -> dict:
    """lab.masks.gpu_varlen.bwd_breakdown's split of one packed backward, beside the run's ceilings: not gated, it
    says what bounds the cell's backward (findings)."""
    return {"kind": KIND, "section": "varlen", "stage": "bwd kernels", "cell": f"{name} D{D} ({tokens} tokens)",
            "bound": bound, "ceilings": {key: ceilings.get(key) for key in ("copy_gbps", "bf16_matmul_tflops")}}


def bound_sentence(row: dict) -> str:
    """One finding from a bound_row: the backward's GPU time, the dK/dV kernel's share and rate, each pass's
    bandwidth, against the ceilings."""
    b, ceil = row["bound"], row.get("ceilings") or {}
    main = b["parts_us"].get("dK/dV kernel")
    text = f"- varlen backward at {row['cell']}: {b['total_us']:.0f} us of GPU time"
    if main:
        text += f"; the dK/dV kernel {main:.0f} us ({100 * main / b['total_us']:.0f} %)"
        if b.get("main_tflops"):
            text += f" at {b['main_tflops']:.0f} TFLOP/s" + (f" (bf16 matmul ceiling {ceil['bf16_matmul_tflops']:.0f})"
                                                            if ceil.get("bf16_matmul_tflops") else "")
    for part, gbps in b.get("passes_gbps", {}).items():
        text += f"; the {part} {b['parts_us'][part]:.0f} us at {gbps:.0f} GB/s"
    if b.get("passes_gbps") and ceil.get("copy_gbps"):
        text += f" (copy ceiling {ceil['copy_gbps']:.0f} GB/s)"
    rest = {k: v for k, v in b["parts_us"].items() if k != "dK/dV kernel" and k not in b.get("passes_gbps", {})}
    if rest:
        text += "; " + ", ".join(f"{k} {v:.0f} us" for k, v in rest.items())
    return text + "."


def checks_row(section: str, cell: str, bad: int, total: int) -> dict:
    return {"kind": KIND, "section": section, "stage": "checks", "cell": cell, "bad": int(bad), "total": int(total)}


# ------------------------------------------------------------------ GPU runs

def _checks(section: str) -> list[dict]:
    """A light pass of each check module's checks on the section's model-shaped cases (their full grids: their own
    modules' checks)."""
    if section == "wide-fwd":
        from .masks import gpu_wide
        return [checks_row(section, "public ops at D 256 / 192 / 200", gpu_wide.public_wide(), 4)]
    if section == "wide-fwd+bwd":
        from .masks import gpu_bwd
        names = ("gemma-local", "gemma-global", "all")
        return [checks_row(section, "masked backward D 256: " + ", ".join(names),
                           gpu_bwd.wide_checks(dims=(256,), trials=1, names=names, extras=False, packed=False),
                           len(names))]
    if section == "decode":
        from .decode import mask_checks
        chosen = mask_checks.cases((128,)) + [c for c in mask_checks.cases((256,)) if c.name.startswith("all-q4")]
        bad = sum(not mask_checks.check_case(c, trials=1)["passed"] for c in chosen)
        return [checks_row(section, f"masked decode D 128 / 256 ({len(chosen)} cases)", bad, len(chosen))]
    if section == "paged":
        from .masks import gpu_paged
        bad = sum(not gpu_paged.check_case(*c) for c in gpu_paged.CASES)
        return [checks_row(section, f"paged prefill ({len(gpu_paged.CASES)} cases)", bad, len(gpu_paged.CASES))]
    if section == "varlen":
        import torch

        from .masks.gpu_varlen import check_varlen_bwd
        docs = [700, 1, 0, 1300, 129, 2048, 64]
        cells = (("docs", 128, None, 0.0), ("docs-gemma", 256, (256, 0), 50.0))
        bad = sum(not check_varlen_bwd(name, docs, docs, 8, 4, D, torch.bfloat16, True, w, cap, False, trials=1)
                  for name, D, w, cap in cells)
        return [checks_row(section, "packed backward D 128 / 256", bad, 2)]
    return []


def _within(start: float, budget_s: float, race):
    """The one row (or ratio) a one-cell race returns, or None when the section's budget is spent or the race
    skipped its cell (a miss the findings name as not run)."""
    if time.time() - start > budget_s:
        return None
    done = race()
    return done[0] if done else None


def run_gpu(section: str, budget_s: float = 60.0, checks: bool = True, names=None) -> list[dict]:
    """Run one section on the GPU (names: the model matrix's families, None for all), append its normalised rows
    to the run's records, and return them."""
    if section not in SECTIONS:
        raise ValueError(f"unknown section {section!r}: one of {SECTIONS}")
    began = time.time()
    rows = _checks(section) if checks and section != "models" else []
    start = time.time()  # the races' budget starts after the checks
    if section == "models":
        from . import models
        rows += model_rows(models.main(names))
    elif section == "wide-fwd":  # one cell a call: the race drops a cell past its budget from what it returns
        from .masks import gpu_wide
        rows += wide_fwd_rows(WIDE_FWD, [_within(start, budget_s, lambda c=c: gpu_wide.race_wide(budget_s, [c]))
                                         for c in WIDE_FWD])
    elif section == "wide-fwd+bwd":
        from .masks import gpu_bwd
        for c in WIDE_BWD:
            done = _within(start, budget_s, lambda c=c: gpu_bwd.wide_race(budget_s, [c]))
            rows += wide_bwd_rows([done] if done else [{"case": {"name": c[0], "B": c[1], "S": c[2], "D": 256},
                                                        "flex_over_lab": None}])
    elif section == "decode":
        from .decode import mask_bench
        rows += decode_rows(mask_bench.run(DECODE, budget_s=min(0.25, budget_s / 40)))
    elif section == "paged":
        from .masks import gpu_paged
        rows += paged_rows(gpu_paged.race(budget_s=min(1.0, budget_s / 4)))
    elif section == "varlen":
        from .masks import gpu_varlen
        for c in [c for c in gpu_varlen.RACE_CELLS if c[0] in VARLEN and c[2] == 128]:
            done = _within(start, budget_s, lambda c=c: gpu_varlen.race(budget_s, [c]))
            rows += varlen_rows([done] if done else [{"cell": c[0], "D": c[2], "tokens": sum(c[1]),
                                                      "flex_over_lab": {"": None}, "lab_over_dense": {}}])
            if done:  # what bounds the backward: its kernels' split (a few calls under torch.profiler)
                from . import bench
                rows.append(bound_row(c[0], c[2], sum(c[1]), gpu_varlen.bwd_breakdown(c[1], c[2]), bench.ceilings()))
    for row in rows:
        record.append({**row, "wall_s": round(time.time() - began, 1)}, chapter=CHAPTER)
    return rows


# ------------------------------------------------------------------ what the chapter shows

def miss(row: dict) -> bool:
    """A gated ratio that is absent (a cell that did not run) or on the wrong side of its target."""
    if row.get("target") is None:
        return False
    return row.get("ratio") is None or not _OPS[row["op"]](row["ratio"], row["target"])


def models_table(rows: list[dict]) -> Table:
    impls = sorted({k for r in rows for k in r["impls"]}, key=lambda k: (k == "lab", k))
    body = [[r["cell"], r["head_dim"], r["dtype"]] + [
        "{:.3g} / {:.2f} / {:.3g}".format(*(r["impls"][k][m] for m in ("logits", "tokens_equal", "grads")))
        if k in r["impls"] else "refused" for k in impls] + [r["fallbacks"], "pass" if r["pass"] else r["why"]]
        for r in rows]
    return Table(["model", "D", "dtype"] + [f"{k}: logits / tokens equal / grads" for k in impls] +
                 ["lab fallbacks", "verdict"], body,
                 "distance from float32 eager (relative L2), greedy tokens equal to its, per implementation")


def ratio_table(rows: list[dict]) -> Table:
    body = []
    for r in rows:
        if r["stage"] == "checks":
            body.append([r["section"], "checks", r["cell"], f"{r['total'] - r['bad']}/{r['total']} pass", "",
                         "MISS" if r["bad"] else "ok"])
        elif "ratio" in r:
            target = f"{r['op']} {r['target']}" if r.get("target") is not None else "(shown)"
            value = r["ratio"] if r["ratio"] is not None else r.get("error") or "not run"
            body.append([r["section"], r["stage"], r["cell"], value, f"{r['what']} {target}",
                         "MISS" if miss(r) else "ok" if r.get("target") is not None else ""])
    return Table(["section", "stage", "cell", "ratio", "target", ""], body,
                 "each ratio against its target (the chapter's gates)" if body else
                 "nothing measured here and nothing recorded on a GPU yet for this section")


def _label(row: dict) -> str:
    words = row["cell"].split()
    return " ".join(words[:1] + [w for w in words[1:] if w.startswith(("S", "D", "page"))]) + "\n" + row["stage"]


def plot(rows: list[dict], path=None):
    """One panel per section: one bar per gated cell, each panel's target as a line."""
    import matplotlib.pyplot as plt

    from .plot import save_figure

    gated = [r for r in rows if r.get("target") is not None and r.get("ratio") is not None]
    sections = [s for s in SECTIONS if any(r["section"] == s for r in gated)]
    fig, axes = plt.subplots(1, max(len(sections), 1), figsize=(3.6 * max(len(sections), 1), 3.6), squeeze=False)
    for ax, section in zip(axes[0], sections):
        mine = [r for r in gated if r["section"] == section]
        ax.bar(range(len(mine)), [r["ratio"] for r in mine], color=["C3" if miss(r) else "C0" for r in mine])
        for target, op in sorted({(r["target"], r["op"]) for r in mine}):
            ax.axhline(target, color="k", ls="--", lw=1, label=f"target {op} {target}")
        ax.set_xticks(range(len(mine)), [_label(r) for r in mine], fontsize=6, rotation=60)
        ax.set_title(section, fontsize=9)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel("ratio (what: see the table)")
    fig.tight_layout()
    return save_figure(fig, path)


def findings(rows: list[dict]) -> list[str]:
    """Sentences from the rows: the model matrix, each section's worst gated ratio, and every miss by name."""
    lines = []
    for dtype in sorted({r["dtype"] for r in rows if r["section"] == "models"}):
        models = [r for r in rows if r["section"] == "models" and r["dtype"] == dtype]
        passed = [r["cell"] for r in models if r["pass"]]
        fell = [f"{r['cell']} ({r['fallbacks']})" for r in models if r["fallbacks"]]
        cpu = " (a CPU: no kernel runs, so every lab call falls back by design)" if dtype == "float32" else ""
        lines.append(f"- Model matrix ({dtype}{cpu}): {len(passed)} of {len(models)} models pass"
                     + "".join(f"; {r['cell']} fails: {r['why']}" for r in models if not r["pass"])
                     + (f"; the adapter fell back in {len(fell)}: {', '.join(fell)}" if fell else
                        "; the adapter fell back nowhere") + ".")
    for section in SECTIONS[1:]:
        mine = [r for r in rows if r["section"] == section]
        gated = [r for r in mine if r.get("target") is not None and r.get("ratio") is not None]
        bad_checks = sum(r["bad"] for r in mine if r["stage"] == "checks")
        if gated:
            worst = min(gated, key=lambda r: r["ratio"] if r["op"] == ">=" else -r["ratio"])
            lines.append(f"- {section}: {sum(not miss(r) for r in gated)} of {len(gated)} gated cells meet their "
                         f"target; worst {worst['cell']} ({worst['stage']}) {worst['ratio']:.3f} "
                         f"({worst['what']}, target {worst['op']} {worst['target']}).")
        if bad_checks:
            lines.append(f"- {section}: {bad_checks} checks failed.")
    lines += [f"- MISS: {r['section']} {r['cell']} ({r['stage']}): "
              + (f"{r['ratio']:.3f}, target {r['op']} {r['target']}" if r.get("ratio") is not None else "not run")
              for r in rows if miss(r)]
    lines += [bound_sentence(r) for r in rows if r.get("stage") == "bwd kernels" and r.get("bound")]
    return lines or ["- nothing measured yet"]


def recorded_matrix() -> list[dict]:
    """The latest GPU session's model-matrix rows anywhere under outputs/ (e.g. a driver log of python -m lab.models),
    normalised; prints where they come from."""
    rows = record.latest_gpu_rows(record.load(kind="model-matrix"))
    if rows:
        env = rows[0]["env"]
        print(f"recorded model matrix: session {rows[0]['session']}, {env['gpu']}, commit {rows[0]['commit']}, "
              f"{rows[0]['timestamp']}")
    return model_rows(rows)


def recorded_races(name: str) -> list[dict]:
    """The latest GPU rows of the check modules' own races for a section (Gemma's D 256 forward: kind "race", features
    wide-*; forward + backward: kind "race_bwd", feature "wide"), normalised; prints their session."""
    if name == "wide-fwd":
        found = [r for r in record.load(kind="race") if str(r.get("feature", "")).startswith("wide-")]
    elif name == "wide-fwd+bwd":
        found = [r for r in record.load(kind="race_bwd") if r.get("feature") == "wide"]
    else:
        return []
    rows = record.latest_gpu_rows(found)
    if rows:
        print(f"recorded {name} race (lab.masks): session {rows[0]['session']}, {rows[0]['env']['gpu']}, "
              f"commit {rows[0]['commit']}, {rows[0]['timestamp']}")
    if name == "wide-fwd":
        return [ratio_row(name, "fwd vs flex", f"{r['feature'][5:]} B{r['case']['B']} H{r['case']['H']}/"
                          f"{r['case']['Hkv']} S{r['case']['S']} D{r['case']['D']}", r["ratio_vs_lab"].get("flex"),
                          ">=", 1.0, "Flex ms / lab ms") for r in rows]
    return wide_bwd_rows(rows)


def section(ch, name: str, budget_s: float = 60.0, checks: bool = True) -> list[dict]:
    """A chapter cell's rows: run the section on a GPU; on a CPU say it is skipped and return the recorded rows
    (this chapter's, else the check modules' own races where they recorded any)."""
    if ch.skip(f"section {name} (checks and race)"):
        return [r for r in ch.recorded(kind=KIND) if r["section"] == name] or recorded_races(name)
    return run_gpu(name, budget_s, checks)
