"""What a profile launches: the target (fwd:<version>, decode:<version>, bwd:<version>, op:attention, op:decode,
sdpa:<backend>, sdpa-bwd:<backend>), its case, the kernel source and name filter ncu uses, the call itself, and the floors its
counters are judged against (bytes that must move, useful FLOPs).
"""
from __future__ import annotations

import re

from .. import bench, cases as case_sets, paths

SDPA_KERNELS = {  # kernel-name filters for SDPA's backends (the profiled launch is also inside an NVTX range);
    # flash's split-KV decode path also launches a combine kernel, which the filter leaves out
    "flash": "flash_fwd_(splitkv_)?kernel", "efficient": "fmha|cutlass|attention_kernel", "cudnn": "cudnn|sdpa|fprop",
    "math": ".*", "default": ".*"}
# The same for SDPA's backward (sdpa-bwd:<backend>). Its launches come from the autograd engine's thread, outside
# the child's NVTX range, so these filters alone pick the kernel: the first match after the warm-ups.
SDPA_BWD_KERNELS = {"flash": "flash_bwd", "efficient": "fmha|cutlass|attention_kernel|backward",
                    "cudnn": "cudnn|sdpa|bprop|dgrad", "math": ".*", "default": ".*"}
BWD_FAMILIES = ("bwd", "sdpa-bwd")  # targets whose work is the backward's: 2.5x the forward's FLOPs


def find_case(name: str, dtype: str | None = None):
    """A case by name from any published case set; dtype re-types the bench sets (seed sizes stay fp16)."""
    for set_name in ("seed", "bench-fwd", "bench-bwd", "bench-decode", "tests", "decode-tests"):
        kwargs = {"dtype": dtype} if dtype and set_name.startswith("bench") else {}
        for case in case_sets.by_name(set_name, **kwargs):
            if case.name == name:
                return case
    grid = re.fullmatch(r"fwd-d(\d+)-s(\d+)(-c)?", name)  # a bench-fwd cell at a length off the default list
    if grid:
        for case in case_sets.bench_fwd_cases(dtype or "bfloat16", head_dims=(int(grid[1]),), seqlens=(int(grid[2]),)):
            if case.name == name:
                return case
    raise ValueError(f"case {name!r} is in no case set of lab.cases")


def parse_target(target: str) -> tuple[str, str]:
    family, _, name = target.partition(":")
    if family not in ("fwd", "decode", "bwd", "op", "sdpa", "sdpa-bwd") or not name:
        raise ValueError(f"target {target!r}: use fwd:<version>, decode:<version>, bwd:<version>, op:attention, "
                         f"op:decode, sdpa:<backend> or sdpa-bwd:<backend>")
    from .. import ops, registry

    table = {"fwd": ops.FWD, "decode": ops.DECODE, "bwd": registry.BWD, "op": {"attention": 1, "decode": 1},
             "sdpa": {b: 1 for b in bench.BACKENDS}, "sdpa-bwd": {b: 1 for b in bench.BACKENDS}}[family]
    if name not in table:
        raise ValueError(f"target {target!r}: {name!r} is not one of {sorted(table)}")
    return family, name


def kernel_source(target: str, case) -> str | None:
    """The .cu file whose kernel the target launches (None for SDPA)."""
    from .. import ops

    family, name = parse_target(target)
    if family == "fwd":
        return ops.FWD[name].source
    if family == "decode":
        return ops.DECODE[name].source
    if family == "bwd":
        from ..registry import BWD

        return BWD[name].source
    if family == "op" and name == "attention":  # the kernel lab.ops.attention picks on this GPU
        import torch

        capability = tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else (0, 0)
        return ops.FWD[ops.default_attention_version(case.D, case.Sq, case.causal, capability)].source
    if family == "op":
        return ops.DECODE[ops.default_decode_version(case.Hq, case.Hkv, case.q_len)].source
    return None


_INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)
_GLOBAL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")


def kernel_regex(target: str, case) -> str:
    """The name filter: the __global__ functions defined in the target's own .cu (not its headers)."""
    source = kernel_source(target, case)
    if source is None:
        family, name = parse_target(target)
        return (SDPA_BWD_KERNELS if family == "sdpa-bwd" else SDPA_KERNELS)[name]
    text = (paths.KERNELS / source).read_text()
    names, level, seen = _GLOBAL.findall(text), [text], set()
    while not names and level:  # a version that instantiates a shared kernel template: the nearest headers that define one
        headers = [h for t in level for h in _INCLUDE.findall(t) if h not in seen and (paths.KERNELS / h).is_file()]
        seen.update(headers)
        level = [(paths.KERNELS / h).read_text() for h in dict.fromkeys(headers)]
        names = [n for t in level for n in _GLOBAL.findall(t)]
    if not names:
        raise ValueError(f"{source} defines no __global__ function to profile")
    return "|".join(sorted(set(names)))


def make_call(target: str, case):
    """A zero-argument call launching the target on fresh inputs for the case (CUDA needed)."""
    from .. import ops, sweep

    family, name = parse_target(target)
    q, k, v, arg = sweep.case_inputs(case)  # arg: is_causal (forward) or cache_seqlens (decode)
    if family == "fwd":
        return ops.fwd_call_factory(name)(q, k, v, arg)
    if family == "decode":
        return ops.decode_call_factory(name)(q, k, v, arg)
    if family == "op":
        return (sweep.public_attention() if name == "attention" else sweep.public_decode())(q, k, v, arg)
    if family in BWD_FAMILIES:
        return _backward_call(family, name, q, k, v, arg)
    runner = bench.sdpa_runner("default", q, k, v, arg if isinstance(arg, bool) else False)

    def sdpa():
        with bench.sdpa_backend(name):
            return runner()
    return sdpa


def _backward_call(family: str, name: str, q, k, v, is_causal: bool):
    """bwd:<version>: the backward launcher called directly (the forward's lse computed once, here);
    sdpa-bwd:<backend>: torch.autograd.grad on SDPA's output, forced to the backend, graph recorded once."""
    import torch

    from .. import ops
    from ..backward.harness import sdpa_step
    from ..backward.op import _bwd_impl
    from ..op_common import _scale

    dout = torch.randn_like(q)
    if family == "sdpa-bwd":
        return sdpa_step(name, "bwd", q, k, v, is_causal, dout)
    gqa = q.shape[1] != k.shape[1]
    with torch.no_grad():
        out, lse = ops.attention(q, k, v, is_causal=is_causal, enable_gqa=gqa, return_lse=True)
    scale = _scale(None, q.shape[-1])
    return lambda: _bwd_impl(dout, q, k, v, out, lse, None, is_causal, scale, False, name)


def byte_floor(case, target: str = "") -> int:
    """Bytes that must move: Q, K, V read once and O written once (decode: bench.decode_bytes); a backward
    target reads Q, K, V, O, dO and writes dQ, dK, dV."""
    if isinstance(case, case_sets.DecodeCase):
        return bench.decode_bytes(case.lengths(), case.Hq, case.Hkv, case.q_len, case.D)
    # per query row: Q read and O written (backward: Q, O, dO read and dQ written); per key row: K and V read
    # (backward: K, V read and dK, dV written); 2 bytes an element
    per_row = 4 if target.partition(":")[0] in BWD_FAMILIES else 2
    return 2 * case.D * per_row * (case.B * case.Hq * case.Sq + case.B * case.Hkv * case.Sk)


def work_flops(case, target: str = "") -> float:
    """Useful FLOPs: the forward's (bench.attention_flops); a backward target 2.5x that, as FlashAttention counts."""
    if isinstance(case, case_sets.DecodeCase):
        return sum(bench.attention_flops(1, case.Hq, case.q_len, n, case.D, False) for n in case.lengths())
    factor = 2.5 if target.partition(":")[0] in BWD_FAMILIES else 1.0
    return factor * bench.attention_flops(case.B, case.Hq, case.Sq, case.Sk, case.D, case.causal)
