"""The SDPA backends every kernel is compared with: one list for timing, tables, plots and the log.

BACKENDS are torch's names (forced with torch.nn.attention.sdpa_kernel by lab.bench); a record names a
backend's row `sdpa-<name>` and a kernel row's ratios use the same keys. Order: the usual headline first.
"""
from __future__ import annotations

BACKENDS = ("flash", "cudnn", "efficient", "math", "default")
SDPA = tuple(f"sdpa-{name}" for name in BACKENDS)


def ordered(names) -> list[str]:
    """Backend row names in the standard order, unknown ones after them, sorted."""
    seen = set(names)
    return [b for b in SDPA if b in seen] + sorted(seen - set(SDPA))
