"""What the chapter generators (tests/cuda/*_make_chapter.py) share: cells appended in order, written as a
clean notebook (sources only, no outputs) with stable cell ids, so regenerating a chapter gives no diff."""
from __future__ import annotations

import json
from pathlib import Path

CHAPTERS = Path(__file__).resolve().parents[2] / "chapters"


class Chapter:
    def __init__(self, name: str):
        self.name, self.cells = name, []  # name: the notebook's stem, e.g. "n11_paged_decode"

    def md(self, text: str) -> None:
        self.cells.append({"cell_type": "markdown", "metadata": {}, "source": text.strip("\n")})

    def code(self, text: str, tags=None) -> None:
        self.cells.append({"cell_type": "code", "metadata": {"tags": tags} if tags else {}, "execution_count": None,
                           "outputs": [], "source": text.strip("\n")})

    def write(self) -> Path:
        prefix = self.name.split("_")[0]
        cells = []
        for i, cell in enumerate(self.cells):
            lines = [line + "\n" for line in cell["source"].split("\n")]
            lines[-1] = lines[-1].rstrip("\n")
            cells.append({**cell, "id": f"{prefix}-{i:02d}", "source": lines})
        nb = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                          "name": "python3"}, "language_info": {"name": "python"}},
              "nbformat": 4, "nbformat_minor": 5}
        path = CHAPTERS / f"{self.name}.ipynb"
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        return path
