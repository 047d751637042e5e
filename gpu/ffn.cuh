// gpu/ffn.cuh: [Eq. 2, §3.3] the position-wise feed-forward network (cpu::ffn_forward, cpu::ffn_backward).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- [Eq. 2, §3.3] the feed-forward network ----------------------------------------------------------
// After the first product (hpre = in W1): the bias, the ReLU and the dropout in one pass, not three, the
// bias added as the pass reads hpre (not written back: nothing reads hpre after this pass). In bf16 the
// product writes hpre's rounding alone, into the place of h's bf16 twin (h16: the twin, or scratch), and the
// pass turns each element into h's, in place (hpre null); in fp32 or TF32 it reads hpre and writes h. A unit
// that did not pass (x <= 0, or dropped) is written as -0, one that did as x scale > 0 (its bf16 rounding +0
// at the least), so the backward takes the mask from h's sign bit, or its twin's; a training step's bf16 twin
// is listed alone, and then the pass writes it and not h (h null). The backward's pass likewise scales dh,
// in bf16 the product's rounding of it in place, and sums b1's gradient as it goes.
// Both passes give a thread one column (columns_grid) and take kFfnRowsAtOnce rows at a time, all their
// loads issued before any is used: with one element a thread, a pass waited a load's latency per element
// (the backward two: the mask's, then dh's) and found the column as i % F, a 64-bit remainder; the two
// moved 1.5-1.8 TB/s on the H100, where a copy moves 3.0 (2026-11-27). In bf16 each reads 32 MiB of bf16
// where it read 64 of fp32, and cuBLAS writes 32 MiB less (64 MiB an FFN of the base step, each way): not
// timed on a GPU yet.
constexpr int kFfnRowsAtOnce = 4;
__global__ void bias_relu_dropout_kernel(float* h, bf16* h16, const float* hpre, const float* b, DropoutKey drop, size_t M, int F,
                                         float scale) {
  drop = at_step(drop);
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= F) return;
  const float bias = b[c];
  for (size_t r0 = (size_t)blockIdx.y * kFfnRowsAtOnce; r0 < M; r0 += (size_t)gridDim.y * kFfnRowsAtOnce) {
    float x[kFfnRowsAtOnce];
    for (int k = 0; k < kFfnRowsAtOnce; ++k) {
      const size_t i = (r0 + k) * F + c;
      x[k] = r0 + k >= M ? 0.f : hpre ? hpre[i] : __bfloat162float(h16[i]);
    }
    for (int k = 0; k < kFfnRowsAtOnce && r0 + k < M; ++k) {
      const size_t i = (r0 + k) * F + c;
      const float v = x[k] + bias;
      const float y = v > 0 && (drop.p == 0 || dropout_keeps(drop, i)) ? v * scale : -0.f;
      if (h) h[i] = y;
      if (h16) h16[i] = __float2bfloat16(y);
    }
  }
}
// Whether unit i passed the ReLU and its dropout, from the sign of what the forward wrote (h16 if not null)
__device__ bool relu_passed(const float* h, const bf16* h16, size_t i) { return !signbit(h16 ? __bfloat162float(h16[i]) : h[i]); }
// The gate backward, dh = dh scale where the unit passed, else 0, in place in dh (fp32), or in bf16 in dh16
// (dh null), and db += sum_rows dh in the same pass: a block takes kBiasGradRows rows of 256 columns at a time
// (grid y, strided), a thread a column, and adds each such sum once.
constexpr int kBiasGradRows = 64;
__global__ void relu_backward_kernel(float* dh, bf16* dh16, float* db, const float* h, const bf16* h16, size_t M, int F, float scale) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= F) return;
  for (size_t r0 = (size_t)blockIdx.y * kBiasGradRows; r0 < M; r0 += (size_t)gridDim.y * kBiasGradRows) {
    const size_t r1 = M - r0 < kBiasGradRows ? M : r0 + kBiasGradRows;
    float sum = 0;
    for (size_t r = r0; r < r1; r += kFfnRowsAtOnce) {
      bool passed[kFfnRowsAtOnce];
      float g[kFfnRowsAtOnce];
      for (int k = 0; k < kFfnRowsAtOnce; ++k) {
        const size_t i = (r + k) * F + c;
        passed[k] = r + k < r1 && relu_passed(h, h16, i);
        g[k] = r + k >= r1 ? 0.f : dh ? dh[i] : __bfloat162float(dh16[i]);
      }
      for (int k = 0; k < kFfnRowsAtOnce && r + k < r1; ++k) {
        const size_t i = (r + k) * F + c;
        const float d = passed[k] ? g[k] * scale : 0.f;
        if (dh) dh[i] = d;
        else dh16[i] = __float2bfloat16(d);
        sum += d;
      }
    }
    atomicAdd(&db[c], sum);
  }
}
void ffn_forward(float* out, const FfnActs<float>& a, const float* in, const FfnWeights<float>& w, DropoutKey relu_drop,
                 int M, int D, int F) {
  const size_t n = (size_t)M * F;
  bool alone;
  bf16* h16 = bf16_twin_of(a.h, n, &alone);
  if (!h16) h16 = rounded_in_pass(n, kHidden);
  // hpre = in W1, then + b1, ReLU, dropout; in bf16 hpre's rounding, into h16
  gemm_operands(false, false, M, F, D, operand(in, (size_t)M * D, kLeft), D, operand(w.w1, (size_t)D * F, kRight), F,
                h16 ? Result(h16) : Result(a.hpre), F, false);
  LAUNCH(bias_relu_dropout_kernel, columns_grid(M, F, kFfnRowsAtOnce), 256, 0, alone ? nullptr : a.h, h16, h16 ? nullptr : a.hpre, w.b1,
         relu_drop, (size_t)M, F, (float)dropout_scale(relu_drop));
  project(out, Operand{a.h, h16}, w.w2, M, F, D);
  defer_bias_add(out, w.b2, M, D);  // + b2: the residual connection's pass adds it (took_bias_add), or a pass of its own
}

void ffn_backward(float* din, const FfnWeights<float>& dw, float* dh, const float* dout, const FfnActs<float>& a,
                  const float* in, const FfnWeights<float>& w, DropoutKey relu_drop, int M, int D, int F) {
  const size_t n = (size_t)M * F;
  const bool add_din = !took_zero_fill(din, (size_t)M * D);  // else written
  bf16* dh16 = rounded_in_pass(n, kHidden);  // in bf16 all that is written of dh
  if (n && !dh16 && !dh) throw std::logic_error("ffn_backward: an fp32 or TF32 backward with no fp32 dh (the arena carved for bf16)");
  linear_backward(dh16 ? Result(dh16) : Result(dh), false, dw.w2, dw.b2, operand(dout, (size_t)M * D, kLeft), a.h, w.w2, M, F, D);
  float* dh32 = dh16 ? nullptr : dh;  // fp32 in and out, or nothing in bf16
  LAUNCH(relu_backward_kernel, columns_grid(M, F, kBiasGradRows), 256, 0, dh32, dh16, dw.b1, a.h, bf16_twin_of(a.h, n), (size_t)M, F,
         (float)dropout_scale(relu_drop));
  linear_backward(din, add_din, dw.w1, nullptr, Operand{dh, dh16}, in, w.w1, M, D, F);  // b1's gradient: the gate's pass
}

}  // namespace gpu
