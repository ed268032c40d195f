"""The wall between the product and the notebook (lab/product.py): no import of a product module, at module level
or inside a function, reaches a harness module, however many modules it passes through.

The imports are read with ast, not run: a function-level import counts as much as a module-level one (it runs
on the user's call), and a module imported as `from pkg import name` counts as `pkg.name` when that is a module.
Importing `a.b.c` also runs `a` and `a.b`, so a package's __init__ is on the chain too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lab.product import PRODUCT

ROOT = Path(__file__).resolve().parents[2]
# Harness modules by name (the README's list): none may be declared product to get past the wall.
HARNESS = ("lab.check", "lab.bench", "lab.sweep", "lab.session", "lab.publish", "lab.record", "lab.plot",
           "lab.gates", "lab.cases", "lab.profile", "lab.findings", "lab.selftest", "lab.emulate", "lab.chapter",
           "lab.experiments", "lab.graphs", "lab.hostcost")
# Where users come in: the walk starts here, so a breach is named by its chain from a public call.
ENTRY = ("lab.ops", "lab.ring", "lab.integrations.transformers", "lab.build")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def imported(name: str, root: Path = ROOT) -> list[tuple[str, int]]:
    """(module, line) of every module of the package `name` imports anywhere in its file."""
    path = module_file(name, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top = name.split(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names
                      if module_file(f"{base}.{alias.name}", root)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in \
                ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((str(node.args[0].value), node.lineno))  # importlib.import_module("lab.x")
    names = []
    for module, line in found:
        if module.split(".")[0] != top:
            continue
        parts = module.split(".")
        names += [(".".join(parts[:i]), line) for i in range(1, len(parts) + 1)]  # a.b.c runs a and a.b first
    return [(module, line) for module, line in names if module_file(module, root)]


def breaches(product, root: Path = ROOT, entry=()) -> list[str]:
    """Every module outside `product` that an import of a product module reaches, with the shortest chain that
    gets there from `entry` (then from each product module the entries do not reach)."""
    came_from: dict[str, tuple[str, int] | None] = {}
    found = []
    for start in [*entry, *sorted(product)]:
        if start in came_from:
            continue
        came_from[start], queue = None, [start]
        while queue:
            name = queue.pop(0)
            if name not in product:
                chain, step = [name], came_from[name]
                while step is not None:
                    chain.append(f"{step[0]}:{step[1]}")
                    step = came_from[step[0]]
                found.append(" <- ".join(chain))
                continue  # one chain per harness module is enough to name
            for module, line in imported(name, root):
                if module not in came_from:
                    came_from[module] = (name, line)
                    queue.append(module)
    return found


# ------------------------------------------------------------------ the lab's wall

def test_every_product_module_exists():
    missing = sorted(name for name in PRODUCT if module_file(name) is None)
    assert not missing, f"lab/product.py names modules that do not exist: {missing}"


def test_no_harness_module_is_declared_product():
    declared = sorted(name for name in PRODUCT if name in HARNESS or name.startswith(tuple(h + "." for h in HARNESS))
                      or "emulate" in name.rpartition(".")[2])
    assert not declared, f"harness modules listed as product in lab/product.py: {declared}"


def test_product_imports_stay_inside_the_product():
    found = breaches(PRODUCT, entry=ENTRY)
    assert not found, ("a product module reaches the harness (module <- importer:line <- ...); move what the "
                       "product needs into a product module, or list the module in lab/product.py if it is "
                       "product:\n  " + "\n  ".join(found))


# ------------------------------------------------------------------ the checker itself

@pytest.fixture
def tree(tmp_path):
    """A small package: pkg.api -> pkg.core (module level) and, inside a function, pkg.tools.plot."""
    files = {
        "pkg/__init__.py": "",
        "pkg/api.py": "from . import core\n\ndef f():\n    from .tools.plot import draw\n    return draw\n",
        "pkg/core.py": "import math\nfrom pkg.util import helper\n",
        "pkg/util.py": "",
        "pkg/tools/__init__.py": "",
        "pkg/tools/plot.py": "def draw():\n    pass\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_checker_follows_function_level_imports_and_names_the_chain(tree):
    found = breaches({"pkg", "pkg.api", "pkg.core", "pkg.util"}, tree)
    assert found == ["pkg.tools <- pkg.api:4", "pkg.tools.plot <- pkg.api:4"]


def test_checker_follows_the_closure(tree):
    (tree / "pkg/util.py").write_text("import importlib\n\ndef g():\n    return importlib.import_module('pkg.tools')\n")
    assert breaches({"pkg", "pkg.api", "pkg.core", "pkg.util", "pkg.tools.plot"}, tree) == \
        ["pkg.tools <- pkg.api:4"]
    assert breaches({"pkg", "pkg.core"}, tree) == ["pkg.util <- pkg.core:2"]


def test_checker_passes_a_closed_product(tree):
    assert breaches({"pkg", "pkg.api", "pkg.core", "pkg.util", "pkg.tools", "pkg.tools.plot"}, tree) == []
