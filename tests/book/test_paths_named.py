"""Every repository path that the README, the chapters and the kernel READMEs name exists.

A path is named inside backticks: `kernels/fwd/v04_lazy.cu`, `bash tools/gpu/sanitize_all.sh`,
`outputs/driver_logs/20261123-{h200,h100}-v07-*` (braces expand, a glob must match something),
`kernels/fwd/v<NN>_<idea>.cu` (a placeholder in <...>: the folder before it must exist). Names relative to
kernels/ (`fwd/v07_overlap.cu`, `common/mask.cuh`) are looked up there. Generated folders (the book's pages,
ad-hoc runs, caches) are not in a fresh clone and are not checked.
"""
from __future__ import annotations

import glob
import itertools
import json
import re

import pytest

from lab import paths

ROOT = paths.ROOT
TOP = ("chapters", "kernels", "lab", "tests", "tools", "outputs")
KERNEL_DIRS = ("fwd", "decode", "bwd", "common")
GENERATED = ("outputs/book", "outputs/log", "outputs/adhoc", "kernels/.scratch", "_build", ".venv", ".cache")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w.*?{},<>/-]*)" % "|".join(TOP + KERNEL_DIRS))
SPAN = re.compile(r"`([^`\n]+)`")


def documents() -> dict[str, str]:
    """name -> the text whose backticked spans are read: markdown files and the chapters' markdown cells."""
    docs = {p.relative_to(ROOT).as_posix(): p.read_text() for p in
            [ROOT / "README.md", *sorted((ROOT / "kernels").rglob("README.md")), *sorted((ROOT / "tools").rglob("README.md"))]}
    for notebook in sorted(paths.CHAPTERS.glob("n*.ipynb")):
        cells = json.loads(notebook.read_text())["cells"]
        docs[notebook.relative_to(ROOT).as_posix()] = "\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return docs


def named_paths(text: str) -> set[str]:
    found = set()
    for span in SPAN.findall(text):
        for match in PATH.findall(span):
            found.add(match.rstrip(".,:;)"))
    return found


def expand_braces(name: str) -> list[str]:
    parts = re.split(r"\{([^{}]*)\}", name)
    choices = [[p] if i % 2 == 0 else _alternatives(p) for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _alternatives(inside: str) -> list[str]:
    """{a,b} -> a, b; {1..6} -> 1 .. 6 (the shell's two brace forms)."""
    bounds = re.fullmatch(r"(\d+)\.\.(\d+)", inside)
    if bounds:
        return [str(n) for n in range(int(bounds[1]), int(bounds[2]) + 1)]
    return inside.split(",")


def exists(name: str) -> bool:
    if name.split("/")[0] in KERNEL_DIRS:
        name = f"kernels/{name}"
    if name.startswith(GENERATED):
        return True
    if "<" in name:  # a placeholder: the folder it goes in must exist
        name = name[:name.index("<")].rsplit("/", 1)[0]
    return all(glob.glob(str(ROOT / variant)) for variant in expand_braces(name.rstrip("/")))


@pytest.mark.parametrize("doc", sorted(documents()))
def test_named_paths_exist(doc):
    missing = sorted(name for name in named_paths(documents()[doc]) if not exists(name))
    assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_the_check_reads_the_forms_the_documents_use():
    text = ("`bash tools/gpu/sanitize_all.sh` `fwd/v07_overlap.cu` `outputs/driver_logs/20261123-{h200,h100}-v07-*`"
            " `kernels/fwd/v<NN>_<idea>.cu`, `lab.ops.attention` `kernels/fwd/v98_nothing.cu`.")
    assert named_paths(text) == {"tools/gpu/sanitize_all.sh", "fwd/v07_overlap.cu", "kernels/fwd/v<NN>_<idea>.cu",
                                 "outputs/driver_logs/20261123-{h200,h100}-v07-*", "kernels/fwd/v98_nothing.cu"}
    assert [exists(n) for n in ("tools/gpu/sanitize_all.sh", "fwd/v07_overlap.cu", "kernels/fwd/v<NN>_<idea>.cu",
                                "outputs/driver_logs/20261123-{h200,h100}-v07-*",
                                "outputs/driver_logs/20261122-h200-hopper-run{1..6}-*.log")] == [True] * 5
    assert not exists("kernels/fwd/v98_nothing.cu") and not exists("outputs/driver_logs/20261123-{h200,h900}-v07-*")
