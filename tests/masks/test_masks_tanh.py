"""bwd v08's softcap tanh on fp16 pairs is taken by bf16 calls alone (kernels/common/hopper/attn_bwd_mask_sm90.cuh
kTanhHalfFor): the PTX of every fp16 kernel is the same whether LAB_BWD_MASK_TANH_HALF is on (the default) or off,
so fp16 keeps tanh.approx.f32 exactly as before; the bf16 softcap kernels change, and only they hold the pair
instruction. Needs nvcc (no GPU). The default's PTX is the compile gate's own (lab.build.ptx keeps it beside the
gate's cubin); the switched-off build is one nvcc -ptx run, cached with it."""
from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from lab import build

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
PAIR = "tanh.approx.f16x2"


def _entries(switch: int) -> dict[str, str]:
    """{kernel entry name: PTX code} of bwd v08 built for sm_90a with LAB_BWD_MASK_TANH_HALF=switch; 1 is the default,
    built without the define (the gate's build). The line table is left out: the code is compared."""
    return build.ptx_entries(build.ptx_code(build.ptx("bwd/v08_masks.cu", "sm_90a",
                                                      None if switch else {"LAB_BWD_MASK_TANH_HALF": 0})))


@pytest.fixture(scope="module")
def builds():
    with ThreadPoolExecutor(2) as pool:
        on, off = pool.map(_entries, (1, 0))
    return on, off


def _softcap_steps(name: str) -> bool:
    """A backward kernel instantiated with WindowSteps<kSoftcap = true, ...>, or the packed sequences' in-place
    kernel bwd_dkdv_packed<Cfg, T, kSoftcap = true, kTanhHalf>."""
    return "WindowStepsILb1E" in name or re.search(r"bwd_dkdv_packed.*(?:__nv_bfloat16|6__half)Lb1E", name) is not None


def test_fp16_keeps_the_f32_tanh(builds):
    on, off = builds
    fp16 = [n for n in on if "6__half" in n]
    assert len(fp16) >= 8 and sum(map(_softcap_steps, fp16)) >= 4  # D 64 and 128, softcap on/off, dense/packed
    assert sorted(fp16) == sorted(n for n in off if "6__half" in n)
    for name in fp16:
        assert on[name] == off[name], name  # the same code, instruction for instruction
        assert PAIR not in on[name], name
    assert any("tanh.approx.f32" in on[n] for n in fp16 if _softcap_steps(n))


def test_bf16_softcap_takes_the_pair(builds):
    on, off = builds
    bf16 = [n for n in on if "__nv_bfloat16" in n]
    capped = [n for n in bf16 if _softcap_steps(n)]
    assert len(capped) >= 4
    for name in capped:
        assert PAIR in on[name], name
        assert "tanh.approx.f32" not in on[name], name
    assert not any(PAIR in body for body in off.values())  # switched off: no kernel holds it
    for name in bf16:  # kernels without the softcap step are untouched by the switch
        if not _softcap_steps(name):
            assert PAIR not in on[name], name
