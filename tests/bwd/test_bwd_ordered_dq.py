"""bwd v17's fixed dQ order (lab.backward.dq_order, the kernel's rules on the CPU): whatever order the CTAs run
their steps in, every query row block gets its adds from the same key blocks in the same (descending) order, the
grid finishes with few SMs, and planted mistakes in the counts deadlock."""
import pytest

from lab.backward import dq_order

SHAPES = [(65, 65), (300, 257), (1025, 2049), (2049, 1025), (4096, 4096)]


def _contributors(seqlen_q, seqlen_k, causal, block_q):
    n_kb = -(-seqlen_k // 128)
    out = {}
    for kb in range(n_kb):
        for m0 in dq_order.row_blocks(kb, seqlen_q, causal, block_q):
            out.setdefault(m0, []).append(kb)
    return out


@pytest.mark.parametrize("block_q", [64, 128], ids=["D128-BR64", "D64-BR128"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", SHAPES)
def test_every_row_block_gets_its_adds_in_one_fixed_order(seqlen_q, seqlen_k, causal, block_q):
    runs = [dq_order.play(seqlen_q, seqlen_k, causal, block_q, heads=2, sms=sms, seed=seed)
            for sms, seed in ((132, 0), (132, 1), (5, 2), (1, 3))]
    assert all(run == runs[0] for run in runs[1:])  # the same order at any speed and any number of SMs
    want = _contributors(seqlen_q, seqlen_k, causal, block_q)
    for (head, m0), order in runs[0].items():
        assert order == sorted(want[m0], reverse=True)  # every contributor once, last key block first
    assert {m0 for _, m0 in runs[0]} == set(want) and {h for h, _ in runs[0]} == {0, 1}


def test_the_causal_first_count_is_zero_on_the_diagonal():
    # key block kb's first row block under the causal mask has no block ahead of it (block_q = 64: rows 128 kb)
    assert all(dq_order.ahead(kb, 128 * kb, 32, True) == 0 for kb in range(32))
    assert dq_order.ahead(3, 0, 32, False) == 28  # without a mask, every later block adds first


def test_a_causal_count_that_ignores_the_mask_deadlocks():
    wrong = lambda kb, m0, n_kb, causal, block_k: n_kb - 1 - kb  # waits for blocks that never reach the row
    with pytest.raises(dq_order.Deadlock):
        dq_order.play(1025, 1025, True, 64, sms=132, ahead_fn=wrong)


def test_an_ascending_order_under_the_descending_grid_deadlocks_with_few_sms():
    wrong = lambda kb, m0, n_kb, causal, block_k: kb  # waits on blocks dispatched after it
    assert dq_order.play(1025, 1025, False, 64, sms=132, ahead_fn=wrong)  # all resident: it only orders differently
    with pytest.raises(dq_order.Deadlock):
        dq_order.play(1025, 1025, False, 64, sms=3, ahead_fn=wrong)
