// gpu/common.cuh: what every kernel family uses: the CUDA runtime or the emulated GPU, launches and
// their checks, the stream, cuBLAS handles, the weight gradients' stream, deferred passes, reductions.
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

// Kernels and cuBLAS for every operation of namespace cpu, same names and argument order, float on device
// pointers; test/parity_gpu.cpp holds each one to its CPU definition. Compiled by nvcc, or by g++ against
// cuda_emulator.h (TRANSFORMER_EMULATED_GPU), which runs the same kernels on the CPU for the tests: the
// includes and the launch below are the only lines that differ between the two.

#ifdef TRANSFORMER_EMULATED_GPU
#include "../test/cuda_emulator.h"
constexpr bool kEmulatedGpu = true;
#define KERNEL_LAUNCH(kernel, grid, block, shared, ...) ::emu::launch(#kernel, kernel, grid, block, shared, gpu::stream(), __VA_ARGS__)
#else
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <mma.h>
constexpr bool kEmulatedGpu = false;
#define KERNEL_LAUNCH(kernel, grid, block, shared, ...) kernel<<<grid, block, shared, gpu::stream()>>>(__VA_ARGS__)
// The block's dynamic shared memory (the launch's third argument), as an array of T; 32-byte aligned, as the
// tensor cores' operands (wmma) must be.
template <typename T> __device__ T* dynamic_shared() {
  extern __shared__ __align__(32) unsigned char dynamic_shared_bytes[];
  return (T*)dynamic_shared_bytes;
}
#endif
// Every kernel is launched through LAUNCH, which first launches the passes still deferred (zero fills, bias
// additions: gpu::launch_deferred_fills) and checks the launch; on the one stream of the GPU path (gpu::stream), so
// that a training step can be captured as a CUDA graph.
#define LAUNCH(kernel, grid, block, shared, ...) \
  (launch_deferred_fills(), KERNEL_LAUNCH(kernel, grid, block, shared, __VA_ARGS__), check_launch())

#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) cublas_check((call), #call, __FILE__, __LINE__)

static void cuda_check(cudaError_t e, const char* what, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::string msg = std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) msg += " (out of GPU memory: lower --batch-tokens)";
  throw std::runtime_error(msg);
}

static void cublas_check(cublasStatus_t s, const char* what, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::string msg = std::string(file) + ":" + std::to_string(line) + ": " + what + ": " + cublasGetStatusString(s);
  if (s == CUBLAS_STATUS_ALLOC_FAILED) msg += " (out of GPU memory: lower --batch-tokens)";
  throw std::runtime_error(msg);
}

bool gpu_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
bool gpu_emulated() { return kEmulatedGpu; }
std::string gpu_name() {
  cudaDeviceProp prop;
  return gpu_available() && cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "";
}

namespace gpu {

template <typename T> static T* alloc_of(size_t n) {
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return (T*)p;
}

// The stream that every kernel, copy and product of the GPU path is queued on: not the legacy default
// stream, which cannot be captured. Created blocking, so what runs on the legacy stream (the synchronous
// copies of upload and download, data parallelism's ncclAllReduce) waits for it, and it for them.
static cudaStream_t stream() {
  static cudaStream_t s = [] {
    cudaStream_t created;
    CUDA_CHECK(cudaStreamCreate(&created));
    return created;
  }();
  return s;
}

// The matrix products' precision (set_precision): fp32 until a program asks for another.
static Precision& products() {
  static Precision p = Precision::fp32;
  return p;
}
// cuBLAS's math mode for a precision. TF32: SGEMM on the tensor cores. bf16: the default math, which leaves
// cuBLAS free to choose tensor-core kernels for cublasGemmEx (pedantic math may not); an SGEMM there (a bias
// gradient) is still fp32, as TF32 must be asked for. fp32: pedantic, the reference.
static cublasMath_t math_mode(Precision p) {
  return p == Precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : p == Precision::bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH;
}
// The cuBLAS handles made so far (set_precision sets their math mode).
static std::vector<cublasHandle_t>& blas_handles() {
  static std::vector<cublasHandle_t> v;
  return v;
}
// A cuBLAS handle whose products go on the stream s, with a workspace of its own: cuBLAS then allocates
// nothing while a step is captured (32 MiB, what cuBLAS's documentation asks for on Hopper; set after the
// stream, which resets it); and two handles' products may run at once.
static cublasHandle_t blas_on(cudaStream_t s) {
  cublasHandle_t handle;
  CUBLAS_CHECK(cublasCreate(&handle));
  CUBLAS_CHECK(cublasSetMathMode(handle, math_mode(products())));
  CUBLAS_CHECK(cublasSetStream(handle, s));
  constexpr size_t kWorkspaceBytes = 32u << 20;
  CUBLAS_CHECK(cublasSetWorkspace(handle, alloc_of<unsigned char>(kWorkspaceBytes), kWorkspaceBytes));
  blas_handles().push_back(handle);
  return handle;
}
static cublasHandle_t blas() {
  static cublasHandle_t h = blas_on(stream());
  return h;
}

// ---- the weight gradients' products, on a stream of their own -------------------------------------------
// A weight's gradient, dW += in^T @ d (a bias's, ones^T @ d), is read by nothing until the update, and the
// backward's next ops (the input's gradient d @ W^T, then the sub-layers below) do not wait for it. So these
// products go on a second stream (weight_gradient_product), where a GPU runs them beside the backward's
// chain, in the SMs and the gaps that its ops leave idle; a captured step keeps the two branches in its
// graph. Each product is forked from the main stream (it waits for the main stream's work so far, which
// produced its operands); an op of the main stream that is to write bytes that such a product reads or
// writes waits for that product first (wait_for_weight_grads: a scratch buffer reused by the next
// sub-layer, the sub-layer gradient d_sub, the embedding's gradient that the loss's product also adds to),
// and the backward's end waits for all of them (join_weight_grads). The emulated GPU runs each product as
// late as these waits let it, and fails the product if its operands changed between its issue and its run.
struct WeightGradStream {
  cudaStream_t stream;
  cublasHandle_t blas;
  cudaEvent_t fork;                    // recorded on the main stream before each product
  std::array<cudaEvent_t, 256> done;  // recorded after each product, in turn (a wait on one recorded again
                                       // since waits for more, never too little: the base model's step has
                                       // 79 products)
  size_t products = 0;               // products issued so far
};
static WeightGradStream& weight_grad_stream() {
  static WeightGradStream w = [] {
    WeightGradStream n;
    CUDA_CHECK(cudaStreamCreate(&n.stream));  // blocking, as the main stream
    n.blas = blas_on(n.stream);
    CUDA_CHECK(cudaEventCreateWithFlags(&n.fork, cudaEventDisableTiming));
    for (cudaEvent_t& e : n.done) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return n;
  }();
  return w;
}
// The spans of device memory that the products not yet waited for read or write, each with the event
// recorded after its product.
struct WeightGradSpan {
  const char* p;
  size_t bytes;
  cudaEvent_t done;
};
static std::vector<WeightGradSpan>& weight_grad_spans() {
  static std::vector<WeightGradSpan> v;
  return v;
}
// Before the main stream writes the bytes at p: it waits for the products that read or write them.
static void wait_for_weight_grads(const void* p, size_t bytes) {
  std::vector<WeightGradSpan>& v = weight_grad_spans();
  const char* b = static_cast<const char*>(p);
  v.erase(std::remove_if(v.begin(), v.end(),
                         [&](const WeightGradSpan& s) {
                           if (!bytes || !s.bytes || b >= s.p + s.bytes || s.p >= b + bytes) return false;
                           CUDA_CHECK(cudaStreamWaitEvent(stream(), s.done, 0));
                           return true;
                         }),
          v.end());
}
// After a synchronisation (or a synchronous copy, which waits for every stream), every product has run.
static void weight_grads_done() { weight_grad_spans().clear(); }
// The main stream waits for every product issued so far (the backward's end; a captured step must join its
// branch before its capture ends).
static void join_weight_grads() {
  std::vector<WeightGradSpan>& v = weight_grad_spans();
  if (v.empty()) return;
  v.clear();
  const WeightGradStream& w = weight_grad_stream();
  CUDA_CHECK(cudaStreamWaitEvent(stream(), w.done[(w.products - 1) % w.done.size()], 0));
}
// Whether the stream is being captured into a CUDA graph (GpuModel's training step).
static bool capturing() {
  cudaStreamCaptureStatus status;
  CUDA_CHECK(cudaStreamIsCapturing(stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}
// Counts the changes that leave a captured graph stale: scratch buffers reallocated, the precision set.
static size_t& graph_epoch() {
  static size_t epoch = 0;
  return epoch;
}
// The work as a CUDA graph: captured from the stream, instantiated.
template <typename F> static cudaGraphExec_t capture(F work) {
  CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeGlobal));
  cudaGraph_t graph = nullptr;
  try {
    work();
  } catch (...) {
    cudaStreamEndCapture(stream(), &graph);  // ends the capture; the error is work's
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // (the capture's own, left for the next check of a launch, would fail it)
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(e);
  return exec;
}
float* alloc(size_t n) { return alloc_of<float>(n); }
// Device doubles that the reductions write into (the loss and its token count; the gradient's squared
// norm, a part per block), allocated once: no allocation, an implicit synchronisation, inside a training step.
constexpr unsigned kNormBlocks = 1024;
enum Scalar { kLossSum, kTokenCount, kSquareParts, kScalars = kSquareParts + kNormBlocks };
static double* scalar(Scalar which) {
  static double* slots = alloc_of<double>(kScalars);
  return slots + which;
}
int* alloc_ints(size_t n) { return alloc_of<int>(n); }
uint8_t* alloc_bytes(size_t n) { return alloc_of<uint8_t>(n); }
void release(void* p) { CUDA_CHECK(cudaFree(p)); }
// copies between host and device: after the zero fills still deferred (launch_deferred_fills)
static void copy_bytes(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  launch_deferred_fills();
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  weight_grads_done();
}
void upload(float* dst, const float* src, size_t n) { copy_bytes(dst, src, n * sizeof(float), cudaMemcpyHostToDevice); }
void upload(int* dst, const int* src, size_t n) { copy_bytes(dst, src, n * sizeof(int), cudaMemcpyHostToDevice); }
void upload(uint8_t* dst, const uint8_t* src, size_t n) { copy_bytes(dst, src, n, cudaMemcpyHostToDevice); }
void download(float* dst, const float* src, size_t n) { copy_bytes(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost); }
void synchronize() {
  CUDA_CHECK(cudaDeviceSynchronize());
  weight_grads_done();
}

// Blocks for a grid-stride loop over n elements: at least one (a grid of zero blocks fails to launch).
static unsigned blocks_for(size_t n, unsigned threads = 256) {
  return (unsigned)std::clamp<size_t>((n + threads - 1) / threads, 1, 65535u * 16);
}
#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
static void check_launch() { CUDA_CHECK(cudaGetLastError()); }

__global__ void fill_kernel(float* p, float value, size_t n) { GRID_STRIDE(i, n) p[i] = value; }
void fill(float* p, float value, size_t n) {
  if (n == 0) return;
  wait_for_weight_grads(p, n * sizeof(float));
  LAUNCH(fill_kernel, blocks_for(n), 256, 0, p, value, n);
}

// ---- passes that the next op makes unnecessary: zero fills, bias additions ------------------------------
// The backward zeroes a gradient, then an op adds into it (GpuOps::zero, then e.g. the residual's
// backward). On the GPU that fill waits (defer_zero_fill): an op whose first act is to add into exactly
// those floats takes them (took_zero_fill) and writes 0 + x where it would add x, the same bits, with no
// pass of the fill and no read of its zeros. Likewise the FFN's output bias (defer_bias_add): the residual
// connection, the one op that reads the FFN's output, takes it (took_bias_add) and adds it as it reads the
// product, the same bits as a pass of its own (read and written: 32 MiB an FFN of the base step) and one
// launch fewer. Any other GPU work first launches the passes still waiting (launch_deferred_fills: from
// LAUNCH, before a product, a copy), so it reads what it would have read.
struct DeferredPass {
  float* p;
  size_t n;
  const float* bias;  // null: a zero fill; else p is (n / cols, cols) and gets the bias added to each row
  int cols;
};
static std::vector<DeferredPass>& deferred_fills() {
  static std::vector<DeferredPass> v;
  return v;
}
void defer_zero_fill(float* p, size_t n) {
  if (n) deferred_fills().push_back({p, n, nullptr, 0});
}
static void defer_bias_add(float* p, const float* bias, int rows, int cols) {
  if (bias && rows > 0 && cols > 0) deferred_fills().push_back({p, (size_t)rows * cols, bias, cols});  // (no bias: nothing to add)
}
// The pass waiting over exactly the n floats at p, a zero fill or (add) a bias addition, taken off the list
static bool took_deferred(const float* p, size_t n, bool add, DeferredPass* taken) {
  std::vector<DeferredPass>& v = deferred_fills();
  const auto it = std::find_if(v.begin(), v.end(), [&](const DeferredPass& f) { return f.p == p && f.n == n && (f.bias != nullptr) == add; });
  if (it == v.end()) return false;
  *taken = *it;
  v.erase(it);
  return true;
}
static bool took_zero_fill(const float* p, size_t n) {
  DeferredPass f;
  return took_deferred(p, n, false, &f);
}
// The bias waiting to be added to each row of the n floats at p, taken off the list (*cols: its length); else null
static const float* took_bias_add(const float* p, size_t n, int* cols) {
  DeferredPass f;
  if (!took_deferred(p, n, true, &f)) return nullptr;
  *cols = f.cols;
  return f.bias;
}
static void add_bias(float* out, const float* b, size_t M, int O);
void launch_deferred_fills() {
  std::vector<DeferredPass> v;
  v.swap(deferred_fills());  // emptied first: the passes' own launches find none waiting
  for (const DeferredPass& f : v)
    if (f.bias) add_bias(f.p, f.bias, f.n / f.cols, f.cols);
    else fill(f.p, 0, f.n);
}
void drop_deferred_fills() { deferred_fills().clear(); }

// Reductions by op (Sum, Max): over the 32 lanes of a warp, every lane getting the result, with no barrier;
// and over a block's threads, a whole number of warps up to kRowThreads, every thread getting the result.
// The block's: each warp reduces its lanes, then each thread combines the warps' results, read from
// `shared` (kRowWarps elements) in warp order; two barriers, whatever the block's size.
struct Sum {
  template <typename T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
// warp_reduce<kLanes>: over each group of kLanes adjacent lanes (a power of 2 up to 32), each group getting its
// own result; the shuffles name the caller's group alone, so a group may reduce while another has returned.
template <int kLanes = 32, typename T, typename Op> __device__ T warp_reduce(T x, Op op) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "groups of a power of 2 lanes");
  const unsigned group = kLanes == 32 ? 0xffffffffu : ((1u << kLanes) - 1) << (threadIdx.x % 32 / kLanes * kLanes);
  for (int o = kLanes / 2; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(group, x, o));
  return x;
}
template <typename T, typename Op> __device__ T block_reduce(T x, T* shared, Op op) {
  x = warp_reduce(x, op);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = x;
  __syncthreads();
  T r = shared[0];
  for (unsigned w = 1; w < blockDim.x / 32; ++w) r = op(r, shared[w]);
  __syncthreads();  // shared is free again for the next reduction
  return r;
}
template <typename T> __device__ T warp_sum(T x) { return warp_reduce(x, Sum{}); }
__device__ float warp_max(float x) { return warp_reduce(x, Max{}); }
template <typename T> __device__ T block_sum(T x, T* shared) { return block_reduce(x, shared, Sum{}); }
__device__ float block_max(float x, float* shared) { return block_reduce(x, shared, Max{}); }
constexpr int kRowThreads = 256;            // threads of a block_sum's block at most
constexpr int kRowWarps = kRowThreads / 32;  // the elements of its shared array
// The one-warp-per-row kernels (LayerNorm, the loss; the fused residual + LayerNorm ones give a small row
// fewer lanes, row_lanes below): a row's lanes stride over it and its sums are warp_reduce()s, so no thread
// waits at a block barrier. They serve the training step's rows, thousands of
// them (a batch's tokens), enough warps to fill a GPU; decoding's few rows take a block each (block_sum).
constexpr int kWarpRows = 8;                      // rows (warps) of a block
constexpr int kWarpRowThreads = kWarpRows * 32;  // its threads
// The fused residual + LayerNorm kernels give a row kLanes adjacent lanes, not always a warp: 32 where D > 128
// (the paper's 512: 16 elements a lane), 16 where D > 64, else 8 (the tiny model's 64: 8 elements a lane,
// where a warp's lanes held 2 and 24 of a warp's 32 lanes idled in each sum): a warp takes 32 / kLanes rows,
// whose sums are reduced together (3 shuffles each at 8 lanes, where a warp per row took 5 for each row).
// row_lanes(D, f) calls f(std::integral_constant<int, kLanes>) with the row's.
template <typename F> static void row_lanes(int D, F f) {
  if (D > 128) f(std::integral_constant<int, 32>{});
  else if (D > 64) f(std::integral_constant<int, 16>{});
  else f(std::integral_constant<int, 8>{});
}
template <int kLanes> constexpr int kGroupRows = kWarpRowThreads / kLanes;  // rows of a block
template <int kLanes> static unsigned group_row_blocks(int M) { return (M + kGroupRows<kLanes> - 1) / kGroupRows<kLanes>; }
// The row of this thread's group of kLanes lanes; M or more for a last block's spare groups (which return as
// a whole).
template <int kLanes> __device__ int group_row() { return blockIdx.x * kGroupRows<kLanes> + threadIdx.x / kLanes; }
// A warp a row: the blocks for M rows, and the row of this thread's warp.
static unsigned warp_row_blocks(int M) { return group_row_blocks<32>(M); }
__device__ int warp_row() { return group_row<32>(); }
// Threads for a row of n elements: a power of 2 from 32 to kRowThreads, no more than the row needs (fewer
// idle threads resumed at each of block_sum's barriers; the idle ones add zeros).
static unsigned row_threads(int n) {
  unsigned t = 32;
  while ((int)t < n && t < (unsigned)kRowThreads) t *= 2;
  return t;
}

}  // namespace gpu
