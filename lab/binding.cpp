// The lab's one torch binding: checks tensors, fills the plain-C params struct, calls a launcher.
//
// Built once per torch version by lab/build.py (load_inline). Launchers live in separately built
// kernel libraries and arrive here as a function address, so editing a kernel never recompiles
// torch headers. The Python layer (lab/ops.py) raises clear ValueError/TypeError for bad input first;
// these checks stand on their own for anyone calling torch.ops.lab.* or the runners directly: every
// input a kernel cannot take is refused with a RuntimeError naming the argument, or copied into a
// layout it can read (as lab.ops does).
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <ATen/MemoryOverlap.h>

#include <cmath>
#include <initializer_list>
#include <utility>

#include "common/params.h"

namespace {

typedef int (*AttnFwdLauncher)(const AttnFwdParams*, void*);
typedef int (*DecodeLauncher)(const DecodeParams*, void*);

constexpr int64_t kIntMax = 0x7fffffff;  // the params structs hold sizes in int

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kHalf) return LAB_FP16;
  if (t.scalar_type() == at::kBFloat16) return LAB_BF16;
  TORCH_CHECK(false, "query dtype must be float16 or bfloat16, got ", t.scalar_type());
  return -1;
}

// Device, rank, dtype and sizes of a (B, H, S, D) tensor; its layout is handled by readable()/writable().
void check_bhsd(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), " but query is on ", like.device());
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D (B, H, S, D), got ", t.dim(), "-D");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(), " but query has ",
              like.scalar_type());
  for (int i = 0; i < 4; ++i)
    TORCH_CHECK(t.size(i) <= kIntMax, name, ".size(", i, ") = ", t.size(i), " does not fit the kernels' int sizes");
}

// What the kernels read with 16-byte loads: data 16-byte aligned, last stride 1, other strides multiples of
// 8 elements and never 0 on a dim of size > 1 (an expanded tensor). A size-1 dim's stride is never used.
bool layout_ok(const at::Tensor& t) {
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  if (t.size(3) > 1 && t.stride(3) != 1) return false;
  for (int i = 0; i < 3; ++i)
    if (t.size(i) > 1 && (t.stride(i) == 0 || t.stride(i) % 8 != 0)) return false;
  return true;
}

// A fresh contiguous copy (a new, aligned allocation: .contiguous() would return a contiguous view at an
// odd offset unchanged) of any input the kernels cannot read as it is, as lab.ops does: right, only slower.
at::Tensor readable(const at::Tensor& t) {
  if (t.numel() == 0 || layout_ok(t)) return t;
  return at::empty(t.sizes(), t.options()).copy_(t);
}

// The tensor the kernel writes: `out` itself when its layout allows, else a contiguous buffer copied into
// `out` afterwards (finish()). An out that overlaps itself (a stride of 0) or an input is refused.
at::Tensor writable(const at::Tensor& out, std::initializer_list<std::pair<const at::Tensor*, const char*>> inputs) {
  if (out.numel() == 0) return out;
  TORCH_CHECK(at::has_internal_overlap(out) != at::MemOverlap::Yes,
              "out has a stride of 0 on a dim of size > 1 (several elements share memory); pass a dense tensor");
  for (const auto& in : inputs)
    TORCH_CHECK(in.first->numel() == 0 || at::get_overlap_status(out, *in.first) == at::MemOverlapStatus::No,
                "out overlaps ", in.second, "; pass a separate output tensor");
  return layout_ok(out) ? out : at::empty(out.sizes(), out.options());
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
void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                  const char* kname, const char* vname) {
  TORCH_CHECK(k.size(0) == q.size(0), kname, " has batch ", k.size(0), " but query has batch ", q.size(0));
  TORCH_CHECK(k.sizes() == v.sizes(), kname, " and ", vname, " shapes differ: ", k.sizes(), " vs ", v.sizes());
  TORCH_CHECK(q.size(3) > 0, "query head dim must be positive, got ", q.size(3));
  TORCH_CHECK(k.size(3) == q.size(3), kname, " has head dim ", k.size(3), " but query has ", q.size(3));
  TORCH_CHECK(k.size(1) > 0, kname, " must have at least one head, got ", k.size(1));
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads (", q.size(1), ") must be a multiple of ", kname, " heads (",
              k.size(1), ")");
  TORCH_CHECK(o.sizes() == q.sizes(), "out must have the query's shape ", q.sizes(), ", got ", o.sizes());
}

float check_scale(double scale) {
  TORCH_CHECK(std::isfinite(scale) && std::fabs(scale) <= 3.4028234663852886e38, "scale must be a finite float32 value, got ",
              scale);
  return static_cast<float>(scale);
}

// A float32 CUDA tensor on query's device, contiguous, with at least (exactly, if exact) `numel` elements.
float* float_buffer(const at::Tensor& t, const char* name, const at::Tensor& q, int64_t numel, bool exact) {
  TORCH_CHECK(t.is_cuda() && t.device() == q.device(), name, " must be a CUDA tensor on query's device ", q.device(),
              ", got ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(exact ? t.numel() == numel : t.numel() >= numel, name, " must have ", exact ? "" : "at least ", numel,
              " elements, got ", t.numel(), " (shape ", t.sizes(), ")");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " data pointer is not 16-byte aligned");
  return t.data_ptr<float>();
}

void raise_on_error(int rc, const char* what) {
  if (rc == 0) return;
  if (rc < 0) {
    const char* reason = rc == LAB_E_HEAD_DIM ? "head_dim not supported by this kernel"
                         : rc == LAB_E_DTYPE ? "dtype not supported by this kernel"
                         : rc == LAB_E_SHAPE ? "shape not supported by this kernel"
                         : rc == LAB_E_WORKSPACE ? "missing workspace" : "unknown launcher error";
    TORCH_CHECK(false, what, ": ", reason, " (code ", rc, ")");
  }
  TORCH_CHECK(false, what, ": CUDA error ", rc, ": ", cudaGetErrorString(static_cast<cudaError_t>(rc)));
}

}  // namespace

void attn_fwd(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
              c10::optional<at::Tensor> lse, double scale, bool causal, c10::optional<at::Tensor> debug) {
  check_bhsd(q, "query", q);
  check_bhsd(k, "key", q);
  check_bhsd(v, "value", q);
  check_bhsd(o, "out", q);
  check_shapes(q, k, v, o, "key", "value");
  const int dtype = dtype_code(q);
  const float scale_f = check_scale(scale);
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor qr = readable(q), kr = readable(k), vr = readable(v);
  at::Tensor ow = writable(o, {{&q, "query"}, {&k, "key"}, {&v, "value"}});
  AttnFwdParams p{};
  p.q = qr.data_ptr();
  p.k = kr.data_ptr();
  p.v = vr.data_ptr();
  p.o = ow.data_ptr();
  if (lse.has_value()) p.lse = float_buffer(*lse, "lse", q, q.size(0) * q.size(1) * q.size(2), true);
  if (debug.has_value()) p.debug = float_buffer(*debug, "debug", q, 0, false);
  copy_all_strides(p, qr, kr, vr, ow);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.seqlen_q = q.size(2);
  p.seqlen_k = k.size(2);
  p.head_dim = q.size(3);
  p.scale = scale_f;
  p.causal = causal;
  p.dtype = dtype;
  if (q.numel() == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  raise_on_error(reinterpret_cast<AttnFwdLauncher>(launcher)(&p, stream), "attention kernel");
  finish(o, ow);
}

void decode_fwd(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                c10::optional<at::Tensor> cache_seqlens, at::Tensor partial_o, at::Tensor partial_lse,
                c10::optional<at::Tensor> lse, double scale, int64_t num_splits) {
  check_bhsd(q, "query", q);
  check_bhsd(k, "key_cache", q);
  check_bhsd(v, "value_cache", q);
  check_bhsd(o, "out", q);
  check_shapes(q, k, v, o, "key_cache", "value_cache");
  const int dtype = dtype_code(q);
  const float scale_f = check_scale(scale);
  TORCH_CHECK(num_splits >= 1 && num_splits <= LAB_MAX_NUM_SPLITS, "num_splits must be in [1, ", LAB_MAX_NUM_SPLITS,
              "], got ", num_splits);
  const int64_t rows = q.size(0) * q.size(1) * q.size(2);  // output rows (b, h, token)
  TORCH_CHECK(rows * num_splits * q.size(3) <= kIntMax, "num_splits = ", num_splits,
              " is too large for this shape: B*Hq*q_len*num_splits*D = ", rows * num_splits * q.size(3),
              " must fit in int32");
  TORCH_CHECK(k.size(2) + 64 * num_splits <= kIntMax, "key_cache length ", k.size(2), " with num_splits = ",
              num_splits, " overflows the kernels' int key offsets");
  c10::cuda::CUDAGuard guard(q.device());
  at::Tensor qr = readable(q), kr = readable(k), vr = readable(v);
  at::Tensor ow = writable(o, {{&q, "query"}, {&k, "key_cache"}, {&v, "value_cache"}});
  DecodeParams p{};
  p.q = qr.data_ptr();
  p.k_cache = kr.data_ptr();
  p.v_cache = vr.data_ptr();
  p.o = ow.data_ptr();
  if (cache_seqlens.has_value()) {  // values past the cache are clamped by the kernels, never read beyond it
    const at::Tensor& s = *cache_seqlens;
    TORCH_CHECK(s.is_cuda() && s.device() == q.device(), "cache_seqlens must be a CUDA tensor on query's device ",
                q.device(), ", got ", s.device());
    TORCH_CHECK(s.scalar_type() == at::kInt && s.is_contiguous() && s.dim() == 1 && s.numel() == q.size(0),
                "cache_seqlens must be a contiguous int32 tensor of shape (", q.size(0), ",), got ", s.scalar_type(),
                " of shape ", s.sizes());
    p.cache_seqlens = s.data_ptr<int32_t>();
  }
  p.partial_o = float_buffer(partial_o, "partial_o", q, rows * num_splits * q.size(3), false);
  p.partial_lse = float_buffer(partial_lse, "partial_lse", q, rows * num_splits, false);
  if (lse.has_value()) p.lse = float_buffer(*lse, "lse", q, rows, true);
  copy_all_strides(p, qr, kr, vr, ow);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.q_len = q.size(2);
  p.seqlen_cache = k.size(2);
  p.head_dim = q.size(3);
  p.num_splits = static_cast<int>(num_splits);
  p.scale = scale_f;
  p.dtype = dtype;
  if (q.numel() == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  raise_on_error(reinterpret_cast<DecodeLauncher>(launcher)(&p, stream), "decode kernel");
  finish(o, ow);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attn_fwd", &attn_fwd, "forward attention through a launcher address");
  m.def("decode_fwd", &decode_fwd, "split-K decoding through a launcher address");
}
