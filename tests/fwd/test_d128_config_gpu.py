"""fwd v07's two D = 128 configs on both sides of the padding rule (kernels/fwd/v07_overlap.cu, SHORT_PAD_MAX_SK):
non-causal calls with more than 2048 keys take the few-keys config (B_c 128, persistent) where it pads S_k by 1 %
less than the long config's B_c 176, and the long one otherwise. Key counts at each switch
(lab.fwd.tile_race.d128_config names the config each takes) through the public op, fp16 and bf16, GQA, partial
query tiles, against float64 (lab.check).

Marked `gpu` (skipped without CUDA); both configs are Hopper's, so other GPUs skip.
"""
from __future__ import annotations

import pytest
import torch

from lab import cases, check, ops
from lab.fwd import tile_race

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _isolated_records(session_dir):
    return session_dir


@pytest.mark.parametrize("Sk", [2112, 2113, 2176, 2177, 3500, 4000, 4096, 4097])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_both_configs_at_the_padding_rule_switches(Sk, dtype):
    if tuple(torch.cuda.get_device_capability()) != (9, 0):
        pytest.skip("fwd v07 runs on compute capability 9.0 only")
    case = cases.Case(f"d128-rule-{Sk}-{tile_race.d128_config(130, Sk, False)}", 2, 4, 2, 130, Sk, 128, dtype, False)
    q = torch.empty(case.B, case.Hq, case.Sq, 128, device="cuda", dtype=getattr(torch, dtype))
    assert ops.attention_version(q, is_causal=False) == "v07"

    def run(q, k, v, is_causal, scale, out):
        out.copy_(ops.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=True))
    result = check.check_forward(run, case, "lab.ops.attention", trials=2)
    assert result.passed, repr(result)
