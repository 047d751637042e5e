// cuda_emulator: the emulated GPU (cuda_emulator.h) against what CUDA defines, and its bug finders against
// kernels they must reject. Built only against the emulator (build/emu, with ASan and UBSan).
//   - the built-in variables, static and dynamic shared memory, atomics, grid-stride loops over 3-D grids;
//   - the warp collectives: a two-stage block reduction by __shfl_xor_sync, __shfl_down_sync, __shfl_sync
//     with a width, __ballot_sync, __syncwarp, each against its definition;
//   - thread orders: inorder, reverse and shuffle start a block's threads in those orders, and a race on
//     shared memory (a missing __syncthreads) gives different results under two of them; a warp whose
//     __syncwarp completes runs ahead of the other warps, so a race between warps shows under each order;
//   - asynchronous copies (__pipeline_memcpy_async): none done before the wait that covers its group, the
//     zero-filled bytes zeros;
//   - tensor cores (wmma, TF32 m16n16k8): D = A B + C against its definition in double on operands rounded by
//     __float_to_tf32 (to nearest, ties away), B row- and column-major, C loaded and D stored both ways; which
//     lane holds which element;
//   - findings: a __syncthreads only some threads reach, barriers at different lines, a collective whose
//     mask names a returned lane or leaves the caller out, a read from a lane outside the mask, a deadlock,
//     a thread that returns with asynchronous copies not waited for, a misaligned asynchronous copy, wmma
//     operations with a misaligned pointer, a bad ldm, lanes that pass different pointers, a lane that returned,
//     a kernel that never ends (in a child process, CUDA_EMULATOR_TIMEOUT), a write past a device
//     allocation (in a child process: AddressSanitizer); each names the kernel and is sticky until
//     cudaDeviceReset;
//   - launches CUDA refuses: 1025 threads, a zero grid, dynamic shared memory over 48 KiB unless raised;
//   - the host API: NaN-filled allocations, copies that leave an allocation, cudaFree of a foreign pointer;
//   - cuBLAS: cublasSgemm and cublasSgemmStridedBatched against a column-major definition in double (and
//     cublasSgemm against the row-major cpu::gemm<double> the CPU path uses, on the transposed problem), every
//     transpose, leading dimensions larger than the matrix, alpha and beta (beta 0 ignores a NaN C), TF32
//     rounding, and the argument checks cuBLAS documents;
//   - bf16: __float2bfloat16 rounding to nearest even (ties, overflow, NaN), cublasGemmEx and
//     cublasGemmStridedBatchedEx (one operand shared) on bf16 operands against the definition in double on
//     the rounded values, and their refusals;
//   - the counts (emu::counts()): launches per kernel and cuBLAS calls per function, refused ones left out,
//     copies by direction, memsets, device bytes and their peak; a dry run counts without running;
//   - streams and graphs: a capture records launches, async copies and memsets and cuBLAS products without
//     running them; a graph replays them in order, with kernel arguments and alpha/beta as captured and
//     memory (device or pinned) as it is at the replay; the calls CUDA refuses under a capture (allocation,
//     synchronous copies and synchronisation, work on the legacy stream, cuBLAS left on it) fail and
//     invalidate it, and cudaStreamEndCapture then fails;
//   - branches (a stream forked from another by an event): their products wait for the join or a
//     synchronisation and then run in order; a product whose operand the main stream wrote before the join
//     is an error, also when replayed from a graph, and so is one issued after more work of the main stream
//     than its fork waited for; a wait does not fork a stream that has run work of its own; a capture joins its
//     branch at the join (the branch's work from before it runs then, outside the graph), one that ends with a
//     branch not joined fails, and a captured stream may not wait on an event recorded outside the capture.
#include "cuda_emulator.h"

#include <sys/wait.h>

#include <numeric>

#include "check.h"

namespace {

#define RUN(kernel, grid, block, shared, ...) ::emu::launch(#kernel, kernel, grid, block, shared, nullptr, __VA_ARGS__)

// ---- kernels that CUDA defines the result of ---------------------------------------------------------------
__global__ void index_kernel(unsigned* out) {  // every thread of a 3-D grid of 3-D blocks writes its global id
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
  out[block * per_block + thread] = block * 1000 + thread;
}

// Sum of n floats per block: warps reduce by __shfl_xor_sync, then warp 0 reduces the warps' sums.
__global__ void warp_reduce_kernel(float* out, const float* in, int n) {
  __shared__ float warp_sums[32];
  float x = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) x += in[blockIdx.x * n + i];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = x;
  __syncthreads();
  if (threadIdx.x < 32) {
    x = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xffffffffu, x, o);
    if (threadIdx.x == 0) out[blockIdx.x] = x;
  }
}

__global__ void shfl_kernel(int* from_lane3, int* down2, unsigned* ballot, double* xor_width8) {
  const int lane = threadIdx.x;
  from_lane3[lane] = __shfl_sync(0xffffffffu, lane * 10, 3, 8);    // lane 3 of each group of 8
  down2[lane] = __shfl_down_sync(0xffffffffu, lane * 10, 2, 16);    // groups of 16: the last two keep their own
  ballot[lane] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  __syncwarp();
  xor_width8[lane] = __shfl_xor_sync(0xffffffffu, lane + 0.5, 5, 8);  // a double: 8 bytes per lane
}

__global__ void shared_kernel(float* out, float* dynamic_first, float* misalignment) {
  float* dyn = dynamic_shared<float>();
  if (threadIdx.x == 0) dynamic_first[blockIdx.x] = dyn[5];  // read before any write: NaN
  if (threadIdx.x == 0) misalignment[blockIdx.x] = (float)((uintptr_t)dyn % 16);  // 16-byte loads (float4) need 0
  __syncthreads();
  dyn[threadIdx.x] = (float)(threadIdx.x + blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[blockDim.x - 1 - threadIdx.x];
}

__global__ void atomic_kernel(float* sum, unsigned* count, unsigned* order) {
  atomicAdd(sum, 0.5f);
  const unsigned k = atomicAdd(count + blockIdx.x, 1u);
  if (blockIdx.x == 0) order[k] = threadIdx.x;  // the order in which block 0's threads started
}

// Thread 0 reads its neighbour's slot before the barrier that would make it safe: a race on shared memory.
__global__ void race_kernel(float* out) {
  __shared__ float slot[64];
  slot[threadIdx.x] = (float)threadIdx.x;
  out[threadIdx.x] = slot[(threadIdx.x + 1) % 64];  // missing __syncthreads() before this read
}

// Each thread reads the other warp's slot after a __syncwarp, which orders only its own warp's lanes: a race
// between the warps (a __syncthreads is missing), which shows only if a warp may run ahead of the other.
__global__ void warp_race_kernel(float* out) {
  __shared__ float slot[64];
  slot[threadIdx.x] = -1;  // what a slot holds before the race's write
  __syncthreads();
  slot[threadIdx.x] = (float)threadIdx.x;
  __syncwarp();
  out[threadIdx.x] = slot[(threadIdx.x + 32) % 64];
}

// Asynchronous copies (cp.async) into shared memory, out[7 * 64] per thread t of 64, in[128]: a copy is not
// done before a wait covers its group, __pipeline_wait_prior(1) leaves the newest group waiting, and a
// copy's last zfill bytes are zeros.
__global__ void async_copy_kernel(float* out, const float* in) {
  alignas(16) __shared__ float a[64], b[64], c[256];
  const unsigned t = threadIdx.x;
  a[t] = b[t] = -1;
  for (int i = 0; i < 4; ++i) c[4 * t + i] = -1;
  __pipeline_memcpy_async(&a[t], &in[t], sizeof(float));  // group 1
  out[t] = a[t];                                           // before any wait: -1
  __pipeline_commit();
  __pipeline_memcpy_async(&b[t], &in[64 + t], sizeof(float));  // group 2
  __pipeline_memcpy_async(&c[4 * t], &in[t % 32 * 4], 16, t % 2 ? 8 : 0);  // 16 bytes, odd threads' last 8 zeros
  __pipeline_commit();
  __pipeline_wait_prior(1);  // group 1 done, group 2 not
  out[64 + t] = a[t], out[128 + t] = b[t], out[192 + t] = c[4 * t];
  __pipeline_wait_prior(0);
  out[256 + t] = b[t], out[320 + t] = c[4 * t + 1], out[384 + t] = c[4 * t + 3];
}

// Tensor cores (wmma, TF32 m16n16k8): one warp, D (16 x 16) = A (16 x K) B (K x 16) + C, A and B rounded to TF32
// (__float_to_tf32), B read row-major or column-major (BLayout), C loaded column-major, D stored row-major into d
// and column-major into d_col; a, b (row-major, K x 16) and c (16 x 16) in global memory, K a multiple of 8 up to 32.
template <typename BLayout>
__global__ void wmma_kernel(float* d, float* d_col, const float* a, const float* b, const float* c, int K) {
  namespace wmma = nvcuda::wmma;
  constexpr int ld = 36;  // a multiple of 4 floats
  alignas(32) __shared__ float sa[16 * ld], sb[32 * ld], sc[16 * ld];
  const bool b_col = std::is_same_v<BLayout, wmma::col_major>;
  for (int i = threadIdx.x; i < 16 * K; i += 32) sa[i / K * ld + i % K] = a[i];
  for (int i = threadIdx.x; i < K * 16; i += 32) sb[b_col ? i % 16 * ld + i / 16 : i / 16 * ld + i % 16] = b[i];
  for (int i = threadIdx.x; i < 16 * 16; i += 32) sc[i % 16 * ld + i / 16] = c[i];
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::load_matrix_sync(acc, sc, ld, wmma::mem_col_major);
  for (int k0 = 0; k0 < K; k0 += 8) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, BLayout> fb;
    wmma::load_matrix_sync(fa, sa + k0, ld);
    wmma::load_matrix_sync(fb, b_col ? sb + k0 : sb + k0 * ld, ld);
    for (float& x : fa.x) x = wmma::__float_to_tf32(x);
    for (float& x : fb.x) x = wmma::__float_to_tf32(x);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(sa, acc, ld, wmma::mem_row_major);  // into A's tile, which every lane has read
  wmma::store_matrix_sync(sb, acc, ld, wmma::mem_col_major);
  __syncwarp();  // each lane stored its own elements
  for (int i = threadIdx.x; i < 256; i += 32) d[i] = sa[i / 16 * ld + i % 16], d_col[i] = sb[i % 16 * ld + i / 16];
}
// Each lane's accumulator elements set to its lane number and stored: which element a lane holds (CUDA leaves
// it unspecified; the emulator's own mapping)
__global__ void wmma_mapping_kernel(float* out) {
  alignas(32) __shared__ float s[16 * 16];
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> f;
  for (float& x : f.x) x = (float)threadIdx.x;
  nvcuda::wmma::store_matrix_sync(s, f, 16, nvcuda::wmma::mem_row_major);
  __syncwarp();
  for (int i = threadIdx.x; i < 256; i += 32) out[i] = s[i];
}

// ---- kernels the emulator must reject --------------------------------------------------------------------
__global__ void unwaited_copy_kernel(float* out) {  // returns with its copy not waited for
  __shared__ float a[64];
  __pipeline_memcpy_async(&a[threadIdx.x], &out[threadIdx.x], sizeof(float));
  __pipeline_commit();
}
__global__ void misaligned_copy_kernel(float* out) {  // 16 bytes from an address 4 bytes past a 16-byte boundary
  alignas(16) __shared__ float a[256];
  __pipeline_memcpy_async(&a[4 * threadIdx.x], &out[4 * threadIdx.x + 1], 16);
  __pipeline_commit();
  __pipeline_wait_prior(0);
}
// wmma loads CUDA leaves undefined: a pointer off the 32-byte grid, an ldm not a multiple of 4 floats, lanes
// passing different pointers; and a lane that returns before the warp's mma_sync
__global__ void wmma_misaligned_kernel(float* out) {
  alignas(32) __shared__ float s[16 * 16 + 4];
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major> f;
  nvcuda::wmma::load_matrix_sync(f, s + 4, 16);
  out[threadIdx.x] = f.x[0];
}
__global__ void wmma_bad_ldm_kernel(float* out) {
  alignas(32) __shared__ float s[16 * 16];
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major> f;
  nvcuda::wmma::load_matrix_sync(f, s, 10);
  out[threadIdx.x] = f.x[0];
}
__global__ void wmma_lanes_disagree_kernel(float* out) {
  alignas(32) __shared__ float s[2 * 16 * 16];
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::col_major> f;
  nvcuda::wmma::load_matrix_sync(f, s + threadIdx.x % 2 * 256, 16);
  out[threadIdx.x] = f.x[0];
}
__global__ void wmma_lane_returned_kernel(float* out) {
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major> a;
  nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 8, nvcuda::wmma::precision::tf32, nvcuda::wmma::row_major> b;
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float> c;
  nvcuda::wmma::fill_fragment(a, 1.f), nvcuda::wmma::fill_fragment(b, 1.f), nvcuda::wmma::fill_fragment(c, 0.f);
  if (threadIdx.x == 9) return;
  nvcuda::wmma::mma_sync(c, a, b, c);
  out[threadIdx.x] = c.x[0];
}
__global__ void early_return_kernel(float* out) {
  if (threadIdx.x >= 100) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void two_barriers_kernel(float* out) {
  if (threadIdx.x % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}
__global__ void caller_outside_mask_kernel(float* out) { out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, 1.f, 1); }
__global__ void lane_outside_mask_kernel(float* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.f, 20 % 32, 32);
}
__global__ void deadlock_kernel(float* out) {
  if (threadIdx.x == 0) {
    __syncwarp();  // waits for lanes 1-31, which wait at the barrier for thread 0
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void spin_kernel(volatile int* flag) {
  while (*flag == 0) {}  // no other thread will ever set it
}
__global__ void past_the_end_kernel(float* out, int n) { out[n + threadIdx.x] = 1; }
__global__ void nothing_kernel(float* out) { out[threadIdx.x] = 0; }
__global__ void axpy_kernel(float* y, const float* x, const float* a_on_device, float a, int n) {  // y += (a + *a_on_device) x
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] += (a + *a_on_device) * x[i];
}

template <typename T> std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
  return h;
}
template <typename T> T* device(size_t n) {
  T* p = nullptr;
  cudaMalloc(&p, n * sizeof(T));
  return p;
}

// A finding: the launch fails with cudaErrorLaunchFailure, the message names the kernel and says `what`,
// the error stays until cudaDeviceReset, after which a launch works again.
template <typename... P, typename... A>
void expect_finding(Checker& ck, const char* name, void (*kernel)(P...), unsigned threads, const char* what, A... args) {
  emu::launch(name, kernel, dim3(2), dim3(threads), 0, nullptr, args...);
  const cudaError_t e = cudaGetLastError();
  const std::string msg = cudaGetErrorString(e);
  ck.expect(e == cudaErrorLaunchFailure && msg.find(name) != std::string::npos && msg.find(what) != std::string::npos,
            "%s: expected a launch failure naming the kernel and '%s', got %s: %s", name, what, cudaGetErrorName(e), msg.c_str());
  ck.expect(cudaGetLastError() == cudaErrorLaunchFailure && cudaDeviceSynchronize() == cudaErrorLaunchFailure,
            "%s: the error is sticky", name);
  cudaDeviceReset();
  float* out = device<float>(64);
  RUN(nothing_kernel, 1, 64, 0, out);
  ck.expect(cudaGetLastError() == cudaSuccess, "%s: after cudaDeviceReset a launch works", name);
  cudaFree(out);
  std::printf("  finding: %s\n", msg.c_str());
}

// Runs f in a child process; returns its exit status (128 + signal when killed) and what it wrote to stderr.
template <typename F> std::pair<int, std::string> in_child(F f) {
  std::fflush(stdout);
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 2);
    close(pipe_fds[0]);
    f();
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string err;
  char buf[4096];
  for (ssize_t r; (r = read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, (size_t)r);
  close(pipe_fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
}

// C = alpha op(A) op(B) + beta C, column-major, in double, from the cuBLAS documentation's definition.
std::vector<double> gemm_definition(bool ta, bool tb, int m, int n, int k, double alpha, const std::vector<float>& A, int lda,
                                    const std::vector<float>& B, int ldb, double beta, const std::vector<float>& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double s = 0;
      for (int l = 0; l < k; ++l) s += (double)(ta ? A[(size_t)i * lda + l] : A[(size_t)l * lda + i]) * (tb ? B[(size_t)l * ldb + j] : B[(size_t)j * ldb + l]);
      out[(size_t)j * ldc + i] = alpha * s + (beta == 0 ? 0 : beta * C[(size_t)j * ldc + i]);
    }
  return out;
}

float tf32(float x) {  // round to nearest even at 10 mantissa bits, written out independently of the emulator
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t low = b & 0x1fffu, half = 0x1000u;
  b &= ~0x1fffu;
  if (low > half || (low == half && (b & 0x2000u))) b += 0x2000u;
  std::memcpy(&x, &b, 4);
  return x;
}

// bf16 by its definition: the float's top 16 bits, rounded to nearest even on the 16 below.
float bf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint32_t low = b & 0xffffu;
  b &= 0xffff0000u;
  if (low > 0x8000u || (low == 0x8000u && (b & 0x10000u))) b += 0x10000u;
  std::memcpy(&x, &b, 4);
  return x;
}

}  // namespace

int main() {
  Checker ck("cuda_emulator");
  std::printf("cuda_emulator: thread order %s\n", emu::order_name());
  std::vector<float> host(4096);
  for (size_t i = 0; i < host.size(); ++i) host[i] = (float)((i * 37) % 101) / 7.f - 5.f;

  {  // built-in variables over a 3-D grid of 3-D blocks
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    unsigned* out = device<unsigned>(12 * 24);
    RUN(index_kernel, grid, block, 0, out);
    const std::vector<unsigned> h = download(out, 12 * 24);
    int wrong = 0;
    for (unsigned b = 0; b < 12; ++b)
      for (unsigned t = 0; t < 24; ++t) wrong += h[b * 24 + t] != b * 1000 + t;
    ck.expect(cudaGetLastError() == cudaSuccess && wrong == 0, "index_kernel: %d threads wrote a wrong index", wrong);
    cudaFree(out);
  }
  {  // warp reductions: 3 blocks of 256 threads, 1000 values each
    float* in = device<float>(3000);
    float* out = device<float>(3);
    cudaMemcpy(in, host.data(), 3000 * sizeof(float), cudaMemcpyHostToDevice);
    RUN(warp_reduce_kernel, 3, 256, 0, out, in, 1000);
    const std::vector<float> h = download(out, 3);
    for (int b = 0; b < 3; ++b) {
      double want = 0;
      for (int i = 0; i < 1000; ++i) want += host[b * 1000 + i];
      ck.close(h[b], want, 1e-5, 1e-5, "warp_reduce_kernel: __shfl_xor_sync and __shfl_down_sync block sum");
    }
    cudaFree(in), cudaFree(out);
  }
  {  // each collective against its definition
    int* lane3 = device<int>(32);
    int* down2 = device<int>(32);
    unsigned* ballot = device<unsigned>(32);
    double* xor8 = device<double>(32);
    RUN(shfl_kernel, 1, 32, 0, lane3, down2, ballot, xor8);
    const auto a = download(lane3, 32), b = download(down2, 32);
    const auto c = download(ballot, 32);
    const auto d = download(xor8, 32);
    unsigned want_ballot = 0;
    for (int l = 0; l < 32; l += 3) want_ballot |= 1u << l;
    int wrong = 0;
    for (int l = 0; l < 32; ++l) {
      wrong += a[l] != (l / 8 * 8 + 3) * 10;
      wrong += b[l] != ((l % 16) + 2 < 16 ? (l + 2) * 10 : l * 10);
      wrong += c[l] != want_ballot;
      wrong += d[l] != (l ^ 5) + 0.5;  // l ^ 5 stays in l's group of 8
    }
    ck.expect(wrong == 0, "shfl_kernel: %d lanes got another value than CUDA defines", wrong);
    for (void* p : {(void*)lane3, (void*)down2, (void*)ballot, (void*)xor8}) cudaFree(p);
  }
  {  // static and dynamic shared memory; dynamic shared memory starts as NaN in every block, 16-byte aligned
    float* out = device<float>(2 * 64);
    float* first = device<float>(2);
    float* misalignment = device<float>(2);
    RUN(shared_kernel, 2, 64, 64 * sizeof(float) + 3, out, first, misalignment);  // a size that is no multiple of 16
    const auto h = download(out, 128), f = download(first, 2), m = download(misalignment, 2);
    int wrong = 0;
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < 64; ++t) wrong += h[b * 64 + t] != (float)(63 - t + b);
    ck.expect(wrong == 0 && std::isnan(f[0]) && std::isnan(f[1]), "shared_kernel: %d wrong, unwritten dynamic shared %g %g", wrong, f[0], f[1]);
    ck.expect(m[0] == 0 && m[1] == 0, "shared_kernel: dynamic shared memory %g and %g bytes past a 16-byte boundary", m[0], m[1]);
    cudaFree(out), cudaFree(first), cudaFree(misalignment);
  }
  {  // atomics, and the order in which a block's threads start under each CUDA_EMULATOR_ORDER
    const emu::Order saved = emu::state().order;
    std::vector<std::vector<unsigned>> orders;
    for (emu::Order o : {emu::Order::inorder, emu::Order::reverse, emu::Order::shuffle}) {
      emu::state().order = o;
      float* sum = device<float>(1);
      unsigned* count = device<unsigned>(4);
      unsigned* order = device<unsigned>(64);
      cudaMemset(sum, 0, sizeof(float)), cudaMemset(count, 0, 4 * sizeof(unsigned));
      RUN(atomic_kernel, 4, 64, 0, sum, count, order);
      const float s = download(sum, 1)[0];
      const std::vector<unsigned> counts = download(count, 4);
      ck.expect(s == 128.f && counts == std::vector<unsigned>(4, 64), "atomic_kernel: sum %g, want 128; 64 threads a block", s);
      std::vector<unsigned> h = download(order, 64);  // block 0's threads, in the order they started
      orders.push_back(h);
      cudaFree(sum), cudaFree(count), cudaFree(order);
    }
    std::vector<unsigned> inorder(64), reverse(64);
    std::iota(inorder.begin(), inorder.end(), 0u);
    std::iota(reverse.rbegin(), reverse.rend(), 0u);
    std::vector<unsigned> sorted = orders[2];
    std::sort(sorted.begin(), sorted.end());
    ck.expect(orders[0] == inorder, "inorder: threads start 0, 1, 2, ...");
    ck.expect(orders[1] == reverse, "reverse: threads start 63, 62, ...");
    ck.expect(sorted == inorder && orders[2] != inorder && orders[2] != reverse, "shuffle: a permutation, neither in order nor reversed");
    // a race on shared memory shows as different results under two orders
    std::vector<std::vector<float>> results;
    for (emu::Order o : {emu::Order::inorder, emu::Order::reverse}) {
      emu::state().order = o;
      float* out = device<float>(64);
      RUN(race_kernel, 1, 64, 0, out);
      results.push_back(download(out, 64));
      cudaFree(out);
    }
    ck.expect(results[0] != results[1], "race_kernel: a missing __syncthreads gives the same result under inorder and reverse");
    // a race between warps that a __syncwarp does not order: a warp runs ahead and reads a slot before its write
    for (emu::Order o : {emu::Order::inorder, emu::Order::reverse}) {
      emu::state().order = o;
      float* out = device<float>(64);
      RUN(warp_race_kernel, 1, 64, 0, out);
      const std::vector<float> h = download(out, 64);
      cudaFree(out);
      ck.expect(std::count(h.begin(), h.end(), -1.f) == 32, "warp_race_kernel (%s): %d of 64 threads read the other warp's slot before its write (want 32: one warp runs ahead)",
                emu::order_name(), (int)std::count(h.begin(), h.end(), -1.f));
    }
    emu::state().order = saved;
  }

  {  // asynchronous copies: done at the wait that covers their group, not before
    std::vector<float> h_in(128);
    std::iota(h_in.begin(), h_in.end(), 1.f);
    float* in = device<float>(128);
    float* out = device<float>(7 * 64);
    cudaMemcpy(in, h_in.data(), 128 * sizeof(float), cudaMemcpyHostToDevice);
    RUN(async_copy_kernel, 1, 64, 0, out, in);
    const std::vector<float> h = download(out, 7 * 64);
    int wrong = 0;
    for (int t = 0; t < 64; ++t) {
      const float want[7] = {-1, h_in[t], -1, -1, h_in[64 + t], h_in[t % 32 * 4 + 1], t % 2 ? 0.f : h_in[t % 32 * 4 + 3]};
      for (int k = 0; k < 7; ++k) wrong += h[64 * k + t] != want[k];
    }
    ck.expect(cudaGetLastError() == cudaSuccess && wrong == 0,
              "async_copy_kernel: %d of 448 values differ from the copies' order (none done before its wait, the zero-filled bytes zeros)", wrong);
    cudaFree(in);
    cudaFree(out);
  }

  {  // tensor cores (wmma, TF32 m16n16k8): D = A B + C against the definition in double on the TF32-rounded operands
    const float tie = 1.f + std::ldexp(1.f, -11);  // half a TF32 unit past 1: rounds away from zero
    ck.expect(nvcuda::wmma::__float_to_tf32(tie) == 1.f + std::ldexp(1.f, -10) && nvcuda::wmma::__float_to_tf32(-tie) == -(1.f + std::ldexp(1.f, -10)) &&
                  nvcuda::wmma::__float_to_tf32(std::nextafter(tie, 0.f)) == 1.f && std::isnan(nvcuda::wmma::__float_to_tf32(NAN)) &&
                  nvcuda::wmma::__float_to_tf32(INFINITY) == INFINITY,
              "__float_to_tf32: to nearest, ties away from zero; NaN and infinity kept");
    auto tf32 = [](float x) { return (double)nvcuda::wmma::__float_to_tf32(x); };
    for (int K : {8, 32})
      for (bool b_col : {false, true}) {
        std::mt19937 rng(K + b_col);
        std::uniform_real_distribution<float> u(-2, 2);
        std::vector<float> a(16 * K), b(K * 16), c(256);
        for (float& x : a) x = u(rng);
        for (float& x : b) x = u(rng);
        for (float& x : c) x = u(rng);
        float *da = device<float>(a.size()), *db = device<float>(b.size()), *dc = device<float>(256), *dd = device<float>(512);
        cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice), cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dc, c.data(), 256 * 4, cudaMemcpyHostToDevice);
        if (b_col) RUN(wmma_kernel<nvcuda::wmma::col_major>, 1, 32, 0, dd, dd + 256, da, db, dc, K);
        else RUN(wmma_kernel<nvcuda::wmma::row_major>, 1, 32, 0, dd, dd + 256, da, db, dc, K);
        const std::vector<float> d = download(dd, 512);
        double worst = 0;
        for (int i = 0; i < 16; ++i)
          for (int j = 0; j < 16; ++j) {
            double want = c[i * 16 + j], size = std::fabs(want);
            for (int k = 0; k < K; ++k) want += tf32(a[i * K + k]) * tf32(b[k * 16 + j]), size += std::fabs(tf32(a[i * K + k]) * tf32(b[k * 16 + j]));
            for (int half : {0, 256}) worst = std::max(worst, std::fabs(d[half + i * 16 + j] - want) / size);
          }
        ck.expect(cudaGetLastError() == cudaSuccess && worst < 1e-6, "wmma_kernel K %d, B %s: worst error %.2g of the sum of |terms| (tol 1e-6)", K,
                  b_col ? "column-major" : "row-major", worst);
        std::printf("  wmma m16n16k8 TF32, K %d, B %s: D stored both ways, worst error %.2g of the sum of |terms| (tol 1e-6)\n", K,
                    b_col ? "column-major" : "row-major", worst);
        cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
      }
    float* m = device<float>(256);
    RUN(wmma_mapping_kernel, 1, 32, 0, m);
    const std::vector<float> h = download(m, 256);
    int off = 0;
    for (int e = 0; e < 256; ++e) off += h[e] != (float)(e % 32);
    ck.expect(off == 0, "wmma fragments: %d of 256 accumulator elements not held by lane e %% 32", off);
    cudaFree(m);
  }

  // findings, each naming the kernel (each with an allocation of its own: cudaDeviceReset frees them)
  struct Finding {
    const char* name;
    void (*kernel)(float*);
    unsigned threads;
    const char* what;
  };
  for (const Finding& f : {Finding{"early_return_kernel", early_return_kernel, 128, "reached by 100 of the block's 128 threads"},
                           Finding{"two_barriers_kernel", two_barriers_kernel, 64, "different __syncthreads"},
                           Finding{"exited_lane_kernel", exited_lane_kernel, 32, "names lane 7, which has returned"},
                           Finding{"caller_outside_mask_kernel", caller_outside_mask_kernel, 32, "leaves the lane out"},
                           Finding{"lane_outside_mask_kernel", lane_outside_mask_kernel, 32, "reads lane 20, which is not in the mask"},
                           Finding{"deadlock_kernel", deadlock_kernel, 64, "deadlock: 63 at __syncthreads"},
                           Finding{"unwaited_copy_kernel", unwaited_copy_kernel, 64, "returned with asynchronous copies"},
                           Finding{"misaligned_copy_kernel", misaligned_copy_kernel, 32, "not 4, 8 or 16 bytes aligned"},
                           Finding{"wmma_misaligned_kernel", wmma_misaligned_kernel, 32, "is not 32-byte aligned"},
                           Finding{"wmma_bad_ldm_kernel", wmma_bad_ldm_kernel, 32, "ldm 10 is not a multiple of 4 floats"},
                           Finding{"wmma_lanes_disagree_kernel", wmma_lanes_disagree_kernel, 32, "passes another pointer than lane"},
                           Finding{"wmma_lane_returned_kernel", wmma_lane_returned_kernel, 32, "mask 0xffffffff names lane 9, which has returned"}})
    expect_finding(ck, f.name, f.kernel, f.threads, f.what, device<float>(256));
  const auto [spin, spin_err] = in_child([] {
    emu::state().timeout = 1;
    int* flag = device<int>(1);
    cudaMemset(flag, 0, sizeof(int));
    RUN(spin_kernel, 1, 1, 0, flag);
  });
  ck.expect(spin == 124 && spin_err.find("kernel spin_kernel still runs") != std::string::npos,
            "spin_kernel: a kernel that never ends exits 124 naming itself after the timeout, got %d: %s", spin, spin_err.c_str());
  std::printf("  finding (child process): %s", spin_err.c_str());
#ifdef CUDA_EMULATOR_ASAN
  const auto [overflow, overflow_err] = in_child([] {
    float* p = device<float>(64);
    RUN(past_the_end_kernel, 1, 32, 0, p, 64);
  });
  ck.expect(overflow != 0 && overflow_err.find("heap-buffer-overflow") != std::string::npos &&
                overflow_err.find("past_the_end_kernel") != std::string::npos,
            "past_the_end_kernel: AddressSanitizer stops a write past a device allocation (exit %d)", overflow);
  const size_t summary = overflow_err.find("SUMMARY");
  std::printf("  finding (child process): %s\n", overflow_err.substr(summary, overflow_err.find('\n', summary) - summary).c_str());
#else
  ck.expect(false, "this test is built with AddressSanitizer (make emu): a write past a device allocation is not caught without it");
#endif

  // launches CUDA refuses (not sticky: the next launch works)
  float* out = device<float>(2048);
  RUN(nothing_kernel, 1, 1025, 0, out);
  ck.expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads: cudaErrorInvalidConfiguration");
  RUN(nothing_kernel, 0, 32, 0, out);
  ck.expect(cudaGetLastError() == cudaErrorInvalidConfiguration, "a zero grid: cudaErrorInvalidConfiguration");
  RUN(shared_kernel, 1, 32, 49 * 1024, out, out, out + 1);
  ck.expect(cudaGetLastError() == cudaErrorInvalidValue, "49 KiB of dynamic shared memory: cudaErrorInvalidValue");
  ck.expect(cudaFuncSetAttribute(shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess,
            "cudaFuncSetAttribute raises the limit to 64 KiB");
  RUN(shared_kernel, 1, 32, 49 * 1024, out, out + 1024, out + 1025);
  ck.expect(cudaGetLastError() == cudaSuccess, "49 KiB of dynamic shared memory once raised: launched");

  {  // the host API
    float* d = device<float>(10);
    const auto fresh = download(d, 10);
    ck.expect(std::all_of(fresh.begin(), fresh.end(), [](float x) { return std::isnan(x); }), "cudaMalloc: NaN until written");
    ck.expect(cudaMemcpy(d + 5, host.data(), 6 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
              "cudaMemcpy of 6 floats into the last 5 of an allocation: cudaErrorInvalidValue");
    ck.expect(std::string(cudaGetErrorString(cudaGetLastError())).find("past the end") != std::string::npos, "the message says past the end");
    ck.expect(cudaMemcpy(host.data(), host.data() + 8, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue,
              "cudaMemcpy from host memory said to be device memory: cudaErrorInvalidValue");
    ck.expect(cudaMemset(d, 0, 11 * sizeof(float)) == cudaErrorInvalidValue, "cudaMemset past the end: cudaErrorInvalidValue");
    ck.expect(cudaFree(host.data()) == cudaErrorInvalidValue, "cudaFree of a host pointer: cudaErrorInvalidValue");
    float* pinned = nullptr;
    ck.expect(cudaMallocHost(&pinned, 10 * sizeof(float)) == cudaSuccess && cudaFreeHost(pinned) == cudaSuccess, "pinned memory");
    cudaGetLastError();
    cudaFree(d);
  }

  {  // cuBLAS against its definition: every transpose, ld larger than the matrix, alpha/beta, TF32, refusals
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 7, n = 5, k = 6, pad = 3;
    for (int tf = 0; tf < 2; ++tf) {
      cublasSetMathMode(h, tf ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH);
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          for (auto [alpha, beta] : {std::pair{1.f, 0.f}, {1.f, 1.f}, {0.5f, -2.f}, {-1.5f, 0.f}}) {
            const int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
            std::vector<float> A(host.begin(), host.begin() + (size_t)lda * (ta ? m : k)),
                B(host.begin() + 500, host.begin() + 500 + (size_t)ldb * (tb ? k : n)),
                C(host.begin() + 1000, host.begin() + 1000 + (size_t)ldc * n);
            if (beta == 0) std::fill(C.begin(), C.end(), NAN);  // beta 0: C is not read
            float *dA = device<float>(A.size()), *dB = device<float>(B.size()), *dC = device<float>(C.size());
            cudaMemcpy(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice);
            const cublasStatus_t st = cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
                                                  dA, lda, dB, ldb, &beta, dC, ldc);
            std::vector<float> Ar = A, Br = B;
            if (tf) std::transform(A.begin(), A.end(), Ar.begin(), tf32), std::transform(B.begin(), B.end(), Br.begin(), tf32);
            const std::vector<double> want = gemm_definition(ta, tb, m, n, k, alpha, Ar, lda, Br, ldb, beta, C, ldc);
            // and against the row-major CPU product the model uses: column-major C (m,n) is row-major C^T (n,m),
            // C^T = op(B)^T op(A)^T, each operand's memory read row-major with its transpose as given
            std::vector<double> Ad(Ar.begin(), Ar.end()), Bd(Br.begin(), Br.end()), P(C.size(), 0.0);
            cpu::gemm<double>(tb, ta, n, m, k, Bd.data(), ldb, Ad.data(), lda, P.data(), ldc, false);
            const std::vector<float> got = download(dC, C.size());
            const std::string what = "cublasSgemm " + std::string(ta ? "T" : "N") + (tb ? "T" : "N") + (tf ? " TF32" : "") +
                                     " alpha " + std::to_string(alpha) + " beta " + std::to_string(beta);
            ck.expect(st == CUBLAS_STATUS_SUCCESS, "%s: status %s", what.c_str(), cublasGetStatusString(st));
            for (int j = 0; j < n; ++j)
              for (int i = 0; i < ldc; ++i) {
                const size_t at = (size_t)j * ldc + i;
                if (i < m) {
                  ck.close(got[at], want[at], 1e-5, 1e-5, what.c_str());
                  ck.close(got[at], alpha * P[at] + (beta == 0 ? 0 : beta * (double)C[at]), 1e-5, 1e-5, (what + ", row-major cpu::gemm").c_str());
                }
                else ck.expect(std::isnan(got[at]) == std::isnan(C[at]) && (std::isnan(C[at]) || got[at] == C[at]),
                               "%s: the padding rows of C are left alone", what.c_str());
              }
            cudaFree(dA), cudaFree(dB), cudaFree(dC);
          }
    }
    cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
    {  // strided batched: 3 products 1 apart in memory by their strides
      const int bm = 4, bn = 3, bk = 5, batches = 3;
      const long long sa = bm * bk + 2, sb = bk * bn + 1, sc = bm * bn + 4;
      float *dA = device<float>(sa * batches), *dB = device<float>(sb * batches), *dC = device<float>(sc * batches);
      cudaMemcpy(dA, host.data(), sa * batches * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(dB, host.data() + 300, sb * batches * 4, cudaMemcpyHostToDevice);
      const float one = 1, zero = 0;
      ck.expect(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, bm, bn, bk, &one, dA, bm, sa, dB, bk, sb, &zero, dC, bm, sc, batches) ==
                    CUBLAS_STATUS_SUCCESS, "cublasSgemmStridedBatched: success");
      const std::vector<float> got = download(dC, sc * batches);
      for (int b = 0; b < batches; ++b) {
        const std::vector<float> A(host.begin() + b * sa, host.begin() + b * sa + bm * bk), B(host.begin() + 300 + b * sb, host.begin() + 300 + b * sb + bk * bn);
        const std::vector<double> want = gemm_definition(false, false, bm, bn, bk, 1, A, bm, B, bk, 0, std::vector<float>(bm * bn), bm);
        for (int i = 0; i < bm * bn; ++i) ck.close(got[b * sc + i], want[i], 1e-5, 1e-5, "cublasSgemmStridedBatched");
      }
      cudaFree(dA), cudaFree(dB), cudaFree(dC);
    }
    float* d = device<float>(100);
    const float one = 1, zero = 0;
    // an injected failure (fail_blas_call): the n-th call from now fails at its issue, the others run; a
    // strided-batched call counts once
    float* e = device<float>(4);
    const float ones[4] = {1, 1, 1, 1};
    cudaMemcpy(d, ones, sizeof ones, cudaMemcpyHostToDevice);
    const auto product = [&] { return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, d, 2, d, 2, &zero, e, 2); };
    const auto batched = [&] {
      return cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, d, 1, 1, d, 1, 1, &zero, e, 1, 1, 3);
    };
    emu::fail_blas_call(3);
    const cublasStatus_t first = product(), second = batched();
    cudaMemset(e, 0, 4 * sizeof(float));
    const cublasStatus_t third = product(), fourth = product();
    ck.expect(first == CUBLAS_STATUS_SUCCESS && second == CUBLAS_STATUS_SUCCESS && third == CUBLAS_STATUS_EXECUTION_FAILED &&
                  fourth == CUBLAS_STATUS_SUCCESS && e[0] == 2 && cudaGetLastError() == cudaSuccess,
              "fail_blas_call(3): the third call fails, the others run (statuses %d %d %d %d, e[0] %g)", first, second, third, fourth, e[0]);
    emu::fail_blas_call(1);
    emu::fail_blas_call(0);
    ck.expect(product() == CUBLAS_STATUS_SUCCESS, "fail_blas_call(0) cancels the failure to come");
    ck.expect(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, d, 3, d, 2, &zero, d, 4) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasSgemm: lda 3 < m 4 is refused");
    ck.expect(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, 4, 3, 2, &one, d, 4, d, 2, &zero, d, 4) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasSgemm: op(B) = B^T needs ldb >= n");
    ck.expect(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 0, &one, d, 4, d, 0, &zero, d, 4) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasSgemm: ldb 0 is refused even when k is 0");
    ck.expect(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, -1, 3, 2, &one, d, 4, d, 2, &zero, d, 4) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasSgemm: m < 0 is refused");
    ck.expect(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 11, 11, 11, &one, d, 11, d, 11, &zero, d, 11) == CUBLAS_STATUS_EXECUTION_FAILED,
              "cublasSgemm: operands that run past their allocation fail");
    cudaDeviceReset();
    cublasDestroy(h);
  }
  {  // bf16: conversions as cuda_bf16.h defines them, and cublasGemmEx on bf16 operands with fp32 sums
    const float one_ulp = 1.f / 128, cases[] = {1.f, 1 + one_ulp / 2, 1 + 3 * one_ulp / 2, 1 + one_ulp / 2 + 1e-6f, -2.5f, 3.4e38f, 1e-40f};
    const float want[] = {1.f, 1.f, 1 + 2 * one_ulp, 1 + one_ulp, -2.5f, INFINITY, bf16(1e-40f)};
    int wrong = 0;
    for (int i = 0; i < 7; ++i) wrong += __bfloat162float(__float2bfloat16(cases[i])) != want[i];
    ck.expect(wrong == 0, "__float2bfloat16: %d of 7 values rounded otherwise than to nearest even", wrong);
    ck.expect(std::isnan(__bfloat162float(__float2bfloat16(NAN))), "__float2bfloat16: a NaN stays NaN");
    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 6, n = 5, k = 9, lda = 10, ldb = 11, ldc = 8;  // C = A^T B, padded leading dimensions
    std::vector<float> A(host.begin(), host.begin() + (size_t)m * lda), B(host.begin() + 500, host.begin() + 500 + (size_t)n * ldb);
    std::vector<__nv_bfloat16> a16(A.size()), b16(B.size());
    std::vector<float> Ar(A.size()), Br(B.size());
    for (size_t i = 0; i < A.size(); ++i) a16[i] = __float2bfloat16(A[i]), Ar[i] = bf16(A[i]);
    for (size_t i = 0; i < B.size(); ++i) b16[i] = __float2bfloat16(B[i]), Br[i] = bf16(B[i]);
    __nv_bfloat16 *dA = device<__nv_bfloat16>(A.size()), *dB = device<__nv_bfloat16>(B.size());
    float* dC = device<float>((size_t)n * ldc);
    cudaMemcpy(dA, a16.data(), A.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, b16.data(), B.size() * 2, cudaMemcpyHostToDevice);
    const std::vector<float> C(host.begin() + 1000, host.begin() + 1000 + (size_t)n * ldc);
    cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice);
    const float alpha = 0.5f, beta = 1;
    ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &beta, dC, CUDA_R_32F,
                           ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS, "cublasGemmEx bf16: success");
    const std::vector<float> got = download(dC, C.size());
    const std::vector<double> exact = gemm_definition(true, false, m, n, k, alpha, Ar, lda, Br, ldb, beta, C, ldc);
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) ck.close(got[(size_t)j * ldc + i], exact[(size_t)j * ldc + i], 1e-5, 1e-5, "cublasGemmEx bf16 A^T B");
    {  // C in bf16, beta 0: each element the rounding of its sum (within half a bf16 step, 2^-8 of it, of the exact one), C not read
      __nv_bfloat16* dC16 = device<__nv_bfloat16>((size_t)n * ldc);  // NaN bytes: a read of C would show
      const float zero = 0;
      ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero, dC16,
                             CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS,
                "cublasGemmEx bf16 C: success");
      std::vector<__nv_bfloat16> got16((size_t)n * ldc);
      cudaMemcpy(got16.data(), dC16, got16.size() * 2, cudaMemcpyDeviceToHost);
      const std::vector<double> product = gemm_definition(true, false, m, n, k, alpha, Ar, lda, Br, ldb, 0, C, ldc);
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          const double want = product[(size_t)j * ldc + i];
          ck.close(__bfloat162float(got16[(size_t)j * ldc + i]), want, std::ldexp(1.0, -8) + 1e-6, 1e-6, "cublasGemmEx bf16 C, rounded");
        }
      ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero, dC16,
                             CUDA_R_16BF, ldc + 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED,
                "cublasGemmEx: a bf16 C is 2 bytes an element, and one running past its allocation fails");
      cudaDeviceReset();
      dA = device<__nv_bfloat16>(A.size()), dB = device<__nv_bfloat16>(B.size()), dC = device<float>((size_t)n * ldc);
      cudaMemcpy(dA, a16.data(), A.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dB, b16.data(), B.size() * 2, cudaMemcpyHostToDevice);
      float* dAf = device<float>(A.size());
      ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dAf, CUDA_R_32F, lda, dAf, CUDA_R_32F, ldb, &zero, dC,
                             CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasGemmEx: fp32 operands with a bf16 C are not supported here");
    }
    ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, dC, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F,
                           ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED,
              "cublasGemmEx: a bf16 A with an fp32 B is not supported here");
    ck.expect(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, m - 1, dB, CUDA_R_16BF, ldb, &beta, dC,
                           CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
              "cublasGemmEx: op(A) = A^T needs lda >= k");
    ck.expect(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 20, n, k, &alpha, dA, CUDA_R_16BF, 20, dB, CUDA_R_16BF, ldb, &beta, dC,
                           CUDA_R_32F, ldc + 20, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_EXECUTION_FAILED,
              "cublasGemmEx: bf16 operands are 2 bytes an element, and one running past its allocation fails");
    cudaDeviceReset();
    {  // strided batched on bf16 operands: A shared by every product (stride 0), B and C strided, C added to
      const int batches = 3;
      dA = device<__nv_bfloat16>(A.size());  // the refusal above left its error sticky: a fresh device
      cudaMemcpy(dA, a16.data(), A.size() * 2, cudaMemcpyHostToDevice);
      const long long sb = (long long)n * ldb / 2, sc = (long long)n * ldc + 3;  // B's products overlap: they only read it
      __nv_bfloat16* dBs = device<__nv_bfloat16>((size_t)(batches - 1) * sb + B.size());
      std::vector<__nv_bfloat16> bs16((size_t)(batches - 1) * sb + B.size());
      std::vector<float> Bs(bs16.size());
      for (size_t i = 0; i < bs16.size(); ++i) bs16[i] = __float2bfloat16(host[i % host.size()]), Bs[i] = bf16(host[i % host.size()]);
      cudaMemcpy(dBs, bs16.data(), bs16.size() * 2, cudaMemcpyHostToDevice);
      const std::vector<float> Cs(host.begin() + 1000, host.begin() + 1000 + (size_t)(batches - 1) * sc + C.size());
      float* dCs = device<float>(Cs.size());
      cudaMemcpy(dCs, Cs.data(), Cs.size() * 4, cudaMemcpyHostToDevice);
      ck.expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, 0, dBs, CUDA_R_16BF, ldb, sb,
                                           &beta, dCs, CUDA_R_32F, ldc, sc, batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                    CUBLAS_STATUS_SUCCESS,
                "cublasGemmStridedBatchedEx bf16: success");
      const std::vector<float> gots = download(dCs, Cs.size());
      for (int b = 0; b < batches; ++b) {
        const std::vector<float> Bb(Bs.begin() + b * sb, Bs.begin() + b * sb + B.size()), Cb(Cs.begin() + b * sc, Cs.begin() + b * sc + C.size());
        const std::vector<double> want = gemm_definition(true, false, m, n, k, alpha, Ar, lda, Bb, ldb, beta, Cb, ldc);
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < m; ++i)
            ck.close(gots[b * sc + (size_t)j * ldc + i], want[(size_t)j * ldc + i], 1e-5, 1e-5, "cublasGemmStridedBatchedEx bf16, A shared");
      }
      ck.expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, 0, dBs, CUDA_R_16BF, ldb,
                                           sb, &beta, dCs, CUDA_R_32F, ldc, sc, batches + 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                    CUBLAS_STATUS_EXECUTION_FAILED,
                "cublasGemmStridedBatchedEx: a fourth product past B's and C's allocations fails");
      cudaDeviceReset();
      // C in bf16 (beta 0: not read), strided in its own 2-byte elements: each product's element the rounding of its sum
      dA = device<__nv_bfloat16>(A.size()), dBs = device<__nv_bfloat16>(bs16.size());
      cudaMemcpy(dA, a16.data(), A.size() * 2, cudaMemcpyHostToDevice);
      cudaMemcpy(dBs, bs16.data(), bs16.size() * 2, cudaMemcpyHostToDevice);
      __nv_bfloat16* dCs16 = device<__nv_bfloat16>(Cs.size());  // NaN bytes: a read of C would show
      const float zero = 0;
      ck.expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dA, CUDA_R_16BF, lda, 0, dBs, CUDA_R_16BF, ldb, sb,
                                           &zero, dCs16, CUDA_R_16BF, ldc, sc, batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                    CUBLAS_STATUS_SUCCESS,
                "cublasGemmStridedBatchedEx bf16 C: success (strides in 2-byte elements: in 4-byte ones the last product would leave C)");
      std::vector<__nv_bfloat16> got16(Cs.size());
      cudaMemcpy(got16.data(), dCs16, got16.size() * 2, cudaMemcpyDeviceToHost);
      for (int b = 0; b < batches; ++b) {
        const std::vector<float> Bb(Bs.begin() + b * sb, Bs.begin() + b * sb + B.size());
        const std::vector<double> want = gemm_definition(true, false, m, n, k, alpha, Ar, lda, Bb, ldb, 0, C, ldc);
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < m; ++i)
            ck.close(__bfloat162float(got16[b * sc + (size_t)j * ldc + i]), want[(size_t)j * ldc + i], std::ldexp(1.0, -8) + 1e-6, 1e-6,
                     "cublasGemmStridedBatchedEx bf16 C, rounded");
      }
      ck.expect(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, dBs, CUDA_R_32F, lda, 0, dBs, CUDA_R_32F, ldb, sb,
                                           &zero, dCs16, CUDA_R_16BF, ldc, sc, batches, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
                    CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasGemmStridedBatchedEx: fp32 operands with a bf16 C are not supported here");
      cudaDeviceReset();
    }
    cublasDestroy(h);
  }
  {  // the counts `bench --count` prints, and the dry run that counts without running
    const emu::Counts& n = emu::counts();
    ck.expect(n.device_bytes == 0 && n.launches.empty(), "counts: cudaDeviceReset clears them (%zu device bytes)", n.device_bytes);
    unsigned* a = device<unsigned>(1000);
    float* b = device<float>(500);
    ck.expect(n.device_bytes == 6000 && n.peak_device_bytes == 6000, "counts: 6000 device bytes allocated (%zu, peak %zu)", n.device_bytes,
              n.peak_device_bytes);
    cudaFree(a);
    emu::reset_counts();
    ck.expect(n.device_bytes == 2000 && n.peak_device_bytes == 2000, "counts: a reset starts the peak at what is allocated (%zu, peak %zu)",
              n.device_bytes, n.peak_device_bytes);
    unsigned* c = device<unsigned>(24 * 12);
    cudaFree(c);
    ck.expect(n.device_bytes == 2000 && n.peak_device_bytes == 2000 + 24 * 12 * 4, "counts: the peak outlives a cudaFree (%zu, peak %zu)",
              n.device_bytes, n.peak_device_bytes);
    c = device<unsigned>(24 * 12);
    RUN(index_kernel, dim3(3, 2, 2), dim3(4, 3, 2), 0, c);
    RUN(index_kernel, dim3(3, 2, 2), dim3(4, 3, 2), 0, c);
    RUN(nothing_kernel, 1, 1025, 0, b);  // refused: not a launch
    cudaGetLastError();
    RUN(nothing_kernel, 1, 32, 0, b);
    std::vector<float> h(500, 1.f);
    cudaMemcpy(b, h.data(), 2000, cudaMemcpyHostToDevice);
    cudaMemcpyAsync(b + 100, b, 400, cudaMemcpyDeviceToDevice);
    cudaMemcpy(h.data(), b, 2000, cudaMemcpyDeviceToHost);
    cudaMemcpy(h.data(), b, 2000, cudaMemcpyDeviceToHost);
    cudaMemset(b, 0, 8);
    cublasHandle_t blas;
    cublasCreate(&blas);
    const float one = 1, zero = 0;
    cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, b, 4, b, 2, &zero, b + 100, 4);
    cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, b, 3, b, 2, &zero, b + 100, 4);  // refused: lda < m
    cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, b, 4, 8, b, 2, 6, &zero, b + 100, 4, 12, 3);
    cublasGemmStridedBatchedEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, b, CUDA_R_32F, 4, 0, b, CUDA_R_32F, 2, 6, &zero, b + 100,
                               CUDA_R_32F, 4, 12, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    const auto count = [&](const std::map<std::string, size_t>& m, const char* k) { return m.count(k) ? m.at(k) : 0; };
    ck.expect(count(n.launches, "index_kernel") == 2 && count(n.launches, "nothing_kernel") == 1 && n.launches.size() == 2,
              "counts: 2 + 1 launches, the refused one left out (%zu index_kernel, %zu nothing_kernel)", count(n.launches, "index_kernel"),
              count(n.launches, "nothing_kernel"));
    ck.expect(n.to_device == 1 && n.on_device == 1 && n.to_host == 2 && n.memsets == 1,
              "counts: copies by direction and memsets (to device %zu, on device %zu, to host %zu, memsets %zu)", n.to_device, n.on_device,
              n.to_host, n.memsets);
    ck.expect(count(n.blas_calls, "cublasSgemm") == 1 && count(n.blas_calls, "cublasSgemmStridedBatched") == 1 &&
                  count(n.blas_calls, "cublasGemmStridedBatchedEx") == 1,
              "counts: a cuBLAS call is one, however many products; a refused one is none (%zu cublasSgemm, %zu and %zu strided)",
              count(n.blas_calls, "cublasSgemm"), count(n.blas_calls, "cublasSgemmStridedBatched"),
              count(n.blas_calls, "cublasGemmStridedBatchedEx"));
    const std::vector<unsigned> before = download(c, 24 * 12);
    cudaMemset(c, 0xFF, 24 * 12 * 4);
    const std::vector<float> product = download(b + 100, 12);
    emu::state().dry_run = true;
    RUN(index_kernel, dim3(3, 2, 2), dim3(4, 3, 2), 0, c);
    cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 2, &one, b + 8, 4, b, 2, &zero, b + 100, 4);
    emu::state().dry_run = false;
    const std::vector<unsigned> after = download(c, 24 * 12);
    ck.expect(before[5] == 5 && after[5] == 0xFFFFFFFFu && download(b + 100, 12) == product && count(n.launches, "index_kernel") == 3 &&
                  count(n.blas_calls, "cublasSgemm") == 2,
              "counts: a dry run counts a launch and a product without running them (index 5 is %u, was %u)", after[5], before[5]);
    cublasDestroy(blas);
    cudaFree(b), cudaFree(c);
    cudaDeviceReset();
  }
  {  // stream capture and graph replay
    cudaStream_t st;
    cudaStreamCreate(&st);
    cublasHandle_t blas;
    cublasCreate(&blas);
    cublasSetStream(blas, st);
    float *x = device<float>(6), *y = device<float>(6), *a = device<float>(1), *c = device<float>(4), *pinned = nullptr;
    cudaMallocHost(&pinned, 6 * sizeof(float));
    const std::vector<float> ones(6, 1.f);
    for (int i = 0; i < 6; ++i) pinned[i] = (float)(i + 1);
    cudaMemcpy(x, ones.data(), 6 * sizeof(float), cudaMemcpyHostToDevice);
    const float zero = 0, one = 1, half = 0.5f;
    float coefficient = 2;
    emu::reset_counts();
    // the work: x = pinned; y = 0; y += (coefficient + *a) x; c (2x2) = 0.5 * x(2x3) x(3x2)
    ck.expect(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture: begins on a created stream");
    cudaStreamCaptureStatus status;
    cudaStreamIsCapturing(st, &status);
    ck.expect(status == cudaStreamCaptureStatusActive, "capture: the stream reports it is capturing");
    cudaMemcpyAsync(x, pinned, 6 * sizeof(float), cudaMemcpyHostToDevice, st);
    cudaMemsetAsync(y, 0, 6 * sizeof(float), st);
    emu::launch("axpy_kernel", axpy_kernel, dim3(1), dim3(4), 0, st, y, x, (const float*)a, coefficient, 6);
    ck.expect(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &half, x, 2, x, 3, &zero, c, 2) == CUBLAS_STATUS_SUCCESS,
              "capture: cublasSgemm on the capturing stream is accepted");
    coefficient = 100;  // a kernel node keeps the argument it was captured with
    // (read straight from the emulated device memory: a cudaMemcpy here would break the capture)
    ck.expect(std::vector<float>(x, x + 6) == ones && std::isnan(y[0]) && emu::counts().launches.empty() && emu::counts().blas_calls.empty(),
              "capture: nothing runs while it is recorded (y[0] %g)", y[0]);
    cudaGraph_t graph;
    ck.expect(cudaStreamEndCapture(st, &graph) == cudaSuccess && graph && graph->nodes.size() == 4, "capture: ends with a graph of 4 nodes");
    cudaGraphExec_t exec;
    ck.expect(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "capture: the graph instantiates");
    double worst = 0;
    for (float on_device : {0.f, 3.f}) {  // memory is read at the replay: *a and the pinned input change between them
      cudaMemcpy(a, &on_device, sizeof(float), cudaMemcpyHostToDevice);
      for (int i = 0; i < 6; ++i) pinned[i] = (float)(i + 1) + on_device;
      ck.expect(cudaGraphLaunch(exec, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess, "capture: the graph launches");
      const std::vector<float> hy = download(y, 6), hc = download(c, 4);
      for (int i = 0; i < 6; ++i) worst = std::max(worst, (double)std::fabs(hy[i] - (2 + on_device) * pinned[i]));
      for (int i = 0; i < 2; ++i)  // column-major: c(i, j) = 0.5 sum_l x(i, l) x(l, j), x as 2x3 (ld 2) and 3x2 (ld 3)
        for (int j = 0; j < 2; ++j) {
          double want = 0;
          for (int l = 0; l < 3; ++l) want += 0.5 * pinned[l * 2 + i] * pinned[j * 3 + l];
          worst = std::max(worst, std::fabs(hc[j * 2 + i] - want));
        }
    }
    ck.expect(worst == 0, "capture: each replay computes from the memory of its time and the arguments of the capture (worst error %g)", worst);
    const emu::Counts& n = emu::counts();
    ck.expect(n.graph_launches == 2 && n.graph_nodes == 8 && n.graph_kernels == 2 && n.launches.at("axpy_kernel") == 2 &&
                  n.blas_calls.at("cublasSgemm") == 2 && n.memsets == 2,
              "capture: counts: 2 graph launches of 4 nodes, each node counted as the work it runs (%zu launches, %zu nodes)",
              n.graph_launches, n.graph_nodes);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
    // what a capture refuses: each call fails, and the capture ends invalidated, with no graph
    const auto refused = [&](const char* what, cudaError_t expected, auto call) {
      cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
      const int e = (int)call();
      cudaGraph_t g = nullptr;
      const cudaError_t end = cudaStreamEndCapture(st, &g);
      ck.expect(e == (int)expected && end == cudaErrorStreamCaptureInvalidated && !g,
                "capture: %s is refused (%d, expected %d) and invalidates the capture (%s)", what, e, (int)expected, cudaGetErrorName(end));
      cudaGetLastError();
    };
    void* p = nullptr;
    float h[6];
    refused("cudaMalloc", cudaErrorStreamCaptureUnsupported, [&] { return cudaMalloc(&p, 16); });
    refused("cudaFree", cudaErrorStreamCaptureUnsupported, [&] { return cudaFree(c); });
    refused("cudaMemcpy", cudaErrorStreamCaptureUnsupported, [&] { return cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost); });
    refused("cudaMemset", cudaErrorStreamCaptureUnsupported, [&] { return cudaMemset(y, 0, 8); });
    refused("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, [&] { return cudaStreamSynchronize(st); });
    refused("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported, [&] { return cudaDeviceSynchronize(); });
    refused("cudaMemcpyAsync on the legacy stream", cudaErrorStreamCaptureImplicit,
            [&] { return cudaMemcpyAsync(y, x, 8, cudaMemcpyDeviceToDevice, nullptr); });
    refused("a launch on the legacy stream", cudaErrorStreamCaptureImplicit, [&] {
      emu::launch("nothing_kernel", nothing_kernel, dim3(1), dim3(4), 0, nullptr, y);
      return cudaGetLastError();
    });
    cublasHandle_t legacy;
    cublasCreate(&legacy);
    refused("cuBLAS on a handle left on the legacy stream", (cudaError_t)CUBLAS_STATUS_EXECUTION_FAILED,
            [&] { return cublasSgemm(legacy, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, x, 2, x, 3, &zero, c, 2); });
    cublasDestroy(legacy);
    ck.expect(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported,
              "capture: the legacy default stream cannot be captured");
    ck.expect(cudaMemcpy(h, x, sizeof h, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] == 4, "capture: after the refusals the stream works (x[0] %g)", h[0]);
    cublasDestroy(blas);
    cudaFreeHost(pinned);
    cudaStreamDestroy(st);
    cudaDeviceReset();
  }
  {  // a branch: a stream forked from another by an event, its work run as late as the joins let it
    cudaStream_t main_st, side;
    cudaStreamCreate(&main_st), cudaStreamCreate(&side);
    cublasHandle_t blas;
    cublasCreate(&blas);
    cublasSetStream(blas, side);
    cudaEvent_t fork, done;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaEventCreateWithFlags(&done, cudaEventDisableTiming);
    float *x = device<float>(4), *c = device<float>(4), *c2 = device<float>(4);
    const float zero = 0, one = 1;
    const std::vector<float> xs = {1, 2, 3, 4};
    const auto reset = [&] {
      cudaMemcpy(x, xs.data(), 4 * sizeof(float), cudaMemcpyHostToDevice);
      cudaMemset(c, 0, 4 * sizeof(float)), cudaMemset(c2, 0, 4 * sizeof(float));
    };
    // c = x x (2x2, column-major: c = {7, 10, 15, 22}); c2 = c x, which reads what the product before it writes
    const auto products = [&] {
      cudaEventRecord(fork, main_st);
      cudaStreamWaitEvent(side, fork, 0);
      cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, x, 2, x, 2, &zero, c, 2);
      cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, c, 2, x, 2, &zero, c2, 2);
      cudaEventRecord(done, side);
    };
    const std::vector<float> want_c = {7, 10, 15, 22}, want_c2 = {37, 54, 81, 118};
    reset();
    products();
    ck.expect(std::vector<float>(c, c + 4) == std::vector<float>(4, 0.f), "branch: its products wait for their join (c[0] %g)", c[0]);
    cudaStreamWaitEvent(main_st, done, 0);
    ck.expect(std::vector<float>(c, c + 4) == want_c && std::vector<float>(c2, c2 + 4) == want_c2 && cudaGetLastError() == cudaSuccess,
              "branch: the join runs them, in order (c2 reads c as the first product wrote it: c2[0] %g)", c2[0]);
    reset();
    products();
    ck.expect(cudaDeviceSynchronize() == cudaSuccess && std::vector<float>(c2, c2 + 4) == want_c2, "branch: a synchronisation runs them too");
    // the finding: work of the main stream writes an operand of the branch's product before the join
    reset();
    products();
    cudaMemsetAsync(x, 0, sizeof(float), main_st);
    cudaStreamWaitEvent(main_st, done, 0);
    ck.expect(cudaGetLastError() == cudaErrorLaunchFailure && std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("its A changed") != std::string::npos,
              "branch: a product whose operand the main stream wrote before the join is an error: %s", cudaGetErrorString(cudaErrorLaunchFailure));
    cudaDeviceReset();  // (clears the sticky error, and the allocations)
    x = device<float>(4), c = device<float>(4), c2 = device<float>(4);
    cublasSetStream(blas, side);
    // under a capture: the branch joins it, its nodes placed at the join; the finding at the replay
    const auto captured = [&](bool write_x, bool join) {
      cudaGraph_t g = nullptr;
      cudaStreamBeginCapture(main_st, cudaStreamCaptureModeGlobal);
      products();
      if (write_x) cudaMemsetAsync(x, 0, sizeof(float), main_st);
      if (join) cudaStreamWaitEvent(main_st, done, 0);
      const cudaError_t e = cudaStreamEndCapture(main_st, &g);
      return std::make_pair(e, g);
    };
    reset();
    emu::reset_counts();
    auto [e, g] = captured(false, true);
    cudaGraphExec_t exec = nullptr;
    ck.expect(e == cudaSuccess && g && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess && cudaGraphLaunch(exec, main_st) == cudaSuccess &&
                  cudaStreamSynchronize(main_st) == cudaSuccess && std::vector<float>(c2, c2 + 4) == want_c2,
              "branch: captured, joined, replayed (c2[0] %g)", c2[0]);
    ck.expect(emu::counts().graph_nodes == 2 && emu::counts().on_branches == 2, "branch: the replay ran 2 nodes, both the branch's (%zu, %zu)",
              emu::counts().graph_nodes, emu::counts().on_branches);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(g);
    std::tie(e, g) = captured(false, false);
    ck.expect(e == cudaErrorStreamCaptureUnjoined && !g, "branch: a capture that ends with the branch not joined fails (%s)", cudaGetErrorName(e));
    cudaGetLastError();
    reset();
    std::tie(e, g) = captured(true, true);
    ck.expect(e == cudaSuccess && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess && cudaGraphLaunch(exec, main_st) == cudaErrorLaunchFailure,
              "branch: a replay in which the main stream writes a branch product's operand before the join fails");
    cudaGraphExecDestroy(exec), cudaGraphDestroy(g);
    cudaDeviceReset();
    x = device<float>(4), c = device<float>(4), c2 = device<float>(4);
    reset();
    // a product of the branch issued after more work of the main stream than its fork waited for: refused
    products();
    cudaMemsetAsync(c, 0, sizeof(float), main_st);
    cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, x, 2, x, 2, &zero, c, 2);
    ck.expect(cudaStreamWaitEvent(main_st, done, 0) == cudaErrorLaunchFailure &&
                  std::string(cudaGetErrorString(cudaErrorLaunchFailure)).find("than its fork waited for") != std::string::npos,
              "branch: a call issued after the main stream's work since the fork is an error: %s", cudaGetErrorString(cudaErrorLaunchFailure));
    cudaDeviceReset();
    x = device<float>(4), c = device<float>(4), c2 = device<float>(4);
    reset();
    // a stream that has run work of its own is not forked by a wait: its work still runs at once
    cudaStream_t other;
    cudaStreamCreate(&other);
    cudaMemsetAsync(c, 0, sizeof(float), other);
    cudaEventRecord(fork, main_st);
    cudaStreamWaitEvent(other, fork, 0);
    cudaMemcpyAsync(c, x, sizeof(float), cudaMemcpyDeviceToDevice, other);
    ck.expect(c[0] == 1, "branch: a wait does not fork a stream that has run work (c[0] %g)", c[0]);
    cudaStreamDestroy(other);
    // a branch's work from before a capture runs when the capture forks it, and is not the graph's
    products();
    cudaStreamBeginCapture(main_st, cudaStreamCaptureModeGlobal);
    cudaEventRecord(fork, main_st);
    cudaStreamWaitEvent(side, fork, 0);
    ck.expect(std::vector<float>(c2, c2 + 4) == want_c2, "branch: its work from before a capture runs when the capture forks it");
    cudaEventRecord(done, side);
    cudaStreamWaitEvent(main_st, done, 0);
    e = cudaStreamEndCapture(main_st, &g);
    ck.expect(e == cudaSuccess && g && g->nodes.empty(), "branch: and is not the graph's (%s, %zu nodes)", cudaGetErrorName(e),
              g ? g->nodes.size() : 0);
    cudaGraphDestroy(g);
    // a captured stream waits only on an event of the capture: another is refused and invalidates the capture
    const auto refused_in_capture = [&](cudaEvent_t event) {
      cudaStreamBeginCapture(main_st, cudaStreamCaptureModeGlobal);
      e = cudaStreamWaitEvent(main_st, event, 0);
      const bool refused = e == cudaErrorStreamCaptureIsolation && cudaStreamEndCapture(main_st, &g) == cudaErrorStreamCaptureInvalidated && !g;
      cudaGetLastError();
      return refused;
    };
    cudaEventRecord(done, side);
    bool refused = refused_in_capture(done);
    ck.expect(refused, "branch: a captured stream waiting on an event recorded outside the capture fails (%s), and invalidates it",
              cudaGetErrorName(e));
    // an event recorded in a capture that has ended stands for nodes of its graph: no stream waits on it,
    // outside a capture or in another
    cudaStreamBeginCapture(main_st, cudaStreamCaptureModeGlobal);
    cudaEventRecord(fork, main_st);
    cudaStreamWaitEvent(side, fork, 0);
    cudaEventRecord(done, side);
    cudaStreamWaitEvent(main_st, done, 0);
    e = cudaStreamEndCapture(main_st, &g);
    ck.expect(e == cudaSuccess && g, "branch: a capture with a fork and its join (%s)", cudaGetErrorName(e));
    cudaGraphDestroy(g);
    e = cudaStreamWaitEvent(main_st, done, 0);
    ck.expect(e == cudaErrorStreamCaptureIsolation, "branch: a stream waiting on an event of a capture that has ended fails (%s)",
              cudaGetErrorName(e));
    cudaGetLastError();
    e = cudaStreamWaitEvent(main_st, fork, 0);
    ck.expect(e == cudaErrorStreamCaptureIsolation, "branch: so does its wait on its own event of that capture (%s)", cudaGetErrorName(e));
    cudaGetLastError();
    refused = refused_in_capture(done);
    ck.expect(refused, "branch: a captured stream waiting on an event of an earlier capture fails (%s), and invalidates it",
              cudaGetErrorName(e));
    // an injected cuBLAS failure invalidates the capture it is issued into
    cudaStreamBeginCapture(main_st, cudaStreamCaptureModeGlobal);
    cublasSetStream(blas, main_st);
    emu::fail_blas_call(1);
    const cublasStatus_t failed = cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, x, 2, x, 2, &zero, c, 2);
    e = cudaStreamEndCapture(main_st, &g);
    ck.expect(failed == CUBLAS_STATUS_EXECUTION_FAILED && e == cudaErrorStreamCaptureInvalidated && !g,
              "fail_blas_call: a captured call that fails invalidates the capture (%d, %s)", failed, cudaGetErrorName(e));
    cudaGetLastError();
    cublasDestroy(blas);
    cudaEventDestroy(fork), cudaEventDestroy(done);
    cudaStreamDestroy(main_st), cudaStreamDestroy(side);
    cudaDeviceReset();
  }
  return ck.finish();
}
