// The lab's one torch binding: checks tensors, fills the plain-C params struct, calls a launcher.
//
// Built once per torch version by lab/build.py (load_inline). Launchers live in separately built
// kernel libraries and arrive here as a function address, so editing a kernel never recompiles
// torch headers. The Python layer (lab/ops.py) raises clear ValueError/TypeError for bad input first;
// these checks stand on their own for anyone calling torch.ops.lab.* or the runners directly: every
// input a kernel cannot take is refused with a RuntimeError naming the argument, or copied into a
// layout it can read (as lab.ops does).
#include <torch/extension.h>
// LAB_BINDING_CPU_CHECKS: the same checks on CPU tensors, nothing launched, for tests/product/test_binding_checks.py
// (a CPU-only torch cannot build or load the CUDA parts).
#ifndef LAB_BINDING_CPU_CHECKS
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#endif
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <deque>
#include <vector>
#include <cmath>
#include <tuple>
#include <cstdio>
#include <string>
#include <initializer_list>
#include <utility>

#include "common/params.h"

namespace {

// Bad input is reported without a C++ exception crossing into Python: each check returns the message of the
// first failure (empty: fine), the bound functions return it, and lab/build.py's wrapper raises it as a
// RuntimeError. Messages are built by plain string appends (msg below), never c10::str / iostreams: on the
// H200 machine (torch 2.11.0+cu130, 2026-11-22) a 3-line load_inline module segfaults when it formats with
// c10::str, whether it throws (TORCH_CHECK) or just returns the string, while std::to_string and a thrown
// std::runtime_error work (outputs/driver_logs/20261122-h200-test_gpu-run3-b39524931e.log, probe at the top).
#define LAB_REQUIRE(cond, ...)                      \
  do {                                              \
    if (!(cond)) return msg(__VA_ARGS__);           \
  } while (0)
#define LAB_TRY(expr)                               \
  do {                                              \
    std::string lab_error_ = (expr);                \
    if (!lab_error_.empty()) return lab_error_;     \
  } while (0)

void append(std::string& out, const char* s) { out += s; }
void append(std::string& out, const std::string& s) { out += s; }
void append(std::string& out, int64_t x) { out += std::to_string(x); }
void append(std::string& out, int x) { out += std::to_string(x); }
void append(std::string& out, double x) {
  char buf[32];
  snprintf(buf, sizeof buf, "%g", x);
  out += buf;
}
void append(std::string& out, c10::ScalarType t) { out += c10::toString(t); }
void append(std::string& out, const c10::Device& d) { out += d.str(); }
void append(std::string& out, c10::IntArrayRef sizes) {
  out += "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(sizes[i]);
  }
  out += "]";
}

template <typename... Args>
std::string msg(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

// The device the kernels need (any device in the CPU check build).
bool on_gpu(const at::Tensor& t) {
#ifdef LAB_BINDING_CPU_CHECKS
  (void)t;
  return true;
#else
  return t.is_cuda();
#endif
}

typedef int (*AttnFwdLauncher)(const AttnFwdParams*, void*);
typedef int (*DecodeLauncher)(const DecodeParams*, void*);
typedef int (*AttnBwdLauncher)(const AttnBwdParams*, void*);

constexpr int64_t kIntMax = 0x7fffffff;  // the params structs hold sizes in int

std::string dtype_code(const at::Tensor& t, int* code) {
  *code = t.scalar_type() == at::kHalf ? LAB_FP16 : LAB_BF16;
  LAB_REQUIRE(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
              "query dtype must be float16 or bfloat16, got ", t.scalar_type());
  return "";
}

// Device, rank, dtype and sizes of a (B, H, S, D) tensor; its layout is handled by readable()/writable().
std::string check_bhsd(const at::Tensor& t, const char* name, const at::Tensor& like) {
  LAB_REQUIRE(on_gpu(t), name, " must be a CUDA tensor, got device ", t.device());
  LAB_REQUIRE(t.device() == like.device(), name, " is on ", t.device(), " but query is on ", like.device());
  LAB_REQUIRE(t.dim() == 4, name, " must be 4-D (B, H, S, D), got ", t.dim(), "-D");
  LAB_REQUIRE(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(), " but query has ",
              like.scalar_type());
  for (int i = 0; i < 4; ++i)
    LAB_REQUIRE(t.size(i) <= kIntMax, name, ".size(", i, ") = ", t.size(i), " does not fit the kernels' int sizes");
  return "";
}

// The kernels' stride rule: last stride 1, other strides multiples of 8 elements and never 0 on a dim of size > 1
// (an expanded tensor). A size-1 dim's stride is never used.
bool strides_ok(const at::Tensor& t) {
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  for (int i = 0; i < 3; ++i)
    if (t.size(i) > 1 && (t.stride(i) == 0 || t.stride(i) % 8 != 0)) return false;
  return true;
}

// What the kernels read with 16-byte loads: data 16-byte aligned, and the stride rule.
bool layout_ok(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && strides_ok(t);
}

// A fresh contiguous copy (a new, aligned allocation: .contiguous() would return a contiguous view at an
// odd offset unchanged) of any input the kernels cannot read as it is, as lab.ops does: right, only slower.
at::Tensor readable(const at::Tensor& t) {
  if (t.numel() == 0 || layout_ok(t)) return t;
  return at::empty(t.sizes(), t.options()).copy_(t);
}

// A gradient in its input's layout: a (B, H, S, D) view of (B, S, H, D) memory (what a model's projections give,
// q_proj(x).view(B, S, H, D).transpose(1, 2)) gets a gradient with the same strides, so autograd hands it back to
// the projection as a view. A contiguous gradient there costs a transposing copy per tensor on the way back (three
// of them took 278 us beside the 653 us dK / dV kernel, 8 x 2048 causal at D 128 on an H200). Inputs the kernels
// cannot read through their strides, or that are not dense, get a contiguous gradient as before. The rule reads
// strides only (not the data's alignment), so the ops' fakes (lab.op_common.grad_like) give the same layout under
// torch.compile.
at::Tensor grad_like(const at::Tensor& t) {
  const bool ok = t.numel() > 0 && t.dim() == 4 && t.is_non_overlapping_and_dense() && strides_ok(t);
  return ok ? at::empty_like(t, at::MemoryFormat::Preserve) : at::empty(t.sizes(), t.options());
}

// The tensor the kernel writes: `out` itself when its layout allows, else a contiguous buffer copied into
// `out` afterwards (finish()). An out that overlaps itself (a stride of 0) or an input is refused.
std::string writable(const at::Tensor& out, std::initializer_list<std::pair<const at::Tensor*, const char*>> inputs,
                     at::Tensor* written) {
  *written = out;
  if (out.numel() == 0) return "";
  LAB_REQUIRE(at::has_internal_overlap(out) != at::MemOverlap::Yes,
              "out has a stride of 0 on a dim of size > 1 (several elements share memory); pass a dense tensor");
  // get_overlap_status answers TooHard for any non-contiguous input (a KV-cache slice, a transposed
  // view): that is no evidence of overlap, so only a proven one (Full, Partial) is refused.
  for (const auto& in : inputs) {
    if (in.first->numel() == 0) continue;
    const auto status = at::get_overlap_status(out, *in.first);
    LAB_REQUIRE(status != at::MemOverlapStatus::Full && status != at::MemOverlapStatus::Partial,
                "out overlaps ", in.second, "; pass a separate output tensor");
  }
  if (!layout_ok(out)) *written = at::empty(out.sizes(), out.options());
  return "";
}

void finish(at::Tensor& out, const at::Tensor& written) {
  if (!written.is_same(out)) out.copy_(written);
}

// A size-1 dim is only ever indexed by 0, so its stride is free: one that the kernels would refuse (odd, 0)
// becomes the stride a contiguous tensor has there (a multiple of D, nonzero), as a copy would have.
void copy_strides(int64_t* dst, const at::Tensor& t) {
  for (int i = 0; i < 3; ++i) {
    dst[i] = t.stride(i);
    if (t.size(i) == 1 && (dst[i] == 0 || dst[i] % 8 != 0)) {
      dst[i] = 1;
      for (int j = i + 1; j < 4; ++j) dst[i] *= t.size(j);
    }
  }
}

// Both params structs carry q/k/v/o strides under the same names.
template <typename Params>
void copy_all_strides(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o) {
  copy_strides(p.q_stride, q);
  copy_strides(p.k_stride, k);
  copy_strides(p.v_stride, v);
  copy_strides(p.o_stride, o);
}

// Batch, head dim and head counts of query, key/value and out agree; no size makes a kernel divide by 0.
std::string check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                  const char* kname, const char* vname) {
  LAB_REQUIRE(k.size(0) == q.size(0), kname, " has batch ", k.size(0), " but query has batch ", q.size(0));
  LAB_REQUIRE(k.sizes() == v.sizes(), kname, " and ", vname, " shapes differ: ", k.sizes(), " vs ", v.sizes());
  LAB_REQUIRE(q.size(3) > 0, "query head dim must be positive, got ", q.size(3));
  LAB_REQUIRE(k.size(3) == q.size(3), kname, " has head dim ", k.size(3), " but query has ", q.size(3));
  LAB_REQUIRE(k.size(1) > 0, kname, " must have at least one head, got ", k.size(1));
  LAB_REQUIRE(q.size(1) % k.size(1) == 0, "query heads (", q.size(1), ") must be a multiple of ", kname, " heads (",
              k.size(1), ")");
  LAB_REQUIRE(o.sizes() == q.sizes(), "out must have the query's shape ", q.sizes(), ", got ", o.sizes());
  return "";
}

std::string check_scale(double scale) {
  LAB_REQUIRE(std::isfinite(scale) && std::fabs(scale) <= 3.4028234663852886e38,
              "scale must be a finite float32 value, got ", scale);
  return "";
}

// A float32 CUDA tensor on query's device, contiguous, with at least (exactly, if exact) `numel` elements.
std::string float_buffer(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t numel, bool exact,
                         float** ptr) {
  LAB_REQUIRE(on_gpu(t) && t.device() == q.device(), name, " must be a CUDA tensor on query's device ", q.device(),
              ", got ", t.device());
  LAB_REQUIRE(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  LAB_REQUIRE(t.is_contiguous(), name, " must be contiguous");
  LAB_REQUIRE(exact ? t.numel() == numel : t.numel() >= numel, name, " must have ", exact ? "" : "at least ", numel,
              " elements, got ", t.numel(), " (shape ", t.sizes(), ")");
  LAB_REQUIRE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " data pointer is not 16-byte aligned");
  *ptr = t.data_ptr<float>();
  return "";
}

std::string launch_error(int rc, const char* what) {
  if (rc == 0) return "";
  if (rc < 0) {
    const char* reason = rc == LAB_E_HEAD_DIM ? "head_dim not supported by this kernel"
                         : rc == LAB_E_DTYPE ? "dtype not supported by this kernel"
                         : rc == LAB_E_SHAPE ? "shape not supported by this kernel"
                         : rc == LAB_E_WORKSPACE ? "missing workspace"
                         : rc == LAB_E_MODE    ? "mode not supported by this kernel (deterministic)"
                                               : "unknown launcher error";
    return msg(what, ": ", reason, " (code ", rc, ")");
  }
#ifdef LAB_BINDING_CPU_CHECKS
  return msg(what, ": CUDA error ", rc);
#else
  return msg(what, ": CUDA error ", rc, ": ", cudaGetErrorString(static_cast<cudaError_t>(rc)));
#endif
}

// Launch a kernel through its launcher address on the current stream; the message of its error code, or "".
// The CPU build of the checks (LAB_BINDING_CPU_CHECKS, tests/product/test_binding_checks.py) stops before it.
template <typename Launcher, typename Params>
std::string run_launcher(int64_t launcher, const Params& p, const char* what) {
#ifdef LAB_BINDING_CPU_CHECKS
  (void)launcher, (void)p, (void)what;
  return "";
#else
  return launch_error(reinterpret_cast<Launcher>(launcher)(&p, c10::cuda::getCurrentCUDAStream().stream()), what);
#endif
}

// What every call checks first: query, key/value and out are 4-D CUDA tensors of query's dtype and device,
// their shapes agree, the scale is a finite float32. Sets the dtype code.
std::string check_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                       const char* kname, const char* vname, double scale, int* dtype) {
  LAB_TRY(check_bhsd(q, "query", q));
  LAB_TRY(check_bhsd(k, kname, q));
  LAB_TRY(check_bhsd(v, vname, q));
  LAB_TRY(check_bhsd(o, "out", q));
  LAB_TRY(check_shapes(q, k, v, o, kname, vname));
  LAB_TRY(dtype_code(q, dtype));
  return check_scale(scale);
}

// The fields every params struct names alike (AttnFwdParams, AttnBwdParams, DecodeParams), from the tensors the
// kernel reads: q and o, the four tensors' strides, B, H_q, D, the scale, causal, the dtype code.
template <typename Params>
void fill_common(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                 double scale, bool causal, int dtype) {
  p.q = q.data_ptr();
  p.o = o.data_ptr();
  copy_all_strides(p, q, k, v, o);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.head_dim = q.size(3);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.dtype = dtype;
}

// The fields forward and backward params share (AttnFwdParams, AttnBwdParams), from the tensors the kernel reads.
template <typename Params>
void fill_attention(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                    double scale, bool causal, int dtype) {
  fill_common(p, q, k, v, o, scale, causal, dtype);
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.heads_kv = k.size(1);
  p.seqlen_q = q.size(2);
  p.seqlen_k = k.size(2);
}

// The end of a forward or decode call, once its checks have passed: `o` made writable (writable(): a stand-in
// written back by finish() when o cannot be written directly), nothing launched for an empty query (on_empty()
// then), the device guard, readable copies of q, k, v (copies of misaligned or unusual strides must outlive
// the launch: named, not temporaries) handed with the written tensor to launch(qr, kr, vr, ow), which fills
// the params and runs the launcher; then o finished. The message of the first problem, or "".
template <class Launch, class OnEmpty>
std::string launch_on_copies(at::Tensor& o, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const char* kname, const char* vname, Launch&& launch, OnEmpty&& on_empty) {
  at::Tensor ow;
  LAB_TRY(writable(o, {{&q, "query"}, {&k, kname}, {&v, vname}}, &ow));
  if (q.numel() == 0) {
    on_empty();
    return "";
  }
#ifndef LAB_BINDING_CPU_CHECKS
  c10::cuda::CUDAGuard guard(q.device());
#endif
  at::Tensor qr = readable(q), kr = readable(k), vr = readable(v);
  LAB_TRY(launch(qr, kr, vr, ow));
  finish(o, ow);
  return "";
}
void nothing() {}

// The checks and the launch of one forward call; the message of the first problem, or "".
std::string attn_fwd_impl(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                          c10::optional<at::Tensor> lse, double scale, bool causal, c10::optional<at::Tensor> debug) {
  int dtype = 0;
  LAB_TRY(check_call(q, k, v, o, "key", "value", scale, &dtype));
  AttnFwdParams p{};
  if (lse.has_value()) LAB_TRY(float_buffer(*lse, "lse", q, q.size(0) * q.size(1) * q.size(2), true, &p.lse));
  if (debug.has_value()) LAB_TRY(float_buffer(*debug, "debug", q, 0, false, &p.debug));
  auto launch = [&](const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr, const at::Tensor& ow) {
    fill_attention(p, qr, kr, vr, ow, scale, causal, dtype);
    return run_launcher<AttnFwdLauncher>(launcher, p, "attention kernel");
  };
  return launch_on_copies(o, q, k, v, "key", "value", launch, nothing);
}

// The checks and fields decode and paged decode share: num_splits, the split workspaces (partial O and LSE,
// float32), the kernels' int offsets for `keys` keys (the cache length, or the block table's capacity: `what`),
// and cache_seqlens (values past the cache are clamped by the kernels, never read beyond it).
std::string decode_splits(DecodeParams& p, const at::Tensor& q, int64_t keys, const char* what,
                          const c10::optional<at::Tensor>& cache_seqlens, const at::Tensor& partial_o,
                          const at::Tensor& partial_lse, int64_t num_splits) {
  LAB_REQUIRE(num_splits >= 1 && num_splits <= LAB_MAX_NUM_SPLITS, "num_splits must be in [1, ", LAB_MAX_NUM_SPLITS,
              "], got ", num_splits);
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);  // output rows (b, h, token)
  LAB_REQUIRE(rows * num_splits * q.size(3) <= kIntMax, "num_splits = ", num_splits,
              " is too large for this shape: B*Hq*q_len*num_splits*D = ", rows * num_splits * q.size(3),
              " must fit in int32");
  LAB_REQUIRE(keys + 64 * num_splits <= kIntMax, what, " ", keys, " with num_splits = ", num_splits,
              " overflows the kernels' int key offsets");
  if (cache_seqlens.has_value()) {
    const at::Tensor& s = *cache_seqlens;
    LAB_REQUIRE(on_gpu(s) && s.device() == q.device(), "cache_seqlens must be a CUDA tensor on query's device ",
                q.device(), ", got ", s.device());
    LAB_REQUIRE(s.scalar_type() == at::kInt && s.is_contiguous() && s.dim() == 1 && s.numel() == q.size(0),
                "cache_seqlens must be a contiguous int32 tensor of shape (", q.size(0), ",), got ", s.scalar_type(),
                " of shape ", s.sizes());
    p.cache_seqlens = s.data_ptr<int32_t>();
  }
  LAB_TRY(float_buffer(partial_o, "partial_o", q, rows * num_splits * q.size(3), false, &p.partial_o));
  return float_buffer(partial_lse, "partial_lse", q, rows * num_splits, false, &p.partial_lse);
}

// The fields decode and paged decode share, from the tensors the kernel reads: the caches' KV-head count and
// the key count the split plan covers (the cache length, or the block table's capacity) come from the caller.
void fill_decode(DecodeParams& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                 int64_t heads_kv, int64_t seqlen_cache, int64_t num_splits, double scale, int dtype, bool causal) {
  fill_common(p, q, k, v, o, scale, causal, dtype);
  p.k_cache = k.data_ptr();
  p.v_cache = v.data_ptr();
  p.heads_kv = heads_kv;
  p.q_len = q.size(2);
  p.seqlen_cache = static_cast<int>(seqlen_cache);
  p.num_splits = static_cast<int>(num_splits);
}

// A decode call's masks (DecodeParams' window, softcap and sinks; kernels/common/decode_masks.cuh), checked here:
// window entries >= -1 (-1: unbounded; any >= 0 sets the window), softcap finite and >= 0, sinks a contiguous
// float32 (H_q,) tensor on the query's device. Edges past the int range are clamped (they see everything anyway).
struct DecodeMasks {
  int window = 0, left = -1, right = -1;
  float softcap = 0.f;
  const float* sinks = nullptr;
};
std::string decode_masks(const at::Tensor& q, int64_t left, int64_t right, double softcap,
                         const c10::optional<at::Tensor>& sinks, DecodeMasks* m) {
  LAB_REQUIRE(left >= -1 && right >= -1, "window_size entries must be >= -1 (-1: unbounded), got (", left, ", ",
              right, ")");
  LAB_REQUIRE(std::isfinite(softcap) && softcap >= 0.0, "softcap must be a finite float >= 0 (0 = off), got ",
              softcap);
  m->window = left >= 0 || right >= 0;
  m->left = static_cast<int>(std::min(left, kIntMax));
  m->right = static_cast<int>(std::min(right, kIntMax));
  m->softcap = static_cast<float>(softcap);
  if (sinks.has_value()) {
    const at::Tensor& t = *sinks;
    LAB_REQUIRE(on_gpu(t) && t.device() == q.device(), "sinks must be a CUDA tensor on query's device ", q.device(),
                ", got ", t.device());
    LAB_REQUIRE(t.scalar_type() == at::kFloat && t.dim() == 1 && t.size(0) == q.size(1) && t.is_contiguous(),
                "sinks must be a contiguous float32 tensor of shape (", q.size(1), ",), got ", t.scalar_type(),
                " of shape ", t.sizes());
    m->sinks = t.data_ptr<float>();
  }
  return "";
}
void apply_masks(DecodeParams& p, const DecodeMasks* m) {
  if (m == nullptr) return;
  p.window = m->window;
  p.window_left = m->left;
  p.window_right = m->right;
  p.softcap = m->softcap;
  p.sinks = m->sinks;
}

std::string decode_fwd_impl(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                            c10::optional<at::Tensor> cache_seqlens, at::Tensor partial_o, at::Tensor partial_lse,
                            c10::optional<at::Tensor> lse, double scale, int64_t num_splits, bool causal = false,
                            const DecodeMasks* masks = nullptr) {
  int dtype = 0;
  LAB_TRY(check_call(q, k, v, o, "key_cache", "value_cache", scale, &dtype));
  DecodeParams p{};
  LAB_TRY(decode_splits(p, q, k.size(2), "key_cache length", cache_seqlens, partial_o, partial_lse, num_splits));
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);  // output rows (b, h, token)
  if (lse.has_value()) LAB_TRY(float_buffer(*lse, "lse", q, rows, true, &p.lse));
  auto launch = [&](const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr, const at::Tensor& ow) {
    // causal is bottom-right; only decode v03 reads it (lab.ops sends causal calls nowhere else)
    fill_decode(p, qr, kr, vr, ow, k.size(1), k.size(2), num_splits, scale, dtype, causal);
    apply_masks(p, masks);
    return run_launcher<DecodeLauncher>(launcher, p, "decode kernel");
  };
  return launch_on_copies(o, q, k, v, "key_cache", "value_cache", launch, nothing);
}

// Paged decode (decode v03): caches (num_pages, page_size, H_kv, D), block_table (B, max_pages) int32,
// page_errors (B,) int32 that the kernel writes every call (0, or LAB_PAGE_E_* bits: that sequence's output
// is 0). The table's contents and cache_seqlens' values are never read here (graph capture; the kernel
// checks them on the device).
std::string check_paged_cache(const at::Tensor& t, const char* name, const at::Tensor& q) {
  LAB_REQUIRE(on_gpu(t) && t.device() == q.device(), name, " must be a CUDA tensor on query's device ", q.device(),
              ", got ", t.device());
  LAB_REQUIRE(t.dim() == 4, name, " must be 4-D (num_pages, page_size, H_kv, D) with a block_table, got ", t.dim(),
              "-D");
  LAB_REQUIRE(t.scalar_type() == q.scalar_type(), name, " has dtype ", t.scalar_type(), " but query has ",
              q.scalar_type());
  for (int i = 0; i < 4; ++i)
    LAB_REQUIRE(t.size(i) <= kIntMax, name, ".size(", i, ") = ", t.size(i), " does not fit the kernels' int sizes");
  return "";
}

// errors: the caller's page_errors (or one allocated for the call), checked here; nullptr for the lab-owned flags of
// the deferred call (decode_paged_deferred).
std::string check_paged(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                        const at::Tensor& table, const at::Tensor* errors) {
  LAB_TRY(check_bhsd(q, "query", q));
  LAB_TRY(check_bhsd(o, "out", q));
  LAB_TRY(check_paged_cache(k, "key_cache", q));
  LAB_TRY(check_paged_cache(v, "value_cache", q));
  LAB_REQUIRE(k.sizes() == v.sizes(), "key_cache and value_cache shapes differ: ", k.sizes(), " vs ", v.sizes());
  LAB_REQUIRE(k.size(0) > 0, "key_cache has no pages (num_pages = 0)");
  LAB_REQUIRE(k.size(1) > 0 && k.size(1) % 16 == 0, "page_size (key_cache.size(1)) must be a positive multiple of 16, got ",
              k.size(1));
  LAB_REQUIRE(q.size(3) > 0, "query head dim must be positive, got ", q.size(3));
  LAB_REQUIRE(k.size(3) == q.size(3), "key_cache has head dim ", k.size(3), " but query has ", q.size(3));
  LAB_REQUIRE(k.size(2) > 0, "key_cache must have at least one head, got ", k.size(2));
  LAB_REQUIRE(q.size(1) % k.size(2) == 0, "query heads (", q.size(1), ") must be a multiple of key_cache heads (",
              k.size(2), ")");
  LAB_REQUIRE(o.sizes() == q.sizes(), "out must have the query's shape ", q.sizes(), ", got ", o.sizes());
  LAB_REQUIRE(on_gpu(table) && table.device() == q.device(), "block_table must be a CUDA tensor on query's device ",
              q.device(), ", got ", table.device());
  LAB_REQUIRE(table.scalar_type() == at::kInt && table.dim() == 2 && table.size(0) == q.size(0),
              "block_table must be an int32 tensor of shape (", q.size(0), ", max_pages), got ", table.scalar_type(),
              " of shape ", table.sizes());
  LAB_REQUIRE(table.size(1) > 0, "block_table must have at least one column (max_pages >= 1)");
  LAB_REQUIRE((table.size(1) <= 1 || table.stride(1) == 1) && (table.size(0) <= 1 || table.stride(0) >= table.size(1)),
              "block_table rows must be contiguous and must not overlap (stride(1) == 1, stride(0) >= max_pages)");
  LAB_REQUIRE(table.size(1) * k.size(1) <= kIntMax, "block_table capacity max_pages * page_size = ",
              table.size(1) * k.size(1), " does not fit the kernels' int key offsets");
  if (errors == nullptr) return "";
  LAB_REQUIRE(on_gpu(*errors) && errors->device() == q.device() && errors->scalar_type() == at::kInt &&
                  errors->is_contiguous() && errors->numel() == q.size(0),
              "page_errors must be a contiguous int32 CUDA tensor of ", q.size(0), " elements on query's device, got ",
              errors->scalar_type(), " of shape ", errors->sizes(), " on ", errors->device());
  return "";
}

// The kernel writes its flags into errors (the caller's page_errors, or one allocated for the call) or, with errors
// nullptr, into `flags` (a slot of the deferred call's queue); zero_flags() clears them when nothing is launched.
template <class ZeroFlags>
std::string decode_paged_impl(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                              c10::optional<at::Tensor> cache_seqlens, at::Tensor table, const at::Tensor* errors,
                              int32_t* flags, at::Tensor partial_o, at::Tensor partial_lse, double scale,
                              int64_t num_splits, bool causal, ZeroFlags&& zero_flags,
                              const DecodeMasks* masks = nullptr) {
  int dtype = 0;
  LAB_TRY(check_paged(q, k, v, o, table, errors));
  LAB_TRY(dtype_code(q, &dtype));
  LAB_TRY(check_scale(scale));
  const int64_t capacity = table.size(1) * k.size(1);
  DecodeParams p{};
  LAB_TRY(decode_splits(p, q, capacity, "block_table capacity", cache_seqlens, partial_o, partial_lse, num_splits));
  auto launch = [&](const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr, const at::Tensor& ow) {
    // caches (num_pages, page_size, H_kv, D): the strides copied are (page, key in page, head)
    fill_decode(p, qr, kr, vr, ow, k.size(2), capacity, num_splits, scale, dtype, causal);
    p.block_table = table.data_ptr<int32_t>();
    p.block_table_stride = table.size(0) > 1 ? table.stride(0) : table.size(1);
    p.page_errors = errors != nullptr ? errors->data_ptr<int32_t>() : flags;
    p.num_pages = static_cast<int>(k.size(0));
    p.page_size = static_cast<int>(k.size(1));
    p.max_pages = static_cast<int>(table.size(1));
    apply_masks(p, masks);
    return run_launcher<DecodeLauncher>(launcher, p, "paged decode kernel");
  };
  // no query rows: no launch, and no sequence is flagged
  return launch_on_copies(o, q, k, v, "key_cache", "value_cache", launch, zero_flags);
}

// ------------------------------------------------------------------ the deferred call's page flags
// lab.ops.decode's default paged call (no page_errors; lab/decode/deferred.py) reads no flags after its kernel, so it
// never waits for the GPU. The kernel writes page_errors into a slot of pinned host memory through the slot's device
// alias (no copy on the stream: a device-to-host copy after the kernel would add a node of a few microseconds to a
// step of tens), and an event is recorded after it on the current stream. The slot waits in its device's queue;
// each later deferred call on that device, and page_flags_check, retires the slots whose event has completed,
// oldest first, without waiting (page_flags_check(true) waits), and hands back those with a flag set: (device,
// call number, the flags as a CPU tensor). Retired slots are reused, so a decoding loop allocates nothing once
// warm; with kMaxPendingFlags slots queued a call first waits for the oldest (the host is then that many calls
// ahead of the GPU, which hides every host cost). The CPU check build stands in for the device (host memory, and
// events that complete when page_flags_cpu_complete says), so tests/decode/test_paged_deferred.py runs the queue itself.
constexpr size_t kMaxPendingFlags = 64;
constexpr int64_t kFlagSlotInts = 256;  // a slot holds at least this many flags: one slot fits every usual batch

#ifdef LAB_BINDING_CPU_CHECKS
typedef int64_t FlagEvent;  // a ticket, done once page_flags_cpu_complete has passed it
int64_t cpu_tickets = 0, cpu_done = 0;
bool cpu_capturing = false;
#else
typedef cudaEvent_t FlagEvent;
#endif

struct FlagSlot {
  int32_t* host = nullptr;    // pinned and mapped (cudaHostAllocMapped): read here once `done` has completed
  int32_t* device = nullptr;  // the same memory as the kernel addresses it
  int64_t capacity = 0, batch = 0, call = 0;
  FlagEvent done{};
};

struct FlagQueue {
  std::deque<FlagSlot> pending;  // oldest first
  std::vector<FlagSlot> spare;
  int64_t calls = 0, waits = 0;  // deferred calls queued; times a full queue waited for its oldest slot
};

typedef std::vector<std::tuple<int64_t, int64_t, at::Tensor>> BadFlags;  // (device, call, flags (B,) int32 CPU)

std::vector<FlagQueue>& flag_queues() {
  static auto* queues = new std::vector<FlagQueue>();  // never destroyed: no CUDA call during process exit
  return *queues;
}

FlagQueue& flag_queue(int64_t device) {
  auto& queues = flag_queues();
  if (static_cast<int64_t>(queues.size()) <= device) queues.resize(device + 1);
  return queues[device];
}

int64_t flag_device(const at::Tensor& q) { return std::max<int64_t>(q.get_device(), 0); }  // CPU build: "device" 0

std::string flag_cuda_error(int status, const char* what) {
#ifdef LAB_BINDING_CPU_CHECKS
  return msg("page flags: ", what, ": CUDA error ", status);
#else
  (void)cudaGetLastError();
  return msg("page flags: ", what, ": CUDA error ", status, ": ", cudaGetErrorString(static_cast<cudaError_t>(status)));
#endif
}

// Whether the current stream of `device` is being captured into a CUDA graph: then no event is queried or recorded
// (a query during capture invalidates it) and the call keeps its flags on the device, unread.
bool capturing(int64_t device) {
#ifdef LAB_BINDING_CPU_CHECKS
  (void)device;
  return cpu_capturing;
#else
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device).stream(), &status) != cudaSuccess) {
    (void)cudaGetLastError();  // the legacy stream while another stream captures: treat it as capturing
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
#endif
}

std::string event_done(FlagEvent event, bool wait, bool* done) {
#ifdef LAB_BINDING_CPU_CHECKS
  if (wait) cpu_done = std::max(cpu_done, event);
  *done = event <= cpu_done;
  return "";
#else
  const cudaError_t status = wait ? cudaEventSynchronize(event) : cudaEventQuery(event);
  *done = status == cudaSuccess;
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: cleared so that the next launch's check does not see it
    return "";
  }
  return *done ? "" : flag_cuda_error(status, "waiting for a decode call's flags");
#endif
}

// The oldest slot, its event completed: its flags copied out if any is set, the slot spare again.
void retire_oldest(FlagQueue& queue, int64_t device, BadFlags& bad) {
  const FlagSlot slot = queue.pending.front();
  queue.pending.pop_front();
  if (std::any_of(slot.host, slot.host + slot.batch, [](int32_t f) { return f != 0; })) {
    at::Tensor flags = at::empty({slot.batch}, at::TensorOptions().dtype(at::kInt));
    std::copy(slot.host, slot.host + slot.batch, flags.data_ptr<int32_t>());
    bad.emplace_back(device, slot.call, flags);
  }
  queue.spare.push_back(slot);
}

// Retires the device's completed slots, oldest first, up to the first one still running (wait: all of them).
std::string drain(int64_t device, bool wait, BadFlags& bad) {
  FlagQueue& queue = flag_queue(device);
  while (!queue.pending.empty()) {
    bool done = false;
    LAB_TRY(event_done(queue.pending.front().done, wait, &done));
    if (!done) return "";
    retire_oldest(queue, device, bad);
  }
  return "";
}

// A spare slot that holds `batch` flags, or a new one (pinned memory and an event: the only allocations).
std::string take_slot(FlagQueue& queue, int64_t batch, FlagSlot* slot) {
  for (size_t i = 0; i < queue.spare.size(); ++i) {
    if (queue.spare[i].capacity < batch) continue;
    *slot = queue.spare[i];
    queue.spare[i] = queue.spare.back();
    queue.spare.pop_back();
    return "";
  }
  slot->capacity = std::max(batch, kFlagSlotInts);
#ifdef LAB_BINDING_CPU_CHECKS
  slot->host = slot->device = new int32_t[slot->capacity]();  // kept for the process's life, as on the GPU
#else
  // Portable: any device may write it; with unified addressing the device alias is the host pointer itself.
  cudaError_t status = cudaHostAlloc(reinterpret_cast<void**>(&slot->host), slot->capacity * sizeof(int32_t),
                                     cudaHostAllocMapped | cudaHostAllocPortable);
  if (status != cudaSuccess) return flag_cuda_error(status, "pinned flags buffer");
  status = cudaHostGetDevicePointer(reinterpret_cast<void**>(&slot->device), slot->host, 0);
  if (status != cudaSuccess) return flag_cuda_error(status, "device alias of the pinned flags buffer");
  status = cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming);
  if (status != cudaSuccess) return flag_cuda_error(status, "flags event");
#endif
  return "";
}

std::string record_slot(FlagSlot& slot, int64_t device) {
#ifdef LAB_BINDING_CPU_CHECKS
  (void)device;
  slot.done = ++cpu_tickets;
#else
  const cudaError_t status = cudaEventRecord(slot.done, c10::cuda::getCurrentCUDAStream(device).stream());
  if (status != cudaSuccess) return flag_cuda_error(status, "recording the flags event");
#endif
  return "";
}

// Backward (kernels/bwd/*): the checks, the gradients and one float32 workspace allocated here, the launch.
// dq, dk, dv come back in the layout of q, k, v (grad_like); the workspace holds delta and lse*log2(e) per padded
// query row and a float32 dQ accumulator.
std::string attn_bwd_impl(int64_t launcher, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& o, const at::Tensor& lse, const c10::optional<at::Tensor>& dlse,
                          const at::Tensor& dout, double scale, bool causal, bool deterministic, at::Tensor* dq,
                          at::Tensor* dk, at::Tensor* dv) {
  int dtype = 0;
  LAB_TRY(check_call(q, k, v, o, "key", "value", scale, &dtype));
  LAB_TRY(check_bhsd(dout, "grad_out", q));
  LAB_REQUIRE(dout.sizes() == q.sizes(), "grad_out must have the query's shape ", q.sizes(), ", got ", dout.sizes());
  AttnBwdParams p{};
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);
  float* lse_ptr = nullptr;
  LAB_TRY(float_buffer(lse, "lse", q, rows, true, &lse_ptr));
  p.lse = lse_ptr;
  if (dlse.has_value()) {
    float* dlse_ptr = nullptr;
    LAB_TRY(float_buffer(*dlse, "grad_lse", q, rows, true, &dlse_ptr));
    p.dlse = dlse_ptr;
  }
  *dq = grad_like(q);
  *dk = grad_like(k);
  *dv = grad_like(v);
  if (q.numel() == 0 || k.numel() == 0) {  // no query rows or no keys: every gradient is 0
    dq->zero_();
    dk->zero_();
    dv->zero_();
    return "";
  }
#ifndef LAB_BINDING_CPU_CHECKS
  c10::cuda::CUDAGuard guard(q.device());
#endif
  const int64_t padded = q.size(0) * q.size(1) *
                         ((q.size(2) + LAB_BWD_ROW_PAD - 1) / LAB_BWD_ROW_PAD * LAB_BWD_ROW_PAD);
  // dq_accum and, after it, a word per padded row for the tile counters (kernels/common/params.h); in the
  // deterministic mode too, where bwd v17 adds dQ there in a fixed order (v01's dQ pass leaves it unread)
  // dq_accum's width is the kernel's: a narrow head dim (bwd v20) runs on the next multiple of 64
  const int64_t width = (q.size(3) + 63) / 64 * 64;
  at::Tensor work = at::empty({2 * padded + padded * (width + 1)}, q.options().dtype(at::kFloat));
  p.delta = work.data_ptr<float>();
  p.lse_log2 = p.delta + padded;
  p.dq_accum = p.delta + 2 * padded;
  at::Tensor qr = readable(q), kr = readable(k), vr = readable(v), orr = readable(o), dr = readable(dout);
  fill_attention(p, qr, kr, vr, orr, scale, causal, dtype);
  p.dout = dr.data_ptr();
  p.dq = dq->data_ptr();
  p.dk = dk->data_ptr();
  p.dv = dv->data_ptr();
  copy_strides(p.do_stride, dr);
  copy_strides(p.dq_stride, *dq);
  copy_strides(p.dk_stride, *dk);
  copy_strides(p.dv_stride, *dv);
  p.deterministic = deterministic;
  LAB_TRY(run_launcher<AttnBwdLauncher>(launcher, p, "attention backward kernel"));
  return "";
}

}  // namespace

// Both return "" on success or the error message (raised by lab/build.py's wrapper).
std::string attn_fwd(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                     c10::optional<at::Tensor> lse, double scale, bool causal, c10::optional<at::Tensor> debug) {
  return attn_fwd_impl(launcher, q, k, v, o, lse, scale, causal, debug);
}

std::string decode_fwd(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                       c10::optional<at::Tensor> cache_seqlens, at::Tensor partial_o, at::Tensor partial_lse,
                       c10::optional<at::Tensor> lse, double scale, int64_t num_splits) {
  return decode_fwd_impl(launcher, q, k, v, o, cache_seqlens, partial_o, partial_lse, lse, scale, num_splits);
}

// What lab.ops calls: the same checks and launch, with the output and workspaces allocated here. An
// allocation through at::empty costs ~1 us against ~2.7 us through Python (H200 machine, 2026-11-22, each
// stage of the call path timed alone), and decode needs three per call, while a batch-1 decoding step is a
// few tens of microseconds of GPU work: the whole host path must stay within SDPA's + 5 us or it, not the
// kernel, sets the step time. Returns (error, out, lse); the tensors are undefined (None) when error is not empty.
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> attn_call(int64_t launcher, at::Tensor q, at::Tensor k,
                                                                      at::Tensor v, double scale, bool causal,
                                                                      bool want_lse) {
  if (q.dim() != 4) return {msg("query must be 4-D (B, H, S, D), got ", q.sizes()), at::Tensor(), c10::nullopt};
  at::Tensor o = at::empty(q.sizes(), q.options());
  c10::optional<at::Tensor> lse;
  if (want_lse) lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  std::string error = attn_fwd_impl(launcher, q, k, v, o, lse, scale, causal, c10::nullopt);
  return {error, o, lse};
}

// The eager calls' scale: None is 1/sqrt(D), computed as Python's 1.0 / math.sqrt(D) is (both correctly rounded),
// so the one-crossing calls and lab.ops' full path pass the same float.
double scale_or_default(const c10::optional<double>& scale, const at::Tensor& q) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// lab.ops.attention's eager call in one crossing. Here only the Python layer's rules that attn_call's checks
// (check_call: device, rank, dtype, shapes, scale) do not make: an autograd call, a last dim with stride != 1
// (attn_call would copy it, ops._check_tensor raises), query heads != key heads without enable_gqa, an empty
// key. A refusal answers "refused", attn_call's checks answer their message; on any answer lab.ops takes its
// full path, which raises the right TypeError/ValueError. Why: the public op's host time shows in every short
// row of n9's race (an L2-flushed call does not hide it), and each Python attribute read of the checks costs about what the C++ check does.
bool python_rules_hold(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool enable_gqa,
                       bool gradients = false) {
  if (!gradients && at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad()))
    return false;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4) return false;  // (the rules below index dims 1-3)
    if (t->stride(3) != 1 && t->numel() != 0) return false;
  }
  return k.size(2) > 0 && (enable_gqa || q.size(1) == k.size(1));
}

std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> attn_auto(int64_t launcher, at::Tensor q, at::Tensor k,
                                                                      at::Tensor v, bool causal, bool enable_gqa,
                                                                      bool want_lse, c10::optional<double> scale) {
  if (!python_rules_hold(q, k, v, enable_gqa)) return {"refused", at::Tensor(), c10::nullopt};
  const double s = scale_or_default(scale, q);
  return attn_call(launcher, q, k, v, s, causal, want_lse);
}

// lab.ops.attention's eager masked calls (window_size / softcap / sinks, and attention_varlen) in one crossing, as
// attn_auto is the dense call's. lab.masks.fast keys a plan by what its full path checked once (the mask from
// lab.masks.spec, the diagonal offset, the kernel), so only the rules that can change between two calls of one
// plan are left: a gradient wanted (sinks' too), a last dim with stride != 1, GQA without enable_gqa, an empty key
// answer "refused"; the checks here the rest (sinks and cu_seqlens as the kernel reads them: contiguous, on query's
// device, of the right dtype and length). On any answer lab.ops takes its full path, which raises the right error.
// Why: the masked calls' Python path cost 87-126 us of host time against the dense call's 17 us (H100's host), and a
// cold call's window holds what a flush does not hide.
typedef int (*AttnMaskLauncher)(const AttnMaskParams*, void*);

std::string mask_fields(AttnMaskParams& p, int64_t left, int64_t right, int64_t offset, double softcap,
                        const c10::optional<at::Tensor>& sinks, const at::Tensor& q) {
  for (int64_t x : {left, right, offset})
    LAB_REQUIRE(x >= -kIntMax && x <= kIntMax, "window_size / offset ", x, " does not fit the kernels' int");
  LAB_REQUIRE(std::isfinite(softcap) && softcap >= 0 && softcap <= 3.4028234663852886e38,
              "softcap must be a finite float32 value >= 0, got ", softcap);
  float* sink = nullptr;
  if (sinks.has_value()) LAB_TRY(float_buffer(*sinks, "sinks", q, q.size(1), true, &sink));
  p.window_left = static_cast<int>(left);
  p.window_right = static_cast<int>(right);
  p.diag_offset = static_cast<int>(offset);
  p.softcap = static_cast<float>(softcap);
  p.sinks = sink;
  return "";
}

bool wants_grad(const c10::optional<at::Tensor>& t) {
  return t.has_value() && at::GradMode::is_enabled() && t->requires_grad();
}

// The dense masked call: (B, H, S, D) tensors, out (and lse) allocated here. causal arrives as right = 0.
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> attn_mask_auto(
    int64_t launcher, int64_t left, int64_t right, int64_t offset, double softcap, at::Tensor q, at::Tensor k,
    at::Tensor v, c10::optional<at::Tensor> sinks, bool enable_gqa, bool want_lse, c10::optional<double> scale) {
  if (!python_rules_hold(q, k, v, enable_gqa) || wants_grad(sinks)) return {"refused", at::Tensor(), c10::nullopt};
  const double s = scale_or_default(scale, q);
  at::Tensor o = at::empty(q.sizes(), q.options());
  c10::optional<at::Tensor> lse;
  if (want_lse) lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  auto run = [&]() -> std::string {
    int dtype = 0;
    LAB_TRY(check_call(q, k, v, o, "key", "value", s, &dtype));
    AttnMaskParams p{};
    if (lse.has_value()) LAB_TRY(float_buffer(*lse, "lse", q, lse->numel(), true, &p.base.lse));
    LAB_TRY(mask_fields(p, left, right, offset, softcap, sinks, q));
    auto launch = [&](const at::Tensor& qr, const at::Tensor& kr, const at::Tensor& vr, const at::Tensor& ow) {
      fill_attention(p.base, qr, kr, vr, ow, s, false, dtype);
      return run_launcher<AttnMaskLauncher>(launcher, p, "masked attention kernel");
    };
    return launch_on_copies(o, q, k, v, "key", "value", launch, nothing);
  };
  return {run(), o, lse};
}

// cu_seqlens as the kernel reads it: int32, contiguous, (batch + 1,) on query's device.
std::string check_cu_seqlens(const at::Tensor& cu, const char* name, const at::Tensor& q, int64_t entries) {
  LAB_REQUIRE(on_gpu(cu) && cu.device() == q.device(), name, " must be on query's device ", q.device(), ", got ",
              cu.device());
  LAB_REQUIRE(cu.scalar_type() == at::kInt, name, " must be int32, got ", cu.scalar_type());
  LAB_REQUIRE(cu.dim() == 1 && cu.size(0) >= 1 && (entries < 0 || cu.size(0) == entries), name,
              " must be 1-D (batch + 1,) and match cu_seqlens_q, got shape ", cu.sizes());
  LAB_REQUIRE(cu.is_contiguous(), name, " must be contiguous");
  return "";
}

// Both cu_seqlens and the two max lengths of a packed call, as both packed crossings check them.
std::string check_packed_lengths(const at::Tensor& cu_q, const at::Tensor& cu_k, const at::Tensor& q, int64_t max_q,
                                 int64_t max_k) {
  LAB_TRY(check_cu_seqlens(cu_q, "cu_seqlens_q", q, -1));
  LAB_TRY(check_cu_seqlens(cu_k, "cu_seqlens_k", q, cu_q.size(0)));
  LAB_REQUIRE(max_q >= 0 && max_q <= kIntMax && max_k >= 0 && max_k <= kIntMax,
              "max_seqlen_q / max_seqlen_k must be in [0, 2^31), got ", max_q, " / ", max_k);
  return "";
}

// The sizes of a packed call's AttnMaskParams, the packed and the paged crossings alike: the batch is cu_seqlens'
// length - 1, the sequence lengths are the max lengths, and the totals are the packed rows (total_k: the paged
// cache's bound on a key row).
void packed_sizes(AttnMaskParams& p, const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t heads_q, int64_t heads_kv,
                  int64_t max_q, int64_t max_k, int64_t head_dim, double scale, int dtype, int64_t total_q,
                  int64_t total_k) {
  AttnFwdParams& b = p.base;
  b.batch = static_cast<int>(cu_q.size(0) - 1);
  b.heads_q = static_cast<int>(heads_q);
  b.heads_kv = static_cast<int>(heads_kv);
  b.seqlen_q = static_cast<int>(max_q);
  b.seqlen_k = static_cast<int>(max_k);
  b.head_dim = static_cast<int>(head_dim);
  b.scale = static_cast<float>(scale);
  b.causal = false;
  b.dtype = dtype;
  p.cu_seqlens_q = cu_q.data_ptr<int32_t>();
  p.cu_seqlens_k = cu_k.data_ptr<int32_t>();
  p.total_q = static_cast<int>(total_q);
  p.total_k = static_cast<int>(total_k);
}

#ifdef LAB_BINDING_CPU_CHECKS
static std::string packed_cpu_params;  // the CPU check build: the last packed call's AttnMaskParams, as launched
pybind11::bytes packed_params_cpu_last() { return pybind11::bytes(packed_cpu_params); }
#endif

// The packed call's layout rules (attn_varlen_packed), on the 3-D tensor as the (1, H, total, D) view would have them.
bool packed_readable(const at::Tensor& t) {  // layout_ok() of the (1, H, total, D) view
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.size(2) > 1 && t.stride(2) != 1) return false;
  for (int i : {1, 0})
    if (t.size(i) > 1 && (t.stride(i) == 0 || t.stride(i) % 8 != 0)) return false;
  return true;
}

// copy_strides() of the (1, H, total, D) view, its batch stride 0 (the packed kernels' {unused, head, token}).
void copy_packed_strides(int64_t* dst, const at::Tensor& t) {
  dst[0] = 0;
  dst[1] = t.stride(1);
  if (t.size(1) == 1 && (dst[1] == 0 || dst[1] % 8 != 0)) dst[1] = t.size(0) * t.size(2);
  dst[2] = t.stride(0);
  if (t.size(0) == 1 && (dst[2] == 0 || dst[2] % 8 != 0)) dst[2] = t.size(2);
}

// check_bhsd() of the (1, H, total, D) view.
std::string check_packed(const at::Tensor& t, const char* name, const at::Tensor& q) {
  LAB_REQUIRE(on_gpu(t), name, " must be a CUDA tensor, got device ", t.device());
  LAB_REQUIRE(t.device() == q.device(), name, " is on ", t.device(), " but query is on ", q.device());
  LAB_REQUIRE(t.scalar_type() == q.scalar_type(), name, " has dtype ", t.scalar_type(), " but query has ",
              q.scalar_type());
  for (int i = 0; i < 3; ++i)
    LAB_REQUIRE(t.size(i) <= kIntMax, name, ".size(", i, ") = ", t.size(i), " does not fit the kernels' int sizes");
  return "";
}

// The packed call (attention_varlen without the host check of cu_seqlens: its values are clamped by the kernel) in
// one crossing, on the (total, H, D) tensors themselves: out (and the (H_q, total_q) lse) allocated here; rows of no
// sequence left unwritten, as the full path leaves them without a host copy. Every rule the full path (lab.masks.op)
// applies to the (1, H, total, D) views it checks holds here on the views' dims (1: heads, 2: tokens, 3: D of the 3-D
// tensor's 1, 0, 2), and an input the kernels cannot read as it is runs on a contiguous copy, as readable() makes
// one; tests/masks/test_masks_fast.py holds its AttnMaskParams to the full path's, field for field. Why not check
// and launch through those views, as the dense crossings do: the eight view ops (each a dispatcher round trip with
// its view bookkeeping) and the out's four overlap checks cost 12.5-18.2 us a call on the H200's host, three rounds
// of three (the views' crossing 41-65 us, this one 29-48 us; outputs/experiments/20261129-varlen-packed-crossing-
// host-three-rounds.json); on the CPU check build (-O0, 8 x 2048 tokens, H 16, D 128) 38.5 against 26.4 us.
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> attn_varlen_packed(
    int64_t launcher, int64_t left, int64_t right, double softcap, at::Tensor q, at::Tensor k, at::Tensor v,
    at::Tensor cu_q, at::Tensor cu_k, int64_t max_q, int64_t max_k, c10::optional<at::Tensor> sinks, bool want_lse,
    c10::optional<double> scale) {
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3 || grad || wants_grad(sinks))
    return {"refused", at::Tensor(), c10::nullopt};
  for (const at::Tensor* t : {&q, &k, &v})  // python_rules_hold: the last dim's stride, a key to attend to
    if (t->stride(2) != 1 && t->numel() != 0) return {"refused", at::Tensor(), c10::nullopt};
  if (k.size(0) == 0) return {"refused", at::Tensor(), c10::nullopt};
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  at::Tensor o = at::empty(q.sizes(), q.options());
  c10::optional<at::Tensor> lse;
  if (want_lse) lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
  auto run = [&]() -> std::string {
    int dtype = 0;
    LAB_TRY(check_packed(q, "query", q));  // check_call's checks on the views
    LAB_TRY(check_packed(k, "key", q));
    LAB_TRY(check_packed(v, "value", q));
    LAB_REQUIRE(k.sizes() == v.sizes(), "key and value shapes differ: ", k.sizes(), " vs ", v.sizes());
    LAB_REQUIRE(q.size(2) > 0, "query head dim must be positive, got ", q.size(2));
    LAB_REQUIRE(k.size(2) == q.size(2), "key has head dim ", k.size(2), " but query has ", q.size(2));
    LAB_REQUIRE(k.size(1) > 0, "key must have at least one head, got ", k.size(1));
    LAB_REQUIRE(q.size(1) % k.size(1) == 0, "query heads (", q.size(1), ") must be a multiple of key heads (",
                k.size(1), ")");
    LAB_TRY(dtype_code(q, &dtype));
    LAB_TRY(check_scale(s));
    LAB_TRY(check_packed_lengths(cu_q, cu_k, q, max_q, max_k));
    AttnMaskParams p{};
    if (lse.has_value()) LAB_TRY(float_buffer(*lse, "lse", q, lse->numel(), true, &p.base.lse));
    LAB_TRY(mask_fields(p, left, right, 0, softcap, sinks, q));
    if (q.numel() == 0) return "";  // launch_on_copies: nothing to compute
#ifndef LAB_BINDING_CPU_CHECKS
    c10::cuda::CUDAGuard guard(q.device());
#endif
    // readable(): a contiguous copy of an input the kernels cannot read as it is (named: it outlives the launch)
    const at::Tensor qr = q.numel() == 0 || packed_readable(q) ? q : at::empty(q.sizes(), q.options()).copy_(q);
    const at::Tensor kr = k.numel() == 0 || packed_readable(k) ? k : at::empty(k.sizes(), k.options()).copy_(k);
    const at::Tensor vr = v.numel() == 0 || packed_readable(v) ? v : at::empty(v.sizes(), v.options()).copy_(v);
    AttnFwdParams& b = p.base;
    b.q = qr.data_ptr();
    b.k = kr.data_ptr();
    b.v = vr.data_ptr();
    b.o = o.data_ptr();
    copy_packed_strides(b.q_stride, qr);
    copy_packed_strides(b.k_stride, kr);
    copy_packed_strides(b.v_stride, vr);
    copy_packed_strides(b.o_stride, o);
    packed_sizes(p, cu_q, cu_k, q.size(1), k.size(1), max_q, max_k, q.size(2), s, dtype, q.size(0), k.size(0));
#ifdef LAB_BINDING_CPU_CHECKS
    packed_cpu_params.assign(reinterpret_cast<const char*>(&p), sizeof p);
#endif
    return run_launcher<AttnMaskLauncher>(launcher, p, "packed attention kernel");
  };
  return {run(), o, lse};
}

// The paged prefill's serving call (lab.ops.attention_varlen with block_table and page_errors, no host check of
// cu_seqlens) in one crossing, as attn_varlen_packed is the packed call's: lab.masks.paged keys the plan by what its
// full path checked once (head dim, device, mask, launcher), so here every rule of that path that can change between
// two calls of one plan, as lab.masks.paged's checks make them (check_paged, _check_cu, check_sinks, forward only).
// Whatever the full path would copy (a query the kernel cannot read as it is, a non-contiguous cu_seqlens, sinks or
// table rows), refuse or not launch (nothing to compute: it only zeroes the flags) answers "refused" or its message,
// and lab.masks.paged then takes its full path, which raises its own error or makes the copy. The fields are the ones
// lab.masks.op.paged_fields packs: the caches' (page, head, key in page) strides, total_k unread (2^30).
// Why: the Python serving path (a plan key over eight tensors' shapes and strides, then the parameter packing) cost
// 2-4 % of a 0.4 ms call through the public op, where the packed call pays its one crossing.
bool paged_readable(const at::Tensor& t) {  // lab.masks.paged's cache rule and lab.op_common._readable's (no copy)
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0 || t.stride(t.dim() - 1) != 1) return false;
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    if (t.stride(i) % 8 != 0) return false;
  return true;
}

std::string paged_prefill_fields(AttnMaskParams& p, int64_t left, int64_t right, double softcap, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
                                 const at::Tensor& cu_k, const at::Tensor& table, const at::Tensor& errors,
                                 int64_t max_q, int64_t max_k, const c10::optional<at::Tensor>& sinks, double scale) {
  LAB_REQUIRE(q.dim() == 3 && on_gpu(q), "query must be a 3-D (total_q, H, D) CUDA tensor");
  LAB_REQUIRE(q.size(0) <= kIntMax && q.size(1) <= kIntMax, "query's sizes do not fit the kernels' int sizes");
  int dtype = 0;
  LAB_TRY(dtype_code(q, &dtype));
  LAB_TRY(check_paged_cache(k, "key_cache", q));
  LAB_TRY(check_paged_cache(v, "value_cache", q));
  LAB_REQUIRE(k.sizes() == v.sizes(), "key_cache and value_cache shapes differ: ", k.sizes(), " vs ", v.sizes());
  LAB_REQUIRE(k.size(0) > 0 && k.size(1) > 0 && k.size(1) % 16 == 0, "key_cache needs pages of a multiple of 16 keys");
  LAB_REQUIRE(k.size(2) > 0 && q.size(1) % k.size(2) == 0, "query heads (", q.size(1),
              ") must be a multiple of key_cache heads (", k.size(2), ")");
  LAB_REQUIRE(k.size(3) == q.size(2) && (q.size(2) == 64 || q.size(2) == 128),
              "the paged prefill runs at head dims 64 / 128 (fwd v11), query and key_cache alike");
  LAB_REQUIRE(paged_readable(q) && paged_readable(k) && paged_readable(v), "refused");  // (a copy, or the error)
  LAB_TRY(check_packed_lengths(cu_q, cu_k, q, max_q, max_k));
  const int64_t batch = cu_q.size(0) - 1;
  LAB_REQUIRE(on_gpu(table) && table.device() == q.device() && table.scalar_type() == at::kInt && table.dim() == 2 &&
                  table.size(0) == batch && table.size(1) > 0,
              "block_table must be an int32 (", batch, ", max_pages >= 1) tensor on query's device");
  LAB_REQUIRE((table.size(1) <= 1 || table.stride(1) == 1) && table.stride(0) >= table.size(1), "refused");
  LAB_REQUIRE(table.size(1) * k.size(1) <= (int64_t{1} << 30), "block_table capacity max_pages * page_size = ",
              table.size(1) * k.size(1), " exceeds 2^30 keys");
  LAB_REQUIRE(on_gpu(errors) && errors.device() == q.device() && errors.scalar_type() == at::kInt &&
                  errors.dim() == 1 && errors.size(0) == batch && errors.is_contiguous(),
              "page_errors must be a contiguous int32 (", batch, ",) tensor on query's device");
  LAB_REQUIRE(!sinks.has_value() || sinks->dim() == 1, "sinks must have shape (H_q,)");
  LAB_TRY(check_scale(scale));
  LAB_TRY(mask_fields(p, left, right, 0, softcap, sinks, q));
  AttnFwdParams& b = p.base;
  b.q = q.data_ptr();
  b.k = k.data_ptr();
  b.v = v.data_ptr();
  const int64_t qs[3] = {0, q.stride(1), q.stride(0)}, ks[3] = {k.stride(0), k.stride(2), k.stride(1)},
                vs[3] = {v.stride(0), v.stride(2), v.stride(1)};
  std::copy(qs, qs + 3, b.q_stride);
  std::copy(ks, ks + 3, b.k_stride);
  std::copy(vs, vs + 3, b.v_stride);
  packed_sizes(p, cu_q, cu_k, q.size(1), k.size(2), max_q, max_k, q.size(2), scale, dtype, q.size(0), 1 << 30);
  p.block_table = table.data_ptr<int32_t>();
  p.page_errors = errors.data_ptr<int32_t>();
  p.block_table_stride = table.stride(0);
  p.num_pages = static_cast<int>(k.size(0));
  p.page_size = static_cast<int>(k.size(1));
  p.max_pages = static_cast<int>(table.size(1));
  return "";
}

#ifdef LAB_BINDING_CPU_CHECKS
static std::string paged_cpu_params;  // the CPU check build: the last paged call's AttnMaskParams, as launched
pybind11::bytes paged_params_cpu_last() { return pybind11::bytes(paged_cpu_params); }
#endif

std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> attn_varlen_paged_auto(
    int64_t launcher, int64_t left, int64_t right, double softcap, at::Tensor q, at::Tensor k, at::Tensor v,
    at::Tensor cu_q, at::Tensor cu_k, at::Tensor table, at::Tensor errors, int64_t max_q, int64_t max_k,
    c10::optional<at::Tensor> sinks, bool want_lse, c10::optional<double> scale) {
  const bool grad = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (grad || wants_grad(sinks) || q.dim() != 3) return {"refused", at::Tensor(), c10::nullopt};
  const double s = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  AttnMaskParams p{};
  std::string error =
      paged_prefill_fields(p, left, right, softcap, q, k, v, cu_q, cu_k, table, errors, max_q, max_k, sinks, s);
  if (error.empty() && (max_q == 0 || q.size(0) == 0 || p.base.batch == 0)) error = "refused";  // nothing launched
  if (!error.empty()) return {error, at::Tensor(), c10::nullopt};
  at::Tensor o = at::empty(q.sizes(), q.options());
  c10::optional<at::Tensor> lse;
  if (want_lse) {
    lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
    p.base.lse = lse->data_ptr<float>();
  }
  p.base.o = o.data_ptr();
  p.base.o_stride[0] = 0;
  p.base.o_stride[1] = o.stride(1);
  p.base.o_stride[2] = o.stride(0);
#ifdef LAB_BINDING_CPU_CHECKS
  paged_cpu_params.assign(reinterpret_cast<const char*>(&p), sizeof p);
#else
  c10::cuda::CUDAGuard guard(q.device());
#endif
  error = run_launcher<AttnMaskLauncher>(launcher, p, "masked attention kernel v11 (paged)");
  return {error, o, lse};
}

std::tuple<std::string, at::Tensor> decode_call(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v,
                                                c10::optional<at::Tensor> cache_seqlens, double scale,
                                                int64_t num_splits) {
  if (q.dim() != 4) return {msg("query must be 4-D (B, H, S, D), got ", q.sizes()), at::Tensor()};
  if (num_splits < 1 || num_splits > LAB_MAX_NUM_SPLITS)  // checked again inside; here it bounds the allocation
    return {msg("num_splits must be in [1, ", LAB_MAX_NUM_SPLITS, "], got ", num_splits), at::Tensor()};
  at::Tensor o = at::empty(q.sizes(), q.options());
  // One float32 buffer holds both workspaces: partial_o (B, Hq, q_len, splits, D), then partial_lse.
  const int64_t rows = q.size(0) * q.size(1) * q.size(2) * num_splits;
  at::Tensor work = at::empty({rows * (q.size(3) + 1)}, q.options().dtype(at::kFloat));
  at::Tensor partial_o = work.narrow(0, 0, rows * q.size(3));
  at::Tensor partial_lse = work.narrow(0, rows * q.size(3), rows);
  std::string error = decode_fwd_impl(launcher, q, k, v, o, cache_seqlens, partial_o, partial_lse, c10::nullopt,
                                      scale, num_splits);
  return {error, o};
}

// lab.ops.decode's eager contiguous call in one crossing, as attn_auto is lab.ops.attention's: lab.ops keys the plan
// (kernel, splits) by the shapes its full path validated once, so only the rules that can change between two calls
// of one shape are left: a gradient wanted or a last dim with stride != 1 answer "refused", decode_call's checks the
// rest (dtypes, devices, lengths that are not a contiguous int32 (B,) tensor, which the full path converts). On any
// answer lab.ops takes its full path, which raises the right error.
std::tuple<std::string, at::Tensor> decode_auto(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v,
                                                c10::optional<at::Tensor> cache_seqlens, c10::optional<double> scale,
                                                int64_t num_splits) {
  if (!python_rules_hold(q, k, v, true)) return {"refused", at::Tensor()};
  const double s = scale_or_default(scale, q);
  return decode_call(launcher, q, k, v, cache_seqlens, s, num_splits);
}

// The output and the split workspaces (partial O and LSE, float32) a decode call allocates.
void decode_buffers(const at::Tensor& q, int64_t num_splits, at::Tensor* o, at::Tensor* partial_o,
                    at::Tensor* partial_lse) {
  *o = at::empty(q.sizes(), q.options());
  const int64_t rows = q.size(0) * q.size(1) * q.size(2) * num_splits;
  at::Tensor work = at::empty({rows * (q.size(3) + 1)}, q.options().dtype(at::kFloat));
  *partial_o = work.narrow(0, 0, rows * q.size(3));
  *partial_lse = work.narrow(0, rows * q.size(3), rows);
}

// Decode v03 as lab.ops calls it: paged when block_table is given (page_errors: the caller's (B,) int32 flags, or
// allocated here), else the contiguous cache; causal is bottom-right. Returns (error, out, page_errors or None).
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> decode_paged_masked_impl(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    c10::optional<at::Tensor> block_table, c10::optional<at::Tensor> page_errors, double scale, int64_t num_splits,
    bool causal, const DecodeMasks* masks) {
  if (q.dim() != 4) return {msg("query must be 4-D (B, H, S, D), got ", q.sizes()), at::Tensor(), c10::nullopt};
  if (num_splits < 1 || num_splits > LAB_MAX_NUM_SPLITS)
    return {msg("num_splits must be in [1, ", LAB_MAX_NUM_SPLITS, "], got ", num_splits), at::Tensor(), c10::nullopt};
  at::Tensor o, partial_o, partial_lse;
  decode_buffers(q, num_splits, &o, &partial_o, &partial_lse);
  if (!block_table.has_value()) {
    if (page_errors.has_value()) return {"page_errors needs a block_table (a paged cache)", at::Tensor(), c10::nullopt};
    std::string error = decode_fwd_impl(launcher, q, k, v, o, cache_seqlens, partial_o, partial_lse, c10::nullopt,
                                        scale, num_splits, causal, masks);
    return {error, o, c10::nullopt};
  }
  at::Tensor errors = page_errors.has_value() ? *page_errors : at::empty({q.size(0)}, q.options().dtype(at::kInt));
  std::string error = decode_paged_impl(launcher, q, k, v, o, cache_seqlens, *block_table, &errors, nullptr,
                                        partial_o, partial_lse, scale, num_splits, causal, [&] { errors.zero_(); },
                                        masks);
  return {error, o, errors};
}
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> decode_paged_call(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    c10::optional<at::Tensor> block_table, c10::optional<at::Tensor> page_errors, double scale, int64_t num_splits,
    bool causal) {
  return decode_paged_masked_impl(launcher, q, k, v, cache_seqlens, block_table, page_errors, scale, num_splits,
                                  causal, nullptr);
}

// decode_paged_call with the masks (window_left / window_right -1: unbounded, softcap 0: off, sinks or None): the
// masked call of lab.ops.decode (decode v03, v06-v08; lab/decode/masks.py).
std::tuple<std::string, at::Tensor, c10::optional<at::Tensor>> decode_masked_call(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    c10::optional<at::Tensor> block_table, c10::optional<at::Tensor> page_errors, double scale, int64_t num_splits,
    bool causal, int64_t window_left, int64_t window_right, double softcap, c10::optional<at::Tensor> sinks) {
  DecodeMasks masks;
  std::string error = decode_masks(q, window_left, window_right, softcap, sinks, &masks);
  if (!error.empty()) return {error, at::Tensor(), c10::nullopt};
  return decode_paged_masked_impl(launcher, q, k, v, cache_seqlens, block_table, page_errors, scale, num_splits,
                                  causal, &masks);
}

// lab.ops.decode's default paged call (no page_errors), eager: decode_paged_call's checks and launch, the flags
// written into a slot of the device's queue (above: the deferred call's page flags) and read at a later call,
// never now. First the queue's completed slots are retired; if one has a flag set, nothing is launched and the
// answer is ("", undefined, bad) for lab.decode.deferred to raise. Under CUDA-graph capture the flags stay on the
// device, unread (decode_paged_call's behaviour). Returns (error, out, bad).
std::tuple<std::string, at::Tensor, BadFlags> decode_deferred_impl(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    at::Tensor block_table, double scale, int64_t num_splits, bool causal, const DecodeMasks* masks) {
  BadFlags bad;
  if (q.dim() != 4 || !on_gpu(q) || num_splits < 1 || num_splits > LAB_MAX_NUM_SPLITS || capturing(flag_device(q))) {
    auto [error, o, errors] = decode_paged_masked_impl(launcher, q, k, v, cache_seqlens, block_table, c10::nullopt,
                                                       scale, num_splits, causal, masks);  // or the graph's flags
    return {error, o, bad};
  }
  const int64_t device = flag_device(q);
#ifndef LAB_BINDING_CPU_CHECKS
  c10::cuda::CUDAGuard guard(q.device());
#endif
  std::string error = drain(device, false, bad);
  FlagQueue& queue = flag_queue(device);
  if (error.empty() && bad.empty() && queue.pending.size() >= kMaxPendingFlags) {
    bool done = false;
    error = event_done(queue.pending.front().done, true, &done);
    if (error.empty()) {
      ++queue.waits;
      retire_oldest(queue, device, bad);
    }
  }
  FlagSlot slot;
  if (error.empty() && bad.empty()) error = take_slot(queue, q.size(0), &slot);
  if (!error.empty() || !bad.empty()) return {error, at::Tensor(), bad};
  at::Tensor o, partial_o, partial_lse;
  decode_buffers(q, num_splits, &o, &partial_o, &partial_lse);
  error = decode_paged_impl(launcher, q, k, v, o, cache_seqlens, block_table, nullptr, slot.device, partial_o,
                            partial_lse, scale, num_splits, causal,
                            [&] { std::fill(slot.host, slot.host + q.size(0), 0); }, masks);  // no rows: host zeros
#ifdef LAB_BINDING_CPU_CHECKS
  std::fill(slot.host, slot.host + q.size(0), 0);  // the kernel's writes, every sequence fine (page_flags_cpu_write)
#endif
  if (error.empty()) error = record_slot(slot, device);
  if (!error.empty()) {
    queue.spare.push_back(slot);
    return {error, at::Tensor(), bad};
  }
  slot.batch = q.size(0);
  slot.call = ++queue.calls;
  queue.pending.push_back(slot);
  return {"", o, bad};
}
std::tuple<std::string, at::Tensor, BadFlags> decode_paged_deferred(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    at::Tensor block_table, double scale, int64_t num_splits, bool causal) {
  return decode_deferred_impl(launcher, q, k, v, cache_seqlens, block_table, scale, num_splits, causal, nullptr);
}
// decode_paged_deferred with the masks, as decode_masked_call is decode_paged_call.
std::tuple<std::string, at::Tensor, BadFlags> decode_masked_deferred(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, c10::optional<at::Tensor> cache_seqlens,
    at::Tensor block_table, double scale, int64_t num_splits, bool causal, int64_t window_left, int64_t window_right,
    double softcap, c10::optional<at::Tensor> sinks) {
  DecodeMasks masks;
  std::string error = decode_masks(q, window_left, window_right, softcap, sinks, &masks);
  if (!error.empty()) return {error, at::Tensor(), BadFlags()};
  return decode_deferred_impl(launcher, q, k, v, cache_seqlens, block_table, scale, num_splits, causal, &masks);
}

// The deferred calls' queues on every device retired: without wait, the slots whose event has completed (oldest
// first, up to the first still running); with wait, all of them (lab.ops.check_page_errors). A device whose
// current stream is capturing a graph is left alone. Returns (error, bad, slots still queued).
std::tuple<std::string, BadFlags, int64_t> page_flags_check(bool wait) {
  BadFlags bad;
  int64_t left = 0;
  const int64_t devices = static_cast<int64_t>(flag_queues().size());
  for (int64_t device = 0; device < devices; ++device) {
    if (flag_queue(device).pending.empty()) continue;
#ifndef LAB_BINDING_CPU_CHECKS
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
#endif
    if (!capturing(device)) {
      std::string error = drain(device, wait, bad);
      if (!error.empty()) return {error, bad, left};
    }
    left += static_cast<int64_t>(flag_queue(device).pending.size());
  }
  return {"", bad, left};
}

// The queues' sizes, summed over devices: (slots queued, spare slots, deferred calls, waits on a full queue).
std::tuple<int64_t, int64_t, int64_t, int64_t> page_flags_state() {
  int64_t pending = 0, spare = 0, calls = 0, waits = 0;
  for (const FlagQueue& queue : flag_queues()) {
    pending += static_cast<int64_t>(queue.pending.size());
    spare += static_cast<int64_t>(queue.spare.size());
    calls += queue.calls;
    waits += queue.waits;
  }
  return {pending, spare, calls, waits};
}

#ifdef LAB_BINDING_CPU_CHECKS
// The CPU check build's stand-ins for the device (tests/decode/test_paged_deferred.py): the kernel's flags written into
// the newest queued slot of device 0, the events completed up to a call's ticket (-1: all recorded so far), the
// current stream capturing or not.
void page_flags_cpu_write(at::Tensor flags) {
  if (flag_queue(0).pending.empty()) return;
  FlagSlot& slot = flag_queue(0).pending.back();
  std::copy(flags.data_ptr<int32_t>(), flags.data_ptr<int32_t>() + std::min(flags.numel(), slot.batch), slot.host);
}
void page_flags_cpu_complete(int64_t ticket) { cpu_done = ticket < 0 ? cpu_tickets : ticket; }
void page_flags_cpu_capture(bool on) { cpu_capturing = on; }
#endif

// Backward: returns (error, dq, dk, dv); the tensors are undefined (None) when error is not empty.
std::tuple<std::string, at::Tensor, at::Tensor, at::Tensor> attn_bwd_call(
    int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o, at::Tensor lse,
    c10::optional<at::Tensor> dlse, at::Tensor dout, double scale, bool causal, bool deterministic) {
  at::Tensor dq, dk, dv;
  std::string error = attn_bwd_impl(launcher, q, k, v, o, lse, dlse, dout, scale, causal, deterministic, &dq, &dk, &dv);
  if (!error.empty()) return {error, at::Tensor(), at::Tensor(), at::Tensor()};
  return {error, dq, dk, dv};
}

// lab.ops.attention's eager call when a gradient is wanted: forward and backward as a C++ autograd node.
// Why: a cold training step's host work before its first launch is not hidden, and a Python autograd.Function
// costs ~40 us more per forward and ~10 us more per backward than a C++ node, the Python path's checks ~15 us more
// (CPU box; outputs/experiments/20261126-bwd-grad-node.json has both paths timed on a GPU). The node saves q, k, v, out and lse (never P).
// Its backward reads torch.are_deterministic_algorithms_enabled() when it runs, as lab.backward.op does: the
// plan's kernel, or in deterministic mode the kernel Python's resolver names (set_deterministic_resolver). An
// error there is thrown as std::runtime_error, the exception that crosses this module's boundary safely (see
// the top of this file); the autograd engine raises it as RuntimeError.
PyObject* deterministic_resolver = nullptr;  // owned for the process's life: never released at exit

int64_t deterministic_launcher(int64_t head_dim) {
  pybind11::gil_scoped_acquire gil;  // the engine runs CUDA backwards on its own thread, without the GIL
  if (deterministic_resolver == nullptr)
    throw std::runtime_error("lab binding: no deterministic backward resolver is set (lab.backward.op sets it)");
  try {
    return pybind11::reinterpret_borrow<pybind11::object>(deterministic_resolver)(head_dim).cast<int64_t>();
  } catch (const pybind11::error_already_set& e) {
    throw std::runtime_error(e.what());
  }
}

struct AttentionNode : public torch::autograd::Function<AttentionNode> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::Tensor q, at::Tensor k,
                                                at::Tensor v, int64_t fwd_launcher, int64_t bwd_launcher,
                                                double scale, bool causal) {
    auto [error, o, lse] = attn_call(fwd_launcher, q, k, v, scale, causal, true);
    if (!error.empty()) throw std::runtime_error(error);  // caught by attn_auto_grad: no node is recorded
    ctx->save_for_backward({q, k, v, o, *lse});
    ctx->saved_data["launcher"] = bwd_launcher;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["causal"] = causal;
    ctx->set_materialize_grads(false);  // an unused lse gets no zero gradient tensor
    return {o, *lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &o = saved[3], &lse = saved[4];
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(o);  // only lse was used
    c10::optional<at::Tensor> dlse;
    if (grads[1].defined()) dlse = grads[1].contiguous();
    const bool deterministic = at::globalContext().deterministicAlgorithms();
    const int64_t launcher = deterministic ? deterministic_launcher(q.size(3)) : ctx->saved_data["launcher"].toInt();
    at::Tensor dq, dk, dv;
    std::string error = attn_bwd_impl(launcher, q, k, v, o, lse, dlse, dout, ctx->saved_data["scale"].toDouble(),
                                      ctx->saved_data["causal"].toBool(), deterministic, &dq, &dk, &dv);
    if (!error.empty()) throw std::runtime_error(error);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// attn_auto's twin for calls that want gradients: the same rules but the gradient one, then the node above.
// Returns (error or "refused", out, lse); on any answer lab.ops takes its full path, which raises the right error.
std::tuple<std::string, at::Tensor, at::Tensor> attn_auto_grad(int64_t fwd_launcher, int64_t bwd_launcher,
                                                               at::Tensor q, at::Tensor k, at::Tensor v, bool causal,
                                                               bool enable_gqa, c10::optional<double> scale) {
  if (!python_rules_hold(q, k, v, enable_gqa, true)) return {"refused", at::Tensor(), at::Tensor()};
  const double s = scale_or_default(scale, q);
  try {
    torch::autograd::variable_list out = AttentionNode::apply(q, k, v, fwd_launcher, bwd_launcher, s, causal);
    return {"", out[0], out[1]};
  } catch (const std::exception& e) {
    return {e.what(), at::Tensor(), at::Tensor()};
  }
}

void set_deterministic_resolver(pybind11::object resolver) {
  Py_XDECREF(deterministic_resolver);
  deterministic_resolver = resolver.release().ptr();
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attn_fwd", &attn_fwd, "forward attention through a launcher address");
  m.def("decode_fwd", &decode_fwd, "split-K decoding through a launcher address");
  m.def("attn_call", &attn_call, "forward attention, output allocated here: (error, out, lse)");
  m.def("attn_auto", &attn_auto, "lab.ops.attention's eager call: (error or \"refused\", out, lse)");
  m.def("attn_mask_auto", &attn_mask_auto,
        "lab.ops.attention's eager masked call (window, softcap, sinks): (error or \"refused\", out, lse)");
  m.def("attn_varlen_packed", &attn_varlen_packed,
        "lab.ops.attention_varlen's unchecked packed call on the 3-D tensors: (error or \"refused\", out, lse)");
  m.def("attn_varlen_paged_auto", &attn_varlen_paged_auto,
        "lab.ops.attention_varlen's paged serving call: (error or \"refused\", out, lse)");
  m.def("decode_call", &decode_call, "split-K decoding, output and workspaces allocated here: (error, out)");
  m.def("decode_auto", &decode_auto, "lab.ops.decode's eager contiguous call: (error or \"refused\", out)");
  m.def("decode_paged_call", &decode_paged_call,
        "decode v03 (paged or contiguous, bottom-right causal), allocated here: (error, out, page_errors)");
  m.def("decode_paged_deferred", &decode_paged_deferred,
        "lab.ops.decode's default paged call, its flags read at a later call: (error, out, earlier calls' bad flags)");
  m.def("decode_masked_call", &decode_masked_call,
        "decode_paged_call with a window, softcap and sinks (decode v03, v06-v08): (error, out, page_errors)");
  m.def("decode_masked_deferred", &decode_masked_deferred,
        "decode_paged_deferred with a window, softcap and sinks: (error, out, earlier calls' bad flags)");
  m.def("page_flags_check", &page_flags_check,
        "retire the deferred calls' completed flags (wait: all of them): (error, bad flags, slots still queued)");
  m.def("page_flags_state", &page_flags_state, "the flags queues: (queued, spare, deferred calls, waits when full)");
#ifdef LAB_BINDING_CPU_CHECKS
  m.def("page_flags_cpu_write", &page_flags_cpu_write, "CPU check build: flags into the newest queued slot");
  m.def("page_flags_cpu_complete", &page_flags_cpu_complete, "CPU check build: events done up to a ticket (-1: all)");
  m.def("page_flags_cpu_capture", &page_flags_cpu_capture, "CPU check build: the current stream capturing or not");
  m.def("paged_params_cpu_last", &paged_params_cpu_last, "CPU check build: the last paged prefill's AttnMaskParams");
  m.def("packed_params_cpu_last", &packed_params_cpu_last, "CPU check build: the last packed call's AttnMaskParams");
#endif
  m.def("attn_bwd_call", &attn_bwd_call, "backward attention, gradients allocated here: (error, dq, dk, dv)");
  m.def("attn_auto_grad", &attn_auto_grad,
        "lab.ops.attention's eager call with gradients, a C++ autograd node: (error or \"refused\", out, lse)");
  m.def("set_deterministic_resolver", &set_deterministic_resolver,
        "the Python function head_dim -> launcher of the deterministic backward, for the node's backward");
}
