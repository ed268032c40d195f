"""Where things live. Every cache stays inside the repository (ignored), never under $HOME."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
CHAPTERS = ROOT / "chapters"
OUTPUTS = Path(os.environ.get("LAB_OUTPUTS", ROOT / "outputs"))
CACHE = Path(os.environ.get("LAB_CACHE", ROOT / ".cache"))


def relative(path: Path | str) -> str:
    """A path as the reader should see it: relative to the repository when inside it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def setup_cache_env() -> None:
    """Point torch extensions, matplotlib and Jupyter caches into .cache/ unless the user chose."""
    defaults = {
        "TORCH_EXTENSIONS_DIR": CACHE / "torch_extensions",
        "MPLCONFIGDIR": CACHE / "matplotlib",
        "JUPYTER_RUNTIME_DIR": CACHE / "jupyter_runtime",
    }
    for name, path in defaults.items():
        if name not in os.environ:
            path.mkdir(parents=True, exist_ok=True)
            os.environ[name] = str(path)
