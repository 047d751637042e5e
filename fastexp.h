// exp over a row of floats, fast form: part of transformer.cu's translation unit (it includes this file),
// used by the float log-softmax that decoding runs over the whole vocabulary at every step (it was 14% of
// beam search's time with the scalar std::exp). On a CPU with AVX-512 sixteen at a time, chosen at run
// time as gemm.h chooses its kernel; elsewhere std::exp. test/fastexp.cpp checks it against std::exp in
// double.
#pragma once
#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// ---- hot loop: exp(x) = 2^k exp(r), k = round(x / ln 2) (to nearest), r = x - k ln 2 in [-ln 2 / 2,
// ln 2 / 2] (ln 2 in two parts, so that r is exact to a float's precision); exp(r) by its Taylor series to
// r^7 (the rest is below 2^-27 of it); scalef multiplies by 2^k, giving subnormals and then 0 below
// 2^-126. x is clamped to [-104, 89] (exp is 0 in float below, inf above); a NaN stays NaN.
__attribute__((target("avx512f"))) inline __m512 exp16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-104.0f), highest = _mm512_set1_ps(89.0f);
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ), x, lowest);  // a NaN compares false
  x = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, highest, _CMP_GT_OQ), x, highest);
  const __m512 shifter = _mm512_set1_ps(12582912.0f);  // 1.5 2^23: adding it rounds to an integer
  const __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504f), shifter), shifter);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);  // ln 2's first 17 bits: k ln2_hi is exact
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);      // ln 2 - ln2_hi
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
  return _mm512_maskz_scalef_ps((__mmask16)0xffff, p, k);  // all lanes (GCC 12 warns on the unmasked form: its bug 105593)
}

__attribute__((target("avx512f"))) void exp_shifted_avx512(float* out, const float* z, float shift, int n) {
  const __m512 s = _mm512_set1_ps(shift);
  int i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, exp16(_mm512_sub_ps(_mm512_loadu_ps(z + i), s)));
  if (i < n) {
    const __mmask16 rest = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, rest, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(rest, z + i), s)));
  }
}
#endif

// out[i] = exp(z[i] - shift) for i < n (out may be z)
void exp_shifted(float* out, const float* z, float shift, int n) {
#if defined(__x86_64__) || defined(__i386__)
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return exp_shifted_avx512(out, z, shift, n);
#endif
  for (int i = 0; i < n; ++i) out[i] = std::exp(z[i] - shift);
}

}  // namespace

}  // namespace cpu
