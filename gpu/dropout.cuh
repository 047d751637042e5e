// gpu/dropout.cuh: §5.4 dropout with the CPU's hash (cpu::dropout_forward, cpu::dropout_backward).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §5.4 dropout: the same hash as the CPU (dropout_keeps) -----------------------------------------
// A key as the kernel uses it: one replayed from a CUDA graph takes its step from device memory (DropoutKey).
__device__ DropoutKey at_step(DropoutKey key) {
  if (key.step) key.stream = dropout_site_stream(key.step->stream, key.site + key.step->micro_site);
  return key;
}
// out16: out's bf16 twin, or null
__global__ void dropout_forward_kernel(float* out, bf16* out16, const float* in, DropoutKey key, size_t n, float scale) {
  key = at_step(key);
  GRID_STRIDE(i, n) {
    out[i] = key.p == 0 ? in[i] : dropout_keeps(key, i) ? in[i] * scale : 0.f;
    if (out16) out16[i] = __float2bfloat16(out[i]);
  }
}
// din16: din's bf16 twin, or null
// add: din holds values to add to; else it is taken zeroed (took_zero_fill) and written, 0 + its gradient.
__global__ void dropout_backward_kernel(float* din, bf16* din16, const float* dout, DropoutKey key, size_t n, float scale, bool add) {
  key = at_step(key);
  GRID_STRIDE(i, n) {
    const bool kept = key.p == 0 || dropout_keeps(key, i);
    if (!add) din[i] = kept ? 0.f + dout[i] * scale : 0.f;
    else if (kept) din[i] += dout[i] * scale;
    if (din16) din16[i] = __float2bfloat16(din[i]);
  }
}
void dropout_forward(float* out, const float* in, DropoutKey key, size_t n) {
  if (n == 0 || (key.p == 0 && out == in)) return;
  LAUNCH(dropout_forward_kernel, blocks_for(n), 256, 0, out, bf16_twin_of(out, n), in, key, n, (float)dropout_scale(key));
}
void dropout_backward(float* din, const float* dout, DropoutKey key, size_t n) {
  if (n == 0) return;
  before_writing(din, n);
  const bool add = !took_zero_fill(din, n);
  LAUNCH(dropout_backward_kernel, blocks_for(n), 256, 0, din, bf16_twin_of(din, n), dout, key, n, (float)dropout_scale(key), add);
}

}  // namespace gpu
