"""fwd v11's persistent packed order (lab.masks.packed_order, the kernel's PackedOrder written out): every packed
query tile once, v07's PAIR for one length, and the key tiles per CTA."""
import pytest

from lab.fwd import work_order
from lab.masks import packed_order
from lab.masks.gpu_varlen import DOCS12, DOCS_MIXED

LENGTH_SETS = [[2048] * 8, DOCS12, DOCS_MIXED, [0, 5, 1025, 63, 0, 300, 128, 129], [2000, 1, 3, 130, 0, 257],
               [1], [0, 0, 1], [129] * 3, [384, 128, 256]]


@pytest.mark.parametrize("lens", LENGTH_SETS)
@pytest.mark.parametrize("heads,grid", [(16, 132), (4, 132), (3, 5), (1, 1)])
def test_every_packed_tile_is_taken_exactly_once(lens, heads, grid):
    grid = min(grid, packed_order.units(lens, heads)) or 1
    want = sorted((b, h, mb) for b, n in enumerate(lens) for h in range(heads) for mb in range(-(-n // 128)))
    order = packed_order.packed_pair_order(lens, heads, grid)
    assert sorted(t for tiles in order for t in tiles) == want


def test_one_length_is_v07_pair():
    """8 x 2048 with 16 heads: the same tiles per CTA, in the same order, as the dense default's PAIR."""
    packed = packed_order.packed_pair_order([2048] * 8, 16, 132)
    dense = work_order.pair_order(16, 8 * 16, 132)
    assert [[(b * 16 + h, mb) for b, h, mb in tiles] for tiles in packed] == dense


def test_balance():
    """Key tiles per CTA (causal, 132 CTAs): one length within 4 % of the mean (8 units of 17 at most against 7.76),
    the twelve documents within 17 % (the static order's weak side: a round straddling two documents gives its
    first CTAs the one and its last the other)."""
    for lens, limit in (([2048] * 8, 1.04), (DOCS12, 1.17)):
        tiles = packed_order.causal_key_tiles(packed_order.packed_pair_order(lens, 16, 132))
        assert max(tiles) / (sum(tiles) / len(tiles)) < limit, (lens, max(tiles), sum(tiles) / len(tiles))
