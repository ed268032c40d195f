"""lab.backward.schedule: the CPU model of how the backward's CTAs fill the SMs, and bwd v14's tile order
(tail_tile in kernels/common/hopper/attn_bwd_tail.cuh, mirrored by schedule.tail_lpt_tile)."""
from pathlib import Path

import pytest

from lab.backward import schedule

ROOT = Path(__file__).resolve().parents[2]


def test_equal_ctas_end_on_their_last_wave():
    # 2048 equal CTAs on 132 SMs: 15.52 waves of work take 16
    assert schedule.makespan([1.0] * 2048) == 16.0
    assert schedule.loss([1.0] * 2048) == pytest.approx(16 / (2048 / 132) - 1)
    assert schedule.loss([1.0] * 132 * 4) == 0.0


def test_a_long_cta_dispatched_last_sets_the_end():
    assert schedule.makespan([1.0] * 131 + [10.0]) == 10.0
    assert schedule.makespan([1.0] * 132 + [10.0]) == 11.0


@pytest.mark.parametrize("n_kb,n_heads", [(1, 1), (4, 512), (8, 256), (16, 128), (128, 16), (33, 64), (3, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_tail_order_takes_every_tile_once(n_kb, n_heads, causal):
    order = [schedule.tail_lpt_tile(i, n_kb, n_heads, causal) for i in range(n_kb * n_heads)]
    assert sorted(order) == list(range(n_kb * n_heads))
    if not causal:
        assert order == list(range(n_kb * n_heads))


def test_a_swapped_tail_map_fails():
    n_kb, n_heads = 8, 256
    w = -(-264 // n_kb)
    first = (n_heads - w) * n_kb
    bad = [i if i < first else (n_heads - w + (i - first) // w) * n_kb + (i - first) % w for i in range(n_kb * n_heads)]
    assert sorted(bad) != list(range(n_kb * n_heads))


def test_the_tail_order_ends_causal_grids_sooner():
    """bench-bwd's causal D = 128, S = 1024 cell: 16 x 16 heads, 8 key blocks of 64-query steps."""
    n_kb, heads, seqlen = 8, 256, 1024
    in_order = schedule.order_costs(range(n_kb * heads), seqlen, seqlen, True, 64)
    tail = schedule.order_costs([schedule.tail_lpt_tile(i, n_kb, heads, True) for i in range(n_kb * heads)],
                                seqlen, seqlen, True, 64)
    assert sorted(in_order) == sorted(tail)  # the same work
    assert schedule.loss(in_order) > 0.05 and schedule.loss(tail) < 0.02


def test_the_tail_keeps_its_heads_q_and_do_within_the_l2_share():
    # bench-bwd's GQA cell (4 x 8 KV heads of 4 query heads, S = 4096, D = 128, 32 key blocks): two waves would
    # take 9 heads of 8 MB of Q and dO each; the cap leaves 3 (24 MB)
    head_bytes = 4 * 4 * 4096 * 128
    assert schedule.tail_heads(32, 32) == 9
    assert schedule.tail_heads(32, 32, head_bytes) == 3
    # the dense causal cells keep their two waves: D = 128, S = 1024 (256 heads, 8 key blocks) and S = 16384
    assert schedule.tail_heads(8, 256, 4 * 1024 * 128) == 33
    assert schedule.tail_heads(128, 16, 4 * 16384 * 128) == 3
    # a head larger than the whole share still reorders one head, and the map stays a bijection
    order = [schedule.tail_lpt_tile(i, 32, 32, True, head_bytes=1 << 30) for i in range(32 * 32)]
    assert sorted(order) == list(range(32 * 32)) and order[:31 * 32] == list(range(31 * 32))


def test_the_kernel_uses_the_models_tail():
    source = (ROOT / "kernels/common/hopper/attn_bwd_tail.cuh").read_text()
    assert "kTailCtas = 2 * 132" in source  # tail_lpt_tile's defaults: waves=2, sms=132
    assert f"kTailBytes = {schedule.TAIL_BYTES >> 20}ll << 20" in source
    assert "4ll * (p.heads_q / p.heads_kv) * p.seqlen_q * C::D" in source  # head_bytes: Q and dO, 2 bytes each
    assert "min(min(heads, fit), (kTailCtas + n_kb - 1) / n_kb)" in source
    assert "return (heads - w + r % w) * n_kb + r / w;" in source
