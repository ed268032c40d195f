"""The Hopper backward v15 / v16's dQ conversion by each KV head's last CTA, emulated (lab.backward.emulate_lastconv;
test_backward_convert checks every element converted once, after its last partial): the kernel's enumeration and
placement of float4s cover each head's rows, v16's shuffle gather gives the dense rows, and a wrong count or
enumeration must show."""
from pathlib import Path

import numpy as np
import pytest

from lab.backward import emulate_lastconv as el
from lab.backward.emulate import backward_reference

ROOT = Path(__file__).resolve().parents[2]


def _inputs(B, Hq, Hkv, Sq, Sk, D, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, Hq, Sq, D))]


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Sq", [1, 63, 64, 65, 128, 129, 1025])
def test_the_enumeration_places_every_pair_of_the_group_once(Sq, D):
    B, Hq, Hkv = 2, 4, 2
    sq_pad = el.padded_rows(Sq)
    seen = {}
    for b in range(B):
        for hkv in range(Hkv):
            for idx in el.group_quads(b, hkv, Hq // Hkv, Hq, Sq, D):
                qb, qh, row, col = el.quad_place(idx, D, Hq, sq_pad)
                assert (qb, qh // (Hq // Hkv)) == (b, hkv)  # only its own group's heads
                for r in (row, row + 8):
                    if r < Sq:
                        seen[(qb, qh, r, col)] = seen.get((qb, qh, r, col), 0) + 1
    assert set(seen.values()) == {1}
    assert len(seen) == B * Hq * Sq * D // 2


def test_a_wrong_count_or_enumeration_shows():
    q, k, v, do = _inputs(1, 2, 1, 300, 300, 64, seed=3)
    want = backward_reference(q, k, v, do, False)[0]
    dq, _ = el.emulate_lastconv(q, k, v, do, False, last_count=lambda n: n)  # nobody is last
    assert np.isnan(dq).all()
    # converted one CTA early: wrong in some interleaving (in others the last CTA's adds all came before)
    errors = [np.abs(el.emulate_lastconv(q, k, v, do, False, seed=seed, last_count=lambda n: n - 2)[0] - want).max()
              for seed in range(6)]
    assert max(errors) > 1e-3
    # S_q's 64-row blocks rounded down instead of up: the rows after the last whole block are never converted
    def floor_blocks(b, hkv, group, heads_q, seqlen_q, head_dim):
        per_head = seqlen_q // 64 * 64 * head_dim // 4
        return [i for i in el.group_quads(b, hkv, group, heads_q, seqlen_q, head_dim)
                if (i % (el.padded_rows(seqlen_q) * head_dim // 4)) < per_head]

    dq, _ = el.emulate_lastconv(q, k, v, do, False, enumerate_quads=floor_blocks)
    assert np.isnan(dq[:, :, 256:]).all() and not np.isnan(dq[:, :, :256]).any()


def test_the_kernel_enumerates_as_the_emulation():
    source = (ROOT / "kernels/bwd/v15_lastconv.cu").read_text()
    assert "const int per_head = (p.seqlen_q + 63) / 64 * kQuads;" in source
    assert "const int64_t head_stride = (int64_t)sq_pad / 64 * kQuads;" in source
    assert "idx[u] = first + (int64_t)(i / per_head) * head_stride + i % per_head;" in source
    count = (ROOT / "kernels/common/hopper/attn_bwd_lastcta.cuh").read_text()
    assert "last = atomicAdd(count, 1) == n_kb - 1;" in count  # the emulation's last_count default


@pytest.mark.parametrize("D", [64, 128])
def test_v16_gathers_each_rows_eight_columns_from_the_accumulator_order(D):
    """A block in accumulator order (as quad_place reads it) comes out of v16's stores as the dense 64 x D rows,
    every element once."""
    dense = np.arange(64 * D, dtype=np.float64).reshape(64, D) + 1
    block = np.zeros(64 * D)
    for idx in range(64 * D // 4):
        _, _, row, col = el.quad_place(idx, D, heads_q=1, sq_pad=64)
        block[4 * idx: 4 * idx + 4] = dense[row, col], dense[row, col + 1], dense[row + 8, col], dense[row + 8, col + 1]
    out, writes = np.zeros((64, D)), np.zeros((64, D), int)
    for row, col, floats in el.block_stores(D):
        out[row, col:col + 8] = block[floats]
        writes[row, col:col + 8] += 1
    assert (writes == 1).all()
    np.testing.assert_array_equal(out, dense)


def test_v16_stores_as_the_emulation():
    source = (ROOT / "kernels/bwd/v16_ringconv.cu").read_text()
    assert "__shfl_sync(0xffffffffu, lo, (lane & ~3) + k)" in source
    assert "v[k] = t == 0 ? l : h;" in source
    assert "const int row = m0 + warp * 16 + g + (t == 1 ? 8 : 0);" in source
    assert "const int col = (C::kSplitDq ? part * C::kDqCols : 0) + 8 * r4;" in source
