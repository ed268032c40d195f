"""The in-place packed backward's layout (common/hopper/attn_bwd_packed_sm90.cuh, mirrored by
lab.masks.varlen_bwd.packed_layout): every key block of every sequence is exactly one CTA's slot, with at most one
empty slot per sequence; each sequence's workspace rows (padded to 128) lie inside R and apart from the others'."""
import random

import pytest

from lab.masks import varlen_bwd


def _cu(lens):
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return cu


CASES = [[1, 0, 63, 65, 200, 0, 130], [128, 128, 256, 1], [0, 0, 0, 5], [4096, 517, 1900, 2500, 640, 3300],
         [127, 129, 255, 257, 383, 385]]
random.seed(7)
CASES += [[random.choice([0, 1, 64, 127, 128, 129, random.randint(0, 3000)]) for _ in range(random.randint(1, 40))]
          for _ in range(30)]


@pytest.mark.parametrize("lens", CASES)
def test_slots_cover_every_key_block_once(lens):
    cu = _cu(lens)
    lay = varlen_bwd.packed_layout(cu, cu, max(lens), max(lens))
    blocks = [(b, nb) for b, n in enumerate(lens) for nb in range((n + 127) // 128)]
    taken = [m for m in lay["mapping"] if m is not None]
    assert sorted(taken) == blocks
    assert lay["slots"] - len(blocks) <= len(lens)  # the grid's waste: at most one slot per sequence


@pytest.mark.parametrize("lens", CASES)
def test_workspace_rows_apart_and_inside(lens):
    cu = _cu(lens)
    lay = varlen_bwd.packed_layout(cu, cu, max(lens), max(lens))
    spans = [(s["ws"], s["ws"] + (s["sq"] + 127) // 128 * 128) for s in lay["seqs"]]
    for a, b in spans:
        assert a % 128 == 0 and 0 <= a <= b <= lay["rows"]
    for (a0, b0), (a1, _) in zip(spans, spans[1:]):
        assert b0 <= a1  # the next sequence starts after this one's padded rows
    assert lay["rows"] <= sum(lens) + 128 * len(lens)


def test_lengths_clamp_to_max_seqlen():
    lens = [300, 10]
    cu = _cu(lens)
    lay = varlen_bwd.packed_layout(cu, cu, 200, 200)
    assert [s["sq"] for s in lay["seqs"]] == [200, 10]
    assert sorted(m for m in lay["mapping"] if m is not None) == [(0, 0), (0, 1), (1, 0)]


@pytest.mark.parametrize("lens", CASES)
def test_workspace_blocks_lie_in_one_sequence(lens):
    """Each 128-row block of the workspace (a sequence's padded rows are whole ones) and each 64-row block of the block
    convert (LAB_BWD_PACKED_BLOCK_CONVERT) lies wholly inside one sequence's padded rows or inside no sequence's, and
    ws_block's search (the last sequence whose workspace starts at or before the block) names that sequence."""
    cu = _cu(lens)
    layout = varlen_bwd.packed_layout(cu, cu, max(lens + [0]), max(lens + [0]))
    seqs = layout["seqs"]
    for size in (128, 64):
        for rho0 in range(0, layout["rows"], size):
            inside = [b for b, s in enumerate(seqs)
                      if s["ws"] < rho0 + size and rho0 < s["ws"] + -(-s["sq"] // 128) * 128]
            assert len(inside) <= 1
            found = max([b for b, s in enumerate(seqs) if s["ws"] <= rho0], default=0)
            s = seqs[found]
            live = 0 <= rho0 - s["ws"] < -(-s["sq"] // 128) * 128
            assert live == bool(inside) and (not inside or inside == [found])
            if live:
                assert rho0 + size <= s["ws"] + -(-s["sq"] // 128) * 128


def test_default_build_sets_and_restores_the_packed_backwards_build():
    """varlen_bwd.default_build: calls that name no layout or build run as the block says, and the values before come
    back on leaving, an exception included (an A/B that fails must not leave its build as the default)."""
    assert (varlen_bwd.LAYOUT, varlen_bwd.DEFINES) == (None, None)
    with varlen_bwd.default_build("padded", {"X": 1}):
        assert (varlen_bwd.LAYOUT, varlen_bwd.DEFINES) == ("padded", {"X": 1})
        with varlen_bwd.default_build(None, {"Y": 0}):
            assert (varlen_bwd.LAYOUT, varlen_bwd.DEFINES) == (None, {"Y": 0})
        assert varlen_bwd.DEFINES == {"X": 1}
    with pytest.raises(RuntimeError):
        with varlen_bwd.default_build("padded", {"X": 1}):
            raise RuntimeError("the A/B failed")
    assert (varlen_bwd.LAYOUT, varlen_bwd.DEFINES) == (None, None)
