// The float matrix product on the CPU, fast form: cpu::gemm<float>, part of transformer.cu's translation
// unit (it includes this file). The reference is the template cpu::gemm<T> in transformer.cu (run for
// double by the gradient checks); test/gemm.cpp checks this one against it for every kernel the CPU can run.
//
// Blocked as BLAS libraries do: a (KC x NC) block of op(B) is packed into NR-wide column panels, an
// MR-row panel of op(A) beside it, and a register-tile kernel accumulates each MR x NR tile of C over the
// block's KC terms. The kernel is written once per instruction set (AVX-512, AVX2 + FMA, NEON, plain C++),
// each compiled for its own target (the x86 ones with a function attribute), and chosen at run time from
// what the CPU reports: the build needs no -march flag and runs on any x86-64 or AArch64 (or, with the plain
// kernel only, elsewhere). Every element of C sums its K terms in the same order whatever the number of
// threads; the kernels round differently from one another (the AVX and NEON kernels fuse each multiply-add).
#pragma once
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>

#include "transformer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GEMM_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#define GEMM_NEON 1
#endif

namespace cpu {

namespace {

constexpr int KC = 256, NC = 512;  // a packed block of op(B): 512 KB, in L2 beside A's panels

// C[0:h, 0:w] += (MR x NR tile) sum_k a[k MR + r] b[k NR + c], for k < kc; a and b are packed panels
// (zero past h rows and w columns), 64-byte aligned.
using TileKernel = void (*)(int kc, const float* a, const float* b, float* C, int ldc, int h, int w);

// Adds a finished tile to C, the part of it inside the matrix.
template <int MR, int NR> inline void add_tile(const float (&acc)[MR][NR], float* C, int ldc, int h, int w) {
  for (int r = 0; r < h; ++r)
    for (int c = 0; c < w; ++c) C[(size_t)r * ldc + c] += acc[r][c];
}

// Plain C++: any CPU (the compiler vectorises it for the baseline instruction set).
constexpr int kGenericMR = 6, kGenericNR = 8;
void tile_generic(int kc, const float* a, const float* b, float* C, int ldc, int h, int w) {
  constexpr int MR = kGenericMR, NR = kGenericNR;
  float acc[MR][NR] = {};
  for (int k = 0; k < kc; ++k)
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < NR; ++c) acc[r][c] += a[k * MR + r] * b[k * NR + c];
  add_tile<MR, NR>(acc, C, ldc, h, w);
}

#ifdef GEMM_X86
// ---- hot loop: AVX2 + FMA, 6 x 16 tile: 12 ymm accumulators, 2 loads of B and 6 broadcasts of A per k ----
constexpr int kAvx2MR = 6, kAvx2NR = 16;
__attribute__((target("avx2,fma"))) void tile_avx2(int kc, const float* a, const float* b, float* C, int ldc, int h, int w) {
  constexpr int MR = kAvx2MR, NR = kAvx2NR;
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b + k * NR), b1 = _mm256_load_ps(b + k * NR + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + k * MR + r);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  if (h == MR && w == NR) {
    for (int r = 0; r < MR; ++r) {
      float* c = C + (size_t)r * ldc;
      _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), acc[r][0]));
      _mm256_storeu_ps(c + 8, _mm256_add_ps(_mm256_loadu_ps(c + 8), acc[r][1]));
    }
    return;
  }
  alignas(32) float t[MR][NR];
  for (int r = 0; r < MR; ++r) _mm256_store_ps(t[r], acc[r][0]), _mm256_store_ps(t[r] + 8, acc[r][1]);
  add_tile<MR, NR>(t, C, ldc, h, w);
}

// ---- hot loop: AVX-512, 12 x 32 tile: 24 zmm accumulators, 2 loads of B and 12 broadcasts of A per k ----
constexpr int kAvx512MR = 12, kAvx512NR = 32;
__attribute__((target("avx512f"))) void tile_avx512(int kc, const float* a, const float* b, float* C, int ldc, int h, int w) {
  constexpr int MR = kAvx512MR, NR = kAvx512NR;
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * NR), b1 = _mm512_load_ps(b + k * NR + 16);
    for (int r = 0; r < MR; ++r) {
      const __m512 ar = _mm512_set1_ps(a[k * MR + r]);
      acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  if (h == MR && w == NR) {
    for (int r = 0; r < MR; ++r) {
      float* c = C + (size_t)r * ldc;
      _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), acc[r][0]));
      _mm512_storeu_ps(c + 16, _mm512_add_ps(_mm512_loadu_ps(c + 16), acc[r][1]));
    }
    return;
  }
  alignas(64) float t[MR][NR];
  for (int r = 0; r < MR; ++r) _mm512_store_ps(t[r], acc[r][0]), _mm512_store_ps(t[r] + 16, acc[r][1]);
  add_tile<MR, NR>(t, C, ldc, h, w);
}
#endif

#ifdef GEMM_NEON
// ---- hot loop: NEON (AArch64), 12 x 8 tile: 24 of the 32 q registers accumulate; per k, 2 loads of B and 3
// of A, whose lanes the 24 multiply-adds take as their multipliers (fmla by element: no broadcasts). Written
// with the vector extension's operators, which g++ and clang contract into fmla: with vfmaq_laneq_f32, g++ 12
// counts each intrinsic as a side effect (it may raise a floating-point exception) and stored all 24
// accumulators to the stack at every k ----
constexpr int kNeonMR = 12, kNeonNR = 8;
void tile_neon(int kc, const float* a, const float* b, float* C, int ldc, int h, int w) {
  constexpr int MR = kNeonMR, NR = kNeonNR;
  float32x4_t acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = vdupq_n_f32(0.0f);
  for (int k = 0; k < kc; ++k) {
    const float32x4_t b0 = vld1q_f32(b + k * NR), b1 = vld1q_f32(b + k * NR + 4);
    for (int q = 0; q < MR / 4; ++q) {  // rows 4q .. 4q + 3
      const float32x4_t aq = vld1q_f32(a + k * MR + 4 * q);
      for (int l = 0; l < 4; ++l) {
        acc[4 * q + l][0] += b0 * aq[l];
        acc[4 * q + l][1] += b1 * aq[l];
      }
    }
  }
  if (h == MR && w == NR) {
    for (int r = 0; r < MR; ++r) {
      float* c = C + (size_t)r * ldc;
      vst1q_f32(c, vaddq_f32(vld1q_f32(c), acc[r][0]));
      vst1q_f32(c + 4, vaddq_f32(vld1q_f32(c + 4), acc[r][1]));
    }
    return;
  }
  float t[MR][NR];
  for (int r = 0; r < MR; ++r) vst1q_f32(t[r], acc[r][0]), vst1q_f32(t[r] + 4, acc[r][1]);
  add_tile<MR, NR>(t, C, ldc, h, w);
}
#endif

struct Kernel {
  int MR, NR;
  TileKernel tile;
};

Kernel kernel_for(GemmKernel k) {
  switch (k) {
#ifdef GEMM_X86
    case GemmKernel::avx512: return {kAvx512MR, kAvx512NR, tile_avx512};
    case GemmKernel::avx2: return {kAvx2MR, kAvx2NR, tile_avx2};
#endif
#ifdef GEMM_NEON
    case GemmKernel::neon: return {kNeonMR, kNeonNR, tile_neon};
#endif
    case GemmKernel::generic: return {kGenericMR, kGenericNR, tile_generic};
    default: throw std::invalid_argument(std::string("gemm: the ") + gemm_kernel_name(k) + " kernel is not built for this CPU");
  }
}

// A float buffer aligned to 64 bytes that grows and is kept: no allocation once the largest shape is seen.
struct Workspace {
  std::unique_ptr<float, decltype(&std::free)> p{nullptr, &std::free};
  size_t n = 0;
  float* get(size_t want) {
    if (want > n) {
      p.reset(static_cast<float*>(std::aligned_alloc(64, (want * sizeof(float) + 63) / 64 * 64)));
      if (!p) throw std::bad_alloc();
      n = want;
    }
    return p.get();
  }
};

// One NR-wide column panel of op(B): op(B)(k0 + k, jb + c) at dst[k NR + c] for k < kc, zero past
// column w. gemm_with packs a (KC x NC) block of op(B) at a time, and op(A)'s row panels as column panels
// of op(A)^T; PackedOperands packs whole operands.
void pack_panel(float* dst, int NR, bool tb, const float* B, int ldb, int k0, int kc, int jb, int w) {
  if (w < NR) std::fill(dst, dst + (size_t)kc * NR, 0.0f);
  if (!tb)  // op(B)(k, j) = B[k ldb + j]: rows of w
    for (int k = 0; k < kc; ++k) {
      const float* src = B + (size_t)(k0 + k) * ldb + jb;
      for (int c = 0; c < w; ++c) dst[k * NR + c] = src[c];
    }
  else  // op(B)(k, j) = B[j ldb + k]: columns of kc
    for (int c = 0; c < w; ++c) {
      const float* src = B + (size_t)(jb + c) * ldb + k0;
      for (int k = 0; k < kc; ++k) dst[k * NR + c] = src[k];
    }
}

thread_local const PackedOperands* active_packing = nullptr;  // the innermost one alive on this thread

}  // namespace

const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::automatic: return "automatic";
    case GemmKernel::avx512: return "avx512";
    case GemmKernel::avx2: return "avx2";
    case GemmKernel::neon: return "neon";
    case GemmKernel::generic: return "plain";
  }
  return "?";
}

bool gemm_kernel_supported(GemmKernel k) {
  switch (k) {
#ifdef GEMM_X86
    case GemmKernel::avx512: return __builtin_cpu_supports("avx512f");
    case GemmKernel::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
#ifdef GEMM_NEON
    case GemmKernel::neon: return true;  // AArch64's Advanced SIMD is part of the architecture: every such CPU has it
#endif
    case GemmKernel::automatic:
    case GemmKernel::generic: return true;
    default: return false;
  }
}

GemmKernel gemm_best_kernel() {
  static const GemmKernel best = gemm_kernel_supported(GemmKernel::avx512) ? GemmKernel::avx512
                                 : gemm_kernel_supported(GemmKernel::avx2) ? GemmKernel::avx2
                                 : gemm_kernel_supported(GemmKernel::neon) ? GemmKernel::neon
                                                                          : GemmKernel::generic;
  return best;
}

void gemm_with(GemmKernel which, bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
               float* C, int ldc, bool accumulate) {
  if (!accumulate)
    for (int i = 0; i < M; ++i) std::fill(C + (size_t)i * ldc, C + (size_t)i * ldc + N, 0.0f);
  if (M == 0 || N == 0 || K == 0) return;
  if (which == GemmKernel::automatic) which = gemm_best_kernel();
  const Kernel kern = kernel_for(which);
  const int MR = kern.MR, NR = kern.NR;
  const float* packed = active_packing ? active_packing->find(which, {tb, N, K, B, ldb}) : nullptr;
  static thread_local Workspace aspace, bspace;  // the calling thread's; its team shares them
  const int row_panels = (M + MR - 1) / MR, kcmax = std::min(KC, K);
  float* apack = aspace.get((size_t)row_panels * MR * kcmax);
  float* bpack = packed ? nullptr : bspace.get((size_t)kcmax * ((std::min(NC, N) + NR - 1) / NR * NR));
  // A team from a million multiply-adds (tens of microseconds here): waking a sleeping one costs about as
  // much (OMP_WAIT_POLICY=passive), and a decoding step's products of 64 rows, 262,144 multiply-adds at
  // d_model 64, ran slower in two threads than in one (a greedy decode of 500 number sentences, run one after
  // the other: 3.65 s with them in two threads, 2.34 s in one; the FFN's, 1,048,576, still take two)
#pragma omp parallel if ((long)M * N * K > 1000000)
  for (int k0 = 0; k0 < K; k0 += KC) {
    const int kc = std::min(KC, K - k0);
    // row panel ip of op(A) holds op(A)(ip MR + r, k0 + k) at [(ip kc + k) MR + r], zero past row M
#pragma omp for schedule(static)
    for (int ip = 0; ip < row_panels; ++ip)  // the column panels of op(A)^T: A with the opposite transposition
      pack_panel(apack + (size_t)ip * kc * MR, MR, !ta, A, lda, k0, kc, ip * MR, std::min(MR, M - ip * MR));
    for (int j0 = 0; j0 < N; j0 += NC) {
      const int nc = std::min(NC, N - j0), panels = (nc + NR - 1) / NR;
      // column panel p of this block is at bblock + p bstride: in the operand's packed copy when there is
      // one, else packed here
      const float* bblock = bpack;
      size_t bstride = (size_t)kc * NR;
      if (packed)
        bblock = packed + ((size_t)(j0 / NR) * K + k0) * NR, bstride = (size_t)K * NR;
      else {
#pragma omp for schedule(static)
        for (int p = 0; p < panels; ++p) {
          const int jb = j0 + p * NR;
          pack_panel(bpack + (size_t)p * kc * NR, NR, tb, B, ldb, k0, kc, jb, std::min(NR, N - jb));
        }
      }
      // The tiles, row panel by row panel, each over the whole packed block of op(B) (in L2). The threads
      // split the tiles in consecutive runs: by row panels when there are many, by column panels for a
      // short, wide product.
#pragma omp for schedule(static)
      for (int tile = 0; tile < row_panels * panels; ++tile) {
        const int ip = tile / panels, p = tile % panels, i0 = ip * MR, jb = j0 + p * NR;
        kern.tile(kc, apack + (size_t)ip * kc * MR, bblock + p * bstride, C + (size_t)i0 * ldc + jb, ldc,
                  std::min(MR, M - i0), std::min(NR, N - jb));
      }
    }
  }
}

// Each operand whole, in NR-wide column panels over all K rows: panel p holds op(B)(k, p NR + c) at
// [(p K + k) NR + c]. A (KC x NC) block of it is then what gemm_with would have packed (NC is a multiple
// of every NR), with panels K NR apart instead of kc NR.
PackedOperands::PackedOperands(const std::vector<GemmOperand>& operands, GemmKernel k)
    : kernel_(k == GemmKernel::automatic ? gemm_best_kernel() : k), previous_(active_packing) {
#ifdef GEMM_X86
  static_assert(NC % kAvx512NR == 0 && NC % kAvx2NR == 0, "a block must hold whole panels");
#endif
#ifdef GEMM_NEON
  static_assert(NC % kNeonNR == 0, "a block must hold whole panels");
#endif
  static_assert(NC % kGenericNR == 0, "a block must hold whole panels");
  const int NR = kernel_for(kernel_).NR;
  for (const GemmOperand& op : operands) {
    if (find(kernel_, op)) continue;  // listed twice, or held by an enclosing one
    const int panels = (op.N + NR - 1) / NR;
    const size_t n = (size_t)panels * op.K * NR;
    if (n == 0) continue;  // gemm_with has nothing to multiply
    float* data = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
    if (!data) throw std::bad_alloc();
    packed_.emplace_back(op, std::unique_ptr<float, void (*)(void*)>(data, &std::free));
#pragma omp parallel for schedule(static) if (n > 100000)
    for (int p = 0; p < panels; ++p)
      pack_panel(data + (size_t)p * op.K * NR, NR, op.tb, op.B, op.ldb, 0, op.K, p * NR, std::min(NR, op.N - p * NR));
  }
  active_packing = this;
}

PackedOperands::~PackedOperands() { active_packing = previous_; }

const float* PackedOperands::find(GemmKernel k, const GemmOperand& op) const {
  if (k == kernel_)
    for (const auto& [o, data] : packed_)
      if (o == op) return data.get();
  return previous_ ? previous_->find(k, op) : nullptr;
}

template <>
void gemm<float>(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
                 bool accumulate) {
  gemm_with(GemmKernel::automatic, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

}  // namespace cpu
