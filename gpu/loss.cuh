// gpu/loss.cuh: §5.4 label-smoothed cross-entropy (cpu::label_smoothed_xent_forward/backward).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §5.4 label-smoothed cross-entropy: softmax and loss fused, one warp per row --------------------
// Logits a thread reads at a time, forward and backward, their loads all issued before any value is used
constexpr int kXentAtOnce = 8;
__device__ float logit(const float* z, int v) { return z[v]; }
__device__ float logit(const bf16* z, int v) { return __bfloat162float(z[v]); }
template <typename In>  // the logits' elements: float, or bf16 (their twin listed alone in a bf16 model's pass)
__global__ void xent_forward_kernel(float* lse, double* loss_sum, double* tokens, const In* logits, const int* targets, int M, int V,
                                    double qt, double qo, int pad) {
  const int r = warp_row(), lane = threadIdx.x % 32;
  if (r >= M) return;
  const In* z = logits + (size_t)r * V;
  // One pass over the row (the online softmax): a lane reads kXentAtOnce logits at a time, all loads in
  // flight at once, and keeps the largest logit it has read and the sum of their exponentials relative to
  // it, rescaled when it grows; the lanes' sums are then taken to the row's largest. Two passes, the largest
  // first, read the logits twice (250 MiB each at the benchmark's 8192 rows of 8000 in fp32).
  float mx = -INFINITY;
  double s = 0, zsum = 0;
  for (int v0 = lane; v0 < V; v0 += 32 * kXentAtOnce) {
    float x[kXentAtOnce];
    for (int k = 0; k < kXentAtOnce; ++k) x[k] = v0 + 32 * k < V ? logit(z, v0 + 32 * k) : -INFINITY;
    float most = x[0];
    for (int k = 1; k < kXentAtOnce; ++k) most = fmaxf(most, x[k]);
    if (most > mx) s *= exp((double)mx - most), mx = most;
    for (int k = 0; k < kXentAtOnce && v0 + 32 * k < V; ++k) s += expf(x[k] - mx), zsum += x[k];
  }
  const float row_max = warp_max(mx);
  s = warp_sum(s * exp((double)mx - row_max));  // a lane with no logit (V < 32): 0 exp(-inf)
  zsum = warp_sum(zsum);
  if (lane == 0) {
    const float l = row_max + logf((float)s);
    lse[r] = l;
    const int t = targets[r];
    // -sum_v q_v log softmax(z)_v = lse - sum_v q_v z_v   (sum_v q_v = 1)
    if (t != pad) atomicAdd(loss_sum, (double)l - (qo * zsum + (qt - qo) * (double)logit(z, t))), atomicAdd(tokens, 1.0);
  }
}

// tokens += the number of targets that are not padding (the loss's denominator)
__global__ void count_targets_kernel(double* tokens, const int* targets, size_t M, int pad) {
  __shared__ double red[kRowWarps];
  double c = 0;
  GRID_STRIDE(i, M) c += targets[i] != pad;
  c = block_sum(c, red);
  if (threadIdx.x == 0) atomicAdd(tokens, c);
}

// dlogits16: dlogits' bf16 twin, or null (written for padding's rows too, which get no gradient). add:
// dlogits holds values to add to; else it was taken zeroed (took_zero_fill) and is written, padding's rows 0,
// or, where its twin is listed alone (dlogits null), only the twin is.
template <typename In>  // as xent_forward_kernel's
__global__ void xent_backward_kernel(float* dlogits, bf16* dlogits16, const In* logits, const float* lse, const int* targets, int V,
                                     float qt, float qo, const double* tokens, int pad, bool add) {
  const int t = targets[blockIdx.x];
  const bool none = t == pad || *tokens == 0;
  const float inv_n = none ? 0.f : (float)(1.0 / *tokens);
  const In* z = logits + (size_t)blockIdx.x * V;
  float* dz = dlogits ? dlogits + (size_t)blockIdx.x * V : nullptr;
  const float l = lse[blockIdx.x];
  // kXentAtOnce logits (and dlogits, where added to) at a time: a logit at a time, each load waited for the
  // store before it (dlogits might alias the logits for all nvcc knows), one load a thread in flight
  for (int v0 = threadIdx.x; v0 < V; v0 += blockDim.x * kXentAtOnce) {
    float zs[kXentAtOnce], xs[kXentAtOnce];
    for (int k = 0; k < kXentAtOnce; ++k) {
      const int v = v0 + k * blockDim.x;
      zs[k] = v < V ? logit(z, v) : 0.f;
      xs[k] = add && v < V ? dz[v] : 0.f;
    }
    for (int k = 0; k < kXentAtOnce && v0 + k * (int)blockDim.x < V; ++k) {
      const int v = v0 + k * blockDim.x;
      float x = xs[k];
      if (!none) x += (expf(zs[k] - l) - (v == t ? qt : qo)) * inv_n;
      if (dz && !(none && add)) dz[v] = x;
      if (dlogits16) dlogits16[(size_t)blockIdx.x * V + v] = __float2bfloat16(x);
    }
  }
}

// Calls f with the logits as the loss's passes read them: their bf16 twin where a bf16 model's pass lists it
// alone (the output projection then writes only the twin), else their fp32 elements.
template <typename F> static void with_logits(const float* logits, size_t n, F f) {
  bool alone;
  const bf16* z16 = bf16_twin_of(logits, n, &alone);
  if (z16 && !alone) throw std::logic_error("the logits have a bf16 twin beside their fp32 values: the output projection writes one");
  if (z16) return f(z16);
  f(logits);
}
double label_smoothed_xent_forward(float* lse, const float* logits, const int* targets, int M, int V, double eps,
                                   LabelSmoothing form, int pad) {
  double qt, qo;
  cpu::smoothing_weights(eps, form, V, &qt, &qo);
  if (M == 0) return 0;
  static_assert(kTokenCount == kLossSum + 1, "the loss and its token count are neighbours: one memset, one read");
  CUDA_CHECK(cudaMemsetAsync(scalar(kLossSum), 0, 2 * sizeof(double), stream()));
  with_logits(logits, (size_t)M * V, [&](auto z) {
    using In = Elements<decltype(z)>;
    LAUNCH(xent_forward_kernel<In>, warp_row_blocks(M), kWarpRowThreads, 0, lse, scalar(kLossSum), scalar(kTokenCount),
           z, targets, M, V, qt, qo, pad);
  });
  if (capturing()) return NAN;  // a graph cannot read: whoever replays it reads the loss (last_loss)
  return last_loss();
}
double last_loss() {
  double sums[2];  // the loss summed over real tokens, and their count
  CUDA_CHECK(cudaMemcpy(sums, scalar(kLossSum), sizeof sums, cudaMemcpyDeviceToHost));
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}
__global__ void add_step_loss_kernel(double* step_sum, const double* loss_sum) { *step_sum += *loss_sum; }
void add_step_loss(double* step_sum) { LAUNCH(add_step_loss_kernel, 1, 1, 0, step_sum, scalar(kLossSum)); }
__global__ void keep_step_loss_kernel(double* ring, const double* step_sum, const AdamStep* step) {
  ring[step->t % kLossRing] = *step_sum;
}
void keep_step_loss(double* ring, const double* step_sum, const AdamStep* step) {
  LAUNCH(keep_step_loss_kernel, 1, 1, 0, ring, step_sum, step);
}

void label_smoothed_xent_backward(float* dlogits, const float* logits, const float* lse, const int* targets, int M, int V,
                                  double eps, LabelSmoothing form, int pad) {
  double qt, qo;
  cpu::smoothing_weights(eps, form, V, &qt, &qo);
  if (M == 0) return;
  const bool add = !took_zero_fill(dlogits, (size_t)M * V);
  bool alone;
  bf16* dlogits16 = bf16_twin_of(dlogits, (size_t)M * V, &alone);
  if (alone && add) throw std::logic_error("label_smoothed_xent_backward: adding into a gradient whose fp32 values are not kept (a bf16 twin listed alone)");
  // the number of real tokens is counted on the device: nothing comes back to the host
  CUDA_CHECK(cudaMemsetAsync(scalar(kTokenCount), 0, sizeof(double), stream()));
  LAUNCH(count_targets_kernel, std::min(blocks_for(M), 64u), kRowThreads, 0, scalar(kTokenCount), targets, M, pad);
  with_logits(logits, (size_t)M * V, [&](auto z) {
    using In = Elements<decltype(z)>;
    LAUNCH(xent_backward_kernel<In>, M, row_threads(V), 0, alone ? nullptr : dlogits, dlogits16, z, lse, targets, V,
           (float)qt, (float)qo, scalar(kTokenCount), pad, add);
  });
}

}  // namespace gpu
