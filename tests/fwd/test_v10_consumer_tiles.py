"""fwd v10's causal consumer tile count (kernels/fwd/v10_wide.cu, consumer_tiles; lab.fwd.work_order mirrors it):
every key a consumer skips is masked for all of its rows, it skips at most the CTA's last tile (which no later
load waits on), and the skipped share is what the prediction uses."""
import re

import pytest

from lab import paths
from lab.fwd.work_order import consumer_tile_saving, consumer_tiles, v10_snake

SOURCE = (paths.KERNELS / "fwd" / "v10_wide.cu").read_text()


@pytest.mark.parametrize("block_k", [64, 80, 96, 112])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (63, 65), (65, 130), (130, 200), (200, 130), (512, 512),
                                               (1025, 63), (4097, 4097), (300, 1000)])
def test_a_skipped_tile_holds_only_masked_keys(seqlen_q, seqlen_k, block_k):
    for m0 in range(0, seqlen_q, 128):
        cta = consumer_tiles(seqlen_q, seqlen_k, m0, block_k, rows=128)
        for wm0 in (m0, m0 + 64):
            n = min(cta, consumer_tiles(seqlen_q, seqlen_k, wm0, block_k))
            assert cta - n <= 1  # only the CTA's last tile, so no later load waits for its release
            rows = range(wm0, min(wm0 + 64, seqlen_q))
            for j in range(n, cta):
                keys = range(j * block_k, min((j + 1) * block_k, seqlen_k))
                assert all(key > row for key in keys for row in rows)  # every score masked: P = 0 exactly
            if rows and n < cta:  # and the tile before it is needed by some row (no over-skip)
                last = range((n - 1) * block_k, min(n * block_k, seqlen_k))
                assert any(key <= row for key in last for row in rows)


def test_the_lower_consumer_runs_every_tile_the_cta_loads():
    for s in (65, 512, 1000, 2048):
        for m0 in range(0, s, 128):
            assert consumer_tiles(s, s, m0 + 64, 112) == consumer_tiles(s, s, m0, 112, rows=128)


def test_non_causal_runs_every_tile():
    assert consumer_tiles(512, 700, 0, 80, causal=False) == 9


def test_saving_at_the_wide_tiles():
    assert consumer_tile_saving(512, 112) == pytest.approx(4 / 28)
    assert consumer_tile_saving(512, 80) == pytest.approx(4 / 36)
    assert consumer_tile_saving(8192, 112) < 0.01  # long calls: one tile in hundreds


def test_the_kernel_keeps_the_rule_the_model_mirrors():
    body = SOURCE[SOURCE.index("__device__ __forceinline__ int consumer_tiles"):]
    body = body[:body.index("\n}\n")]
    assert "min(p.seqlen_k, min(p.seqlen_q, wm0 + 64))" in body
    assert re.search(r"static_assert\(BC >= 64", SOURCE)  # the one-tile bound the release rule needs
    assert "#define LAB_FWD_WIDE_WG_TILES 1" in SOURCE


@pytest.mark.parametrize("n_work,grid", [(1, 132), (131, 132), (132, 132), (2048, 132), (2049, 132), (300, 7)])
def test_the_persistent_snake_takes_every_tile_once(n_work, grid):
    order = v10_snake(n_work, grid)
    assert sorted(w for tiles in order for w in tiles) == list(range(n_work))


def test_the_snake_pairs_long_causal_blocks_with_short_ones():
    """S = 512, B_r = 128: 4 query blocks a head, longest first (work_tile_at); 2048 tiles on 132 CTAs. Round robin
    gives a CTA the same block every round; the snake evens the key tiles per CTA out."""
    num_m, grid, n_work = 4, 132, 2048
    cost = lambda w: num_m - w % num_m  # key tiles of block mb = num_m - 1 - w % num_m, in units of B_r keys
    snake = [sum(map(cost, tiles)) for tiles in v10_snake(n_work, grid)]
    robin = [sum(cost(w) for w in range(x, n_work, grid)) for x in range(grid)]
    assert max(robin) / min(robin) >= 3.5
    assert max(snake) / (sum(snake) / grid) < 1.1


def test_the_kernel_walks_the_order_the_model_mirrors():
    body = SOURCE[SOURCE.index("__device__ __forceinline__ int snake_tile"):]
    body = body[:body.index("\n}\n")]
    assert "i * g + ((i & 1) ? g - 1 - x : x)" in body
    assert SOURCE.count("w = snake_tile(++i, n_work)") == 1  # one walk (walk_work_tiles) ...
    assert SOURCE.count("walk_work_tiles<Cfg, kPersist>(p, n_work, work0,") == 2  # ... for the producer and the consumers
    assert "#define LAB_FWD_WIDE_PERSIST 1" in SOURCE  # the default since its n14 session
