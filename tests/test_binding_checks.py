"""The binding's own argument checks (lab/binding.cpp), on CPU: the real C++ source, built with
LAB_BINDING_CPU_CHECKS (CPU tensors accepted as the kernels' device, nothing launched), called with every bad
direct call of tests/binding_cases.py. The same cases run through the CUDA build in tests/test_gpu.py.

The first run compiles the binding (~20 s on the CPU box); later runs load it from .cache/.
"""
from __future__ import annotations

import hashlib
import re
import shutil

import pytest
import torch

import binding_cases
from lab import build, paths


@pytest.fixture(scope="module")
def cpu_binding():
    if shutil.which("ninja") is None or shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler and ninja to build the binding's CPU check build")
    from torch.utils.cpp_extension import load_inline

    source = (paths.ROOT / "lab" / "binding.cpp").read_text()
    header = (paths.KERNELS / "common" / "params.h").read_text()
    key = hashlib.sha256((source + header + torch.__version__).encode()).hexdigest()[:12]
    folder = paths.ROOT / ".cache" / f"binding_cpu_{key}"
    folder.mkdir(parents=True, exist_ok=True)
    module = load_inline(name=f"lab_binding_cpu_{key}", cpp_sources=[source], extra_cflags=["-O0", "-DLAB_BINDING_CPU_CHECKS"],
                         extra_include_paths=[str(paths.KERNELS)], build_directory=str(folder), verbose=False)
    return build.Binding(module)


def _cases(table):
    return sorted(name for name in table("cpu") if name not in binding_cases.GPU_ONLY)


FAMILIES = {"fwd": (binding_cases.fwd_bad, binding_cases.fwd_args, binding_cases.call_fwd),
            "decode": (binding_cases.decode_bad, binding_cases.dec_args, binding_cases.call_decode)}


@pytest.mark.parametrize("family, what", [(f, w) for f, (bad, _, _) in FAMILIES.items() for w in _cases(bad)])
def test_bad_input_is_named(cpu_binding, family, what):
    bad, make_args, call = FAMILIES[family]
    change, pattern = bad("cpu")[what]
    args = make_args("cpu")
    args.update(change(args))
    with pytest.raises(RuntimeError, match=pattern):
        call(cpu_binding, 0, args)


def test_good_calls_pass_every_check(cpu_binding):
    """A good call, and the layouts the binding copies instead of refusing (expanded K/V, a size-1 dim with
    an odd stride, an odd data offset, an out with rows 65 elements apart), get through the checks."""
    binding_cases.call_fwd(cpu_binding, 0, binding_cases.fwd_args("cpu"))
    binding_cases.call_decode(cpu_binding, 0, binding_cases.dec_args("cpu"))
    a = binding_cases.fwd_args("cpu", B=3, Sq=1)
    a["k"], a["v"] = a["k"][:1].expand(3, 2, 70, 64), a["v"][:1].expand(3, 2, 70, 64)
    a["q"] = torch.as_strided(a["q"].clone(), (3, 4, 1, 64), (4 * 64, 64, 7, 1))
    a["o"] = torch.empty(3, 4, 1, 65, dtype=torch.float16)[..., :64]
    binding_cases.call_fwd(cpu_binding, 0, a)
    flat = torch.randn(1 + 2 * 4 * 65 * 64, dtype=torch.float16)
    b = binding_cases.fwd_args("cpu")
    b["q"] = flat[1:].view(2, 4, 65, 64)
    binding_cases.call_fwd(cpu_binding, 0, b)


def test_every_message_names_an_argument():
    """Each pattern names the argument it is about, so a failing direct call says what to fix."""
    names = ("query", "key", "value", "out", "lse", "scale", "num_splits", "partial_o", "partial_lse",
             "cache_seqlens", "head dim")
    for table in (binding_cases.fwd_bad, binding_cases.decode_bad):
        for what, (_, pattern) in table("cpu").items():
            assert any(re.search(re.escape(n), pattern) for n in names), (what, pattern)
