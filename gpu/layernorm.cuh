// gpu/layernorm.cuh: §3.1 LayerNorm and the residual connection (cpu::layernorm_forward/backward,
// cpu::residual_dropout_forward/backward and their fused LayerNorm forms).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §3.1 LayerNorm and the residual connection: a warp per row (fewer lanes for a small one) ----------
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* in, const float* g, const float* b,
                                         int M, int D, float eps) {
  // BEGIN SOLUTION task=layernorm_kernel points=5
  const int r = warp_row(), lane = threadIdx.x % 32;
  if (r >= M) return;
  const float* x = in + (size_t)r * D;
  float s = 0;
  for (int d = lane; d < D; d += 32) s += x[d];
  const float mu = warp_sum(s) / D;
  float v = 0;
  for (int d = lane; d < D; d += 32) v += (x[d] - mu) * (x[d] - mu);
  const float rs = 1.f / sqrtf(warp_sum(v) / D + eps);  // biased variance, as LayerNorm defines it
  float* y = out + (size_t)r * D;
  for (int d = lane; d < D; d += 32) y[d] = (x[d] - mu) * rs * g[d] + b[d];
  if (lane == 0) mean[r] = mu, rstd[r] = rs;
  // END SOLUTION
}

// LayerNorm's backward, a row to a group of kLanes lanes (row_lanes: a warp where D > 128),
// kLayerNormRowsPerGroup rows a group (strided over the grid): the input gradient of each row, add(i, dx_i)
// for each of its elements i = r D + d, and the parameters' gradients dg += sum_rows dy xhat,
// db += sum_rows dy in the same pass over dy and x (a pass of their own read both again: 24.7 us of an H100's
// time for each of a base step's 30, 2026-11-27). Each group sums its rows' terms column by column into its
// own part of the shared memory (a lane its own columns: no atomics), then the block's threads add the
// groups' sums, in group order, to dg and db: one atomicAdd per column and block (a base step's 8192 rows
// make 256 blocks, as many as the pass of its own added from), and a block's sums do not depend on how its
// warps were scheduled.
constexpr int kLayerNormRowsPerGroup = 4;
template <int kLanes> static unsigned layernorm_backward_blocks(int M) {
  constexpr int rows = kGroupRows<kLanes> * kLayerNormRowsPerGroup;  // a block's
  return (M + rows - 1) / rows;
}
// A group's sums, sum dy xhat then sum dy (D floats each), and their stride in floats: 2 D rounded up to 32
// (banks), plus kLanes where a group is less than a warp, so that the groups of a warp, each lane at its own
// columns, hit distinct banks (at D 64, 8 lanes, 2 D apart, the warp's 4 groups shared the same 8 banks).
template <int kLanes> __host__ __device__ constexpr int layernorm_group_floats(int D) { return (2 * D + 31) / 32 * 32 + kLanes % 32; }
// The groups' sums: (kGroupRows, layernorm_group_floats) floats. A warp a row: over the 48 KiB a launch gets
// without asking from D = 769 (the paper's big model, D = 1024, takes 64 KiB); 16 or 8 lanes a row: 17 KiB at
// most.
template <int kLanes, typename K> static size_t layernorm_backward_shared(K kernel, int D) {
  return dynamic_shared_bytes(kernel, (size_t)kGroupRows<kLanes> * layernorm_group_floats<kLanes>(D) * sizeof(float));
}
template <int kLanes, typename Add>
__device__ void layernorm_rows_backward(float* dg, float* db, const float* dout, const float* in, const float* g, const float* mean,
                                        const float* rstd, int M, int D, Add add) {
  const int lane = threadIdx.x % kLanes;
  const int stride = layernorm_group_floats<kLanes>(D);
  float* sums = dynamic_shared<float>();                      // (kGroupRows, stride)
  float* sg = sums + (size_t)threadIdx.x / kLanes * stride;  // this group's sums of dy xhat, then of dy
  float* sb = sg + D;
  for (int d = lane; d < D; d += kLanes) sg[d] = 0, sb[d] = 0;
  for (size_t r = group_row<kLanes>(); r < (size_t)M; r += (size_t)gridDim.x * kGroupRows<kLanes>) {
    const float* x = in + r * D;
    const float* dy = dout + r * D;
    const float mu = mean[r], rs = rstd[r];  // (read once: add's stores might alias them for all nvcc knows)
    float m1 = 0, m2 = 0;
    for (int d = lane; d < D; d += kLanes) {
      const float xhat = (x[d] - mu) * rs;
      m1 += dy[d] * g[d];
      m2 += dy[d] * g[d] * xhat;
      sg[d] += dy[d] * xhat;
      sb[d] += dy[d];
    }
    m1 = warp_reduce<kLanes>(m1, Sum{}) / D;
    m2 = warp_reduce<kLanes>(m2, Sum{}) / D;
    for (int d = lane; d < D; d += kLanes) {
      const float xhat = (x[d] - mu) * rs;
      add(r * D + d, rs * (dy[d] * g[d] - m1 - xhat * m2));
    }
  }
  __syncthreads();  // every group's column sums written
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s_g = 0, s_b = 0;
    for (int w = 0; w < kGroupRows<kLanes>; ++w) s_g += sums[(size_t)w * stride + d], s_b += sums[(size_t)w * stride + D + d];
    atomicAdd(&dg[d], s_g);
    atomicAdd(&db[d], s_b);
  }
}

// din added (add), or written where din was taken zeroed (took_zero_fill); dg and db added.
template <int kLanes>
__global__ void layernorm_backward_kernel(float* din, float* dg, float* db, const float* dout, const float* in, const float* g,
                                          const float* mean, const float* rstd, int M, int D, bool add) {
  layernorm_rows_backward<kLanes>(dg, db, dout, in, g, mean, rstd, M, D, [=](size_t i, float dx) { din[i] = (add ? din[i] : 0.f) + dx; });
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* in, const float* g, const float* b, int M, int D,
                       double eps) {
  if (M == 0) return;
  LAUNCH(layernorm_forward_kernel, warp_row_blocks(M), kWarpRowThreads, 0, out, mean, rstd, in, g, b, M, D, (float)eps);
}
void layernorm_backward(float* din, float* dg, float* db, const float* dout, const float* in, const float* g,
                        const float* mean, const float* rstd, int M, int D) {
  if (M == 0) return;
  const bool add = !took_zero_fill(din, (size_t)M * D);
  row_lanes(D, [&](auto lanes) {
    constexpr int kLanes = decltype(lanes)::value;
    LAUNCH(layernorm_backward_kernel<kLanes>, layernorm_backward_blocks<kLanes>(M), kWarpRowThreads,
           layernorm_backward_shared<kLanes>(layernorm_backward_kernel<kLanes>, D), din, dg, db, dout, in, g, mean, rstd, M, D, add);
  });
}

// x + Dropout(y) of element i: the sub-layer's output dropped and added to its input [§3.1, §5.4]; yb: the
// entry of the sub-layer's output bias still to be added to y (took_bias_add), or null
__device__ float residual_dropout(const float* x, const float* y, const float* yb, DropoutKey drop, float scale, size_t i) {
  return x[i] + (drop.p == 0 || dropout_keeps(drop, i) ? (yb ? y[i] + *yb : y[i]) * scale : 0.f);
}
// y_bias: null, or a bias of D entries to add to each row of y
__global__ void residual_dropout_kernel(float* out, const float* x, const float* y, const float* y_bias, int D, DropoutKey drop,
                                        float scale, size_t n) {
  drop = at_step(drop);
  GRID_STRIDE(i, n) out[i] = residual_dropout(x, y, y_bias ? y_bias + i % D : nullptr, drop, scale, i);
}
// A row to a group of kLanes lanes (row_lanes): the residual sum with its dropout, then LayerNorm of the sum,
// in one pass (the sum is kept: the backward reads it). LayerNorm's arithmetic is layernorm_forward_kernel's
// (a warp a row, the course's task). out16: out's bf16 twin, or null.
template <int kLanes>
__global__ void residual_dropout_layernorm_kernel(float* out, bf16* out16, float* sum, float* mean, float* rstd, const float* x,
                                                  const float* y, const float* y_bias, DropoutKey drop, float scale, const float* g,
                                                  const float* b, int M, int D, float eps) {
  drop = at_step(drop);
  const int r = group_row<kLanes>(), lane = threadIdx.x % kLanes;
  if (r >= M) return;
  const size_t row = (size_t)r * D;
  float s = 0;
  for (int d = lane; d < D; d += kLanes) s += sum[row + d] = residual_dropout(x, y, y_bias ? y_bias + d : nullptr, drop, scale, row + d);
  const float mu = warp_reduce<kLanes>(s, Sum{}) / D;
  float v = 0;
  for (int d = lane; d < D; d += kLanes) v += (sum[row + d] - mu) * (sum[row + d] - mu);  // this lane's own writes
  const float rs = 1.f / sqrtf(warp_reduce<kLanes>(v, Sum{}) / D + eps);
  for (int d = lane; d < D; d += kLanes) {
    const float o = (sum[row + d] - mu) * rs * g[d] + b[d];
    out[row + d] = o;
    if (out16) out16[row + d] = __float2bfloat16(o);
  }
  if (lane == 0) mean[r] = mu, rstd[r] = rs;
}
// The residual's gradient g_i of the sum, added to x's and, through the dropout mask, to y's.
// dy16: dy's bf16 twin, or null. Where add_dx (add_dy) is false, dx (dy) was taken zeroed
// (took_zero_fill): it is written, 0 + its gradient, and not read.
__device__ void residual_dropout_add(float* dx, float* dy, bf16* dy16, float g, DropoutKey drop, float scale, size_t i,
                                     bool add_dx, bool add_dy) {
  dx[i] = (add_dx ? dx[i] : 0.f) + g;
  dy[i] = (add_dy ? dy[i] : 0.f) + (drop.p == 0 || dropout_keeps(drop, i) ? g * scale : 0.f);
  if (dy16) dy16[i] = __float2bfloat16(dy[i]);
}
__global__ void residual_dropout_backward_kernel(float* dx, float* dy, bf16* dy16, const float* dout, DropoutKey drop, float scale,
                                                 size_t n, bool add_dx, bool add_dy) {
  drop = at_step(drop);
  GRID_STRIDE(i, n) residual_dropout_add(dx, dy, dy16, dout[i], drop, scale, i, add_dx, add_dy);
}
// LayerNorm's backward (its input gradient straight into the residual's two paths, and dg and db).
template <int kLanes>
__global__ void residual_dropout_layernorm_backward_kernel(float* dx, float* dy, bf16* dy16, float* dg, float* db, const float* dout,
                                                           const float* sum, const float* g, const float* mean, const float* rstd,
                                                           DropoutKey drop, float scale, int M, int D, bool add_dx, bool add_dy) {
  drop = at_step(drop);
  layernorm_rows_backward<kLanes>(dg, db, dout, sum, g, mean, rstd, M, D, [=](size_t i, float dsum) {
    residual_dropout_add(dx, dy, dy16, dsum, drop, scale, i, add_dx, add_dy);
  });
}
void residual_dropout_forward(float* out, const float* x, const float* y, DropoutKey drop, size_t n) {
  if (n == 0) return;
  int D = 1;
  const float* y_bias = took_bias_add(y, n, &D);
  LAUNCH(residual_dropout_kernel, blocks_for(n), 256, 0, out, x, y, y_bias, D, drop, (float)dropout_scale(drop), n);
}
void residual_dropout_layernorm_forward(float* out, float* sum, float* mean, float* rstd, const float* x, const float* y,
                                        DropoutKey drop, const float* g, const float* b, int M, int D, double eps) {
  if (M == 0) return;
  int cols = 0;
  const float* y_bias = took_bias_add(y, (size_t)M * D, &cols);
  if (y_bias && cols != D) throw std::logic_error("residual_dropout_layernorm_forward: the sub-layer's bias is not a row of D");
  row_lanes(D, [&](auto lanes) {
    constexpr int kLanes = decltype(lanes)::value;
    LAUNCH(residual_dropout_layernorm_kernel<kLanes>, group_row_blocks<kLanes>(M), kWarpRowThreads, 0, out,
           bf16_twin_of(out, (size_t)M * D), sum, mean, rstd, x, y, y_bias, drop, (float)dropout_scale(drop), g, b, M, D, (float)eps);
  });
}
void residual_dropout_backward(float* dx, float* dy, const float* dout, DropoutKey drop, size_t n) {
  if (n == 0) return;
  before_writing(dx, n), before_writing(dy, n);
  const bool add_dx = !took_zero_fill(dx, n), add_dy = !took_zero_fill(dy, n);
  LAUNCH(residual_dropout_backward_kernel, blocks_for(n), 256, 0, dx, dy, bf16_twin_of(dy, n), dout, drop, (float)dropout_scale(drop), n,
         add_dx, add_dy);
}
void residual_dropout_layernorm_backward(float* dx, float* dy, float* dg, float* db, float*, const float* dout, const float* sum,
                                         const float* g, const float* mean, const float* rstd, DropoutKey drop, int M, int D) {
  if (M == 0) return;
  before_writing(dx, (size_t)M * D), before_writing(dy, (size_t)M * D);
  const bool add_dx = !took_zero_fill(dx, (size_t)M * D), add_dy = !took_zero_fill(dy, (size_t)M * D);
  row_lanes(D, [&](auto lanes) {
    constexpr int kLanes = decltype(lanes)::value;
    LAUNCH(residual_dropout_layernorm_backward_kernel<kLanes>, layernorm_backward_blocks<kLanes>(M), kWarpRowThreads,
           layernorm_backward_shared<kLanes>(residual_dropout_layernorm_backward_kernel<kLanes>, D), dx, dy,
           bf16_twin_of(dy, (size_t)M * D), dg, db, dout, sum, g, mean, rstd, drop, (float)dropout_scale(drop), M, D, add_dx, add_dy);
  });
}

}  // namespace gpu
