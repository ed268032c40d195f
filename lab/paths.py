"""Where things live. Every cache goes under one folder, LAB_CACHE_DIR (default: <checkout>/.cache, ignored by
git), never under $HOME: the kernel libraries, the compile checks, the torch binding (TORCH_EXTENSIONS_DIR),
matplotlib's and Jupyter's. Pointing it elsewhere lets a read-only or shared checkout build and run."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
CHAPTERS = ROOT / "chapters"
OUTPUTS = Path(os.environ.get("LAB_OUTPUTS", ROOT / "outputs"))
# LAB_CACHE is the variable's older name, still read so existing scripts keep their cache
CACHE = Path(os.environ.get("LAB_CACHE_DIR") or os.environ.get("LAB_CACHE") or ROOT / ".cache")


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
