// The one interface between Python and every kernel in kernels/.
//
// Plain C, no torch and no CUDA headers, so the same struct is filled by the
// torch binding (lab/binding.cpp) and read by launchers compiled by plain nvcc.
// A launcher is
//     extern "C" int <name>(const <Params>* p, void* stream);
// and returns 0 on success, a cudaError_t value on a CUDA failure, or one of
// the negative LAB_E_* codes for a configuration it does not support.
// Strides are in elements; the last (head-dim) stride is always 1.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Largest num_splits a decode launcher accepts (the binding checks it first, with the
// workspace bound below). lab/decode/splits.py never picks more than 128; more splits than
// 64-key tiles only adds empty splits. The binding also keeps B*Hq*q_len*num_splits*D
// within int32, the range of the kernels' int split and key offsets.
#define LAB_MAX_NUM_SPLITS 1024

enum LabDtype { LAB_FP16 = 0, LAB_BF16 = 1 };

enum LabError {
  LAB_OK = 0,
  LAB_E_HEAD_DIM = -1,   // head_dim not compiled in
  LAB_E_DTYPE = -2,      // dtype not supported by this kernel
  LAB_E_SHAPE = -3,      // a size this kernel cannot take (e.g. q_len too large)
  LAB_E_WORKSPACE = -4,  // a required workspace pointer is null
  LAB_E_MODE = -5,       // a mode this kernel does not run (e.g. deterministic dQ)
};

// Forward attention, layout (B, H, S, D) addressed through strides.
// Causal follows SDPA's is_causal: query i sees key j iff j <= i (top-left
// aligned), also when seqlen_q != seqlen_k.
// GQA: query head h reads KV head h / (heads_q / heads_kv).
typedef struct AttnFwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;            // optional [B, Hq, Sq] contiguous, natural log; NULL to skip
  int64_t q_stride[3];   // batch, head, seq
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  float scale;           // softmax scale, already resolved (1/sqrt(D) by default)
  int causal;
  int dtype;             // LabDtype
  float* debug;          // debug builds only (LAB_DEBUG_DUMP): intermediates dump
} AttnFwdParams;

// Decoding: q_len new tokens attend to a KV cache, every query token sees the
// first cache_seqlens[b] keys of its sequence (no mask inside the cache).
typedef struct DecodeParams {
  const void* q;             // [B, Hq, q_len, D]
  const void* k_cache;       // [B, Hkv, S_cache, D]
  const void* v_cache;       // [B, Hkv, S_cache, D]
  void* o;                   // [B, Hq, q_len, D]
  const int32_t* cache_seqlens;  // [B] device int32, or NULL: every sequence is S_cache long
  float* partial_o;          // workspace [B, Hq, q_len, num_splits, D] fp32 (unused if num_splits == 1)
  float* partial_lse;        // workspace [B, Hq, q_len, num_splits] fp32
  float* lse;                // optional [B, Hq, q_len] contiguous natural log; NULL to skip
  int64_t q_stride[3];
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int batch, heads_q, heads_kv, q_len, seqlen_cache, head_dim;
  int num_splits;            // >= 1, chosen by lab/decode/splits.py unless overridden
  float scale;
  int dtype;
  // Paged KV cache and the causal mask: read by decode v03 (kernels/decode/v03_paged.cu) only; v01 and v02
  // are always called with these zeroed (block_table NULL, causal 0), which is the contract above.
  // Paged (block_table != NULL): k_cache and v_cache are [num_pages, page_size, Hkv, D], the layout of vLLM
  // and flash_attn_with_kvcache; k_stride/v_stride are then the (page, key in page, head) strides; key j of
  // sequence b is row j % page_size of page block_table[b * block_table_stride + j / page_size];
  // seqlen_cache is the table's capacity, max_pages * page_size. Never read: a page index outside
  // [0, num_pages), a table entry past max_pages. Such a sequence gets O = 0 and its page_errors bits.
  const int32_t* block_table;    // [B, max_pages] device int32, or NULL: the contiguous layout above
  int32_t* page_errors;          // [B] device int32, paged only: written every call, 0 or LAB_PAGE_E_* bits
  int64_t block_table_stride;    // elements between two sequences' rows of block_table
  int num_pages, page_size, max_pages;  // page_size: a multiple of 16
  // 1: token i of q_len sees keys [0, len - q_len + i] (bottom-right aligned, FlashAttention's decode rule;
  // AttnFwdParams.causal is SDPA's top-left); a token with no key left gets O = 0. 0: every token sees [0, len).
  int causal;
  // The masks of real models (decode v03, v06-v08; the others return LAB_E_MODE when one is set): a zeroed
  // struct is the plain call. window 1: token i of q_len, on the diagonal key len - q_len + i, sees keys
  // [diag - window_left, diag + window_right] of [0, len) (-1: that side unbounded; causal caps the right at 0),
  // FlashAttention's decode rule (lab/masks/spec.py); the split plan then covers only the window's keys
  // (common/decode_masks.cuh). softcap > 0: s -> softcap * tanh(s / softcap) on the scaled score. sinks: [H_q]
  // float32 logits in the units of the scaled scores that join the softmax's denominator in the split-K combine
  // (or the one split's epilogue), never a split's partial; the LSE written then includes them.
  int window, window_left, window_right;
  float softcap;
  const float* sinks;
} DecodeParams;

// page_errors bits (decode v03, paged): the sequence's output is zeroed and these say why.
#define LAB_PAGE_E_INDEX 1  // a page index among the sequence's first len keys is outside [0, num_pages)
#define LAB_PAGE_E_SHORT 2  // cache_seqlens[b] > max_pages * page_size: the block table is too short

// Backward attention (kernels/bwd/*), layout (B, H, S, D) through strides like the forward. Reads q, k, v,
// the forward's out and its natural-log lse, and the output gradient dout; writes dq, dk, dv (dk/dv summed
// over the query heads of a GQA group). Causal, GQA and scale as in AttnFwdParams.
// Workspaces (float32, allocated by the caller): delta and lse_log2 hold LAB_BWD_ROW_PAD-padded rows
// [B, Hq, round_up(Sq, LAB_BWD_ROW_PAD)]; dq_accum holds as many rows times D ([B, Hq, padded Sq, D]) and is
// needed when deterministic == 0 (dQ by fp32 atomics or bulk reductions, then a convert pass) and by bwd/v17-v18
// in either mode (their reductions in a fixed order), followed by one more 4-byte word per padded row
// (B * Hq * padded Sq: the tile counters of a version that converts dQ in its own kernel, bwd/v06, or the order
// counters of bwd/v17-v18). Each version orders dq_accum its own way: v01 (B, Hq, Sq, D) in its first rows,
// v02 64-row blocks in wgmma accumulator order (bwd/v02_wgmma.cu). 128: bwd/v13 reads and reduces 128 rows a
// step, and the last step of a short S_q must stay inside the workspace.
#define LAB_BWD_ROW_PAD 128
typedef struct AttnBwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;      // [B, Hq, Sq] contiguous, natural log, as the forward wrote it
  const float* dlse;     // optional [B, Hq, Sq] contiguous gradient of lse; NULL: zero
  void* dq;
  void* dk;
  void* dv;
  float* delta;          // workspace: rowsum(dout * out) - dlse
  float* lse_log2;       // workspace: lse * log2(e)
  float* dq_accum;       // workspace: fp32 dQ for the atomic mode
  int64_t q_stride[3];   // batch, head, seq
  int64_t k_stride[3];
  int64_t v_stride[3];
  int64_t o_stride[3];
  int64_t do_stride[3];
  int64_t dq_stride[3];
  int64_t dk_stride[3];
  int64_t dv_stride[3];
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  float scale;           // the forward's softmax scale, any finite value
  int causal;
  int dtype;             // LabDtype
  int deterministic;     // 1: bit-identical across runs (v01: dQ in a separate pass; v17, v18: dQ added in a fixed order)
} AttnBwdParams;

// Forward attention with the masks real models use (fwd v08, kernels/fwd/v08_masks.cu; lab/masks/spec.py
// writes the rule out): a sliding window, logit softcapping, attention sinks, and packed variable-length
// sequences. base.causal is not read: causal arrives as window_right = 0.
// Query row i of a sequence is aligned with key i + offset: dense calls offset = diag_offset; packed calls
// (cu_seqlens_q != NULL) offset = S_k - S_q of each sequence (FlashAttention's bottom-right rule). Row i sees key
// j iff (window_left < 0 or j >= i + offset - window_left) and (window_right < 0 or j <= i + offset + window_right).
// Packed: q, k, v, o are (total, H, D) with base.q_stride = {unused, head, token}; sequence b is rows
// [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q (likewise k, v with cu_seqlens_k); base.batch is the number of
// sequences, base.seqlen_q / seqlen_k are max_seqlen_q / max_seqlen_k (host ints: the grid is sized from them,
// with no copy of cu_seqlens to the host); lengths are clamped to [0, max_seqlen] and rows to [0, total), so no
// cu_seqlens value makes the kernel read or write out of bounds. lse is then [H_q, total_q].
typedef struct AttnMaskParams {
  AttnFwdParams base;
  int window_left, window_right;  // -1: unbounded
  int diag_offset;                // dense only
  float softcap;                  // s -> softcap * tanh(s / softcap) on the scaled score; 0: off
  const float* sinks;             // [H_q] float32 logits in the units of the scaled scores, or NULL
  const int32_t* cu_seqlens_q;    // [batch + 1] device int32, or NULL: dense (B, H, S, D)
  const int32_t* cu_seqlens_k;
  int total_q, total_k;           // packed rows of q and k
  // Paged K/V (fwd v11 only; every other masked kernel returns LAB_E_MODE when block_table is set): packed calls
  // whose k and v are [num_pages, page_size, H_kv, D] caches, base.k_stride / v_stride the (page, key in page, head)
  // strides; key j of sequence b is row j % page_size of page block_table[b * block_table_stride + j / page_size];
  // cu_seqlens_k gives the key lengths only (its rows are not read) and total_k is not read. Never read: a page
  // index outside [0, num_pages), a table entry past max_pages. Such a sequence gets O = 0, LSE = -inf and its
  // page_errors bits (LAB_PAGE_E_*), which are written for every sequence on every call.
  const int32_t* block_table;     // [batch, max_pages] device int32, or NULL: k and v packed as above
  int32_t* page_errors;           // [batch] device int32, written when block_table is set
  int64_t block_table_stride;     // elements between two sequences' rows of block_table
  int num_pages, page_size, max_pages;  // page_size: a multiple of 16
} AttnMaskParams;

#ifdef __cplusplus
}
#endif
