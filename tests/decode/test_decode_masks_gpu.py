"""GPU tests of lab.ops.decode's masks (lab.decode.masks; decode v03, v06-v08): window, softcap, sinks and all three,
contiguous and paged (pages 16 / 64), q_len 1 and 4 causal, GQA 8:1 and 1:1, lengths 0, 1, shorter than the window
and uneven, every head dim, forced split counts, against float64 (lab.decode.mask_checks, lab.check's rule); the
wrong build LAB_DECODE_BUG_SINK_PER_SPLIT must fail; named versions without mask steps raise; a captured graph
replays with new lengths. Marked `gpu`: skipped without CUDA (tests/conftest.py).

Run: python -m pytest -q tests/decode/test_decode_masks_gpu.py (76 passed on an H200, with 8 of them under
compute-sanitizer memcheck, 0 errors: outputs/driver_logs/20261129-h200-batch2-f58d500e62/T3; after the softcap's
tanh.approx, 39 of them again: outputs/driver_logs/20261129-h200-batch3-7152d73448/T3)
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lab import graphs, ops, registry
from lab.decode import mask_checks as mc
from lab.decode import masks

pytestmark = pytest.mark.gpu

FULL = mc.cases((128,))
WIDE = [c for D in (64, 80, 96, 192, 256) for c in mc.cases((D,))
        if c.name.startswith(("all-q4", "win128c-q4-p16", "sinks-q4-c", "softcap-p64", "win-wide"))]


@pytest.mark.parametrize("case", FULL + WIDE, ids=lambda c: c.name)
def test_masked_case(case):
    row = mc.check_case(case)
    assert row["passed"], row


@pytest.mark.parametrize("splits", [1, 4, 37, ops.MAX_NUM_SPLITS])
@pytest.mark.parametrize("name", ["all-q4-p16-D128", "win128c-q4-c-D128", "sinks-q4-p64-D128"])
def test_forced_split_counts(name, splits):
    case = next(c for c in FULL if c.name == name)
    row = mc.check_case(case, num_splits=splits, trials=1)
    assert row["passed"], row


@pytest.mark.parametrize("version", ["v03", "v06", "v07"])
def test_named_masked_versions(version):
    case = next(c for c in FULL if c.name == "all-q4-p16-D128")
    row = mc.check_case(case, version=version, trials=1)
    assert row["passed"], row


BIG_SINK = mc.MaskCase("bug-sinks", 4, 32, 4, 1, 2048, 128, (2048, 1500, 700, 300), window=(128, -1), sinks=True,
                       sink_shift=5.0)


def test_sinks_per_split_build_fails():
    """The wrong build (the sink in every split's partial) fails the same check that the right build passes, on
    the same path (the binding, 4 splits)."""
    right = mc.check_case(BIG_SINK, num_splits=4, version="v07", defines={}, trials=1)
    assert right["passed"], right
    wrong = mc.check_case(BIG_SINK, num_splits=4, version="v07", defines={"LAB_DECODE_BUG_SINK_PER_SPLIT": 1},
                          trials=1)
    assert not wrong["passed"], wrong


@pytest.mark.parametrize("version", ["v01", "v02", "v04", "v05"])
def test_versions_without_mask_steps_raise(version):
    case = next(c for c in FULL if c.name == "sinks-q4-c-D128")
    with pytest.raises(ValueError, match="has no window, softcap or sinks"):
        mc.check_case(case, version=version, trials=1)


def test_the_window_only_shrinks_the_plan():
    q = torch.randn(8, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    plain = masks._v03_plan(q, 8, 16384, None, None, True)[1]
    windowed = masks._plan(q, 8, masks.window_span(16384, 1, 128), None, None, True)[1]
    assert windowed <= plain


def test_graph_replays_with_new_lengths():
    """A masked paged call captured once replays with new cache_seqlens (the window's first key moves on the
    device) and matches an eager call bit for bit."""
    case = dataclasses.replace(next(c for c in FULL if c.name == "all-q4-p16-D128"), lengths=(1537, 900, 0, 1, 64, 700))
    a = mc.inputs(case, 3)
    seqlens = a["seqlens"].clone()
    flags = torch.zeros(case.B, dtype=torch.int32, device="cuda")
    kw = dict(block_table=a["table"], is_causal=True, window_size=case.window, softcap=case.softcap, sinks=a["sinks"])
    graph, out = graphs.capture(lambda: ops.decode(a["q"], a["k_pages"], a["v_pages"], seqlens, page_errors=flags,
                                                   **kw))
    for lengths in [(5, 1537, 1400, 200, 0, 77), (1537,) * 6]:
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        eager = ops.decode(a["q"], a["k_pages"], a["v_pages"], seqlens.clone(), page_errors=torch.zeros_like(flags),
                           **kw)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), lengths
        row = mc.check_case(dataclasses.replace(case, lengths=lengths), trials=1, seed=3)
        assert row["passed"], row


def test_default_paged_call_without_page_errors():
    case = next(c for c in FULL if c.name == "all-q4-p64-D128")
    a = mc.inputs(case, 0)
    out = ops.decode(a["q"], a["k_pages"], a["v_pages"], a["seqlens"], block_table=a["table"], is_causal=True,
                     window_size=case.window, softcap=case.softcap, sinks=a["sinks"])
    ops.check_page_errors()
    ref = mc.masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], case.D ** -0.5, torch.float64)
    eager = mc.masked_math(a["q"], a["k"], a["v"], case.lengths, case, a["sinks"], case.D ** -0.5, torch.bfloat16)
    from lab import check
    assert check.compare(out, ref, eager)["passed"]


def test_masked_default_at_every_head_dim_is_a_masked_kernel():
    for D in registry.DECODE_HEAD_DIMS:
        q = torch.randn(2, 8, 1, D, device="cuda", dtype=torch.bfloat16)
        name, _ = masks._plan(q, 2, 1024, None, None, False)
        assert name in masks.MASK_VERSIONS
