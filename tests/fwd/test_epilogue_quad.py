"""The lane exchange of common/hopper/attn_fwd_sm90.cuh's epilogue_direct (LAB_EPILOGUE_QUAD), walked on the CPU.

One warp holds a 16 x D block of O in the wgmma accumulator layout: lane (g, t) = (lane / 4, lane % 4) holds,
for each 8-column block i and row half hh, the pair of columns 8 i + 2 t, + 1 of row g + 8 hh (one 32-bit word
once packed). The kernel swaps words between lanes t and t ^ 1 (QUAD = 1, 8-byte stores) and then t ^ 2
(QUAD = 2, 16-byte stores) with the selects written below; these tests run the same selects over a simulated
warp and check that every element lands exactly once, at its own row and column, inside an aligned store.
The GPU tests (tests/fwd/test_hopper_gpu.py) run the kernel itself.
"""
import pytest


def words(lane, block, hh):
    """The two (row, col) elements of a lane's packed word for an 8-column block and row half."""
    g, t = divmod(lane, 4)
    return ((g + 8 * hh, 8 * block + 2 * t), (g + 8 * hh, 8 * block + 2 * t + 1))


def shuffle_xor(values, mask):
    return {lane: values[lane ^ mask] for lane in values}


def stores(mode: int, head_dim: int, reversed_select: bool = False, narrow: int | None = None,
           narrow_test=lambda c0, d: c0 < d):
    """[(row, first col, width in elements, elements)] as the kernel issues them for one warp (reversed_select:
    the first exchange sends the word it should keep, a planted bug). narrow: a Narrow<C> call's true head dim
    (the kernel's width is head_dim); a store goes out when narrow_test(its block's first column, narrow) holds,
    the kernel's narrow_stores."""
    out = []
    keep = (lambda col: True) if narrow is None else (lambda col: narrow_test(col - col % 8, narrow))
    for hh in range(2):
        for a in range(head_dim // 32):
            c = {lane: [words(lane, 4 * a + j, hh) for j in range(4)] for lane in range(32)}
            for m in range(2):  # lanes t and t ^ 1
                x = shuffle_xor({lane: c[lane][2 * m] if bool(lane & 1) != reversed_select else c[lane][2 * m + 1]
                                 for lane in c}, 1)
                for lane in c:
                    if lane & 1:
                        c[lane][2 * m] = x[lane]
                    else:
                        c[lane][2 * m + 1] = x[lane]
            if mode == 1:
                for lane in c:
                    g, t = divmod(lane, 4)
                    for m in range(2):
                        col = 8 * (4 * a + 2 * m + (t & 1)) + 2 * (t & 2)
                        if keep(col):
                            out.append((g + 8 * hh, col, 4, c[lane][2 * m] + c[lane][2 * m + 1]))
                continue
            for n in range(2):  # lanes t and t ^ 2
                x = shuffle_xor({lane: c[lane][n] if lane & 2 else c[lane][n + 2] for lane in c}, 2)
                for lane in c:
                    if lane & 2:
                        c[lane][n] = x[lane]
                    else:
                        c[lane][n + 2] = x[lane]
            for lane in c:
                g, t = divmod(lane, 4)
                if keep(8 * (4 * a + t)):
                    out.append((g + 8 * hh, 8 * (4 * a + t), 8, sum(c[lane], ())))
    return out


def placed(mode: int, head_dim: int, **kwargs) -> bool:
    """Every element of the stored width (narrow's, else head_dim) stored exactly once, at its own row and
    columns, each store aligned to its width; no column beyond it (the next row of an unpadded O) written."""
    seen = set()
    for row, col, width, elements in stores(mode, head_dim, **kwargs):
        if col % width or list(elements) != [(row, col + k) for k in range(width)] or seen & set(elements):
            return False
        seen.update(elements)
    wanted = kwargs.get("narrow") or head_dim
    return seen == {(r, c) for r in range(16) for c in range(wanted)}


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mode", [1, 2])
def test_every_element_is_stored_once_at_its_own_place(mode, head_dim):
    assert placed(mode, head_dim)
    assert len(stores(mode, head_dim)) == 16 * head_dim // (4 if mode == 1 else 8)  # 8- or 16-byte stores


@pytest.mark.parametrize("mode", [1, 2])
def test_a_reversed_select_is_caught(mode):
    assert not placed(mode, 128, reversed_select=True)


NARROW = [(64, d) for d in (8, 16, 32, 48, 56)] + [(128, d) for d in (72, 80, 96, 112, 120)]


@pytest.mark.parametrize("width,head_dim", NARROW)
@pytest.mark.parametrize("mode", [1, 2])
def test_a_narrow_call_stores_its_own_columns_only(mode, width, head_dim):
    """Narrow<C> (fwd v05 / v07 at a head dim below the kernel's width): O's first head_dim columns, once each."""
    assert placed(mode, width, narrow=head_dim)


@pytest.mark.parametrize("mode", [1, 2])
def test_narrow_store_bugs_are_caught(mode):
    # LAB_FWD_BUG_NARROW_SHORT's test (the last block unwritten), and one that tests the block's end, not its start
    assert not placed(mode, 128, narrow=80, narrow_test=lambda c0, d: c0 + 8 < d)
    assert not placed(mode, 128, narrow=80, narrow_test=lambda c0, d: c0 <= d)
