"""Kernel registry mechanics shared by every family: the Kernel record, version resolution, launchers.

The tables themselves live in lab.registry (FWD / DECODE, re-exported by lab.ops) and lab.backward.op (BWD); this module
imports neither, so a family's module can register its kernels without importing lab.ops.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import build


@dataclass(frozen=True)
class Kernel:
    source: str
    symbol: str
    head_dims: tuple
    capabilities: tuple = ()  # compute capabilities it runs on, e.g. ((9, 0),) for sm_90a code; () = any sm_80+


_addresses: dict = {}
# Memoised per-call plans of the public ops (lab.ops: launcher addresses keyed by shape and device); they
# hold addresses, so reload() forgets them with _addresses.
plans: dict = {}


def keep_plan(key, plan, table: dict = plans):
    """Memoise a checked call's plan in `table` (lab.ops' plans by default) and return it; the table is cleared
    at 4096 entries, so the shapes a long-lived server sees keep it bounded."""
    if len(table) >= 4096:
        table.clear()
    table[key] = plan
    return plan


def launcher(table: dict, version: str, defines=None) -> int:
    """Build (or load from cache) a kernel and return its launcher address; memoised per process."""
    key = (id(table), version, tuple(sorted(defines.items())) if defines else ())
    address = _addresses.get(key)
    if address is None:
        kernel = table[version]
        address = _addresses[key] = build.build_kernel(kernel.source, defines).address(kernel.symbol)
    return address


def reload() -> None:
    """Forget launcher addresses: the next call rebuilds any kernel whose sources changed."""
    _addresses.clear()
    plans.clear()
    build._loaded.clear()


def resolve_version(version, table: dict, head_dim: int, preference) -> str:
    """`version` (None, an int or a name) checked against `table` and the head dim; None takes the first of
    `preference` that supports the head dim."""
    if version is None:
        for name in preference:
            if name in table and head_dim in table[name].head_dims:
                return name
        raise ValueError(f"head dim {head_dim} is not supported by any kernel "  # of those this preference tries
                         f"(supported: {sorted({d for n in preference if n in table for d in table[n].head_dims})})")
    name = f"v{int(version):02d}" if isinstance(version, int) else str(version)
    if name not in table:
        raise ValueError(f"version={version!r} is unknown; available: {sorted(table)}")
    if head_dim not in table[name].head_dims:
        raise ValueError(f"head dim {head_dim} is not supported by {name} (supported: {list(table[name].head_dims)})")
    return name
