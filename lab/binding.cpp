// The lab's one torch binding: checks tensors, fills the plain-C params struct, calls a launcher.
//
// Built once per torch version by lab/build.py (load_inline). Launchers live in separately built
// kernel libraries and arrive here as a function address, so editing a kernel never recompiles
// torch headers. The Python layer (lab/ops.py) already raised clear ValueError/TypeError for bad
// input; these checks are the second line, for anyone calling the binding directly.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "common/params.h"

namespace {

typedef int (*AttnFwdLauncher)(const AttnFwdParams*, void*);
typedef int (*DecodeLauncher)(const DecodeParams*, void*);

int dtype_code(const at::Tensor& t) {
  if (t.scalar_type() == at::kHalf) return LAB_FP16;
  if (t.scalar_type() == at::kBFloat16) return LAB_BF16;
  TORCH_CHECK(false, "dtype must be float16 or bfloat16, got ", t.scalar_type());
  return -1;
}

void check_bhsd(const at::Tensor& t, const char* name, const at::Tensor& like) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got device ", t.device());
  TORCH_CHECK(t.device() == like.device(), name, " is on ", t.device(), " but query is on ", like.device());
  TORCH_CHECK(t.dim() == 4, name, " must be 4-D (B, H, S, D), got ", t.dim(), "-D");
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " has dtype ", t.scalar_type(), " but query has ",
              like.scalar_type());
  TORCH_CHECK(t.stride(3) == 1, name, " must have a contiguous last dimension (stride(-1) == 1), got ",
              t.stride(3));
  for (int i = 0; i < 3; ++i)  // a stride of a size-1 dim is never used
    TORCH_CHECK(t.size(i) == 1 || t.stride(i) % 8 == 0, name, ".stride(", i, ") = ", t.stride(i),
                " is not a multiple of 8 elements (kernels use 16-byte loads)");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, name, " data pointer is not 16-byte aligned");
}

void copy_strides(int64_t* dst, const at::Tensor& t) {
  for (int i = 0; i < 3; ++i) dst[i] = t.stride(i);
}

// Both params structs carry q/k/v/o strides under the same names.
template <typename Params>
void copy_all_strides(Params& p, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& o) {
  copy_strides(p.q_stride, q);
  copy_strides(p.k_stride, k);
  copy_strides(p.v_stride, v);
  copy_strides(p.o_stride, o);
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
  TORCH_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), "batch sizes differ");
  TORCH_CHECK(k.sizes() == v.sizes(), "key and value shapes differ");
  TORCH_CHECK(q.size(3) == k.size(3), "head dims differ");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "query heads must be a multiple of key/value heads");
  TORCH_CHECK(o.sizes() == q.sizes(), "out must have the query's shape");
  c10::cuda::CUDAGuard guard(q.device());
  AttnFwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = o.data_ptr();
  if (lse.has_value()) {
    TORCH_CHECK(lse->scalar_type() == at::kFloat && lse->is_contiguous() && lse->numel() == q.size(0) * q.size(1) * q.size(2),
                "lse must be a contiguous float32 tensor of shape (B, H, S_q)");
    p.lse = lse->data_ptr<float>();
  }
  if (debug.has_value()) p.debug = debug->data_ptr<float>();
  copy_all_strides(p, q, k, v, o);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.seqlen_q = q.size(2);
  p.seqlen_k = k.size(2);
  p.head_dim = q.size(3);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  p.dtype = dtype_code(q);
  if (q.numel() == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  raise_on_error(reinterpret_cast<AttnFwdLauncher>(launcher)(&p, stream), "attention kernel");
}

void decode_fwd(int64_t launcher, at::Tensor q, at::Tensor k, at::Tensor v, at::Tensor o,
                c10::optional<at::Tensor> cache_seqlens, at::Tensor partial_o, at::Tensor partial_lse,
                c10::optional<at::Tensor> lse, double scale, int64_t num_splits) {
  check_bhsd(q, "query", q);
  check_bhsd(k, "key_cache", q);
  check_bhsd(v, "value_cache", q);
  check_bhsd(o, "out", q);
  TORCH_CHECK(k.sizes() == v.sizes(), "key_cache and value_cache shapes differ");
  TORCH_CHECK(num_splits >= 1, "num_splits must be >= 1");
  c10::cuda::CUDAGuard guard(q.device());
  DecodeParams p{};
  p.q = q.data_ptr();
  p.k_cache = k.data_ptr();
  p.v_cache = v.data_ptr();
  p.o = o.data_ptr();
  if (cache_seqlens.has_value()) {
    TORCH_CHECK(cache_seqlens->scalar_type() == at::kInt && cache_seqlens->is_cuda() &&
                    cache_seqlens->is_contiguous() && cache_seqlens->numel() == q.size(0),
                "cache_seqlens must be a contiguous int32 CUDA tensor of shape (B,)");
    p.cache_seqlens = cache_seqlens->data_ptr<int32_t>();
  }
  TORCH_CHECK(partial_o.scalar_type() == at::kFloat && partial_lse.scalar_type() == at::kFloat,
              "decode workspaces must be float32");
  TORCH_CHECK(partial_o.numel() >= q.numel() * num_splits && partial_lse.numel() >= q.numel() / q.size(3) * num_splits,
              "decode workspaces are too small for num_splits = ", num_splits);
  p.partial_o = partial_o.data_ptr<float>();
  p.partial_lse = partial_lse.data_ptr<float>();
  if (lse.has_value()) p.lse = lse->data_ptr<float>();
  copy_all_strides(p, q, k, v, o);
  p.batch = q.size(0);
  p.heads_q = q.size(1);
  p.heads_kv = k.size(1);
  p.q_len = q.size(2);
  p.seqlen_cache = k.size(2);
  p.head_dim = q.size(3);
  p.num_splits = static_cast<int>(num_splits);
  p.scale = static_cast<float>(scale);
  p.dtype = dtype_code(q);
  if (q.numel() == 0) return;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  raise_on_error(reinterpret_cast<DecodeLauncher>(launcher)(&p, stream), "decode kernel");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attn_fwd", &attn_fwd, "forward attention through a launcher address");
  m.def("decode_fwd", &decode_fwd, "split-K decoding through a launcher address");
}
