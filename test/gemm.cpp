// gemm: the fast float product (gemm.h) against the reference cpu::gemm<double> on the same inputs, for
// every kernel this CPU runs (AVX-512, AVX2, NEON, plain), all four transpositions, with and without
// accumulation, padded leading dimensions, and shapes that leave partial tiles and blocks on every side.
// Error measure: |fast - reference| / sum_k |a_ik b_kj|, within (K + 2) 2^-24 (the bound of a float sum
// of K products). With op(B) packed beforehand (cpu::PackedOperands), the result must be the same bit for
// bit. The checks themselves are shown to reject a result off by a few times that bound, and a product
// computed from a changed packed copy.
#include <cstdio>
#include <vector>

#include "../transformer.h"
#include "check.h"

using cpu::GemmKernel;

struct Lcg {
  uint64_t s = 42;
  float next() {  // uniform in [-1, 1), exactly representable
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int)(s >> 40) - (1 << 23)) / (float)(1 << 23);
  }
};

// One product with kernel k, checked element by element; `off` is added to one element of the result
// before the check (0 for the real test, a multiple of the bound for the check of the check).
static void check_product(Checker& chk, GemmKernel k, bool ta, bool tb, int M, int N, int K, bool accumulate, double off) {
  Lcg rng;
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
  std::vector<float> A((size_t)(ta ? K : M) * lda), B((size_t)(tb ? N : K) * ldb), C((size_t)M * ldc);
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = rng.next();
  std::vector<double> Ad(A.begin(), A.end()), Bd(B.begin(), B.end()), Cd(C.begin(), C.end()), C0(Cd);
  std::vector<double> Aabs(Ad), Babs(Bd), S((size_t)M * ldc);
  for (double& x : Aabs) x = std::fabs(x);
  for (double& x : Babs) x = std::fabs(x);
  cpu::gemm_with(k, ta, tb, M, N, K, A.data(), lda, B.data(), ldb, C.data(), ldc, accumulate);
  cpu::gemm<double>(ta, tb, M, N, K, Ad.data(), lda, Bd.data(), ldb, Cd.data(), ldc, accumulate);
  cpu::gemm<double>(ta, tb, M, N, K, Aabs.data(), lda, Babs.data(), ldb, S.data(), ldc, false);
  if (M > 0 && N > 0) C[(size_t)(M / 2) * ldc + N / 2] += (float)(off * (K + 2) * std::ldexp(1.0, -24) * S[(size_t)(M / 2) * ldc + N / 2]);
  const double tol = (K + 2) * std::ldexp(1.0, -24);
  char what[160];
  std::snprintf(what, sizeof what, "%s ta=%d tb=%d M=%d N=%d K=%d acc=%d", cpu::gemm_kernel_name(k), ta, tb, M, N, K, accumulate);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      const size_t at = (size_t)i * ldc + j;
      // the scale: sum_k |a||b|, plus |C| when accumulating (at least 1e-30 where all of it is zero)
      const double scale = S[at] + (accumulate ? std::fabs(C0[at]) : 0.0) + 1e-30;
      chk.close(C[at], Cd[at], tol, tol * scale, what);
    }
  // past column N of each row, nothing is written
  for (int i = 0; i < M; ++i)
    for (int j = N; j < ldc; ++j) {
      const size_t at = (size_t)i * ldc + j;
      chk.expect(C[at] == (float)Cd[at], "%s: wrote past column N at (%d, %d)", what, i, j);
    }
}

// The same product with op(B) packed beforehand (cpu::PackedOperands, as decoding packs its weights):
// bit for bit the result without it. `corrupt` changes one element of the packed copy first (the check of
// the check: the results must then differ).
static void check_packed(Checker& chk, GemmKernel k, bool ta, bool tb, int M, int N, int K, bool corrupt) {
  Lcg rng;
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
  std::vector<float> A((size_t)(ta ? K : M) * lda), B((size_t)(tb ? N : K) * ldb), C((size_t)M * ldc);
  for (auto* v : {&A, &B, &C})
    for (float& x : *v) x = rng.next();
  std::vector<float> plain(C), packed(C);
  cpu::gemm_with(k, ta, tb, M, N, K, A.data(), lda, B.data(), ldb, plain.data(), ldc, true);
  char what[160];
  std::snprintf(what, sizeof what, "packed op(B): %s ta=%d tb=%d M=%d N=%d K=%d", cpu::gemm_kernel_name(k), ta, tb, M, N, K);
  {
    const cpu::GemmOperand op{tb, N, K, B.data(), ldb};
    const cpu::PackedOperands packs({op}, k);
    float* copy = const_cast<float*>(packs.find(k, op));
    if (N == 0 || K == 0)  // nothing to pack: gemm_with has nothing to multiply
      chk.expect(copy == nullptr, "%s: an empty operand was packed", what);
    else if (!chk.expect(copy != nullptr, "%s: the operand is not found", what))
      return;
    for (GemmKernel other : {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::neon, GemmKernel::generic})
      if (other != k) chk.expect(packs.find(other, op) == nullptr, "%s: found for the %s kernel too", what, cpu::gemm_kernel_name(other));
    chk.expect(packs.find(k, {tb, N, K, B.data(), ldb + 1}) == nullptr, "%s: found with another ldb", what);
    if (corrupt && copy) copy[0] += 1.0f;
    cpu::gemm_with(k, ta, tb, M, N, K, A.data(), lda, B.data(), ldb, packed.data(), ldc, true);
  }
  size_t differ = 0;
  for (size_t i = 0; i < C.size(); ++i) differ += plain[i] != packed[i];
  chk.expect(differ == 0, "%s: %zu elements differ from the product without it", what, differ);
}

int main() {
  Checker chk("gemm");
  std::vector<GemmKernel> kernels;
  for (GemmKernel k : {GemmKernel::avx512, GemmKernel::avx2, GemmKernel::neon, GemmKernel::generic})
    if (cpu::gemm_kernel_supported(k)) kernels.push_back(k);
  std::printf("gemm: kernels run: ");
  for (GemmKernel k : kernels) std::printf("%s ", cpu::gemm_kernel_name(k));
  std::printf("(automatic: %s)\n", cpu::gemm_kernel_name(cpu::gemm_best_kernel()));
  // odd shapes (partial register tiles, KC and NC blocks), and the model's (tokens x d_model x d_ff)
  const int shapes[][3] = {{1, 1, 1}, {0, 7, 3}, {5, 0, 3}, {4, 6, 0}, {13, 33, 7}, {12, 32, 256}, {25, 70, 300},
                           {100, 600, 257}, {37, 1100, 40}, {300, 20, 530}, {64, 256, 1024}};
  for (GemmKernel k : kernels)
    for (const auto& s : shapes)
      for (int t = 0; t < 8; ++t) check_product(chk, k, t & 1, t & 2, s[0], s[1], s[2], t & 4, 0.0);
  for (GemmKernel k : kernels)
    for (const auto& s : shapes)
      for (int t = 0; t < 4; ++t) check_packed(chk, k, t & 1, t & 2, s[0], s[1], s[2], false);
  // the check rejects a result off by four times its bound, and a product that used a changed packed copy
  for (GemmKernel k : kernels) {
    Checker must_fail("gemm, a deliberately wrong result (this FAIL line is expected)");
    check_product(must_fail, k, false, true, 25, 70, 300, false, 4.0);
    chk.expect(must_fail.failures == 1, "%s: a result off by 4x the bound was not rejected (failures %ld)",
               cpu::gemm_kernel_name(k), must_fail.failures);
    Checker packed_must_fail("gemm, a changed packed operand (this FAIL line is expected)");
    check_packed(packed_must_fail, k, false, true, 25, 70, 300, true);
    chk.expect(packed_must_fail.failures == 1, "%s: a product from a changed packed copy was not rejected (failures %ld)",
               cpu::gemm_kernel_name(k), packed_must_fail.failures);
  }
  return chk.finish();
}
