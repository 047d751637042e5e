// gpu/decoding.cuh: §6 decoding's own operations (cpu::log_softmax, cpu::copy_rows); the search
// itself is decoding.cuh's, run here through GpuOps.
// Part of the GPU path (gpu/model.cuh includes it), compiled within transformer.cu's translation unit.
#pragma once

namespace gpu {

// ---- §6 decoding's own operations --------------------------------------------------------------------
// One block per row; the sum of exponentials in double, as on the CPU.
__global__ void log_softmax_kernel(float* out, const float* logits, int V) {
  __shared__ float red[kRowWarps];
  __shared__ double dred[kRowWarps];
  const float* z = logits + (size_t)blockIdx.x * V;
  float* o = out + (size_t)blockIdx.x * V;
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = block_max(mx, red);
  double s = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) s += expf(z[v] - mx);  // as the CPU: exp in float, summed in double
  s = block_sum(s, dred);
  const double lse = mx + log(s);
  for (int v = threadIdx.x; v < V; v += blockDim.x) o[v] = (float)((double)z[v] - lse);
}
void log_softmax(float* out, const float* logits, int M, int V) {
  if (M == 0) return;
  LAUNCH(log_softmax_kernel, M, row_threads(V), 0, out, logits, V);
}

__global__ void copy_rows_kernel(float* dst, size_t dst_stride, const float* src, size_t src_stride, const int* index,
                                 size_t width, size_t n) {
  GRID_STRIDE(i, n) {
    const size_t r = i / width, c = i % width;
    dst[r * dst_stride + c] = src[(size_t)(index ? index[r] : r) * src_stride + c];
  }
}
void copy_rows(float* dst, size_t dst_stride, const float* src, size_t src_stride, const int* index, int rows, size_t width) {
  const size_t n = (size_t)rows * width;
  if (n == 0) return;
  LAUNCH(copy_rows_kernel, blocks_for(n), 256, 0, dst, dst_stride, src, src_stride, index, width, n);
}

// n elements of device memory, zeroed, released with the object (decoding's caches).
template <typename T> class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : p(alloc_of<T>(n)) { CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p(std::exchange(o.p, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p, o.p);
    return *this;
  }
  ~DeviceBuffer() { cudaFree(p); }  // no throwing from here: an error is ignored
  T* data() const { return p; }

 private:
  T* p = nullptr;
};

}  // namespace gpu
