"""The divisor-by-multiplication of kernels/common/fast_div.cuh, in Python, so its bound can be checked on the CPU.

FastDiv(d).div(n) == n // d for 0 <= n < 2**31 and 1 <= d < 2**31 (the round-up method: p = 31 + ceil(log2 d),
mul = ceil(2**p / d), n // d == (n * mul) >> p). The kernels use it for the persistent work-tile arithmetic.
"""
from __future__ import annotations


class FastDiv:
    def __init__(self, divisor: int):
        if not 1 <= divisor < 2**31:
            raise ValueError(f"divisor must be in [1, 2**31), got {divisor}")
        self.d = divisor
        l = (divisor - 1).bit_length()  # ceil(log2 d): the kernel's `while ((1u << l) < d) ++l`
        self.shift = 31 + l
        self.mul = ((1 << self.shift) + divisor - 1) // divisor
        assert self.mul < 2**32, "mul must fit the kernel's uint32_t"

    def div(self, n: int) -> int:
        if not 0 <= n < 2**31:
            raise ValueError(f"n must be in [0, 2**31), got {n}")
        return (n * self.mul) >> self.shift

    def mod(self, n: int) -> int:
        return n - self.div(n) * self.d
