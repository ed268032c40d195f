"""`pip install .` (pyproject.toml) gives another project `import lab.ops`, with the kernel sources inside the package.

The install goes into a fresh venv in a temporary folder, from a copy of the sources (so no build/ or egg-info lands
in the checkout), offline: pip --no-deps --no-build-isolation --no-index. The venv reaches torch (and pip and
setuptools) through a .pth file naming the site-packages folder that holds this interpreter's torch, so nothing is
downloaded. A probe then runs in the new venv from an empty folder with PYTHONPATH unset.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from lab import build, paths, registry
from lab.product import PRODUCT

pytestmark = pytest.mark.xdist_group("test_install")  # one install, shared by the module's tests

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
TABLES = ("FWD", "DECODE", "BWD", "MASKED_FWD", "MASKED_BWD")

PROBE = r"""
import json, sys
from pathlib import Path
import numpy as np
import torch
import lab, lab.ops, lab.paths, lab.ring, lab.integrations.transformers
from lab import build, registry
loaded = sorted(m for m in sys.modules if m == "lab" or m.startswith("lab."))
out = {"lab": lab.__file__, "installed": lab.paths.INSTALLED, "kernels": str(lab.paths.KERNELS),
       "cache": str(lab.paths.CACHE), "loaded": loaded,
       "binding": (Path(build.__file__).parent / "binding.cpp").is_file(),
       "files": sorted(p.relative_to(lab.paths.KERNELS).as_posix() for p in lab.paths.KERNELS.rglob("*") if p.is_file()),
       "hashes": {f"{t}/{v}": build.source_hash(k.source) for t in TABLES for v, k in getattr(registry, t).items()}}
q = torch.randn(1, 2, 40, 64, dtype=torch.float16)
try:
    lab.ops.attention(q, q, q)
    out["cpu_call"] = "no error"
except Exception as error:
    out["cpu_call"] = f"{type(error).__name__}: {error}"
from lab.ring.attention import emulate_ring  # the product's CPU path: the ring over lab.reference's float64 math
q, k, v = (torch.randn(2, 4, 40, 32, dtype=torch.float64) for _ in range(3))
ring = emulate_ring(q, k, v, world=2, is_causal=True)
sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
out["ring_error"] = float((ring - sdpa).abs().max())
import lab.emulate  # the notebook's NumPy emulation ships too (the CPU error points at it)
a = np.random.default_rng(0).standard_normal((1, 2, 70, 64)).astype(np.float32)
tiled, _ = lab.emulate.flash_forward_emulated(a, a, a, is_causal=True, block_m=16, block_n=16)
out["emulate_error"] = float(np.abs(tiled - lab.emulate.attention_reference(a, a, a, is_causal=True)[0]).max())
print(json.dumps(out))
""".replace("TABLES", repr(TABLES))


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LAB_CACHE_DIR", "LAB_CACHE", "VIRTUAL_ENV")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(probe's JSON answer, the venv's site-packages) of `pip install .` in a fresh venv."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    for name in ("lab", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "parent.pth").write_text(str(Path(torch.__file__).resolve().parents[1]) + "\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", str(src)], cwd=tmp, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    work = tmp / "work"
    work.mkdir()
    probe = subprocess.run([str(python), "-c", PROBE], cwd=work, env=_env(XDG_CACHE_HOME=str(tmp / "xdg")),
                           capture_output=True, text=True, timeout=180)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    return json.loads(probe.stdout.splitlines()[-1]), site, tmp


def test_the_installed_package_is_imported(installed):
    answer, site, _ = installed
    assert Path(answer["lab"]).is_relative_to(site), f"lab came from {answer['lab']}, not the venv's {site}"
    assert answer["installed"] is True


def test_kernel_sources_are_found_inside_the_installed_package(installed):
    answer, site, _ = installed
    assert Path(answer["kernels"]) == site / "lab" / "_sources" / "kernels"
    assert answer["binding"], "lab/binding.cpp is missing from the installed package"
    checkout = sorted(p.relative_to(paths.KERNELS).as_posix() for p in paths.KERNELS.rglob("*")
                      if p.is_file() and p.suffix != ".md"
                      and not any(part.startswith(".") for part in p.relative_to(paths.KERNELS).parts))
    assert answer["files"] == checkout  # every CUDA source and header of kernels/, nothing else


def test_installed_kernels_hash_as_in_the_checkout(installed):
    """Each registry kernel's include closure resolves inside the package, under the checkout's relative paths:
    the same source hash (and so the same cache key) as a build from the checkout."""
    answer, _, _ = installed
    here = {f"{t}/{v}": build.source_hash(k.source) for t in TABLES for v, k in getattr(registry, t).items()}
    assert answer["hashes"] == here


def test_installed_cache_defaults_outside_the_package(installed):
    answer, _, tmp = installed
    assert Path(answer["cache"]) == tmp / "xdg" / "lab"  # no LAB_CACHE_DIR: $XDG_CACHE_HOME/lab


def test_a_cpu_call_raises_the_labs_error(installed):
    answer, _, _ = installed
    assert answer["cpu_call"].startswith("ValueError: query must be on a CUDA device"), answer["cpu_call"]


def test_the_cpu_paths_run_installed(installed):
    answer, _, _ = installed
    assert answer["ring_error"] < 1e-12, answer["ring_error"]
    assert answer["emulate_error"] < 1e-5, answer["emulate_error"]


def test_importing_the_public_calls_loads_only_the_product(installed):
    answer, _, _ = installed
    assert set(answer["loaded"]) <= PRODUCT, sorted(set(answer["loaded"]) - PRODUCT)


# ------------------------------------------------------------------ pyproject.toml against the tree

def test_every_package_of_lab_is_listed():
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lab").rglob("__init__.py")
                if "__pycache__" not in p.parts}
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == packages | {"lab._sources.kernels"}


def test_the_notebook_extra_mirrors_requirements():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert PYPROJECT["project"]["optional-dependencies"]["notebook"] == [line for line in lines if line]


def test_the_product_needs_torch_and_numpy_only():
    assert PYPROJECT["project"]["dependencies"] == ["torch", "numpy"]
    assert PYPROJECT["build-system"]["build-backend"] == "setuptools.build_meta"
