"""The D 128 forward's last key tile on the GPU: non-causal calls with more than 2048 keys run fwd v07's long config
(B_c = 176), whose last tile holds S_k mod 176 keys; with LAST_N (kernels/fwd/v07_overlap.cu) a last tile of at most
LAST_N keys runs at that wgmma width. Key counts on both sides of each boundary (1, 48, 64, 65 keys left; a whole
last tile) through the public op, fp16 and bf16, GQA, against float64 (lab.check).

Marked `gpu` (skipped without CUDA); the long config is Hopper's, so other GPUs skip.
"""
from __future__ import annotations

import pytest
import torch

from lab import cases, check, ops

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    return session_dir


@pytest.mark.parametrize("Sk", [12 * 176 + 1, 12 * 176 + 48, 12 * 176 + 64, 12 * 176 + 65, 13 * 176, 4096])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_last_key_tile_of_the_long_config(Sk, dtype):
    if tuple(torch.cuda.get_device_capability()) != (9, 0):
        pytest.skip("fwd v07's long config runs on compute capability 9.0 only")
    case = cases.Case(f"last-tile-{Sk}", 2, 4, 2, 130, Sk, 128, dtype, False)
    q = torch.empty(case.B, case.Hq, case.Sq, 128, device="cuda", dtype=getattr(torch, dtype))
    assert ops.attention_version(q, is_causal=False) == "v07"

    def run(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True))
    result = check.check_forward(run, case, "lab.ops.attention", trials=2)
    assert result.passed, repr(result)
