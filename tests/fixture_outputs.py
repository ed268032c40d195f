"""Fixture outputs/: three sessions written the way `python -m lab session` writes them.

- an older H100 session: n4 (v01 timed, checked) and n5 (the layout bug reproduced, BUG-001, a figure);
- a newer H100 session: n4 again, n6 (v02 at D=128 S=8192), n7 failed with a traceback;
- the newest session, CPU mode: n0 and n4, which must not replace the GPU copy of n4.
"""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lab import gates

REPO = Path(__file__).resolve().parent.parent
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "sms": 132, "driver": "570.1", "cuda": "12.8",
        "torch": "2.13.0", "nvcc": "12.8", "python": "3.12.3", "host": "gpu-host"}
CPU = {**H100, "gpu": "cpu", "capability": None, "sms": None, "driver": None, "cuda": None, "host": "laptop"}
# a 1x1 PNG, enough for an <img> in the rendered page
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")
SESSIONS = {
    "old": ("20251101-100000-h100-80gb-hbm3-aaaa111111", "2025-11-01T10:00:00+00:00", H100, "gpu", "aaaa111111"),
    "new": ("20251110-100000-h100-80gb-hbm3-bbbb222222", "2025-11-10T10:00:00+00:00", H100, "gpu", "bbbb222222"),
    "cpu": ("20251120-100000-cpu-cccc333333", "2025-11-20T10:00:00+00:00", CPU, "cpu", "cccc333333"),
}


def case(name, S, D=128, B=2, H=16, causal=False, **extra):
    return {"name": name, "B": B, "Hq": H, "Hkv": H, "Sq": S, "Sk": S, "D": D, "dtype": "bf16", "causal": causal,
            **extra}


def fwd(impl, c, ms, flash, cudnn, passed=True, kind="fwd", chapter="n4_baseline"):
    return {"kind": kind, "chapter": chapter, "impl": impl, "case": c,
            "timing": {"median_ms": ms, "q1_ms": ms * 0.98, "q3_ms": ms * 1.02, "iqr_ms": ms * 0.04, "n": 20},
            "tflops": 4 * c["B"] * c["Hq"] * c["Sq"] * c["Sk"] * c["D"] / ms / 1e9, "frac_ceiling": 0.3,
            "ratios": {"sdpa-flash": flash, "sdpa-cudnn": cudnn}, "check": {"passed": passed, "max_abs": 0.004}}


def decode_case(name, B, L, Hq=32, Hkv=8):
    return {"name": name, "B": B, "Hq": Hq, "Hkv": Hkv, "q_len": 1, "kv_len": L, "D": 128, "dtype": "bf16",
            "seqlens": []}


def decode_row(impl, c, ms, flash, cudnn):
    return {"kind": "decode", "chapter": "n7_split_k", "impl": impl, "case": c, "gbps": 2000.0 / ms,
            "timing": {"median_ms": ms, "q1_ms": ms, "q3_ms": ms, "iqr_ms": 0.0, "n": 20},
            "ratios": {"sdpa-flash": flash, "sdpa-cudnn": cudnn}}


def rows_for(which: str) -> list[dict]:
    small, big = case("seq1k", 1024), case("seq8k", 8192)
    if which == "old":
        return [
            {"kind": "build", "chapter": "n4_baseline", "step": "cold", "seconds": 21.5},
            {"kind": "build", "chapter": "n4_baseline", "step": "cached", "seconds": 0.05},
            fwd("v01", small, 2.0, 0.08, 0.07), fwd("v01", big, 95.0, 0.05, 0.05),
            {"kind": "check", "chapter": "n5_correctness", "impl": "v01", "case": small,
             "check": {"passed": True, "max_abs": 0.004, "sdpa_max_abs": 0.003}},
            {"kind": "check", "chapter": "n5_correctness", "impl": "v01 + LAB_BUG_LAYOUT", "case": small,
             "check": {"passed": False, "max_abs": 4.1, "sdpa_max_abs": 0.003}},
            {"kind": "bug", "chapter": "n5_correctness", "id": "BUG-001", "title": "v01 reads K with Q's layout",
             "symptom": "max diff 4.1 against the float64 reference", "shape": "B2 H16 S1024 D128 bf16",
             "root_cause": "stride of K taken from Q (BSHD vs BHSD)", "fix": "pass K's own strides",
             "fix_commit": "aaaa111111", "version": "v01", "status": "fixed", "figures": ["figures/layout.png"]},
        ]
    if which == "new":
        return [
            {"kind": "build", "chapter": "n2_build_recipe", "step": "edit", "seconds": 3.2},
            {"kind": "ceiling", "chapter": "n4_baseline", "name": "bf16_matmul_tflops", "value": 700.0},
            fwd("v01", small, 1.9, 0.09, 0.08), fwd("v01", big, 90.0, 0.06, 0.05),
            fwd("v02", big, 4.1, 1.12, 0.95, chapter="n6_fa2"),
            # the public op as users call it, on three shapes (listed out of order: the pivot sorts by S)
            fwd("lab.ops.attention", case("fwd-s4096", 4096), 1.2, 1.0, 0.6, chapter="n6_fa2"),
            fwd("lab.ops.attention", case("fwd-s8192", 8192), 4.0, 1.25, 0.7, chapter="n6_fa2"),
            fwd("lab.ops.attention", case("fwd-s1024", 1024), 0.2, 0.8, 0.5, chapter="n6_fa2"),
            decode_row("lab.ops.decode", decode_case("dec-b1-kv4096", 1, 4096), 0.05, 1.1, 1.0),
            decode_row("lab.ops.decode", decode_case("dec-b1-kv16384", 1, 16384), 0.12, 1.05, 0.97),
            decode_row("sdpa-flash", decode_case("dec-b1-kv4096", 1, 4096), 0.055, 1.0, 1.0),
            {"kind": "check", "chapter": "n6_fa2", "impl": "v02", "case": case("odd", 65, D=64),
             "check": {"passed": False, "max_abs": 0.9, "sdpa_max_abs": 0.004, "nan": False}},
            # the other families of the front page: backward, paged decode, and a ring row that timed its
            # speed-up over one GPU but no SDPA yardstick
            fwd("lab.ops.attention", case("fwd-s2048", 2048), 3.0, 0.5, 0.4, kind="bwd", chapter="n10_backward"),
            {**decode_row("lab.ops.decode", {**decode_case("pg-p64-b8-kv8192", 8, 8192), "page_size": 64}, 0.2,
                          0.9, 0.95), "kind": "paged", "chapter": "n11_paged_decode"},
            {"kind": "ring-scale", "chapter": "n12_ring", "impl": "lab.dist.ring_attention", "world_size": 2,
             "case": {"name": "ring-scale-S262144", "B": 1, "Hq": 16, "Hkv": 16, "S": 262144, "D": 128,
                      "causal": True, "dtype": "bfloat16"},
             "single": {"median_ms": 520.0}, "timing": {"median_ms": 260.0}, "efficiency": 1.0, "tflops": 1000.0},
        ]
    return [{"kind": "check", "chapter": "n4_baseline", "impl": "v01", "case": small,
             "check": {"passed": True, "max_abs": 1e-6}}]


def notebook(title: str, note: str) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata.update(kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
                       language_info={"name": "python"})
    params = new_code_cell('device = "auto"\ncases = "quick"')
    params.metadata["tags"] = ["parameters"]
    injected = new_code_cell('# Parameters\ndevice = "cuda"\n')
    injected.metadata["tags"] = ["injected-parameters"]
    plot = new_code_cell("plot()", outputs=[new_output("display_data", {
        "image/png": base64.b64encode(PNG).decode(), "text/plain": "<Figure>"})])
    table = new_code_cell("show_table()", outputs=[new_output("display_data", {
        "text/markdown": "| impl | ratio |\n|---|---|\n| v01 | 0.08 |", "text/plain": "table"})])
    nb.cells = [new_markdown_cell(f"# {title}"), new_markdown_cell(note), params, injected, plot, table]
    return nb


def session_folder(outputs: Path, which: str, chapters: dict[str, str]) -> Path:
    sid, start, env, mode, commit = SESSIONS[which]
    folder = outputs / "sessions" / sid
    (folder / "figures").mkdir(parents=True)
    rows = [{"session": sid, "timestamp": start, "commit": commit, "env": env, **r} for r in rows_for(which)]
    (folder / "figures" / "layout.png").write_bytes(PNG)
    results = gates.evaluate_all(rows, gates.load_gates(REPO / "chapters" / "gates.json"), list(chapters))
    entries = []
    for name, status in chapters.items():
        nbformat.write(notebook(f"Chapter {name}", f"Run {which} of {name}."), folder / f"{name}.ipynb")
        failed = status == "failed"
        entries.append({"name": name, "status": status, "duration_s": 42.0, "build_s": 1.5,
                        "notebook": f"{name}.ipynb", "error": "RuntimeError: no kernel image" if failed else None,
                        "traceback": "RuntimeError: no kernel image is available" if failed else None,
                        "gates": [g for g in results if g["chapter"] == name]})
        if failed:
            rows.append({"kind": "bug", "chapter": name, "session": sid, "timestamp": start, "env": env,
                         "id": f"RUN-{name}-RuntimeError", "title": f"{name} fails with RuntimeError",
                         "symptom": "RuntimeError: no kernel image", "status": "open"})
    rows.append({"kind": "session", "session": sid, "timestamp": start, "env": env, "mode": mode,
                 "duration_s": 300.0, "status": "complete", "chapters_failed": 0, "build_s": 3.0})
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    info = {"id": sid, "start": start, "end": start, "status": "complete", "mode": mode, "device": "auto",
            "cases": "quick", "parameters": {"device": "auto", "cases": "quick"}, "commit": commit, "env": env,
            "chapters": entries, "gates": gates.counts(results), "duration_s": 300.0,
            "cost": {"price_per_gpu_hour": 2.0, "gpu_hours": 0.0833, "cost": 0.1667} if mode == "gpu" else None}
    (folder / "session.json").write_text(json.dumps(info, indent=1))
    return folder


def build(outputs: Path) -> Path:
    outputs.mkdir(parents=True, exist_ok=True)
    for name in ("bugs.json", "patterns.json"):
        shutil.copy(REPO / "outputs" / name, outputs / name)
    session_folder(outputs, "old", {"n4_baseline": "ok", "n5_correctness": "ok"})
    session_folder(outputs, "new", {"n2_build_recipe": "ok", "n4_baseline": "ok", "n6_fa2": "ok",
                                    "n7_split_k": "failed"})
    session_folder(outputs, "cpu", {"n0_environment": "ok", "n4_baseline": "ok"})
    return outputs
