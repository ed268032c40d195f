"""The swizzled K/V ring of decode v07 (D 64 / 128) and v08 (D 80 / 96), counted lane by lane on the CPU
(lab.decode.swizzle_model, which addresses the ring as common/decode_swizzle.cuh does): every chunk written
once and read back by the ldmatrix lane that needs it, copies and ldmatrix free of bank conflicts, and every 32-byte
sector of the cache landing whole in one 32-byte sector of the ring, where the padded ring splits half of them."""
from __future__ import annotations

import pytest

from lab import registry
from lab.decode import swizzle_model as model


@pytest.mark.parametrize("D", (64, 80, 96, 128))
def test_swizzled_ring_is_exact_conflict_free_and_keeps_sectors_whole(D):
    m = model.model("swizzled", D)
    assert m["ok"] and m["copy_wavefronts"] == 1 == m["ldmatrix_wavefronts"]
    assert m["split_sectors"] == m["need_sectors"]
    assert not model.model("swizzled", D, read_layout="unpadded")["ok"]  # a reader without the XOR is wrong


@pytest.mark.parametrize("D", (64, 80, 96, 128))
def test_padded_ring_splits_half_the_sectors(D):
    m = model.model("padded", D)
    assert m["ok"] and m["split_sectors"] == 1.5 * m["need_sectors"]


def test_the_shift_per_head_dim_and_why():
    assert [model.shift(D) for D in (64, 80, 96, 128)] == [0, 2, 1, 0]
    assert model.model("unpadded", 80)["ldmatrix_wavefronts"] == 2  # 10 r mod 8 repeats every 4 rows
    assert model.model("unpadded", 96)["ldmatrix_wavefronts"] == 4  # 12 r mod 8 every 2


def test_v08_is_the_default_at_the_narrow_dims():
    assert registry.DECODE["v08"].head_dims == (80, 96) and "v08" in registry.PAGED_DECODE
    assert registry.SPLIT_RULE["v08"] == "v02"
    # the swizzled ring is chosen wherever it takes the head dim, paged or not (every default: tests/fixtures/defaults.json)
    for d in registry.DECODE_HEAD_DIMS:
        paged, contiguous = registry.default_paged_version(8, head_dim=d), registry.default_decode_version(32, 8, 1, d)
        ring = {"v07", "v08"} & {v for v in registry.DECODE if d in registry.DECODE[v].head_dims}
        assert (paged in ring and contiguous in ring) if ring else not {paged, contiguous} & {"v07", "v08"}
