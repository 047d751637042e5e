// gpu/embedding.cuh: §3.4 the embeddings (with §3.5's positions) and the pre-softmax projection
// through the shared matrix (cpu::embedding_forward/backward, cpu::output_projection_forward/backward).
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §3.4, §3.5 embeddings -------------------------------------------------------------------------
// out16: out's bf16 twin, or null
__global__ void embedding_forward_kernel(float* out, bf16* out16, const int* ids, const float* emb, int L, int D, int first_pos,
                                         size_t n) {
  const float sqrt_d = sqrtf((float)D);
  GRID_STRIDE(i, n) {
    const size_t r = i / D;
    const int d = (int)(i % D), t = first_pos + (int)(r % L);
    out[i] = emb[(size_t)ids[r] * D + d] * sqrt_d + (float)positional_encoding(t, d, D);
    if (out16) out16[i] = __float2bfloat16(out[i]);
  }
}
__global__ void embedding_backward_kernel(float* demb, const float* dout, const int* ids, int D, size_t n) {
  const float sqrt_d = sqrtf((float)D);
  GRID_STRIDE(i, n) atomicAdd(&demb[(size_t)ids[i / D] * D + i % D], dout[i] * sqrt_d);  // a token may repeat
}
void embedding_forward(float* out, const int* ids, const float* emb, int B, int L, int D, int first_pos) {
  const size_t n = (size_t)B * L * D;
  if (n == 0) return;
  LAUNCH(embedding_forward_kernel, blocks_for(n), 256, 0, out, bf16_twin_of(out, n), ids, emb, L, D, first_pos, n);
}
void embedding_backward(float* demb, const float* dout, const int* ids, int B, int L, int D) {
  const size_t n = (size_t)B * L * D;
  wait_for_weight_grads(demb, sizeof(float));  // the loss's product, which adds to all of demb, from its first row
  LAUNCH(embedding_backward_kernel, blocks_for(n), 256, 0, demb, dout, ids, D, n);
}

// ---- §3.4 the pre-softmax projection (the shared embedding) ------------------------------------------
void output_projection_forward(float* logits, const float* y, const float* emb, int M, int D, int V) {
  // in a bf16 model's pass the logits' twin alone (product_result): only the loss's two passes read them
  gemm_operands(false, true, M, V, D, operand(y, (size_t)M * D, kLeft), D, operand(emb, (size_t)V * D, kRight), D,
                product_result(logits, (size_t)M * V), V, false);
}
void output_projection_backward(float* dy, float* demb, const float* dlogits, const float* y, const float* emb, int M, int D,
                                int V) {
  // forward was: logits = y @ emb^T; so now: dy += dlogits @ emb, demb += dlogits^T @ y
  const bool add_dy = !took_zero_fill(dy, (size_t)M * D);  // else written
  const Operand d = operand(dlogits, (size_t)M * V, kLeft);  // rounded once (bf16) for both products
  gemm_operands(false, false, M, D, V, d, V, operand(emb, (size_t)V * D, kRight), D, dy, D, add_dy);
  weight_gradient_product(true, false, V, D, M, d, V, operand(y, (size_t)M * D, kRight), D, demb, D);
}

}  // namespace gpu
