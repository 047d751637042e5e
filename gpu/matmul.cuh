// gpu/matmul.cuh: the matrix products on cuBLAS (cpu::gemm, cpu::linear_forward/backward),
// in fp32, TF32 or bf16.
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- matrix products: cuBLAS is column-major, so C^T = op(B)^T op(A)^T is computed ------------------
// Products of the same shape in one call (strided-batched): product i reads A + i a, B + i b and writes
// C + i c (a stride of 0: one operand that every product reads), in elements of the operands as read.
struct Batch {
  int count = 1;
  long long a = 0, b = 0, c = 0;
  // the elements that the batch's operands, each of `one` elements and `stride` after the one before, span
  size_t extent(long long stride, size_t one) const { return (size_t)(count - 1) * stride + one; }
};
// Where a product's result goes: its fp32 elements, or only their bf16 rounding (h), for a result that only a
// kernel of ours reads, as bf16 (the FFN's hidden units, forward and backward; attention's q, k, v and dctx;
// the logits):
// cuBLAS's epilogue rounds each element from its fp32 sum (a split K's partial sums, if cuBLAS chooses one,
// maybe too) and writes half the bytes, which that kernel reads back.
struct Result {
  float* f = nullptr;
  bf16* h = nullptr;
  Result(float* f) : f(f) {}
  Result(bf16* h) : h(h) {}
};
// Both operands in bf16: cublasGemmEx on the tensor cores, fp32 sums; otherwise SGEMM (fp32, or TF32 math).
// On the main stream, unless a handle is given (the weight gradients' stream's: weight_gradient_product).
static void gemm_operands(bool ta, bool tb, int M, int N, int K, Operand A, int lda, Operand B, int ldb, Result C, int ldc,
                          bool accumulate, Batch batch = {}, cublasHandle_t handle = nullptr) {
  if (M == 0 || N == 0) return;
  if (C.h && (!A.h || !B.h || accumulate)) throw std::logic_error("a product rounded to bf16 takes bf16 operands and writes its result");
  launch_deferred_fills();  // cuBLAS's kernels are not LAUNCH's
  if (!handle) {
    handle = blas();
    wait_for_weight_grads(C.h ? (const void*)C.h : C.f, batch.extent(batch.c, extent(M, N, ldc)) * (C.h ? sizeof(bf16) : sizeof(float)));
  }
  const float one = 1, beta = accumulate ? 1.f : 0.f;
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (A.h && B.h && batch.count == 1)
    CUBLAS_CHECK(cublasGemmEx(handle, opb, opa, N, M, K, &one, B.h, CUDA_R_16BF, ldb, A.h, CUDA_R_16BF, lda, &beta,
                              C.h ? (void*)C.h : C.f, C.h ? CUDA_R_16BF : CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else if (A.h && B.h)
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, opb, opa, N, M, K, &one, B.h, CUDA_R_16BF, ldb, batch.b, A.h, CUDA_R_16BF, lda,
                                            batch.a, &beta, C.h ? (void*)C.h : C.f, C.h ? CUDA_R_16BF : CUDA_R_32F, ldc, batch.c,
                                            batch.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  else if (batch.count == 1)
    CUBLAS_CHECK(cublasSgemm(handle, opb, opa, N, M, K, &one, B.f, ldb, A.f, lda, &beta, C.f, ldc));
  else
    CUBLAS_CHECK(cublasSgemmStridedBatched(handle, opb, opa, N, M, K, &one, B.f, ldb, batch.b, A.f, lda, batch.a, &beta, C.f, ldc,
                                           batch.c, batch.count));
}
// dW += op(A) op(B), a weight's gradient, on the weight gradients' stream: forked from the main stream
// here; the spans of its operands and result noted for wait_for_weight_grads.
static void weight_gradient_product(bool ta, bool tb, int M, int N, int K, Operand A, int lda, Operand B, int ldb, float* dw, int ldc,
                                    Batch batch = {}) {
  if (M == 0 || N == 0) return;
  launch_deferred_fills();  // on the main stream, before the fork
  WeightGradStream& w = weight_grad_stream();
  CUDA_CHECK(cudaEventRecord(w.fork, stream()));
  CUDA_CHECK(cudaStreamWaitEvent(w.stream, w.fork, 0));
  gemm_operands(ta, tb, M, N, K, A, lda, B, ldb, dw, ldc, true, batch, w.blas);
  const cudaEvent_t done = w.done[w.products++ % w.done.size()];
  CUDA_CHECK(cudaEventRecord(done, w.stream));
  const auto span = [&](const void* p, size_t elements, long long stride, size_t bytes) {
    weight_grad_spans().push_back({(const char*)p, batch.extent(stride, elements) * bytes, done});
  };
  span(A.h ? (const void*)A.h : A.f, ta ? extent(K, M, lda) : extent(M, K, lda), batch.a, A.h ? sizeof(bf16) : sizeof(float));
  span(B.h ? (const void*)B.h : B.f, tb ? extent(N, K, ldb) : extent(K, N, ldb), batch.b, B.h ? sizeof(bf16) : sizeof(float));
  span(dw, extent(M, N, ldc), batch.c, sizeof(float));
}
void gemm(bool ta, bool tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb, float* C, int ldc,
          bool accumulate) {
  if (M == 0 || N == 0) return;
  gemm_operands(ta, tb, M, N, K, operand(A, ta ? extent(K, M, lda) : extent(M, K, lda), kLeft), lda,
                operand(B, tb ? extent(N, K, ldb) : extent(K, N, ldb), kRight), ldb, C, ldc, accumulate);
}
// Where a product writes the n elements at p: only their bf16 twin where a bf16 model's pass lists one alone
// (attention's q, k and v, which only the attention kernels read; the logits, which only the loss's passes
// read), else p's fp32 elements.
static Result product_result(float* p, size_t n) {
  bool alone;
  bf16* twin = bf16_twin_of(p, n, &alone);
  if (twin && !alone) throw std::logic_error("a product's output has a bf16 twin beside its fp32 values: cuBLAS writes only one of them");
  return twin ? Result(twin) : Result(p);
}
// out = in @ w for an input already as the products read it (an input several products share)
static void project(Result out, Operand in, const float* w, int M, int I, int O) {
  gemm_operands(false, false, M, O, I, in, I, operand(w, (size_t)I * O, kRight), O, out, O, false);
}
// Its backward: din (+)= dout @ w^T (added, or written when din holds nothing yet: no zeroing launch; a bf16
// Result is written), dw += in^T @ dout, with dout as both products read it (in bf16 rounded once, into kLeft;
// in must not be there).
static void project_backward(Result din, bool add_din, float* dw, Operand d, Operand in, const float* w, int M, int I, int O) {
  if (din.f || din.h) gemm_operands(false, true, M, I, O, d, O, operand(w, (size_t)I * O, kRight), O, din, I, add_din);
  if (dw) weight_gradient_product(true, false, I, O, M, in, I, d, O, dw, O);
}
// Projections of one input by weights that lie one after another (the parameter layout keeps an attention's
// wq, wk and wv so), products of one shape: one strided-batched call, not one each.
//
// The common distance of buffers that lie evenly apart in ascending order, each n elements or more from the
// next (none overlaps), else 0.
template <typename T> static ptrdiff_t even_stride(std::initializer_list<const T*> p, size_t n) {
  const ptrdiff_t s = p.size() < 2 ? 0 : p.begin()[1] - p.begin()[0];
  for (size_t i = 1; i < p.size(); ++i)
    if (p.begin()[i] - p.begin()[i - 1] != s) return 0;
  return s >= (ptrdiff_t)n && n > 0 ? s : 0;
}
// Whether weights of n elements each lie one right after another (then they are one operand: in bf16 their
// copy's elements, or rounded at once, with nothing read between them)
static bool weights_adjacent(std::initializer_list<const float*> w, size_t n) { return even_stride(w, n) == (ptrdiff_t)n; }
// out_i = in @ w_i for the count adjacent weights w_i = w + i I O (I x O each), out_i = out + i out_stride (in out's
// elements: fp32 or bf16)
static void project_batched(Result out, ptrdiff_t out_stride, Operand in, const float* w, int count, int M, int I, int O) {
  const Operand ws = operand(w, (size_t)count * I * O, kRight);
  gemm_operands(false, false, M, O, I, in, I, ws, O, out, O, false, Batch{count, 0, (long long)I * O, out_stride});
}
// Their weights' gradients, dw_i += in^T @ d_i, dw_i = dw + i dw_stride, d_i = d + i d_stride (in the
// elements the product reads: d's bf16 ones where it has them)
static void weight_grads_batched(float* dw, ptrdiff_t dw_stride, Operand in, Operand d, ptrdiff_t d_stride, int count, int M, int I,
                                 int O) {
  weight_gradient_product(true, false, I, O, M, in, I, d, O, dw, O, Batch{count, 0, d_stride, dw_stride});
}

// The grid of a pass over a row-major (M, cols) matrix that gives a thread a column (the grid's x, blocks of
// 256: no division finds a column) and a block rows_per_block rows at a time (the grid's y, strided).
static dim3 columns_grid(size_t M, int cols, int rows_per_block) {
  return dim3(std::max((cols + 255) / 256, 1), (unsigned)std::clamp<size_t>((M + rows_per_block - 1) / rows_per_block, 1, 65535));
}
__global__ void add_bias_kernel(float* out, const float* b, size_t M, int O) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= O) return;
  const float bias = b[c];
  for (size_t r = blockIdx.y; r < M; r += gridDim.y) out[r * O + c] += bias;
}
static void add_bias(float* out, const float* b, size_t M, int O) { LAUNCH(add_bias_kernel, columns_grid(M, O, 1), 256, 0, out, b, M, O); }
// A device vector of at least n ones, grown when a longer one is needed (cudaFree waits for the work
// that still reads the old one): a sum over rows is the product ones^T @ X, which cuBLAS spreads over
// the whole GPU.
static const float* ones(size_t n) {
  static float* p = nullptr;
  static size_t size = 0;
  if (n > size) {
    if (p) release(p);
    p = alloc(n), size = n;
    fill(p, 1.f, n);
    ++graph_epoch();
  }
  return p;
}

// out = in @ w + b (b may be null), the input as the product reads it
static void linear_forward(float* out, Operand in, const float* w, const float* b, int M, int I, int O) {
  project(out, in, w, M, I, O);
  if (b) add_bias(out, b, M, O);
}
void linear_forward(float* out, const float* in, const float* w, const float* b, int M, int I, int O) {
  linear_forward(out, operand(in, (size_t)M * I, kLeft), w, b, M, I, O);
}

// forward was: out = in @ w + b; so now: din (+)= dout @ w^T (add_din as project_backward's), dw += in^T @ dout,
// db += sum_rows dout (dout as project_backward takes it)
static void linear_backward(Result din, bool add_din, float* dw, float* db, Operand dout, const float* in, const float* w, int M,
                            int I, int O) {
  project_backward(din, add_din, dw, dout, dw ? operand(in, (size_t)M * I, kShared) : Operand{in, nullptr}, w, M, I, O);
  if (db && M > 0) weight_gradient_product(false, false, 1, O, M, {ones(M), nullptr}, M, {dout.f, nullptr}, O, db, O);  // ones^T @ dout, fp32
}
void linear_backward(float* din, float* dw, float* db, const float* dout, const float* in, const float* w, int M, int I, int O) {
  linear_backward(din, true, dw, db, operand(dout, (size_t)M * O, kLeft), in, w, M, I, O);
}

}  // namespace gpu
