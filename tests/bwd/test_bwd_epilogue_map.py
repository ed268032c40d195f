"""Two index maps of the Hopper backward, walked on the CPU: v12's staged dK/dV epilogue and v11's zigzag tiles.

store_dk_dv_staged (common/hopper/attn_bwd_sm90.cuh): thread wt of a consumer warpgroup (warp wt / 32,
g = lane / 4, t = lane % 4) holds dK_w / dV_w in the wgmma accumulator layout, d[4 i + 2 hh + e] = row
16 warp + 8 hh + g, column 8 i + 2 t + e. It writes the pair (e = 0, 1) as one 4-byte word at byte
r * 2D + ((i ^ (r % 8)) << 4) + 4 t of its 64-row stage, then reads 16-byte chunk q = j * 128 + wt (row
q / (D / 8), chunk c = q % (D / 8)) from r * 2D + ((c ^ (r % 8)) << 4) and stores it at global columns 8 c ...
8 c + 7 of that row. The tests check that every element lands once and comes back at its own row and column,
that each warp's 4-byte writes hit 32 different banks (the reason for the XOR), and that a read without the
XOR (a planted bug) puts elements in the wrong columns.

zigzag_tile (bwd/v11_persist.cu): in round r CTA c takes tile r * grid + (c or grid - 1 - c, by r's parity).
Every tile is taken once, and with the grid a multiple of the key blocks per head, a CTA's causal work (key
block kb of n_kb has n_kb - kb query blocks) is balanced where the plain round-robin gives one CTA all the
longest tiles. The GPU tests (tests/bwd/test_backward_gpu.py) and chapter n10 check the kernels themselves.
"""
import pytest


def staged_writes(D: int):
    """{byte offset of a 4-byte word in one warpgroup's 64 x D stage: (row, first column)}, and per warp
    instruction (warp, hh, i) the 32 lanes' offsets."""
    words, per_instruction = {}, {}
    for wt in range(128):
        warp, lane = divmod(wt, 32)
        g, t = divmod(lane, 4)
        for hh in range(2):
            r = warp * 16 + hh * 8 + g
            for i in range(D // 8):
                off = r * 2 * D + ((i ^ (r % 8)) << 4) + 4 * t
                assert off not in words, (wt, hh, i)
                words[off] = (r, 8 * i + 2 * t)
                per_instruction.setdefault((warp, hh, i), []).append(off)
    return words, per_instruction


def staged_reads(D: int, xor: bool = True):
    """{(row, global column): byte offset it is read from} over every thread's 16-byte chunks."""
    chunks = D // 8
    out = {}
    for j in range(64 * chunks // 128):
        for wt in range(128):
            q = j * 128 + wt
            r, c = divmod(q, chunks)
            base = r * 2 * D + (((c ^ (r % 8)) if xor else c) << 4)
            for k in range(8):
                out[(r, 8 * c + k)] = base + 2 * k
    return out


@pytest.mark.parametrize("D", [64, 128])
def test_staged_epilogue_round_trip(D):
    words, _ = staged_writes(D)
    assert len(words) == 64 * D // 2  # every pair of elements written once
    written = {}  # element (row, col) -> byte offset
    for off, (r, col) in words.items():
        written[(r, col)] = off
        written[(r, col + 1)] = off + 2
    reads = staged_reads(D)
    assert set(reads) == {(r, c) for r in range(64) for c in range(D)}
    assert all(reads[key] == written[key] for key in reads), "an element comes back at another row or column"


@pytest.mark.parametrize("D", [64, 128])
def test_staged_writes_are_bank_conflict_free(D):
    _, per_instruction = staged_writes(D)
    for key, offsets in per_instruction.items():
        banks = {(off // 4) % 32 for off in offsets}
        assert len(offsets) == 32 and len(banks) == 32, key


def test_planted_bug_read_without_the_xor_fails():
    words, _ = staged_writes(128)
    written = {}
    for off, (r, col) in words.items():
        written[(r, col)], written[(r, col + 1)] = off, off + 2
    reads = staged_reads(128, xor=False)
    assert sum(reads[key] != written[key] for key in reads) > 0


def zigzag_tile(r: int, c: int, grid: int) -> int:
    return r * grid + ((grid - 1 - c) if r & 1 else c)


def cta_tiles(n_tiles: int, grid: int, zigzag: bool):
    out = {c: [] for c in range(grid)}
    r = 0
    while r * grid < n_tiles:
        for c in range(grid):
            tile = zigzag_tile(r, c, grid) if zigzag else r * grid + c
            if tile < n_tiles:
                out[c].append(tile)
        r += 1
    return out


@pytest.mark.parametrize("n_tiles,grid", [(2048, 132), (7, 132), (133, 132), (1000, 7), (1, 1)])
def test_zigzag_takes_every_tile_once(n_tiles, grid):
    taken = sorted(t for tiles in cta_tiles(n_tiles, grid, True).values() for t in tiles)
    assert taken == list(range(n_tiles))


def test_zigzag_balances_causal_work():
    """S = 512 (4 key blocks of 128 per head, 8 query blocks of 64), 32 x 16 heads, 132 CTAs: v11's first run."""
    n_kb, n_mb = 4, 8
    work = lambda tile: n_mb - 2 * (tile % n_kb)  # causal: key block kb starts at query block 2 kb  # noqa: E731
    spread = {}
    for zigzag in (False, True):
        loads = [sum(work(t) for t in tiles) for tiles in cta_tiles(n_kb * 512, 132, zigzag).values()]
        spread[zigzag] = max(loads) / (sum(loads) / len(loads))
    assert spread[False] > 1.5  # round-robin: the CTAs of key block 0 carry 1.6x the mean
    assert spread[True] < 1.1
