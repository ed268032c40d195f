// Standalone check of the backward kernels (no torch), for compute-sanitizer and a quick correctness pass:
//   nvcc -std=c++17 -O3 -lineinfo -I kernels -gencode arch=compute_90a,code=sm_90a tools/gpu/bwd_main.cu \
//        kernels/bwd/v01_mma.cu -o /tmp/bwd && /tmp/bwd            (add -DLAB_BWD_BUG_NO_DELTA: must FAIL)
//   compute-sanitizer --tool memcheck /tmp/bwd --small ; compute-sanitizer --tool racecheck /tmp/bwd --small
// Each config: random Q, K, V, dO; O and LSE of the forward computed here in double; the launcher's dQ, dK, dV
// (atomic and deterministic dQ) against double-precision gradients. Pass: max abs error <= 0.02 * max|ref| + 2e-3
// (a loose bound for a harness check: the tight SDPA-relative rule is tests/bwd/test_backward_gpu.py's). Output
// buffers are poisoned with NaN (0xFF bytes) first. Uneven sizes, causal with Sq != Sk both ways, GQA, scales.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/params.h"

#ifndef BWD_FN  // the launcher under test: -DBWD_FN=attn_bwd_v02 with kernels/bwd/v02_wgmma.cu
#define BWD_FN attn_bwd_v01
#endif
#ifndef BWD_MODES  // 2: atomic and deterministic dQ; 1: atomic only (a version without a deterministic mode)
#define BWD_MODES 2
#endif
extern "C" int BWD_FN(const AttnBwdParams* p, void* stream);

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

struct Cfg {
  int B, Hq, Hkv, Sq, Sk, D, causal, bf16;
  float scale;  // NAN: 1/sqrt(D)
};

static uint16_t to16(float x, bool bf16) {
  if (bf16) {
    __nv_bfloat16 h = __float2bfloat16(x);
    return *reinterpret_cast<uint16_t*>(&h);
  }
  __half h = __float2half(x);
  return *reinterpret_cast<uint16_t*>(&h);
}
static float from16(uint16_t x, bool bf16) {
  if (bf16) return __bfloat162float(*reinterpret_cast<__nv_bfloat16*>(&x));
  return __half2float(*reinterpret_cast<__half*>(&x));
}

static bool run_one(const Cfg& c, int deterministic, std::mt19937& rng, bool verbose) {
  const float scale = std::isnan(c.scale) ? 1.f / std::sqrt((float)c.D) : c.scale;
  const int G = c.Hq / c.Hkv;
  const size_t nq = (size_t)c.B * c.Hq * c.Sq * c.D, nk = (size_t)c.B * c.Hkv * c.Sk * c.D;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> q(nq), k(nk), v(nk), dout(nq), o(nq);
  std::vector<double> qd(nq), kd(nk), vd(nk), dod(nq);
  for (size_t i = 0; i < nq; ++i) { q[i] = to16(nd(rng), c.bf16); qd[i] = from16(q[i], c.bf16); }
  for (size_t i = 0; i < nk; ++i) { k[i] = to16(nd(rng), c.bf16); kd[i] = from16(k[i], c.bf16); }
  for (size_t i = 0; i < nk; ++i) { v[i] = to16(nd(rng), c.bf16); vd[i] = from16(v[i], c.bf16); }
  for (size_t i = 0; i < nq; ++i) { dout[i] = to16(nd(rng), c.bf16); dod[i] = from16(dout[i], c.bf16); }
  std::vector<float> lse((size_t)c.B * c.Hq * c.Sq);
  std::vector<double> dq(nq, 0.0), dk(nk, 0.0), dv(nk, 0.0), od(nq, 0.0);
  std::vector<double> p(c.Sk), dp(c.Sk);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / G;
      const double* Q = &qd[(((size_t)b * c.Hq + h) * c.Sq) * c.D];
      const double* dO = &dod[(((size_t)b * c.Hq + h) * c.Sq) * c.D];
      const double* K = &kd[(((size_t)b * c.Hkv + hk) * c.Sk) * c.D];
      const double* V = &vd[(((size_t)b * c.Hkv + hk) * c.Sk) * c.D];
      double* dQ = &dq[(((size_t)b * c.Hq + h) * c.Sq) * c.D];
      double* dK = &dk[(((size_t)b * c.Hkv + hk) * c.Sk) * c.D];
      double* dV = &dv[(((size_t)b * c.Hkv + hk) * c.Sk) * c.D];
      for (int i = 0; i < c.Sq; ++i) {
        const int n = c.causal ? std::min(i + 1, c.Sk) : c.Sk;
        double m = -INFINITY;
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int d = 0; d < c.D; ++d) s += Q[i * c.D + d] * K[j * c.D + d];
          p[j] = s * scale;
          m = std::max(m, p[j]);
        }
        double l = 0;
        for (int j = 0; j < n; ++j) l += (p[j] = std::exp(p[j] - m));
        lse[((size_t)b * c.Hq + h) * c.Sq + i] = (float)(m + std::log(l));
        double* O = &od[((((size_t)b * c.Hq + h) * c.Sq) + i) * c.D];
        for (int j = 0; j < n; ++j) {
          p[j] /= l;
          for (int d = 0; d < c.D; ++d) O[d] += p[j] * V[j * c.D + d];
        }
        // O as the forward stores it (16-bit), Delta from that O, as the kernel sees it
        double delta = 0;
        for (int d = 0; d < c.D; ++d) {
          const size_t idx = ((((size_t)b * c.Hq + h) * c.Sq) + i) * c.D + d;
          o[idx] = to16((float)O[d], c.bf16);
          delta += dO[i * c.D + d] * from16(o[idx], c.bf16);
        }
        for (int j = 0; j < n; ++j) {
          double x = 0;
          for (int d = 0; d < c.D; ++d) x += dO[i * c.D + d] * V[j * c.D + d];
          const double ds = p[j] * (x - delta);
          for (int d = 0; d < c.D; ++d) {
            dV[j * c.D + d] += p[j] * dO[i * c.D + d];
            dQ[i * c.D + d] += scale * ds * K[j * c.D + d];
            dK[j * c.D + d] += scale * ds * Q[i * c.D + d];
          }
        }
      }
    }

  void *gq, *gk, *gv, *go, *gdo, *gdq, *gdk, *gdv;
  float *glse, *gwork;
  const int pad = (c.Sq + LAB_BWD_ROW_PAD - 1) / LAB_BWD_ROW_PAD * LAB_BWD_ROW_PAD;
  const size_t padded = (size_t)c.B * c.Hq * pad;
  CK(cudaMalloc(&gq, nq * 2)); CK(cudaMalloc(&gdo, nq * 2)); CK(cudaMalloc(&go, nq * 2)); CK(cudaMalloc(&gdq, nq * 2));
  CK(cudaMalloc(&gk, nk * 2)); CK(cudaMalloc(&gv, nk * 2)); CK(cudaMalloc(&gdk, nk * 2)); CK(cudaMalloc(&gdv, nk * 2));
  CK(cudaMalloc(&glse, lse.size() * 4 + 16));
  CK(cudaMalloc(&gwork, (2 * padded + padded * (c.D + 1)) * 4));  // dq_accum: padded rows
  CK(cudaMemcpy(gq, q.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(gdo, dout.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(go, o.data(), nq * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(gk, k.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(gv, v.data(), nk * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(glse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(gdq, 0xFF, nq * 2)); CK(cudaMemset(gdk, 0xFF, nk * 2)); CK(cudaMemset(gdv, 0xFF, nk * 2));
  CK(cudaMemset(gwork, 0xFF, (2 * padded + padded * (c.D + 1)) * 4));

  AttnBwdParams prm{};
  prm.q = gq; prm.k = gk; prm.v = gv; prm.o = go; prm.dout = gdo; prm.lse = glse;
  prm.dq = gdq; prm.dk = gdk; prm.dv = gdv;
  prm.delta = gwork; prm.lse_log2 = gwork + padded; prm.dq_accum = gwork + 2 * padded;  // bwd v17 orders its adds there in the deterministic mode too
  const int64_t qs[3] = {(int64_t)c.Hq * c.Sq * c.D, (int64_t)c.Sq * c.D, c.D};
  const int64_t ks[3] = {(int64_t)c.Hkv * c.Sk * c.D, (int64_t)c.Sk * c.D, c.D};
  for (int i = 0; i < 3; ++i) {
    prm.q_stride[i] = prm.o_stride[i] = prm.do_stride[i] = prm.dq_stride[i] = qs[i];
    prm.k_stride[i] = prm.v_stride[i] = prm.dk_stride[i] = prm.dv_stride[i] = ks[i];
  }
  prm.batch = c.B; prm.heads_q = c.Hq; prm.heads_kv = c.Hkv; prm.seqlen_q = c.Sq; prm.seqlen_k = c.Sk;
  prm.head_dim = c.D; prm.scale = scale; prm.causal = c.causal; prm.dtype = c.bf16 ? LAB_BF16 : LAB_FP16;
  prm.deterministic = deterministic;
  const int rc = BWD_FN(&prm, nullptr);
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> hq(nq), hk(nk), hv(nk);
  CK(cudaMemcpy(hq.data(), gdq, nq * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hk.data(), gdk, nk * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hv.data(), gdv, nk * 2, cudaMemcpyDeviceToHost));
  auto err = [&](const std::vector<uint16_t>& got, const std::vector<double>& ref, double* worst) {
    double e = 0, mx = 0;
    bool nan = false;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double x = from16(got[i], c.bf16);
      if (!std::isfinite(x)) nan = true;
      e = std::max(e, std::fabs(x - ref[i]));
      mx = std::max(mx, std::fabs(ref[i]));
    }
    *worst = e;
    return !nan && e <= 0.02 * mx + 2e-3;
  };
  double eq, ek, ev;
  const bool ok = rc == 0 && err(hq, dq, &eq) & err(hk, dk, &ek) & err(hv, dv, &ev);
  if (!ok || verbose)
    printf("%s B%d H%d/%d Sq%d Sk%d D%d %s%s scale %g %s: rc %d, max err dq %.3g dk %.3g dv %.3g\n",
           ok ? "PASS" : "FAIL", c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, c.bf16 ? "bf16" : "fp16",
           c.causal ? " causal" : "", scale, deterministic ? "det" : "atomic", rc, eq, ek, ev);
  cudaFree(gq); cudaFree(gk); cudaFree(gv); cudaFree(go); cudaFree(gdo); cudaFree(gdq); cudaFree(gdk);
  cudaFree(gdv); cudaFree(glse); cudaFree(gwork);
  return ok;
}

int main(int argc, char** argv) {
  // --sanitize: the list compute-sanitizer runs (tools/gpu/sanitize_all.sh passes it to every driver)
  const bool small = argc > 1 && (!strcmp(argv[1], "--small") || !strcmp(argv[1], "--sanitize"));
  const bool tiny = argc > 1 && !strcmp(argv[1], "--tiny");  // racecheck: few configs, every kernel path
  std::vector<Cfg> cfgs;
  if (tiny) {
    for (int D : {64, 128}) {
      cfgs.push_back({1, 4, 2, 65, 130, D, 1, 0, NAN});
      cfgs.push_back({1, 2, 2, 130, 63, D, 0, 1, NAN});
    }
  }
  const int sizes[][2] = {{1, 63}, {63, 65}, {65, 63}, {130, 65}, {65, 130}, {1, 1}};
  for (int D : {64, 128})
    for (auto& s : sizes)
      for (int causal : {0, 1})
        for (int bf16 : {0, 1}) {
          if (tiny || (small && bf16 && D == 128)) continue;
          cfgs.push_back({2, 4, 2, s[0], s[1], D, causal, bf16, NAN});
        }
  if (!tiny)
    for (float sc : {-0.3f, 0.f}) cfgs.push_back({1, 2, 1, 65, 70, 64, 1, 1, sc});
  if (!small && !tiny) {
    cfgs.push_back({1, 2, 2, 300, 257, 128, 1, 0, NAN});
    cfgs.push_back({1, 8, 2, 200, 390, 64, 0, 1, NAN});   // several key blocks, query blocks and GQA heads
    cfgs.push_back({1, 4, 1, 390, 200, 128, 1, 1, NAN});
  }
  std::mt19937 rng(1234);
  int fails = 0, total = 0;
  for (const Cfg& c : cfgs)
    for (int det = 0; det < BWD_MODES; ++det) {
      fails += !run_one(c, det, rng, false);
      ++total;
    }
  printf("%d/%d configs pass\n", total - fails, total);
  return fails ? 1 : 0;
}
