// Standalone GPU test + benchmark for the tensor-core forward kernels (no torch).
//
// Build and run (H100):
//   nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a \
//        tools/gpu/fwd_mma_main.cu kernels/fwd/v02_mma.cu -o /tmp/fwd && /tmp/fwd
// Another version: add -DFWD_FN=attn_fwd_v03 and link its .cu instead.
// Flags: --no-bench (correctness only), --no-test (bench only), --quick (a handful
// of small configs only, both D, both dtypes, causal and not, GQA, strided; no
// bench: for compute-sanitizer, which runs 10-100x slower), --sanitize (the list of
// tools/gpu/sanitize_all.sh: B = 2, S_q and S_k up to 1025, MHA and GQA, both D, causal and not, scale
// default / negative / 0; --part i/n runs every n-th of them from the i-th).
//
// Correctness: fresh randn inputs per config, rounded to the kernel dtype; the
// reference is computed in double from those rounded values. The output (and
// LSE) is poisoned with NaN before every launch; any NaN/inf anywhere in the
// output fails. Rows checked against the reference: all of them up to 300,
// otherwise the first and last 136 and every 5th row.
//
// Benchmark: bf16, D in {64,128}, S in {512,2048,8192,16384}, causal in {0,1},
// batch = 32768/S, heads = 2048/D, median of 25 cudaEvent-timed runs after 3
// warm-ups; TFLOP/s from 4*B*H*S*S*D (halved for causal). Each cell is also
// spot-checked on 8 rows against a CPU reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/params.h"
#include "host_bits.h"

#ifndef FWD_FN
#define FWD_FN attn_fwd_v02
#endif
#define STR2(x) #x
#define STR(x) STR2(x)

extern "C" int FWD_FN(const AttnFwdParams* p, void* stream);

// CK (a CUDA call) and check_launch (a launcher's return code): host_bits.h.

// ------------------------------------------------------------ reference
// One row of softmax(Q K^T * scale) V in double; returns lse (natural log).
static double ref_row(const float* qrow, const float* kmat, const float* vmat, int64_t k_rs,
                      int64_t v_rs, int Sk, int D, int i, bool causal, double scale, double* out,
                      std::vector<double>& s) {
  const int n = causal ? std::min(Sk, i + 1) : Sk;
  s.resize(std::max(n, 1));
  double m = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* kr = kmat + j * k_rs;
    double acc = 0;
    for (int d = 0; d < D; ++d) acc += (double)qrow[d] * (double)kr[d];
    s[j] = acc * scale;
    m = std::max(m, s[j]);
  }
  for (int d = 0; d < D; ++d) out[d] = 0;
  double l = 0;
  for (int j = 0; j < n; ++j) {
    const double pj = std::exp(s[j] - m);
    l += pj;
    const float* vr = vmat + j * v_rs;
    for (int d = 0; d < D; ++d) out[d] += pj * (double)vr[d];
  }
  for (int d = 0; d < D; ++d) out[d] = l > 0 ? out[d] / l : 0;
  return m + std::log(l);
}

// ------------------------------------------------------------ correctness
struct TestCfg {
  int B, Hq, Hkv, Sq, Sk, D, causal, dtype, layout, with_lse;
  double scale_mul = 1.0;  // softmax scale = scale_mul / sqrt(D): any finite value (0 and negative too)
};

// layout 0: contiguous (B, H, S, D). layout 1: Q and O are (B, S, H, D)
// buffers viewed as (B, H, S, D); K and V are the two halves of one packed
// (B, S, 2, Hkv, D) buffer.
static bool run_test(const TestCfg& c, std::mt19937& rng) {
  const int D = c.D;
  const size_t nq = (size_t)c.B * c.Hq * c.Sq * D;
  const size_t nk = (size_t)c.B * c.Hkv * c.Sk * D;
  std::normal_distribution<float> nd(0.f, 1.f);
  // Logical (B, H, S, D) values, already rounded to the dtype.
  std::vector<float> q(nq), k(nk), v(nk);
  for (auto& x : q) x = from_bits(to_bits(nd(rng), c.dtype), c.dtype);
  for (auto& x : k) x = from_bits(to_bits(nd(rng), c.dtype), c.dtype);
  for (auto& x : v) x = from_bits(to_bits(nd(rng), c.dtype), c.dtype);

  int64_t qs[3], ks[3], vs[3], os[3];
  size_t q_elems, kv_elems;
  int64_t v_off = 0;
  if (c.layout == 0) {
    qs[0] = (int64_t)c.Hq * c.Sq * D; qs[1] = (int64_t)c.Sq * D; qs[2] = D;
    ks[0] = (int64_t)c.Hkv * c.Sk * D; ks[1] = (int64_t)c.Sk * D; ks[2] = D;
    q_elems = nq;
    kv_elems = 2 * nk;  // K then V in one allocation
    v_off = nk;
  } else {
    qs[0] = (int64_t)c.Sq * c.Hq * D; qs[1] = D; qs[2] = (int64_t)c.Hq * D;
    ks[0] = (int64_t)c.Sk * 2 * c.Hkv * D; ks[1] = D; ks[2] = (int64_t)2 * c.Hkv * D;
    q_elems = nq;
    kv_elems = 2 * nk;
    v_off = (int64_t)c.Hkv * D;
  }
  memcpy(vs, ks, sizeof ks);
  memcpy(os, qs, sizeof qs);

  std::vector<uint16_t> hq(q_elems), hkv(kv_elems);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h)
      for (int i = 0; i < c.Sq; ++i)
        for (int d = 0; d < D; ++d)
          hq[b * qs[0] + h * qs[1] + i * qs[2] + d] =
              to_bits(q[(((size_t)b * c.Hq + h) * c.Sq + i) * D + d], c.dtype);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hkv; ++h)
      for (int j = 0; j < c.Sk; ++j)
        for (int d = 0; d < D; ++d) {
          const size_t li = (((size_t)b * c.Hkv + h) * c.Sk + j) * D + d;
          const int64_t pi = b * ks[0] + h * ks[1] + j * ks[2] + d;
          hkv[pi] = to_bits(k[li], c.dtype);
          hkv[v_off + pi] = to_bits(v[li], c.dtype);
        }

  uint16_t *dq, *dkv, *dout;
  float* dlse = nullptr;
  CK(cudaMalloc(&dq, q_elems * 2));
  CK(cudaMalloc(&dkv, kv_elems * 2));
  CK(cudaMalloc(&dout, q_elems * 2));
  const size_t n_lse = (size_t)c.B * c.Hq * c.Sq;
  if (c.with_lse) CK(cudaMalloc(&dlse, n_lse * 4));
  CK(cudaMemcpy(dq, hq.data(), q_elems * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dkv, hkv.data(), kv_elems * 2, cudaMemcpyHostToDevice));
  // Poison: 0xFFFF is NaN in fp16 and bf16, 0xFFFFFFFF is NaN in fp32.
  CK(cudaMemset(dout, 0xFF, q_elems * 2));
  if (dlse) CK(cudaMemset(dlse, 0xFF, n_lse * 4));

  AttnFwdParams p;
  memset(&p, 0, sizeof p);
  p.q = dq;
  p.k = dkv;
  p.v = dkv + v_off;
  p.o = dout;
  p.lse = dlse;
  memcpy(p.q_stride, qs, sizeof qs);
  memcpy(p.k_stride, ks, sizeof ks);
  memcpy(p.v_stride, vs, sizeof vs);
  memcpy(p.o_stride, os, sizeof os);
  p.batch = c.B; p.heads_q = c.Hq; p.heads_kv = c.Hkv;
  p.seqlen_q = c.Sq; p.seqlen_k = c.Sk; p.head_dim = D;
  p.scale = (float)(c.scale_mul / std::sqrt((double)D));
  p.causal = c.causal;
  p.dtype = c.dtype;
  check_launch(FWD_FN(&p, nullptr), STR(FWD_FN));
  CK(cudaDeviceSynchronize());

  std::vector<uint16_t> ho(q_elems);
  std::vector<float> hl(dlse ? n_lse : 0);
  CK(cudaMemcpy(ho.data(), dout, q_elems * 2, cudaMemcpyDeviceToHost));
  if (dlse) CK(cudaMemcpy(hl.data(), dlse, n_lse * 4, cudaMemcpyDeviceToHost));
  CK(cudaFree(dq));
  CK(cudaFree(dkv));
  CK(cudaFree(dout));
  if (dlse) CK(cudaFree(dlse));

  long bad = 0;  // NaN / inf anywhere in the output
  for (uint16_t x : ho)
    if (!std::isfinite(from_bits(x, c.dtype))) ++bad;
  for (float x : hl)
    if (!std::isfinite(x)) ++bad;

  double err_o = 0, err_lse = 0;
  std::vector<double> ref(D), sbuf;
  const int group = c.Hq / c.Hkv;
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int hk = h / group;
      const float* kmat = k.data() + (((size_t)b * c.Hkv + hk) * c.Sk) * D;
      const float* vmat = v.data() + (((size_t)b * c.Hkv + hk) * c.Sk) * D;
      for (int i = 0; i < c.Sq; ++i) {
        const bool checked = c.Sq <= 300 || i < 136 || i >= c.Sq - 136 || i % 5 == 0;
        if (!checked) continue;
        const float* qrow = q.data() + (((size_t)b * c.Hq + h) * c.Sq + i) * D;
        const double lse = ref_row(qrow, kmat, vmat, D, D, c.Sk, D, i, c.causal,
                                   (double)p.scale, ref.data(), sbuf);
        for (int d = 0; d < D; ++d) {
          const float got = from_bits(ho[b * os[0] + h * os[1] + i * os[2] + d], c.dtype);
          err_o = std::max(err_o, std::fabs((double)got - ref[d]));
        }
        if (dlse) {
          const double got = hl[((size_t)b * c.Hq + h) * c.Sq + i];
          err_lse = std::max(err_lse, std::fabs(got - lse));
        }
      }
    }
  const double tol_o = c.dtype == LAB_BF16 ? 2e-2 : 4e-3;
  const double tol_lse = 1e-3;
  const bool ok = bad == 0 && err_o < tol_o && err_lse < tol_lse && std::isfinite(err_o) &&
                  std::isfinite(err_lse);
  printf("%s %s D=%-3d B=%d Hq=%d Hkv=%d Sq=%-4d Sk=%-4d causal=%d scale=%+.4f %s lse=%d  |dO|=%.2e |dLSE|=%.2e%s\n",
         ok ? "PASS" : "FAIL", c.dtype == LAB_BF16 ? "bf16" : "fp16", D, c.B, c.Hq, c.Hkv, c.Sq,
         c.Sk, c.causal, p.scale, c.layout ? "bshd/kvpacked" : "bhsd", c.with_lse, err_o, err_lse,
         bad ? "  NONFINITE" : "");
  return ok;
}

// ------------------------------------------------------------ benchmark
__device__ uint32_t hash_u32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return (uint32_t)x;
}

template <class T>
__global__ void fill_randn(T* x, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const float u1 = (hash_u32(seed * 0x9e3779b97f4a7c15ull + 2 * i) + 1.f) * 2.3283064e-10f;
    const float u2 = hash_u32(seed * 0x9e3779b97f4a7c15ull + 2 * i + 1) * 2.3283064e-10f;
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    x[i] = (T)z;
  }
}

static void bench() {
  const int kWarmup = 3, kRuns = 25;
  const size_t n = (size_t)32768 * 2048;  // B*S*H*D, the same for every cell
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  CK(cudaMalloc(&q, n * 2));
  CK(cudaMalloc(&k, n * 2));
  CK(cudaMalloc(&v, n * 2));
  CK(cudaMalloc(&o, n * 2));
  CK(cudaMalloc(&lse, (size_t)32768 * 32 * 4));  // B*H*S for the largest H (D=64)
  fill_randn<<<1024, 256>>>(q, n, 1);
  CK(cudaGetLastError());
  fill_randn<<<1024, 256>>>(k, n, 2);
  CK(cudaGetLastError());
  fill_randn<<<1024, 256>>>(v, n, 3);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::mt19937 rng(7);

  for (int D : {64, 128})
    for (int S : {512, 2048, 8192, 16384})
      for (int causal : {0, 1}) {
        const int B = 32768 / S, H = 2048 / D;
        AttnFwdParams p;
        memset(&p, 0, sizeof p);
        p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
        const int64_t st[3] = {(int64_t)H * S * D, (int64_t)S * D, D};
        memcpy(p.q_stride, st, sizeof st);
        memcpy(p.k_stride, st, sizeof st);
        memcpy(p.v_stride, st, sizeof st);
        memcpy(p.o_stride, st, sizeof st);
        p.batch = B; p.heads_q = H; p.heads_kv = H;
        p.seqlen_q = S; p.seqlen_k = S; p.head_dim = D;
        p.scale = 1.f / std::sqrt((float)D);
        p.causal = causal;
        p.dtype = LAB_BF16;
        CK(cudaMemset(o, 0xFF, n * 2));
        for (int r = 0; r < kWarmup; ++r) check_launch(FWD_FN(&p, nullptr), STR(FWD_FN));
        CK(cudaDeviceSynchronize());
        std::vector<float> ms(kRuns);
        for (int r = 0; r < kRuns; ++r) {
          CK(cudaEventRecord(e0));
          check_launch(FWD_FN(&p, nullptr), STR(FWD_FN));
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          CK(cudaEventElapsedTime(&ms[r], e0, e1));
        }
        std::sort(ms.begin(), ms.end());
        const double med = ms[kRuns / 2];
        const double flops = 4.0 * B * H * (double)S * S * D * (causal ? 0.5 : 1.0);

        // Spot check 8 rows of this cell (also catches 32-bit overflow at large S).
        double err = 0;
        long bad = 0;
        std::vector<uint16_t> kv_bits((size_t)S * D);
        std::vector<float> kf((size_t)S * D), vf((size_t)S * D), qf(D);
        std::vector<uint16_t> row_bits(D);
        std::vector<double> ref(D), sbuf;
        for (int t = 0; t < 8; ++t) {
          const int b = rng() % B, h = rng() % H;
          const int i = t == 0 ? S - 1 : (t == 1 ? 0 : (int)(rng() % S));
          const size_t head = (size_t)b * st[0] + (size_t)h * st[1];
          CK(cudaMemcpy(kv_bits.data(), k + head, (size_t)S * D * 2, cudaMemcpyDeviceToHost));
          for (size_t x = 0; x < kf.size(); ++x) kf[x] = from_bits(kv_bits[x], LAB_BF16);
          CK(cudaMemcpy(kv_bits.data(), v + head, (size_t)S * D * 2, cudaMemcpyDeviceToHost));
          for (size_t x = 0; x < vf.size(); ++x) vf[x] = from_bits(kv_bits[x], LAB_BF16);
          CK(cudaMemcpy(row_bits.data(), q + head + (size_t)i * D, D * 2, cudaMemcpyDeviceToHost));
          for (int d = 0; d < D; ++d) qf[d] = from_bits(row_bits[d], LAB_BF16);
          ref_row(qf.data(), kf.data(), vf.data(), D, D, S, D, i, causal,
                  1.0 / std::sqrt((double)D), ref.data(), sbuf);
          CK(cudaMemcpy(row_bits.data(), o + head + (size_t)i * D, D * 2, cudaMemcpyDeviceToHost));
          for (int d = 0; d < D; ++d) {
            const float got = from_bits(row_bits[d], LAB_BF16);
            if (!std::isfinite(got)) ++bad;
            err = std::max(err, std::fabs((double)got - ref[d]));
          }
        }
        printf("bench bf16 D=%-3d S=%-5d causal=%d B=%-2d H=%-2d  %8.3f ms  %6.1f TFLOP/s  spot|dO|=%.1e%s\n",
               D, S, causal, B, H, med, flops / (med * 1e-3) / 1e12, err,
               (bad || err > 2e-2) ? "  SPOT-FAIL" : "");
      }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(q));
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(o));
  CK(cudaFree(lse));
}

int main(int argc, char** argv) {
  bool do_test = true, do_bench = true, quick = false, sanitize = false;
  int part_i = 0, part_n = 1;  // --part i/n: every n-th config of the --sanitize list from the i-th (parallel runs)
  for (int a = 1; a < argc; ++a) {
    if (!strcmp(argv[a], "--sanitize")) sanitize = true, do_bench = false;
    if (!strcmp(argv[a], "--part") && a + 1 < argc) sscanf(argv[++a], "%d/%d", &part_i, &part_n);
    if (!strcmp(argv[a], "--no-bench")) do_bench = false;
    if (!strcmp(argv[a], "--no-test")) do_test = false;
    if (!strcmp(argv[a], "--quick")) quick = true, do_bench = false;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("kernel %s on %s (sm_%d%d, %d SMs)\n", STR(FWD_FN), prop.name, prop.major, prop.minor,
         prop.multiProcessorCount);

  int failed = 0, total = 0;
  if (do_test) {
    // Unsupported configs must be refused with the documented codes.
    {
      AttnFwdParams p;
      memset(&p, 0, sizeof p);
      p.batch = 1; p.heads_q = 1; p.heads_kv = 1; p.seqlen_q = 1; p.seqlen_k = 1;
      p.head_dim = 96; p.dtype = LAB_BF16;
      const int rc_d = FWD_FN(&p, nullptr);
      p.head_dim = 64; p.dtype = 7;
      const int rc_t = FWD_FN(&p, nullptr);
      const bool ok = rc_d == LAB_E_HEAD_DIM && rc_t == LAB_E_DTYPE;
      printf("%s error codes: head_dim=96 -> %d, dtype=7 -> %d\n", ok ? "PASS" : "FAIL", rc_d, rc_t);
      failed += !ok;
      ++total;
    }
    std::mt19937 rng(1234);
    if (sanitize) {
      // The compute-sanitizer list (tools/gpu/sanitize_all.sh): B = 2, uneven S_q and S_k up to 1025
      // (more keys than queries, the reverse, partial tiles on both), both D, causal and not; MHA and GQA
      // and both dtypes and layouts alternate so each appears with every D and causal setting.
      const int spairs[][2] = {{1025, 1025}, {63, 1025}, {1025, 63}, {65, 130}};
      int si = 0;
      for (auto& pr : spairs)
        for (int D : {64, 128})
          for (int causal : {0, 1}) {
            // si bits: 0 causal, 1 D, 2-3 the pair; every (D, causal) sees MHA, GQA, both dtypes, both layouts
            const int pi = si >> 2;
            const bool gqa = pi & 1;
            if (si % part_n != part_i) {
              ++si;
              continue;
            }
            // scale: default, negative (Q negated in smem) and 0 (FLT_MIN) in turn
            TestCfg c{2, gqa ? 6 : 4, gqa ? 2 : 4, pr[0], pr[1], D, causal,
                      ((pi >> 1) ^ (si & 1)) & 1 ? LAB_BF16 : LAB_FP16, ((pi >> 1) ^ (si >> 1)) & 1, 1,
                      si % 3 == 0 ? 1.0 : si % 3 == 1 ? -1.0 : 0.0};
            ++si;
            failed += !run_test(c, rng);
            ++total;
          }
      printf("%s: %d/%d configs passed (sanitize)\n", failed ? "FAILED" : "ALL PASSED", total - failed, total);
      return failed ? 1 : 0;
    }
    if (quick) {
      // Sq/Sk in {1, 63, 65, 130}: partial tiles, a query block that ends
      // inside a key tile, more keys than queries and the reverse. B=1, Hq=2,
      // Hkv=1 (GQA); dtype and layout alternate so both of each appear for
      // every D and causal setting.
      const int qpairs[][2] = {{1, 65}, {63, 65}, {65, 63}, {130, 130}};
      int qi = 0;
      for (auto& pr : qpairs)
        for (int D : {64, 128})
          for (int causal : {0, 1}) {
            const int dtype = (qi & 1) ? LAB_BF16 : LAB_FP16;
            const int layout = (qi >> 1) & 1;
            ++qi;
            TestCfg c{1, 2, 1, pr[0], pr[1], D, causal, dtype, layout, 1};
            failed += !run_test(c, rng);
            ++total;
          }
      printf("%s: %d/%d configs passed (quick)\n", failed ? "FAILED" : "ALL PASSED", total - failed,
             total);
      return failed ? 1 : 0;
    }
    const int pairs[][2] = {{1, 1},     {1, 65},    {63, 63},   {65, 65},
                            {63, 65},   {65, 63},   {1025, 1025}, {1025, 63},
                            {63, 1025}, {1, 1025},  {1025, 1}};
    int idx = 0;
    for (auto& pr : pairs)
      for (int D : {64, 128})
        for (int causal : {0, 1})
          for (int dtype : {LAB_FP16, LAB_BF16}) {
            // Both layouts show up for every (pair, D, causal) and dtype.
            const int layout = (causal ^ dtype ^ (D == 128)) & 1;
            const int with_lse = (idx++ % 5) != 4;
            TestCfg c{3, 6, 2, pr[0], pr[1], D, causal, dtype, layout, with_lse};
            failed += !run_test(c, rng);
            ++total;
          }
    // MHA and MQA head mappings, sizes that cross several tiles unevenly.
    const TestCfg extra[] = {
        {2, 4, 4, 130, 257, 64, 0, LAB_BF16, 0, 1},  {2, 4, 4, 130, 257, 128, 1, LAB_FP16, 1, 1},
        {2, 4, 4, 257, 130, 64, 1, LAB_FP16, 1, 1},  {2, 4, 4, 257, 130, 128, 0, LAB_BF16, 0, 1},
        {1, 8, 1, 300, 200, 64, 1, LAB_BF16, 1, 1},  {1, 8, 1, 300, 200, 128, 1, LAB_BF16, 0, 1},
        {1, 8, 1, 200, 300, 64, 0, LAB_FP16, 0, 1},  {1, 8, 1, 200, 300, 128, 1, LAB_FP16, 1, 1},
        {1, 2, 1, 2048, 2048, 128, 1, LAB_BF16, 1, 1}, {1, 2, 1, 2048, 2048, 64, 1, LAB_FP16, 0, 1},
    };
    for (const TestCfg& c : extra) {
      failed += !run_test(c, rng);
      ++total;
    }
    printf("%s: %d/%d configs passed\n", failed ? "FAILED" : "ALL PASSED", total - failed, total);
  }
  if (do_bench) bench();
  return failed ? 1 : 0;
}
