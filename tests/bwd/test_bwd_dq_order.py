"""The Hopper backward's dQ hand-off (common/hopper/attn_bwd_sm90.cuh: reduce_dq and convert_dq), walked on the CPU.

Each consumer warpgroup holds a 64 x 64 fp32 dQ partial in the wgmma accumulator layout: thread wt of the group,
in warp wt / 32 with (g, t) = (lane / 4, lane % 4), holds d[4 i + e] = row 16 (wt / 32) + g + 8 (e / 2), column
8 i + 2 t + e % 2. reduce_dq stores register quad i of thread wt at float index (i * 128 + wt) * 4 of its part
of the block (D = 128: part = warpgroup, its 64 columns; D = 64: one part that both warpgroups add into), and
convert_dq reads the block back quad by quad. These tests run both index maps over every thread and register
and check that each element of the 64 x D block is written once per warpgroup and read back at its own row
and column; with Cfg's kDqByColumns (v07) D = 64 splits by columns too, each warpgroup a 64 x 32 part (m64n32:
16 registers, quads i < 4; its two parts, one after the other, land where D = 64's single 64-column part does); a planted bug (the two row halves of a quad swapped in the convert) must fail. The GPU tests
(tests/bwd/test_backward_gpu.py) and chapter n10 check the kernel itself.
"""
import pytest


def kernel_writes(D: int, by_columns: bool = False):
    """{float index in the 64-row block: [(row, col), ...]} as reduce_dq's stores place each warpgroup's
    accumulator (D = 128: warpgroup w owns columns 64 w..; D = 64: both own all 64, over their own keys)."""
    split = D == 128 or by_columns
    cols = D // 2 if split else D  # Cfg::kDqCols
    out = {}
    for wg in range(2):
        for slot, row, col in accumulator_slots(cols):
            out.setdefault((wg * 64 * cols if split else 0) + slot, []).append((row, (cols * wg if split else 0) + col))
    return out


def accumulator_slots(cols: int):
    """(float index in accumulator order, row, column) of every element of one warpgroup's 64 x cols partial."""
    for wt in range(128):
        warp, lane = divmod(wt, 32)
        g, t = divmod(lane, 4)
        for i in range(cols // 8):
            for e in range(4):
                yield (i * 128 + wt) * 4 + e, 16 * warp + g + 8 * (e >> 1), 8 * i + 2 * t + (e & 1)


def convert_reads(D: int, swap_halves: bool = False, by_columns: bool = False):
    """{float index: (row, col)} as convert_dq maps each float4 of a block back to (row, col)."""
    split = D == 128 or by_columns
    cols = D // 2 if split else D
    out = {}
    for quad in range(64 * D // 4):
        part, rest = divmod(quad, 16 * cols)  # kPartQuads
        r4, wt = divmod(rest, 128)
        warp, lane = divmod(wt, 32)
        g, t = divmod(lane, 4)
        row = 16 * warp + g
        col = (part * cols if split else 0) + 8 * r4 + 2 * t
        first, second = (row + 8, row) if swap_halves else (row, row + 8)
        for e, (r, c) in enumerate(((first, col), (first, col + 1), (second, col), (second, col + 1))):
            out[4 * quad + e] = (r, c)
    return out


@pytest.mark.parametrize("D, by_columns", [(64, False), (128, False), (64, True)])
def test_every_element_goes_out_and_comes_back_at_its_place(D, by_columns):
    writes, reads = kernel_writes(D, by_columns), convert_reads(D, by_columns=by_columns)
    assert sorted(writes) == list(range(64 * D)) == sorted(reads)  # the block, nothing outside it
    for index, placed in writes.items():
        assert all(p == reads[index] for p in placed), (index, placed, reads[index])
    assert sorted(reads.values()) == [(r, c) for r in range(64) for c in range(D)]  # a bijection onto 64 x D


@pytest.mark.parametrize("D, by_columns", [(64, False), (128, False), (64, True)])
def test_warpgroups_add_once_each(D, by_columns):
    counts = {len(placed) for placed in kernel_writes(D, by_columns).values()}
    # split by columns (D = 128, or v07's D = 64): one write per element; by keys: both add their keys' share
    assert counts == ({1} if D == 128 or by_columns else {2})


def test_swapped_row_halves_in_the_convert_fail():
    writes, reads = kernel_writes(128), convert_reads(128, swap_halves=True)
    assert any(p != reads[i] for i, placed in writes.items() for p in placed)



def row_split_writes(D: int = 64, row_offset: bool = True):
    """{float index from the step's first row: [(row, col)]} as red_dq places v13's partials (Cfg's kDqByRows,
    B_r = 128): warpgroup w holds queries 64 w.. of the step, all D columns (kDqCols = D), and its offset
    wg * 64 * kDqCols is the next 64-row block of the accumulator order."""
    out = {}
    for wg in range(2):
        for slot, row, col in accumulator_slots(D):
            out.setdefault((wg * 64 * D if row_offset else 0) + slot, []).append((64 * wg + row, col))
    return out


def test_row_split_lands_in_two_blocks_the_convert_reads_back():
    writes = row_split_writes()
    block = convert_reads(64)  # convert_dq of kDqCols = D: one part per 64-row block
    reads = {b * 64 * 64 + i: (64 * b + r, c) for b in range(2) for i, (r, c) in block.items()}
    assert sorted(writes) == list(range(128 * 64)) == sorted(reads)
    assert all(len(placed) == 1 and placed[0] == reads[i] for i, placed in writes.items())


def test_row_split_without_the_block_offset_fails():
    writes = row_split_writes(row_offset=False)
    assert max(writes) < 64 * 64 and any(len(placed) == 2 for placed in writes.values())
