"""The shape of lab/: no import cycles, a publishing subpackage that runs without torch, one list each of
chapters and SDPA backends, one records reader and writer: each thing the lab knows is said in one place."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab import backends, paths, toc

LAB = paths.ROOT / "lab"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _module(path: Path) -> str:
    parts = list(path.relative_to(paths.ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """lab module -> the lab modules it imports anywhere in its body (function-level imports count too)."""
    modules = {_module(p): p for p in LAB.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d in modules and d != name and d != "lab"}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, done = [], set()

    def visit(node, stack):
        for nxt in sorted(graph[node]):
            if nxt in stack:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, stack + [nxt])
        done.add(node)
    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found


def test_no_import_cycles_in_lab():
    graph = import_graph()
    assert "lab.publish.log" in graph and "lab.session" in graph
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


BLOCK_TORCH = """
import sys
class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
sys.meta_path.insert(0, BlockTorch())
"""


def test_publishing_needs_no_torch(tmp_path):
    import fixture_outputs

    outputs = fixture_outputs.build(tmp_path / "outputs")
    modules = sorted(_module(p) for p in (LAB / "publish").glob("*.py"))
    script = BLOCK_TORCH + f"""
import importlib
for name in {modules!r}:
    importlib.import_module(name)
from lab.__main__ import main
assert main(["log", "--outputs", {str(outputs)!r}]) == 0
assert not [m for m in sys.modules if m == "torch" or m.startswith("torch.")]
print("published without torch")
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=paths.ROOT, capture_output=True, text=True,
                            env={"PYTHONPATH": str(paths.ROOT), "PATH": "/usr/bin:/bin",
                                 "MPLCONFIGDIR": str(tmp_path / "mpl"), "MPLBACKEND": "Agg"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "published without torch" in result.stdout and (outputs / "log" / "baselines.md").exists()


def test_the_block_really_blocks_torch():
    result = subprocess.run([sys.executable, "-c", BLOCK_TORCH + "import torch"], capture_output=True, text=True)
    assert result.returncode != 0 and "torch is blocked" in result.stderr


def test_chapter_list_comes_from_the_toc(tmp_path):
    listed = toc.chapters()
    assert listed[:2] == ["n0_environment", "n2_build_recipe"] and "n7_split_k" in listed
    assert all(toc.is_chapter_name(name) for name in listed)
    fake = tmp_path / "_toc.yml"
    fake.write_text("root: intro\nparts:\n  - chapters:\n      - file: outputs/book/n1_a  # note\n"
                    "      - file: outputs/log/sessions\n      - file: outputs/book/../../etc\n"
                    "      - file: outputs/book/n9_hopper.ipynb\n      - file: outputs/book/n1_a\n")
    assert toc.chapters(fake) == ["n1_a", "n9_hopper"]
    assert toc.chapters(tmp_path / "missing.yml") == []
    for bad in ("../x", "n1_a/../../b", "", None, "n1-a", "x1_a"):
        assert not toc.is_chapter_name(bad)


def test_one_backend_list():
    from lab import bench
    from lab.publish import tables

    assert bench.BACKENDS is backends.BACKENDS
    assert backends.SDPA == tuple(f"sdpa-{b}" for b in bench.BACKENDS)
    assert backends.ordered(["sdpa-default", "zeta", "sdpa-flash"]) == ["sdpa-flash", "sdpa-default", "zeta"]
    text = tables.seed_baseline([], {}, "v01", {}).markdown()
    assert "config" in text


@pytest.mark.parametrize("pattern", ["records.jsonl\", \"a\"", "json.loads(line)", "%Y%m%d-%H%M%S"])
def test_one_records_reader_writer_and_id_format(pattern):
    """Only lab/record.py opens records for appending, parses their lines, or formats a session id."""
    owners = [p.relative_to(paths.ROOT).as_posix() for p in LAB.rglob("*.py") if pattern in p.read_text()]
    assert owners in ([], ["lab/record.py"]), owners


def test_tables_use_the_log_renderer():
    from lab.publish import pages, tables

    table = tables.Table(["impl", "x"], [["v|1", float("nan")], ["<b>", 1.234]], "caption")
    assert table.markdown() == "**caption**\n\n" + pages.table(["impl", "x"], [["v|1", float("nan")],
                                                                              ["<b>", 1.234]]).rstrip("\n")
    assert "| v\\|1 | n/a |" in table.markdown() and "&lt;b&gt;" in table.markdown()
    json.dumps(table.markdown())


def test_chapters_import_only_what_the_lab_installs():
    """A chapter imports the standard library, lab, torch, IPython (ipykernel's) or a requirements.txt package:
    anything else works on a GPU machine that happens to have it and fails `make book` on a fresh clone."""
    import ast

    pinned = {line.split("==")[0].strip().lower().replace("-", "_")
              for line in (paths.ROOT / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    allowed = set(sys.stdlib_module_names) | {"lab", "torch", "IPython"} | pinned
    for notebook in sorted(paths.CHAPTERS.glob("n*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            source = "\n".join(line for line in "".join(cell["source"]).splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                for name in names:
                    assert name.split(".")[0] in allowed, f"{notebook.name} imports {name}, which nothing installs"


def test_backward_tables_need_no_pandas():
    from types import SimpleNamespace

    from lab.publish import tables

    def result(passed, err):
        return SimpleNamespace(passed=passed, worst={"max_abs": err, "sdpa_max_abs": err / 2})

    checked = tables.gradient_checks([("a", {n: result(True, 1e-3) for n in ("dq", "dk", "dv")}),
                                      ("b", {"dq": result(False, 0.5), "dk": result(True, 1e-3),
                                             "dv": result(True, 1e-3)})])
    assert checked.caption == "1/2 checks pass"
    assert "| b | no | 5.00e-01 / 2.50e-01 |" in checked.markdown()
    row = {"impl": "lab.ops.attention", "case": {"name": "s2048"}, "tflops": 150.0,
           "timing": {"median_ms": 1.5}, "ratios": {"sdpa-flash": 0.6, "sdpa-cudnn": 0.5}}
    race = tables.race([row, {**row, "impl": "sdpa-flash"}]).markdown()
    assert "| s2048 | 150 | 1.50 | 0.6 | 0.5 | n/a |" in race and race.count("s2048") == 1
