// Division by a divisor fixed for a kernel's life, by one wide multiply and a shift (Granlund and Montgomery's
// round-up method), for the persistent kernels' work-tile arithmetic: a signed 32-bit division by a runtime
// value costs ~20 instructions (IABS, I2F, MUFU.RCP, F2I, fix-ups) on the path between two work tiles.
// Exact for 0 <= n < 2^31 and 1 <= d < 2^31: with l = ceil(log2 d), p = 31 + l and mul = ceil(2^p / d), the
// rounding error e = mul d - 2^p < d <= 2^l gives n e < 2^p, so floor(n mul / 2^p) = floor(n / d).
// lab/fast_div.py mirrors it; tests/product/test_fast_div.py checks the bound on the CPU.
#pragma once
#include <stdint.h>

namespace lab {

struct FastDiv {
  int d;
  uint32_t mul, shift;  // shift = p

  __host__ __device__ explicit FastDiv(int divisor) : d(divisor > 0 ? divisor : 1) {
    uint32_t l = 0;
    while ((1u << l) < (uint32_t)d) ++l;  // ceil(log2 d), runs once per kernel (d < 2^31)
    shift = 31 + l;
    mul = (uint32_t)((((uint64_t)1 << shift) + (uint64_t)d - 1) / (uint64_t)d);
  }
  __host__ __device__ int div(int n) const { return (int)(((uint64_t)(uint32_t)n * mul) >> shift); }
  __host__ __device__ int mod(int n) const { return n - div(n) * d; }
};

}  // namespace lab
