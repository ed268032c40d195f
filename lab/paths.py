"""Where things live. Every cache goes under one folder, LAB_CACHE_DIR (default: <checkout>/.cache, ignored by
git; in a checkout never under $HOME): the kernel libraries, the compile checks, the torch binding (TORCH_EXTENSIONS_DIR),
matplotlib's and Jupyter's. Pointing it elsewhere lets a read-only or shared checkout build and run.

Run from the checkout, the kernel sources are its kernels/. Installed (`pip install .`, pyproject.toml), they are a
copy inside the package, lab/_sources/kernels/: ROOT is then lab/_sources, so nvcc runs with the same relative
paths and include folder as in the checkout, and the kernels build on first use. An installed lab has no checkout
to hold its cache: LAB_CACHE_DIR, else $XDG_CACHE_HOME/lab (~/.cache/lab), the place a library's users expect.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = PACKAGE.parent
INSTALLED = not (_CHECKOUT / "kernels" / "common").is_dir() and (PACKAGE / "_sources" / "kernels").is_dir()
ROOT = PACKAGE / "_sources" if INSTALLED else _CHECKOUT
KERNELS = ROOT / "kernels"
CHAPTERS = ROOT / "chapters"
OUTPUTS = Path(os.environ.get("LAB_OUTPUTS", ROOT / "outputs"))
_DEFAULT_CACHE = (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lab" if INSTALLED
                  else ROOT / ".cache")
# LAB_CACHE is the variable's older name, still read so existing scripts keep their cache
CACHE = Path(os.environ.get("LAB_CACHE_DIR") or os.environ.get("LAB_CACHE") or _DEFAULT_CACHE)


def relative(path: Path | str) -> str:
    """A path as the reader should see it: relative to the repository when inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def setup_cache_env() -> None:
    """Point torch extensions, matplotlib and Jupyter caches under CACHE unless the user chose."""
    defaults = {
        "TORCH_EXTENSIONS_DIR": CACHE / "torch_extensions",
        "MPLCONFIGDIR": CACHE / "matplotlib",
        "JUPYTER_RUNTIME_DIR": CACHE / "jupyter_runtime",
    }
    for name, path in defaults.items():
        if name not in os.environ:
            path.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(path)
