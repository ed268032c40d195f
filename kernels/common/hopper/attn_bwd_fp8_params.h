// The FP8 backward's call (bwd/v22_fp8.cu; lab/fp8/backward.py fills it through ctypes, field for field).
#pragma once
#include <stdint.h>

#include "common/params.h"

// base: the bf16 backward's block, read as follows. q, k, v: the forward's e4m3 tensors (B, H, S, D), strides in
// elements (= bytes), every stride a multiple of 16; o, dout: bf16 (B, H_q, S_q, D), the forward's O and the
// incoming gradient; lse: natural log, float32 (B, H_q, S_q) contiguous; dq, dk, dv: bf16 outputs; delta,
// lse_log2, dq_accum: the workspaces of the Hopper bf16 backward (padded rows, lab::bwd::padded_rows); dtype
// LAB_BF16; scale the forward's softmax scale; dlse NULL; deterministic 0.
typedef struct AttnBwdFp8Params {
  AttnBwdParams base;
  const void* dout8;         // e4m3 (B, H_q, S_q, D): dout / do_descale, strides dout8_stride (multiples of 16)
  void* qt;                  // workspace e4m3 (B, H_q, D, q_cols): Q^T, queries permuted per 32 (the V^T pass)
  void* kt;                  // workspace e4m3 (B, H_kv, D, k_cols): K^T, keys permuted the same way
  void* dot;                 // workspace e4m3 (B, H_q, D, q_cols): dO^T
  const float* q_descale;    // (B, H_q) contiguous: Q ~= q * q_descale[b, h]
  const float* k_descale;    // (B, H_kv) contiguous
  const float* v_descale;    // (B, H_kv) contiguous
  const float* do_descale;   // one float: dout ~= dout8 * do_descale (per tensor: dV sums over a group's heads)
  int64_t dout8_stride[3];   // batch, head, seq
  int q_cols, k_cols;        // columns of Q^T / dO^T and of K^T: S_q, S_k rounded up to a multiple of 128
} AttnBwdFp8Params;
