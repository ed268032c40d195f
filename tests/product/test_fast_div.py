"""lab.fast_div (the Python mirror of kernels/common/fast_div.cuh): exact quotients wherever the kernels use it."""
import random

import pytest

from lab.fast_div import FastDiv


EDGE_N = [0, 1, 2, 3, 127, 128, 129, 2**16 - 1, 2**16, 2**30, 2**31 - 2, 2**31 - 1]
EDGE_D = [1, 2, 3, 5, 7, 16, 40, 63, 64, 65, 127, 132, 1000, 4097, 2**16 + 1, 2**30 - 1, 2**30, 2**30 + 1,
          2**31 - 1]


@pytest.mark.parametrize("d", EDGE_D)
def test_quotient_and_remainder_are_exact_at_the_edges(d):
    f = FastDiv(d)
    ns = EDGE_N + [k * d + r for k in (1, 2, 1000) for r in (-1, 0, 1) if 0 <= k * d + r < 2**31]
    for n in ns:
        assert (f.div(n), f.mod(n)) == divmod(n, d), (n, d)


def test_quotient_is_exact_for_random_pairs():
    rng = random.Random(0)
    for _ in range(20000):
        d = rng.choice([rng.randrange(1, 300), rng.randrange(1, 2**31)])
        n = rng.choice([rng.randrange(0, 2**16), rng.randrange(0, 2**31)])
        assert FastDiv(d).div(n) == n // d, (n, d)


def test_a_multiplier_rounded_down_is_caught():
    """The checks can fail: mul = floor(2**p / d) instead of the ceiling gives a wrong quotient at n = d."""
    f = FastDiv(3)
    f.mul = (1 << f.shift) // 3
    assert f.div(3) != 1


def test_out_of_range_arguments_are_refused():
    with pytest.raises(ValueError):
        FastDiv(0)
    with pytest.raises(ValueError):
        FastDiv(3).div(-1)
