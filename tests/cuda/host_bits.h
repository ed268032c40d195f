// Host-side fp16 / bf16 <-> float through raw 16-bit words, for the standalone CUDA drivers
// (decode_main.cu, fwd_mma_main.cu): inputs are drawn in float, rounded once to the kernel's dtype, and the
// reference sees exactly the rounded values.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "common/params.h"

static uint16_t to_bits(float x, int dtype) {
  uint16_t bits;
  if (dtype == LAB_FP16) {
    __half h = __float2half_rn(x);
    memcpy(&bits, &h, 2);
  } else {
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    memcpy(&bits, &h, 2);
  }
  return bits;
}

static float from_bits(uint16_t bits, int dtype) {
  if (dtype == LAB_FP16) {
    __half h;
    memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  memcpy(&h, &bits, 2);
  return __bfloat162float(h);
}
