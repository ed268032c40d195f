"""The Hopper backward's in-kernel dQ conversions, emulated: v06's per slab (lab.backward.emulate_convert) and
v15 / v16's per KV head (lab.backward.emulate_lastconv). Every element is converted exactly once, after its last
partial, in any interleaving of the CTAs; a wrong count must show."""
import math

import numpy as np
import pytest

from lab.backward import emulate_convert as ec
from lab.backward import emulate_lastconv as el
from lab.backward.emulate import backward_reference

SHAPES = [  # (B, Hq, Hkv, Sq, Sk)
    (1, 2, 2, 1, 1), (1, 2, 1, 63, 65), (2, 4, 2, 65, 130), (1, 1, 1, 200, 300), (1, 2, 2, 300, 129)]


def _inputs(B, Hq, Hkv, Sq, Sk, D, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in ((B, Hq, Sq, D), (B, Hkv, Sk, D), (B, Hkv, Sk, D), (B, Hq, Sq, D))]


@pytest.mark.parametrize("emulate", [ec.emulate_convert, el.emulate_lastconv], ids=["v06-slabs", "v15-heads"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_slab_converted_once_after_its_last_partial(shape, causal, D, emulate):
    """v06 (a slab's last warp) and v15 / v16 (a KV head's last CTA; lab.backward.emulate_lastconv): every element
    of dQ converted once, after its last partial."""
    q, k, v, do = _inputs(*shape, D, seed=sum(shape) + D)
    want = backward_reference(q, k, v, do, causal, 0.3)[0]
    for seed in range(2):  # two interleavings of the CTAs
        dq, conversions = emulate(q, k, v, do, causal, 0.3, seed=seed)
        assert not np.isnan(dq).any(), "a slab was never converted"
        assert set(conversions.values()) == {1}
        np.testing.assert_allclose(dq, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("Sq, Sk", [(1, 1), (63, 65), (64, 128), (65, 129), (1025, 4097), (4097, 1025)])
def test_contributors_count_the_ctas_that_visit_a_block(Sq, Sk):
    n_mb, n_kb = math.ceil(Sq / ec.BR), math.ceil(Sk / ec.BC)
    for causal in (False, True):
        for mb in range(n_mb):
            visits = sum(ec.first_block(nb * ec.BC, n_mb, causal) <= mb for nb in range(n_kb))
            assert ec.contributors(mb, Sk, causal) == visits


def test_a_wrong_count_shows():
    """Counting non-causal visits under the causal mask: slabs of early query blocks are never converted; one
    partial too few converts before the last add."""
    q, k, v, do = _inputs(1, 2, 1, 300, 300, 64, seed=3)
    non_causal = lambda mb, sk, causal, d: ec.slab_partials(mb, sk, False, d)  # noqa: E731
    dq, _ = ec.emulate_convert(q, k, v, do, True, partials=non_causal)
    assert np.isnan(dq).any()
    early = lambda mb, sk, causal, d: ec.slab_partials(mb, sk, causal, d) - 1  # noqa: E731
    dq, _ = ec.emulate_convert(q, k, v, do, False, partials=early)
    want = backward_reference(q, k, v, do, False)[0]
    assert np.abs(dq - want).max() > 1e-3
