// gpu/adam.cuh: §5.3 Adam and gradient-norm clipping (cpu::adam_update, cpu::scale_grads, cpu::clip_grad_norm).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §5.3 Adam over the whole buffer, gradient-norm clipping -------------------------------------------
// What changes from step to step (Eq. 3's rate, the bias corrections) is read from device memory, so one
// CUDA graph of the update serves every step. The parameters' bf16 copy, where they have one, is written in
// the same pass.
__global__ void adam_kernel(float* params, bf16* copy, const float* grads, float* m, float* v, size_t n, const AdamStep* step,
                            double beta1, double beta2, double eps) {
  const double lr = step->lr, c1 = step->c1, c2 = step->c2;
  GRID_STRIDE(i, n) {
    m[i] = normal_or_zero<float>(beta1 * m[i] + (1 - beta1) * grads[i]);
    v[i] = normal_or_zero<float>(beta2 * v[i] + (1 - beta2) * (double)grads[i] * grads[i]);
    const double mhat = m[i] / c1, vhat = v[i] / c2;
    params[i] -= (float)(lr * mhat / (sqrt(vhat) + eps));
    if (copy) copy[i] = __float2bfloat16(params[i]);
  }
}
AdamStep adam_step(double lr, double beta1, double beta2, long t) {
  return {lr, 1 - std::pow(beta1, (double)t), 1 - std::pow(beta2, (double)t), t};  // as cpu::adam_update
}
void adam_update(float* params, const float* grads, float* m, float* v, size_t n, const AdamStep* step, double beta1, double beta2,
                 double eps) {
  if (n == 0) return;
  bf16* copy = bf16_copy_of(params);
  if (copy && bf16_copy_of(params + n - 1) != copy + n - 1) throw std::logic_error("adam_update: over part of a buffer's bf16 copy");
  LAUNCH(adam_kernel, blocks_for(n), 256, 0, params, copy, grads, m, v, n, step, beta1, beta2, eps);
}

// The squared norm: each block's sum into a part of its own, which every block of the clipping pass then
// adds in the same fixed order. No atomics: the norm has the same bits on every run and every rank, so
// data parallelism's ranks clip alike.
__global__ void square_sum_kernel(double* part, const float* g, size_t n) {
  __shared__ double red[kRowWarps];
  double s = 0;
  GRID_STRIDE(i, n) s += (double)g[i] * g[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}
// Scales g by max_norm / ||g|| when the norm is above max_norm, decided here: nothing goes to the host.
__global__ void clip_kernel(float* g, size_t n, const double* part, double max_norm) {
  __shared__ double red[kRowWarps];
  double s = 0;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) s += part[b];  // as many parts as blocks
  const double norm = sqrt(block_sum(s, red));
  if (!(norm > max_norm)) return;  // as on the CPU, a NaN norm scales nothing
  GRID_STRIDE(i, n) g[i] = (float)(g[i] * (max_norm / norm));
}
void clip_grad_norm(float* grads, size_t n, double max_norm) {
  if (n == 0) return;
  const unsigned blocks = std::min(blocks_for(n), kNormBlocks);
  LAUNCH(square_sum_kernel, blocks, kRowThreads, 0, scalar(kSquareParts), grads, n);
  LAUNCH(clip_kernel, blocks, kRowThreads, 0, grads, n, scalar(kSquareParts), max_norm);
}
__global__ void scale_kernel(float* g, size_t n, float f) { GRID_STRIDE(i, n) g[i] *= f; }
void scale_grads(float* grads, size_t n, double factor) {
  if (n) LAUNCH(scale_kernel, blocks_for(n), 256, 0, grads, n, (float)factor);
}

}  // namespace gpu
