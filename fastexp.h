// exp over a row of floats, fast form: part of transformer.cu's translation unit (it includes this file),
// used by the float log-softmax that decoding runs over the whole vocabulary at every step (it was 14% of
// beam search's time with the scalar std::exp). On a CPU with AVX-512 sixteen at a time, chosen at run
// time as gemm.h chooses its kernel; on AArch64 four at a time in NEON (every such CPU has it); elsewhere
// std::exp. test/fastexp.cpp checks it against std::exp in double.
#pragma once
#include <algorithm>
#include <cmath>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FASTEXP_X86 1
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace cpu {

namespace {

#ifdef FASTEXP_X86
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

#ifdef __aarch64__
// ---- hot loop: exp16's steps, the same multiply-adds in the same order, four lanes at a time. NEON has no
// scalef: 2^k is applied as two factors 2^(k >> 1) and 2^(k - (k >> 1)), each a normal float for k in
// [-150, 128] (x in [-104, 89]), so that the second multiply is the one rounding, subnormal results included.
// FMAX and FMIN return a NaN operand, so a NaN stays NaN through the clamp.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-104.0f)), vdupq_n_f32(89.0f));
  const float32x4_t shifter = vdupq_n_f32(12582912.0f);  // 1.5 2^23: adding it rounds to an integer
  const float32x4_t k = vsubq_f32(vfmaq_f32(shifter, x, vdupq_n_f32(1.44269504f)), shifter);
  float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693145752f));  // ln 2's first 17 bits: k ln2_hi is exact
  r = vfmsq_f32(r, k, vdupq_n_f32(1.42860677e-6f));            // ln 2 - ln2_hi
  float32x4_t p = vdupq_n_f32(1.0f / 5040);
  for (float c : {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = vfmaq_f32(vdupq_n_f32(c), p, r);
  const int32x4_t ki = vcvtq_s32_f32(k), k1 = vshrq_n_s32(ki, 1), k2 = vsubq_s32(ki, k1);
  const auto pow2 = [](int32x4_t e) { return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(e, vdupq_n_s32(127)), 23)); };
  return vmulq_f32(vmulq_f32(p, pow2(k1)), pow2(k2));
}

void exp_shifted_neon(float* out, const float* z, float shift, int n) {
  const float32x4_t s = vdupq_n_f32(shift);
  int i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, exp4(vsubq_f32(vld1q_f32(z + i), s)));
  if (i < n) {  // the last 1-3 through a vector's worth of scratch
    float t[4] = {};
    std::copy(z + i, z + n, t);
    vst1q_f32(t, exp4(vsubq_f32(vld1q_f32(t), s)));
    std::copy(t, t + (n - i), out + i);
  }
}
#endif

// out[i] = exp(z[i] - shift) for i < n (out may be z)
void exp_shifted(float* out, const float* z, float shift, int n) {
#ifdef __aarch64__
  exp_shifted_neon(out, z, shift, n);
#else
#ifdef FASTEXP_X86
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) return exp_shifted_avx512(out, z, shift, n);
#endif
  for (int i = 0; i < n; ++i) out[i] = std::exp(z[i] - shift);
#endif
}

// which form exp_shifted runs on this CPU (test/fastexp.cpp prints it)
inline const char* exp_shifted_form() {
#ifdef __aarch64__
  return "NEON";
#else
#ifdef FASTEXP_X86
  if (__builtin_cpu_supports("avx512f")) return "AVX-512";
#endif
  return "std::exp (no AVX-512 on this CPU)";
#endif
}

}  // namespace

}  // namespace cpu

