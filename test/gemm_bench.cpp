// gemm_bench: this machine's fp32 peak and cpu::gemm<float> on the model's real shapes, as GFLOP/s and as a
// fraction of that peak, for each kernel the CPU runs; OpenBLAS on the same shapes beside it when its
// library can be loaded (libopenblas.so.0, loaded at run time: a yardstick, not a dependency); for
// decoding's shapes also with op(B) packed beforehand (cpu::PackedOperands, as decoding runs them). Run by
// `make bench` (test/bench.sh), not by CTest.
//   gemm_bench [--reps N]
// The peak is a loop of independent fused multiply-adds on registers only (no memory traffic), on one
// thread and on every thread; a product's figure is the best of N repetitions (default 20, fewer past a second).
#include <dlfcn.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../transformer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

using cpu::GemmKernel;
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Floating-point operations per call of each peak loop: 16 chains of n dependent FMAs, each 2 flops a lane.
// The multiplicands pass through an empty asm statement each iteration, so the compiler cannot fold them.
constexpr int kChains = 16;
#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static float fma_loop_avx512(long n, float seed) {
  __m512 acc[kChains], x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(seed + i);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
    __asm__ volatile("" : "+v"(x), "+v"(y));
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float t[16];
  _mm512_store_ps(t, s);
  return t[0] + t[15];
}
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(long n, float seed) {
  __m256 acc[kChains], x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(seed + i);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(x, y, acc[i]);
    __asm__ volatile("" : "+x"(x), "+x"(y));
  }
  __m256 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  return t[0] + t[7];
}
#endif
#if defined(__aarch64__)
static float fma_loop_neon(long n, float seed) {
  float32x4_t acc[kChains], x = vdupq_n_f32(0.999f), y = vdupq_n_f32(1e-3f);
  for (int i = 0; i < kChains; ++i) acc[i] = vdupq_n_f32(seed + i);
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kChains; ++i) acc[i] = vfmaq_f32(acc[i], x, y);
    __asm__ volatile("" : "+w"(x), "+w"(y));
  }
  float32x4_t s = acc[0];
  for (int i = 1; i < kChains; ++i) s = vaddq_f32(s, acc[i]);
  return vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 3);
}
#endif

#ifdef _OPENMP
static int thread_number() { return omp_get_thread_num(); }
static int max_threads() { return omp_get_max_threads(); }
#else  // a build without OpenMP (make OPENMP=0, or a compiler without it): one thread
static int thread_number() { return 0; }
static int max_threads() { return 1; }
#endif

// GFLOP/s of the peak loop with `lanes`-wide vectors on `threads` threads: the best of 200 short runs (0.3 ms each) (on a
// shared machine the best is the one least disturbed).
static double peak(float (*loop)(long, float), int lanes, int threads) {
  const long n = 100000;
  double best = 0;
  for (int rep = 0; rep < 200; ++rep) {
    float sink = 0;
    const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
    sink += loop(n, 1.0f + thread_number());
    const double s = now() - t0;
    if (sink == 12345.0f) std::printf(" ");  // keeps the loop's result alive
    best = std::max(best, 2.0 * kChains * lanes * n * threads / s / 1e9);
  }
  return best;
}

using CblasSgemm = void (*)(int order, int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                            int ldb, float beta, float* C, int ldc);

struct Shape {
  const char* what;
  bool ta, tb;
  int M, N, K;
};

int main(int argc, char** argv) {
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--reps") reps = std::atoi(argv[i + 1]);
  const int threads = max_threads();
  double peak_all = 0;
#if defined(__x86_64__) || defined(__i386__)
  if (cpu::gemm_kernel_supported(GemmKernel::avx512)) {
    const double p1 = peak(fma_loop_avx512, 16, 1), pn = peak(fma_loop_avx512, 16, threads);
    std::printf("PEAK isa=avx512 threads=1 gflops=%.1f\nPEAK isa=avx512 threads=%d gflops=%.1f\n", p1, threads, pn);
    peak_all = std::max(peak_all, pn);
  }
  if (cpu::gemm_kernel_supported(GemmKernel::avx2)) {
    const double p1 = peak(fma_loop_avx2, 8, 1), pn = peak(fma_loop_avx2, 8, threads);
    std::printf("PEAK isa=avx2 threads=1 gflops=%.1f\nPEAK isa=avx2 threads=%d gflops=%.1f\n", p1, threads, pn);
    peak_all = std::max(peak_all, pn);
  }
#endif
#if defined(__aarch64__)
  if (cpu::gemm_kernel_supported(GemmKernel::neon)) {
    const double p1 = peak(fma_loop_neon, 4, 1), pn = peak(fma_loop_neon, 4, threads);
    std::printf("PEAK isa=neon threads=1 gflops=%.1f\nPEAK isa=neon threads=%d gflops=%.1f\n", p1, threads, pn);
    peak_all = std::max(peak_all, pn);
  }
#endif
  void* lib = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  CblasSgemm blas = lib ? (CblasSgemm)dlsym(lib, "cblas_sgemm") : nullptr;
  if (auto set = lib ? (void (*)(int))dlsym(lib, "openblas_set_num_threads") : nullptr) set(threads);
  std::printf("OpenBLAS: %s\n", blas ? "libopenblas.so.0 loaded" : "not found (apt-get install libopenblas-dev to compare)");
  // The small model's products for a 64 x 32-token batch (2048 rows, d_model 256, d_ff 1024, V 8000), and
  // decoding's (32 sentences, or 32 x 4 beams, one position each).
  const Shape shapes[] = {
      {"linear fwd (Q/K/V/O)", false, false, 2048, 256, 256},   {"linear bwd din", false, true, 2048, 256, 256},
      {"linear bwd dw", true, false, 256, 256, 2048},            {"ffn W1 fwd", false, false, 2048, 1024, 256},
      {"ffn W2 fwd", false, false, 2048, 256, 1024},             {"ffn W1 bwd dw", true, false, 256, 1024, 2048},
      {"output projection fwd", false, true, 2048, 8000, 256},   {"output projection bwd dy", false, false, 2048, 256, 8000},
      {"output projection bwd demb", true, false, 8000, 256, 2048}, {"decode: linear, 128 rows", false, false, 128, 256, 256},
      {"decode: output projection, 32 rows", false, true, 32, 8000, 256},
  };
  std::vector<GemmKernel> kernels;
  for (GemmKernel k : {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::neon, GemmKernel::generic})
    if (cpu::gemm_kernel_supported(k)) kernels.push_back(k);
  for (const Shape& s : shapes) {
    const int lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::vector<float> A((size_t)s.M * s.K, 0.5f), B((size_t)s.K * s.N, 0.25f), C((size_t)s.M * s.N);
    const double flops = 2.0 * s.M * s.N * s.K;
    auto best_of = [&](auto&& call) {
      double best = 1e30, spent = 0;
      call();  // warm-up
      for (int r = 0; r < reps && (r < 2 || spent < 1.0); ++r) {  // at most about a second a figure
        const double t0 = now();
        call();
        best = std::min(best, now() - t0);
        spent += now() - t0;
      }
      return flops / best / 1e9;
    };
    std::string line;
    char buf[160];
    for (GemmKernel k : kernels) {
      const double g = best_of([&] { cpu::gemm_with(k, s.ta, s.tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, C.data(), s.N, false); });
      std::snprintf(buf, sizeof buf, " %s=%.1f", cpu::gemm_kernel_name(k), g);
      line += buf;
      if (k == cpu::gemm_best_kernel() && peak_all > 0) {
        std::snprintf(buf, sizeof buf, " (%.0f%% of peak)", 100 * g / peak_all);
        line += buf;
      }
    }
    if (s.M <= 128) {  // decoding's shapes: op(B) (a weight) packed once beforehand, as decoding does
      const cpu::PackedOperands packed({{s.tb, s.N, s.K, B.data(), ldb}});
      const double g = best_of([&] { cpu::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, A.data(), lda, B.data(), ldb, C.data(), s.N, false); });
      std::snprintf(buf, sizeof buf, " %s_packed=%.1f", cpu::gemm_kernel_name(cpu::gemm_best_kernel()), g);
      line += buf;
    }
    if (blas) {
      const double g = best_of([&] {
        blas(101, s.ta ? 112 : 111, s.tb ? 112 : 111, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N);
      });
      std::snprintf(buf, sizeof buf, " openblas=%.1f", g);
      line += buf;
    }
    std::printf("GEMM %-36s %c%c M=%d N=%d K=%d GFLOP/s:%s\n", s.what, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, line.c_str());
  }
  return 0;
}
