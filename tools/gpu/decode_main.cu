// Standalone GPU test + benchmark for split-K decoding (no torch).
//
// Build and run (H100):
//   nvcc -std=c++17 -O3 -I kernels -gencode arch=compute_90a,code=sm_90a \
//        tools/gpu/decode_main.cu kernels/decode/v01_splitk.cu -o /tmp/dec && /tmp/dec
// Another version: add -DDECODE_FN=decode_splitk_v02 and compile kernels/decode/v02_mma.cu instead.
// Flags: --no-bench (correctness only), --no-test (bench only), --max-kv-gib N (bench cells whose
// K+V exceed N GiB are skipped; default 9, as lab/cases.py DECODE_MAX_KV_BYTES), --quick (a handful of small
// configs, no bench: for compute-sanitizer, which runs 10-100x slower), --sanitize (the list of
// tools/gpu/sanitize_all.sh: lengths 0/1/63/4097, num_splits up to LAB_MAX_NUM_SPLITS), --bps N (blocks per SM the bench's split
// heuristic assumes; default 2 for v01 and 1 for v02, as lab/decode/splits.py choose_num_splits / choose_num_splits_v02).
//
// Correctness: fresh randn inputs per config rounded to the kernel dtype; the reference is computed in
// double from those rounded values. Q and O are strided as (B, q_len, H, D) views and K has padded
// heads, so strides are exercised. Before every launch O, LSE and both workspaces are poisoned with
// NaN; any NaN fails. Per-element bound: tol * max(1, |ref|), tol = 8e-3 (bf16) / 1e-3 (fp16), about
// two output roundings; LSE within 2e-3. A sequence of length 0 must give O = 0 and LSE = -inf.
//
// Benchmark (bench-decode): q_len 1, D 128, bf16, Hq 32, Hkv {32, 8}, KV length {4k, 16k, 32k, 64k},
// batch {1, 8, 64}, num_splits from the same heuristic as lab/decode/splits.py. KV buffers are rotated so the
// set touched per cell is >= 256 MiB (L2 cannot serve it). 3 warm-ups, median of 30 cudaEvent-timed
// runs. GB/s counts K + V + Q + O bytes once. The device-to-device cudaMemcpy line counts bytes read +
// written.
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
#include <string>
#include <vector>

#include "common/params.h"
#include "host_bits.h"

// The launcher under test: -DDECODE_FN=decode_splitk_v02 selects another version (default v01).
#ifndef DECODE_FN
#define DECODE_FN decode_splitk_v01
#endif
#define DECODE_STR2(x) #x
#define DECODE_STR(x) DECODE_STR2(x)
extern "C" int DECODE_FN(const DecodeParams* p, void* stream);

// CK (a CUDA call) and check_launch (a launcher's return code): host_bits.h.

// ------------------------------------------------------------ split heuristic (mirror of lab/decode/splits.py)
// Keep identical to lab/decode/splits.py: constants, candidate filter, 0.8 wave rule, 5% slack.
static const int kBlockN = 64;
static const int kMaxSplits = 128;
static const int kBlocksPerSm = 2;     // v01 (lab/decode/splits.py BLOCKS_PER_SM)
static const int kBlocksPerSmV02 = 1;  // v02 and later (lab/decode/splits.py BLOCKS_PER_SM_V02, choose_num_splits_v02)
static const int kMinChunk = 2 * kBlockN;
static const double kFullEnough = 0.8;
static const double kEfficiencySlack = 0.95;

static int split_chunk(int seqlen, int splits) {
  const int per = (std::max(seqlen, 0) + splits - 1) / splits;
  return (per + kBlockN - 1) / kBlockN * kBlockN;
}

static int nonempty_splits(int seqlen, int splits) {
  const int chunk = split_chunk(seqlen, splits);
  int n = 0;
  for (int s = 0; s < splits; ++s) n += (int64_t)s * chunk < seqlen;
  return n;
}

static double wave_efficiency(int64_t blocks, int num_sms, int blocks_per_sm) {
  const int64_t slots = (int64_t)num_sms * blocks_per_sm;
  const int64_t waves = (blocks + slots - 1) / slots;
  return (double)blocks / (double)(waves * slots);
}

static int choose_num_splits(int batch, int heads_kv, int seqlen, int num_sms, int blocks_per_sm = kBlocksPerSm) {
  if (batch < 1 || heads_kv < 1 || num_sms < 1 || blocks_per_sm < 1 || seqlen < 1) return 1;
  const int64_t base = (int64_t)batch * heads_kv;
  const int64_t slots = (int64_t)num_sms * blocks_per_sm;
  if ((double)base >= kFullEnough * (double)slots) return 1;
  const int upper = std::max(1, std::min({kMaxSplits, (seqlen + kMinChunk - 1) / kMinChunk,
                                          (seqlen + kBlockN - 1) / kBlockN}));
  std::vector<double> eff(upper + 1, -1.0);
  double best = 0.0;
  for (int s = 1; s <= upper; ++s) {
    if (nonempty_splits(seqlen, s) < s) continue;
    eff[s] = wave_efficiency(base * s, num_sms, blocks_per_sm);
    best = std::max(best, eff[s]);
  }
  for (int s = 1; s <= upper; ++s)
    if (eff[s] >= 0.0 && eff[s] >= kEfficiencySlack * best) return s;
  return 1;
}


// ------------------------------------------------------------ correctness
struct TestConfig {
  int heads_q, heads_kv, q_len, head_dim, dtype;
  std::vector<int> lens;  // empty: cache_seqlens = NULL, every sequence seqlen_cache long
  int batch, seqlen_cache;
  std::vector<int> splits;
};

// Fills a strided 16-bit tensor (B, H, S, D) from randn and returns the rounded values contiguous.
static std::vector<float> fill_tensor(std::mt19937& rng, std::vector<uint16_t>& dev_image, int B, int H, int S, int D,
                                      const int64_t st[3], int dtype) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values((size_t)B * H * S * D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < S; ++s)
        for (int d = 0; d < D; ++d) {
          const uint16_t bits = to_bits(normal(rng), dtype);
          dev_image[b * st[0] + h * st[1] + s * st[2] + d] = bits;
          values[(((size_t)b * H + h) * S + s) * D + d] = from_bits(bits, dtype);
        }
  return values;
}

static bool run_test(const TestConfig& c, std::mt19937& rng) {
  const int B = c.batch, Hq = c.heads_q, Hkv = c.heads_kv, T = c.q_len, D = c.head_dim, S = c.seqlen_cache;
  const int Sp = S + 3;  // padded K heads: head stride is not S * D
  int64_t q_st[3] = {(int64_t)T * Hq * D, D, (int64_t)Hq * D};  // (B, q_len, Hq, D) memory, (B, Hq, q_len, D) view
  int64_t o_st[3] = {(int64_t)T * Hq * D, D, (int64_t)Hq * D};
  int64_t k_st[3] = {(int64_t)Hkv * Sp * D, (int64_t)Sp * D, D};
  int64_t v_st[3] = {(int64_t)Hkv * S * D, (int64_t)S * D, D};
  const size_t q_elems = (size_t)B * T * Hq * D, k_elems = (size_t)B * Hkv * Sp * D, v_elems = (size_t)B * Hkv * S * D;
  std::vector<uint16_t> hq(q_elems), hk(k_elems, 0), hv(v_elems);
  std::vector<float> q = fill_tensor(rng, hq, B, Hq, T, D, q_st, c.dtype);
  std::vector<float> k = fill_tensor(rng, hk, B, Hkv, S, D, k_st, c.dtype);
  std::vector<float> v = fill_tensor(rng, hv, B, Hkv, S, D, v_st, c.dtype);
  const float scale = 1.0f / std::sqrt((float)D);

  // CPU double reference, all rows. out_ref (B, Hq, T, D), lse_ref (B, Hq, T).
  const int G = Hq / Hkv;
  std::vector<double> out_ref((size_t)B * Hq * T * D, 0.0), lse_ref((size_t)B * Hq * T, -INFINITY);
  std::vector<double> sc;
  for (int b = 0; b < B; ++b) {
    const int n = c.lens.empty() ? S : std::min(std::max(c.lens[b], 0), S);
    if (n == 0) continue;
    sc.assign(n, 0.0);
    for (int h = 0; h < Hq; ++h)
      for (int t = 0; t < T; ++t) {
        const float* qr = &q[(((size_t)b * Hq + h) * T + t) * D];
        const float* kb = &k[(((size_t)b * Hkv + h / G) * S) * D];
        const float* vb = &v[(((size_t)b * Hkv + h / G) * S) * D];
        double mx = -INFINITY;
        for (int j = 0; j < n; ++j) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += (double)qr[d] * kb[(size_t)j * D + d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0.0;
        double* o = &out_ref[(((size_t)b * Hq + h) * T + t) * D];
        for (int j = 0; j < n; ++j) {
          const double w = std::exp(sc[j] - mx);
          sum += w;
          for (int d = 0; d < D; ++d) o[d] += w * vb[(size_t)j * D + d];
        }
        for (int d = 0; d < D; ++d) o[d] /= sum;
        lse_ref[((size_t)b * Hq + h) * T + t] = mx + std::log(sum);
      }
  }

  const int max_splits = *std::max_element(c.splits.begin(), c.splits.end());
  void *dq, *dk, *dv, *dout;
  float *dlse, *dpo, *dpl;
  int32_t* dlens = nullptr;
  CK(cudaMalloc(&dq, q_elems * 2));
  CK(cudaMalloc(&dk, k_elems * 2));
  CK(cudaMalloc(&dv, v_elems * 2));
  CK(cudaMalloc(&dout, q_elems * 2));
  CK(cudaMalloc(&dlse, (size_t)B * Hq * T * 4));
  CK(cudaMalloc(&dpo, (size_t)B * Hq * T * max_splits * D * 4));
  CK(cudaMalloc(&dpl, (size_t)B * Hq * T * max_splits * 4));
  CK(cudaMemcpy(dq, hq.data(), q_elems * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dk, hk.data(), k_elems * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dv, hv.data(), v_elems * 2, cudaMemcpyHostToDevice));
  if (!c.lens.empty()) {
    CK(cudaMalloc(&dlens, B * sizeof(int32_t)));
    CK(cudaMemcpy(dlens, c.lens.data(), B * sizeof(int32_t), cudaMemcpyHostToDevice));
  }

  DecodeParams p{};
  p.q = dq; p.k_cache = dk; p.v_cache = dv; p.o = dout;
  p.cache_seqlens = dlens; p.partial_o = dpo; p.partial_lse = dpl; p.lse = dlse;
  memcpy(p.q_stride, q_st, sizeof q_st); memcpy(p.k_stride, k_st, sizeof k_st);
  memcpy(p.v_stride, v_st, sizeof v_st); memcpy(p.o_stride, o_st, sizeof o_st);
  p.batch = B; p.heads_q = Hq; p.heads_kv = Hkv; p.q_len = T; p.seqlen_cache = S; p.head_dim = D;
  p.scale = scale; p.dtype = c.dtype;

  const double tol = c.dtype == LAB_BF16 ? 8e-3 : 1e-3;
  const double lse_tol = 2e-3;
  bool all_ok = true;
  std::string detail;
  std::vector<uint16_t> hout(q_elems);
  std::vector<float> hlse((size_t)B * Hq * T);
  for (int splits : c.splits) {
    p.num_splits = splits;
    CK(cudaMemset(dout, 0xFF, q_elems * 2));  // 0xFFFF is NaN in fp16 and bf16, 0xFFFFFFFF in fp32
    CK(cudaMemset(dlse, 0xFF, (size_t)B * Hq * T * 4));
    CK(cudaMemset(dpo, 0xFF, (size_t)B * Hq * T * max_splits * D * 4));
    CK(cudaMemset(dpl, 0xFF, (size_t)B * Hq * T * max_splits * 4));
    check_launch(DECODE_FN(&p, nullptr), DECODE_STR(DECODE_FN));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hout.data(), dout, q_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hlse.data(), dlse, hlse.size() * 4, cudaMemcpyDeviceToHost));
    double max_err = 0.0, max_lse_err = 0.0;
    long bad = 0, nans = 0;
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < Hq; ++h)
        for (int t = 0; t < T; ++t) {
          const size_t row = ((size_t)b * Hq + h) * T + t;
          for (int d = 0; d < D; ++d) {
            const float got = from_bits(hout[b * o_st[0] + h * o_st[1] + t * o_st[2] + d], c.dtype);
            const double ref = out_ref[row * D + d];
            if (!std::isfinite(got)) { ++nans; continue; }
            const double err = std::fabs(got - ref);
            max_err = std::max(max_err, err);
            if (err > tol * std::max(1.0, std::fabs(ref))) ++bad;
          }
          const float got_lse = hlse[row];
          if (std::isnan(got_lse)) { ++nans; continue; }
          if (std::isinf(lse_ref[row])) {
            if (!(std::isinf(got_lse) && got_lse < 0)) ++bad;  // empty sequence: exactly -inf
          } else {
            const double err = std::fabs(got_lse - lse_ref[row]);
            max_lse_err = std::max(max_lse_err, err);
            if (!std::isfinite(got_lse) || err > lse_tol) ++bad;
          }
        }
    const bool ok = bad == 0 && nans == 0;
    all_ok = all_ok && ok;
    char buf[160];
    snprintf(buf, sizeof buf, " s%d:%.1e/%.0e%s", splits, max_err, max_lse_err,
             ok ? "" : (nans ? "(NaN!)" : "(BAD)"));
    detail += buf;
  }
  std::string lens = "[";
  if (c.lens.empty()) lens += "all " + std::to_string(S);
  for (size_t i = 0; i < c.lens.size(); ++i) lens += (i ? "," : "") + std::to_string(c.lens[i]);
  lens += "]";
  printf("%s Hq%d/%d q%d D%d %s lens%s  err(o/lse)%s\n", all_ok ? "PASS" : "FAIL", Hq, Hkv, T, D,
         c.dtype == LAB_BF16 ? "bf16" : "fp16", lens.c_str(), detail.c_str());

  CK(cudaFree(dq)); CK(cudaFree(dk)); CK(cudaFree(dv)); CK(cudaFree(dout));
  CK(cudaFree(dlse)); CK(cudaFree(dpo)); CK(cudaFree(dpl));
  if (dlens) CK(cudaFree(dlens));
  return all_ok;
}

// The launcher's refusals: unsupported head dim, missing workspace.
static bool run_error_codes() {
  DecodeParams p{};
  int64_t st[3] = {8 * 72, 72, 72};
  static __align__(16) char dummy[16];
  p.q = p.k_cache = p.v_cache = dummy; p.o = dummy;
  memcpy(p.q_stride, st, sizeof st); memcpy(p.k_stride, st, sizeof st);
  memcpy(p.v_stride, st, sizeof st); memcpy(p.o_stride, st, sizeof st);
  p.batch = 1; p.heads_q = 1; p.heads_kv = 1; p.q_len = 1; p.seqlen_cache = 8; p.num_splits = 1;
  p.scale = 1.f; p.dtype = LAB_BF16;
  p.head_dim = 72;  // no decode kernel has it (v02/v03 take 64-256 in steps the registry lists, v01/v04 64 and 128)
  const int e_dim = DECODE_FN(&p, nullptr);
  p.head_dim = 64; p.num_splits = 2;
  const int e_ws = DECODE_FN(&p, nullptr);
  p.num_splits = 1; p.heads_q = 3; p.heads_kv = 2;
  const int e_shape = DECODE_FN(&p, nullptr);
  const bool ok = e_dim == LAB_E_HEAD_DIM && e_ws == LAB_E_WORKSPACE && e_shape == LAB_E_SHAPE;
  printf("%s launcher refusals: D=72 -> %d, no workspace -> %d, Hq%%Hkv != 0 -> %d\n", ok ? "PASS" : "FAIL",
         e_dim, e_ws, e_shape);
  return ok;
}

// ------------------------------------------------------------ benchmark
__global__ void fill_random_bf16(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    x[i] = __float2bfloat16((float)(h & 0xffff) * (4.0f / 65536.0f) - 2.0f);  // uniform [-2, 2)
  }
}

static void device_fill(void* ptr, size_t elems, uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(ptr), elems, seed);
  CK(cudaGetLastError());
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

static const int kWarmup = 3;
static const int kRuns = 30;

static double memcpy_bandwidth() {
  const size_t bytes = (size_t)1 << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&dst, bytes));
  CK(cudaMemset(src, 1, bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < kWarmup; ++i) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  std::vector<float> ms;
  for (int i = 0; i < kRuns; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  const double gbs = 2.0 * bytes / (median(ms) * 1e-3) / 1e9;  // read + write
  printf("cudaMemcpy D2D 1 GiB: %.3f ms, %.0f GB/s (read + written)\n", median(ms), gbs);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return gbs;
}

static void run_bench(int num_sms, double max_kv_gib, double copy_gbs, int bps) {
  const int Hq = 32, D = 128, T = 1;
  const size_t rotate_bytes = (size_t)256 << 20;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("bench-decode: q_len 1, D 128, bf16, Hq 32; median of %d; KV rotated over >= 256 MiB\n", kRuns);
  for (int Hkv : {32, 8})
    for (int B : {1, 8, 64})
      for (int L : {4096, 16384, 32768, 65536}) {
        const size_t kv_elems = (size_t)B * Hkv * L * D;  // per tensor
        const size_t kv_bytes = 2 * kv_elems * 2;        // K and V
        if ((double)kv_bytes > max_kv_gib * (double)(1ull << 30)) {
          printf("Hkv%2d B%2d L%5d: skipped, K+V %.1f GiB > %.0f GiB\n", Hkv, B, L, kv_bytes / double(1ull << 30),
                 max_kv_gib);
          continue;
        }
        const int nbuf = (int)std::min<size_t>(16, std::max<size_t>(1, (rotate_bytes + kv_bytes - 1) / kv_bytes));
        const int splits = choose_num_splits(B, Hkv, L, num_sms, bps);
        void* kv;
        CK(cudaMalloc(&kv, kv_bytes * nbuf));
        device_fill(kv, kv_elems * 2 * nbuf, 1234u + L);
        const size_t q_elems = (size_t)B * Hq * T * D;
        void *dq, *dout;
        float *dpo, *dpl;
        CK(cudaMalloc(&dq, q_elems * 2));
        CK(cudaMalloc(&dout, q_elems * 2));
        CK(cudaMalloc(&dpo, q_elems * splits * 4));
        CK(cudaMalloc(&dpl, (size_t)B * Hq * T * splits * 4));
        device_fill(dq, q_elems, 99u);
        CK(cudaDeviceSynchronize());

        DecodeParams p{};
        p.q = dq; p.o = dout; p.partial_o = dpo; p.partial_lse = dpl; p.lse = nullptr; p.cache_seqlens = nullptr;
        const int64_t q_st[3] = {(int64_t)Hq * T * D, (int64_t)T * D, D};
        const int64_t kv_st[3] = {(int64_t)Hkv * L * D, (int64_t)L * D, D};
        memcpy(p.q_stride, q_st, sizeof q_st); memcpy(p.o_stride, q_st, sizeof q_st);
        memcpy(p.k_stride, kv_st, sizeof kv_st); memcpy(p.v_stride, kv_st, sizeof kv_st);
        p.batch = B; p.heads_q = Hq; p.heads_kv = Hkv; p.q_len = T; p.seqlen_cache = L; p.head_dim = D;
        p.num_splits = splits; p.scale = 1.0f / std::sqrt((float)D); p.dtype = LAB_BF16;
        auto launch = [&](int i) {
          char* base = static_cast<char*>(kv) + (size_t)(i % nbuf) * kv_bytes;
          p.k_cache = base;
          p.v_cache = base + kv_elems * 2;
          check_launch(DECODE_FN(&p, nullptr), DECODE_STR(DECODE_FN));
        };
        for (int i = 0; i < kWarmup; ++i) launch(i);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<float> ms;
        for (int i = 0; i < kRuns; ++i) {
          CK(cudaEventRecord(e0));
          launch(kWarmup + i);
          CK(cudaEventRecord(e1));
          CK(cudaEventSynchronize(e1));
          float t;
          CK(cudaEventElapsedTime(&t, e0, e1));
          ms.push_back(t);
        }
        CK(cudaGetLastError());
        // Output sanity: finite everywhere (correctness proper is the test section's job).
        std::vector<uint16_t> hout(q_elems);
        CK(cudaMemcpy(hout.data(), dout, q_elems * 2, cudaMemcpyDeviceToHost));
        long nonfinite = 0;
        for (uint16_t bits : hout) nonfinite += !std::isfinite(from_bits(bits, LAB_BF16));
        const double bytes = (double)kv_bytes + 2.0 * q_elems * 2;  // K + V + Q + O
        const double t_ms = median(ms);
        const double gbs = bytes / (t_ms * 1e-3) / 1e9;
        printf("Hkv%2d B%2d L%5d: splits %3d  %9.1f us  %6.0f GB/s  %3.0f%% of copy%s\n", Hkv, B, L, splits,
               t_ms * 1e3, gbs, 100.0 * gbs / copy_gbs, nonfinite ? "  NON-FINITE OUTPUT" : "");
        CK(cudaFree(kv)); CK(cudaFree(dq)); CK(cudaFree(dout)); CK(cudaFree(dpo)); CK(cudaFree(dpl));
      }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

int main(int argc, char** argv) {
  bool do_test = true, do_bench = true, quick = false, sanitize = false;
  double max_kv_gib = 9.0;
  // Blocks per SM the bench's split heuristic plans for: v01's 2, v02's 1 (as lab/decode/splits.py); --bps N overrides it
  // (experiments only).
  int bps = strcmp(DECODE_STR(DECODE_FN), "decode_splitk_v01") == 0 ? kBlocksPerSm : kBlocksPerSmV02;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--no-bench")) do_bench = false;
    else if (!strcmp(argv[i], "--no-test")) do_test = false;
    else if (!strcmp(argv[i], "--quick")) quick = true, do_bench = false;
    else if (!strcmp(argv[i], "--sanitize")) sanitize = true, do_bench = false;
    else if (!strcmp(argv[i], "--max-kv-gib") && i + 1 < argc) max_kv_gib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--bps") && i + 1 < argc) bps = atoi(argv[++i]);
    else { fprintf(stderr, "usage: %s [--no-bench] [--no-test] [--quick] [--sanitize] [--max-kv-gib N] [--bps N]\n", argv[0]); return 2; }
  }
  int dev = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  printf("%s: %s, %d SMs, sm_%d%d, L2 %d MiB, bench heuristic %d block(s)/SM\n", DECODE_STR(DECODE_FN), prop.name,
         prop.multiProcessorCount, prop.major, prop.minor, prop.l2CacheSize >> 20, bps);
  // The heuristic must agree with lab/decode/splits.py (its doctest values).
  if (choose_num_splits(1, 8, 32768, 132) != 31 || choose_num_splits(8, 32, 4096, 132) != 1 ||
      choose_num_splits(1, 8, 32768, 132, kBlocksPerSmV02) != 16) {
    printf("FAIL split heuristic differs from lab/decode/splits.py\n");
    return 1;
  }

  int failures = 0;
  if (sanitize) {
    // The compute-sanitizer list (tools/gpu/sanitize_all.sh): cache lengths 0, 1, 63 and 4097 in one batch,
    // num_splits from 1 up to LAB_MAX_NUM_SPLITS (the binding's bound; most splits empty), so the combine
    // kernel runs with 2..1024 partials; GQA, MHA and MQA with 128 rows (two row groups); both D and dtypes.
    std::mt19937 rng(20261122);
    failures += !run_error_codes();
    failures += !run_test({8, 2, 1, 128, LAB_BF16, {0, 1, 63, 4097}, 4, 4097, {1, 3, 65, LAB_MAX_NUM_SPLITS}}, rng);
    failures += !run_test({4, 4, 4, 64, LAB_FP16, {4097, 0, 63, 1}, 4, 4097, {1, 2, LAB_MAX_NUM_SPLITS}}, rng);
    failures += !run_test({8, 1, 16, 128, LAB_FP16, {1, 4097}, 2, 4097, {3, 80}}, rng);
    printf("%s: %d failing config(s) (sanitize)\n", failures ? "FAIL" : "ALL PASS", failures);
    return failures ? 1 : 0;
  }
  if (quick) {
    // Small caches (lengths 0, 1, 63, 65, 130), both D and dtypes, GQA and MQA, q_len 1/4/16, 1-3 splits.
    std::mt19937 rng(20261121);
    failures += !run_error_codes();
    failures += !run_test({6, 2, 1, 128, LAB_BF16, {1, 63, 65, 130}, 4, 130, {1, 3}}, rng);
    failures += !run_test({6, 2, 4, 64, LAB_FP16, {130, 0, 65}, 3, 130, {1, 2}}, rng);
    failures += !run_test({8, 1, 16, 128, LAB_FP16, {0, 65, 130}, 3, 130, {1, 3}}, rng);
    failures += !run_test({4, 4, 1, 64, LAB_BF16, {}, 2, 65, {1, 2}}, rng);
    printf("%s: %d failing config(s) (quick)\n", failures ? "FAIL" : "ALL PASS", failures);
    return failures ? 1 : 0;
  }
  if (do_test) {
    std::mt19937 rng(20261121);
    failures += !run_error_codes();
    const std::vector<int> lens = {1, 63, 65, 1025, 4097};
    for (int dtype : {LAB_BF16, LAB_FP16})
      for (int D : {128, 64})
        for (auto hk : {std::pair<int, int>{32, 8}, std::pair<int, int>{6, 2}})
          for (int T : {1, 4, 16}) {
            TestConfig c{hk.first, hk.second, T, D, dtype, lens, (int)lens.size(), 4097, {1, 3, 80}};
            failures += !run_test(c, rng);
          }
    // No cache_seqlens (NULL), MHA, a cache length that is no multiple of 64.
    failures += !run_test({4, 4, 1, 128, LAB_BF16, {}, 3, 1000, {1, 3, 16}}, rng);
    // Empty sequences next to full ones; more splits than tiles; MQA with 8 query heads and q_len 16 (R = 128 > 64
    // rows: two row groups).
    failures += !run_test({8, 1, 16, 128, LAB_FP16, {0, 777, 0, 200}, 4, 777, {1, 3, 80}}, rng);
    failures += !run_test({64, 8, 3, 64, LAB_BF16, {130, 5}, 2, 130, {1, 2, 3}}, rng);
    printf("%s: %d failing config(s)\n", failures ? "FAIL" : "ALL PASS", failures);
  }
  if (do_bench) {
    const double copy = memcpy_bandwidth();
    run_bench(prop.multiProcessorCount, max_kv_gib, copy, bps);
  }
  return failures ? 1 : 0;
}
