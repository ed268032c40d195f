// Host-side bits the standalone CUDA drivers (decode_main.cu, fwd_mma_main.cu) share: fp16 / bf16 <-> float
// through raw 16-bit words (inputs are drawn in float, rounded once to the kernel's dtype, and the reference
// sees exactly the rounded values), and the exits on a CUDA error (CK) or a launcher's nonzero return code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

static void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) {
    fprintf(stderr, "CUDA error %d (%s) at %s:%d: %s\n", (int)e, cudaGetErrorString(e), file, line, what);
    exit(2);
  }
}
#define CK(x) check_cuda((x), #x, __FILE__, __LINE__)

// A launcher's return code: 0, a cudaError_t (> 0) or a LAB_E_* code (< 0); anything but 0 ends the run.
static void check_launch(int rc, const char* what) {
  if (rc != 0) {
    fprintf(stderr, "launcher %s returned %d (%s)\n", what, rc,
            rc > 0 ? cudaGetErrorString((cudaError_t)rc) : "LAB_E_*");
    exit(2);
  }
}
