// cuda_emulator.h: a CUDA emulator for testing the GPU path (gpu/) on a machine without a GPU.
//
// The GPU path compiles either with nvcc against the CUDA runtime and cuBLAS, or with g++
// against this header (TRANSFORMER_EMULATED_GPU), from the same source; kernels launch through one macro.
// This is a test instrument, not a fast path: it runs each block's threads as fibers (glibc ucontext) on
// the calling thread, one block after another, and switches between a block's threads only where CUDA
// makes them meet (__syncthreads, the warp collectives). What it checks along the way:
//   - __syncthreads is a barrier over the block's threads: reached by only some of them (others returned,
//     or wait at another __syncthreads), it is an error naming the kernel, the block and the lines;
//   - a warp collective (__shfl_*_sync, __ballot_sync, __syncwarp) is a step over the lanes of its mask:
//     every lane named must reach the same collective with the same mask, and a lane may only read from a
//     lane of the mask;
//   - threads that wait on each other forever (a deadlock) are reported, never hung; a kernel still
//     running after CUDA_EMULATOR_TIMEOUT seconds of CPU time (default 300: a spin-wait on another block)
//     is too (CPU time, not wall time: on a loaded machine a kernel that runs slowly is not cut short);
//   - launches are refused as CUDA refuses them (cudaErrorInvalidConfiguration for more than 1024
//     threads or a zero grid, cudaErrorInvalidValue for dynamic shared memory over 48 KiB unless raised
//     with cudaFuncSetAttribute);
//   - the tensor cores' wmma (TF32, m16n16k8): a fragment spread over the lanes, load, store and mma as warp
//     collectives that every lane reaches with the same pointer (32-byte aligned) and ldm (a multiple of 4);
//   - cuBLAS (cublasSgemm, cublasSgemmStridedBatched, cublasGemmEx and cublasGemmStridedBatchedEx on fp32 or
//     bf16 operands) computes by cpu::gemm with cuBLAS's argument checks; TF32 math rounds fp32 operands as
//     the tensor cores do; a test of error paths can make one call fail (fail_blas_call);
//   - device allocations are separate host allocations filled with NaN bytes (AddressSanitizer sees an
//     access past their end; a read of memory nothing wrote shows as NaN); copies must stay inside them;
//   - streams run their work at once, unless one is being captured: its launches, async copies, memsets
//     and cuBLAS calls become a graph's nodes, replayed by cudaGraphLaunch; an allocation, a synchronising
//     call or work on the legacy stream during a capture fails and invalidates it, as CUDA's global mode does;
//   - a stream forked from another (a branch: before any work of its own, it waited on an event that a
//     stream not itself a branch recorded) runs its work as late as the program lets it: when a stream waits
//     on an event the branch recorded after that work (a join), or at a synchronising call; under a capture
//     it joins the capture, its nodes placed at their join, and a capture that ends with a branch's work not
//     joined fails, as CUDA's does (so does a captured stream's wait on an event from outside the capture,
//     and any stream's wait on an event recorded in a capture that has ended: the event stands for nodes of
//     that capture's graph, not for work that ran).
//     A cuBLAS call on a branch checks, when it runs, that its operands (A, B and C) hold the bytes they held
//     when it was issued: other work that wrote them in between is a missing join, an error; and work of a
//     branch issued after more work of the stream it was forked from than its fork waited for is an error
//     (on a GPU it may run before that work: a missing fork), stricter than CUDA;
// The order in which a block's threads run between two meeting points, and the order of the blocks, is
// set by CUDA_EMULATOR_ORDER: inorder (default), reverse, or shuffle (reshuffled at every meeting point,
// seeded by CUDA_EMULATOR_SEED): a missing __syncthreads or a race on shared memory gives another result
// under another order. A warp whose collective completes goes on at once, before the threads after it in
// the order, so a warp runs ahead of the others between two __syncthreads: a race between warps that
// only a __syncwarp "orders" shows too. An execution error is sticky as on a GPU: every later call returns
// cudaErrorLaunchFailure, and cudaGetErrorString gives the emulator's one-line finding.
// CUDA_EMULATOR_DRY_RUN=1 checks and counts launches and cuBLAS calls (emu::counts()) without running them:
// what a step asks of the GPU at full size in seconds (copies and memsets still run; results are garbage).
// What it cannot show (NOTES.md, "The emulated GPU"): timing, occupancy, code that relies on a warp's
// lockstep without a sync, races between blocks, memory ordering, nvcc's FMA contraction and fast math.
#pragma once

#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../transformer.h"  // cpu::gemm computes cuBLAS's products

#if defined(__SANITIZE_ADDRESS__)
#define CUDA_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDA_EMULATOR_ASAN 1
#endif
#endif

// ---- the language: qualifiers, built-in variables, intrinsics ----------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Static shared memory: one copy per kernel, which each block in turn uses (blocks run one at a time).
#define __shared__ static

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
constexpr int warpSize = 32;

inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline bool signbit(float x) { return std::signbit(x); }  // CUDA's, in device code: whether the sign bit is set (-0 too)
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }

// float4 (vector_types.h): four floats, 16-byte aligned, as one 16-byte load reads them.
struct alignas(16) float4 {
  float x, y, z, w;
};

// bfloat16 (cuda_bf16.h): a float's sign, its 8 exponent bits and the top 7 of its mantissa.
struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16(float f) {  // to nearest, ties to even; a NaN stays a (quiet) NaN
  uint32_t b;
  std::memcpy(&b, &f, 4);
  if ((b & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((b >> 16) | 0x40u)};
  b += 0x7fffu + ((b >> 16) & 1u);
  return {(uint16_t)(b >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t b = (uint32_t)h.bits << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// ---- the runtime API's types -----------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorLaunchFailure = 719,
  cudaErrorStreamCaptureUnsupported = 900,
  cudaErrorStreamCaptureInvalidated = 901,
  cudaErrorStreamCaptureUnjoined = 904,
  cudaErrorStreamCaptureIsolation = 905,
  cudaErrorStreamCaptureImplicit = 906,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct CUstream_st {};
using cudaStream_t = CUstream_st*;
// an event: the stream that recorded it last, that stream's work before it (a count), and the capture it
// was recorded in (by a stream captured then: the capture's number, from 1; 0 for none)
struct CUevent_st {
  cudaStream_t stream = nullptr;
  unsigned long long position = 0;
  bool recorded = false;
  unsigned long long capture = 0;
};
using cudaEvent_t = CUevent_st*;
constexpr unsigned cudaEventDefault = 0, cudaEventDisableTiming = 2;
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1, cudaStreamCaptureModeRelaxed = 2 };
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1, cudaStreamCaptureStatusInvalidated = 2 };
// A graph is the work a capture recorded, in order (a capture on one stream is a chain of nodes; a
// branch's nodes are placed at their join); its executable form is a copy of it. A node that is not counted
// is the emulator's own: it notes a branch's operands at the place the branch's node was issued.
struct EmuNode {
  std::function<void()> run;
  bool counted = true;
};
struct CUgraph_st {
  std::vector<EmuNode> nodes;
};
struct CUgraphExec_st {
  std::vector<EmuNode> nodes;
};
using cudaGraph_t = CUgraph_st*;
using cudaGraphExec_t = CUgraphExec_st*;
struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin;
  int maxThreadsPerBlock, warpSize, major, minor, multiProcessorCount;
};

// ---- fibers ---------------------------------------------------------------------------------------------
// A fiber's context. On x86-64 a switch saves the callee-saved registers on the stack it leaves and loads
// them from the one it enters: glibc's swapcontext also saves the signal mask, a system call that made it
// 80% of the emulator's time. The floating-point control words (MXCSR, the x87 control word) are not
// switched: every fiber runs kernels, which never change the rounding or exception modes, so all of them
// share the calling thread's. Storing and loading the two words took 80% of a switch's samples (perf), and
// 5 bf16 steps of the tiny model on the number corpus (`make EMU=1`) took 32 s with them, 27 s without
// (AddressSanitizer's fiber switches dominate build/emu's tests, which did not change). Elsewhere (or with CUDA_EMULATOR_UCONTEXT defined) the fibers are
// glibc's ucontext.
#if defined(__x86_64__) && !defined(CUDA_EMULATOR_UCONTEXT)
// switch_stack(save, load): *save = the stack pointer after pushing, then pop from load and return there.
// A local symbol, so that each translation unit that includes this header has its own copy.
asm(R"(
  .text
  .type emu_switch_stack, @function
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");
extern "C" void emu_switch_stack(void** save, void* load);
namespace emu {
struct Context {
  void* sp = nullptr;
};
// A context that starts entry() on the stack [stack, stack + size), laid out as emu_switch_stack pops it.
inline void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  void** sp = (void**)((uintptr_t)(stack + size) & ~(uintptr_t)15);
  *--sp = nullptr;         // entry's return address: it never returns
  *--sp = (void*)entry;    // where the first switch returns to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp, rbx, r12-r15
  c.sp = sp;
}
inline void swap_context(Context& from, Context& to) { emu_switch_stack(&from.sp, to.sp); }
}  // namespace emu
#else
namespace emu {
struct Context {
  ucontext_t uc;
};
inline void make_context(Context& c, char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void swap_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
}  // namespace emu
#endif

namespace emu {

constexpr size_t kSharedDefault = 48 * 1024, kSharedOptin = 227 * 1024;  // an H100's limits per block
constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackBytes = 64 * 1024;  // per emulated thread; kernels' frames are small

enum class Order { inorder, reverse, shuffle };
enum class Wait { running, barrier, warp, exited };
enum class Collective { shfl, shfl_xor, shfl_down, ballot, syncwarp, wmma_load, wmma_store, wmma_mma };
inline const char* collective_name(Collective c) {
  static const char* names[] = {"__shfl_sync", "__shfl_xor_sync", "__shfl_down_sync", "__ballot_sync", "__syncwarp",
                                "wmma::load_matrix_sync", "wmma::store_matrix_sync", "wmma::mma_sync"};
  return names[(int)c];
}

// One emulated thread: its fiber, its index, and what it waits for.
struct Thread {
  uint3 idx;
  size_t fiber = 0;  // the fiber it runs on, once started
  unsigned lane, warp;
  Wait wait = Wait::running;
  int line = 0;  // the line of the __syncthreads or collective it waits at
  Collective kind = Collective::syncwarp;
  unsigned mask = 0;
  uint64_t value = 0, result = 0;  // a collective's operand and its outcome
  int arg = 0, width = 32;
  // wmma::mma_sync: the lane's fragments d, a, b, c, and what computes d over the warp's lanes when all are there
  void* mma_fragments[4] = {};
  void (*mma)(Thread* lanes) = nullptr;
  // its asynchronous copies (__pipeline_memcpy_async) not yet done: groups committed, oldest first, then
  // the copies after the last commit; a copy is done only when a wait covers its group
  struct Copy { void* to; const void* from; size_t bytes; };
  std::vector<std::vector<Copy>> copy_groups;
  std::vector<Copy> uncommitted;
};

// What the host asked of the device since the last reset_counts(): `bench --count` prints it per training
// step. Device bytes are those allocated now, and the most allocated at once since the reset.
// Work a graph replays counts as if the host had asked for it, and graph_nodes counts it again: the host's
// own calls are the total less graph_nodes, plus graph_launches.
struct Counts {
  std::map<std::string, size_t> launches, blas_calls;  // per kernel, per cuBLAS function
  size_t to_device = 0, to_host = 0, on_device = 0, memsets = 0;  // cudaMemcpy(Async) by direction, cudaMemset(Async)
  size_t device_bytes = 0, peak_device_bytes = 0;
  size_t graph_launches = 0, graph_nodes = 0, graph_kernels = 0;  // cudaGraphLaunch calls, the nodes they ran, the kernels among them
  size_t on_branches = 0;  // work that ran on a branch (a stream forked from another), replayed or not
};

// A span of device memory that a call reads or writes (a cuBLAS call's A, B and C).
struct Span {
  const char* name;
  const void* p;
  size_t bytes;
  bool written;
};

struct State {
  // the launch in progress
  const char* kernel = "";
  uint3 block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
  std::vector<Thread> threads;
  std::vector<unsigned> at_collective;  // per warp: its lanes waiting at a warp collective
  std::vector<unsigned> place_in_order;  // run_released's: each thread's place in the visiting order
  // run_released's pass: its order, the place in it reached, the thread last gone on with, whether one is on
  const std::vector<unsigned>* pass_order = nullptr;
  size_t pass_k = 0;
  Thread* pass_thread = nullptr;
  bool in_pass = false;
  Thread* current = nullptr;
  std::vector<unsigned> start_order;  // the order in which the block's threads start
  size_t started = 0;                 // how many have
  std::vector<Context> fibers = std::vector<Context>(kMaxThreads);  // one per stack, never moved (a ucontext points into itself)
  size_t fibers_used = 0;
  Context scheduler;
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  unsigned char* dynamic_shared = nullptr;
  std::string failure;  // the first finding of this block, empty while none
  // fibers' stacks, mapped once and reused, each above a guard page
  std::vector<char*> stacks;
  const void* scheduler_stack = nullptr;  // the scheduler's stack, as AddressSanitizer's fiber switches need it
  size_t scheduler_stack_size = 0;
  // the device
  std::map<uintptr_t, size_t> device_allocations, pinned_allocations;
  std::map<const void*, size_t> shared_limit;  // raised with cudaFuncSetAttribute
  cudaError_t last_error = cudaSuccess, sticky_error = cudaSuccess;
  std::string sticky_detail;
  std::map<cudaError_t, std::string> detail_of;  // the last finding behind each error, for cudaGetErrorString
  Counts counts;
  Order order = Order::inorder;
  std::mt19937_64 rng;
  unsigned timeout = 300;
  bool dry_run = false;
  unsigned blas_failure_in = 0;  // cuBLAS calls left until the one that fails, counting it (fail_blas_call); 0: none
  // stream capture (cudaStreamBeginCapture): the stream whose work is recorded, not run; the nodes so far;
  // and why the capture is invalidated (empty while it is valid)
  cudaStream_t capturing = nullptr;
  unsigned long long captures = 0;  // captures begun so far (the one on is the last)
  std::vector<EmuNode> captured;
  std::string capture_broken;
  bool replaying = false;  // inside cudaGraphLaunch
  // the branches (streams forked from another): each one's work issued so far (its count), the work that
  // waits for a join, whether the branch joined the capture that is on, and the stream it was last forked
  // from with that stream's work issued by then
  struct BranchWork {
    unsigned long long seq;
    std::function<void()> run;
    std::vector<Span> writes;  // what it writes, where it names it
    bool writes_unknown;       // it names nothing: it may write anything
  };
  struct Branch {
    unsigned long long issued = 0;
    std::vector<BranchWork> pending;
    bool captured = false;
    cudaStream_t origin = nullptr;
    unsigned long long forked_at = 0;
  };
  std::map<cudaStream_t, Branch> branches;
  std::map<cudaStream_t, unsigned long long> issued;  // work issued on each stream that is not a branch

  State() {
    const char* o = std::getenv("CUDA_EMULATOR_ORDER");
    const std::string name = o ? o : "inorder";
    if (name == "reverse") order = Order::reverse;
    else if (name == "shuffle") order = Order::shuffle;
    else if (name != "inorder") {
      std::fprintf(stderr, "cuda_emulator: CUDA_EMULATOR_ORDER=%s: expected inorder, reverse or shuffle\n", name.c_str());
      std::exit(2);
    }
    const char* seed = std::getenv("CUDA_EMULATOR_SEED");
    rng.seed(seed ? std::strtoull(seed, nullptr, 10) : 1);
    if (const char* t = std::getenv("CUDA_EMULATOR_TIMEOUT")) timeout = (unsigned)std::strtoul(t, nullptr, 10);
    const char* dry = std::getenv("CUDA_EMULATOR_DRY_RUN");
    dry_run = dry && std::string(dry) == "1";
  }
};
inline State& state() {
  static State s;
  return s;
}
inline Counts& counts() { return state().counts; }
// A test of error paths: the n-th cuBLAS call issued from now on (a strided-batched call counts once) fails
// at its issue with CUBLAS_STATUS_EXECUTION_FAILED, as a fault of the GPU would, and invalidates the capture
// it is issued into; the calls before and after it run. 0 cancels it.
inline void fail_blas_call(unsigned n) { state().blas_failure_in = n; }
inline void reset_counts() {
  Counts& c = counts();
  c = Counts{{}, {}, 0, 0, 0, 0, c.device_bytes, c.device_bytes, 0, 0, 0, 0};
}
inline const char* order_name() {
  static const char* names[] = {"inorder", "reverse", "shuffle"};
  return names[(int)state().order];
}

inline Thread& this_thread() { return *state().current; }

inline char* stack_of(size_t i) {
  State& s = state();
  while (s.stacks.size() <= i) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void* p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "cuda_emulator: cannot map a thread's stack\n");
      std::abort();
    }
    mprotect(p, page, PROT_NONE);  // an overflowing stack faults instead of writing over another
    s.stacks.push_back((char*)p + page);
  }
  return s.stacks[i];
}


// Switches from the scheduler into fiber f, until its thread waits or its threads have returned (from
// run_released: until the pass ends, its fibers switching to one another meanwhile).
// (AddressSanitizer is told of each switch between stacks; no fake stacks are kept, so stack use after
// return is not looked for on fibers.)
inline void switch_to_fiber(size_t f) {
  State& s = state();
#ifdef CUDA_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(nullptr, stack_of(f), kStackBytes);
#endif
  swap_context(s.scheduler, s.fibers[f]);
#ifdef CUDA_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  s.current = nullptr;
}

inline Thread* pass_next(State& s);
template <int = 0> __attribute__((noinline)) void pass_after_wait(State& s);

// Called by the running thread when it waits: returns when it may go on. Within run_released's pass the
// pass's next step is taken here and the next thread's fiber is switched to directly (where that is this
// thread, it goes on at once); otherwise, and at the pass's end, the scheduler is. It keeps no variable in
// memory, as fiber_main does not: the fibers whose threads have all returned stay suspended here, and
// AddressSanitizer would leave such a variable's frame poisoned under the next block's frames (the emulator's
// own test then fails).
inline void suspend() {
  State& s = state();
  if (s.in_pass) {
    pass_after_wait(s);
    if (Thread* next = pass_next(s)) {
      s.pass_thread = next;
      if (next == s.current) return;
      const size_t from = s.current->fiber;
      s.current = next;
#ifdef CUDA_EMULATOR_ASAN
      __sanitizer_start_switch_fiber(nullptr, s.stacks[next->fiber], kStackBytes);
#endif
      swap_context(s.fibers[from], s.fibers[next->fiber]);
#ifdef CUDA_EMULATOR_ASAN
      __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
      return;
    }
  }
#ifdef CUDA_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(nullptr, s.scheduler_stack, s.scheduler_stack_size);
#endif
  swap_context(s.fibers[s.current->fiber], s.scheduler);
#ifdef CUDA_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
}

inline std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
inline std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

// A fiber runs the next thread not yet started; when that thread returns without having waited, the same
// fiber runs the next one, so a block whose threads never meet needs one fiber, not one per thread.
inline void fiber_main() {
  State& s = state();
#ifdef CUDA_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &s.scheduler_stack, &s.scheduler_stack_size);
#endif
  const size_t f = s.fibers_used - 1;
  do {
    Thread& t = s.threads[s.start_order[s.started++]];
    t.fiber = f;
    s.current = &t;
    s.body(s.body_arg);
    if ((!t.copy_groups.empty() || !t.uncommitted.empty()) && s.failure.empty())
      s.failure = format("thread (%u,%u,%u) returned with asynchronous copies (__pipeline_memcpy_async) not waited for",
                         t.idx.x, t.idx.y, t.idx.z);
    s.current->wait = Wait::exited;
  } while (s.started < s.threads.size());
  suspend();  // never resumed
}

// Starts a fiber on the next unstarted thread: the first round of a block.
inline void start_fiber() {
  State& s = state();
  const size_t f = s.fibers_used++;
  // each fiber's frames start 448 bytes (7 cache lines) below the last one's, modulo 4 KiB: at the same offset
  // in every stack, 68 KiB apart, the frames of the 32 lanes of a warp fell into the same sets of the L1 cache
  make_context(s.fibers[f], stack_of(f), kStackBytes - (f * 448 % 4096), fiber_main);
  switch_to_fiber(f);
}

// ---- meeting points: __syncthreads and the warp collectives -------------------------------------------
inline void syncthreads(int line) {
  Thread& t = this_thread();
  t.wait = Wait::barrier, t.line = line;
  suspend();
}

template <typename T> uint64_t to_bits(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "a warp collective moves at most 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <typename T> T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

inline uint64_t collective(Collective kind, unsigned mask, uint64_t value, int arg, int width, int line) {
  Thread& t = this_thread();
  t.wait = Wait::warp, t.kind = kind, t.mask = mask, t.value = value, t.arg = arg, t.width = width, t.line = line;
  ++state().at_collective[t.warp];
  suspend();
  return t.result;
}

// The lane a collective of t reads from (t's own lane where CUDA returns the caller's value).
inline unsigned source_lane(const Thread& t) {
  const unsigned base = t.lane & ~(unsigned)(t.width - 1);
  switch (t.kind) {
    case Collective::shfl: return base + ((unsigned)t.arg & (t.width - 1));
    case Collective::shfl_xor: {
      const unsigned src = t.lane ^ (unsigned)t.arg;
      return src >= base + t.width ? t.lane : src;  // a later group's lane: the caller's own value
    }
    case Collective::shfl_down: return (t.lane - base) + (unsigned)t.arg >= (unsigned)t.width ? t.lane : t.lane + t.arg;
    default: return t.lane;
  }
}

// The number of lanes a mask names. (Not __builtin_popcount: without -mpopcnt, g++ calls libgcc for it, and
// this count, taken at every lane's arrival at a collective, cost 3% of an emulated training step.)
inline unsigned lanes_in(unsigned mask) {
  mask = mask - (mask >> 1 & 0x55555555u);
  mask = (mask & 0x33333333u) + (mask >> 2 & 0x33333333u);
  return ((mask + (mask >> 4)) & 0x0f0f0f0fu) * 0x01010101u >> 24;
}
// Completes the warp collective that t waits at, if every lane of its mask has arrived at it. Returns
// whether it did; a finding goes to state().failure.
inline bool complete_collective(const Thread& t) {
  State& s = state();
  const char* name = collective_name(t.kind);
  const unsigned base = t.warp * warpSize;
  if (!(t.mask >> t.lane & 1u)) {
    s.failure = format("%s at line %d: lane %u calls it with mask 0x%08x, which leaves the lane out", name, t.line, t.lane, t.mask);
    return false;
  }
  if (t.kind != Collective::ballot && t.kind != Collective::syncwarp &&
      (t.width < 1 || t.width > warpSize || (t.width & (t.width - 1)))) {
    s.failure = format("%s at line %d: width %d is not a power of 2 up to 32", name, t.line, t.width);
    return false;
  }
  bool ready = true;
  for (unsigned l = 0; l < (unsigned)warpSize; ++l) {
    if (!(t.mask >> l & 1u)) continue;
    if (base + l >= s.threads.size()) {
      s.failure = format("%s at line %d: mask 0x%08x names lane %u, which this block does not have", name, t.line, t.mask, l);
      return false;
    }
    const Thread& u = s.threads[base + l];
    if (u.wait == Wait::exited) {
      s.failure = format("%s at line %d: mask 0x%08x names lane %u, which has returned (a collective only some lanes reach)",
                         name, t.line, t.mask, l);
      return false;
    }
    ready = ready && u.wait == Wait::warp && u.kind == t.kind && u.mask == t.mask;
  }
  if (!ready) return false;
  const unsigned mask = t.mask;  // t's own fields change below
  if (t.kind >= Collective::wmma_load) {  // the warp's matrix operations: one pointer, one ldm, one function
    for (unsigned l = 0; l < (unsigned)warpSize; ++l) {
      const Thread& u = s.threads[base + l];
      if (u.value != t.value || u.arg != t.arg || u.mma != t.mma) {
        s.failure = format("%s at line %d: lane %u passes %s than lane %u (a warp's lanes pass the same)", name, t.line, l,
                           u.mma != t.mma ? "other fragment types" : u.arg != t.arg ? "another ldm" : "another pointer", t.lane);
        return false;
      }
    }
    if (t.kind == Collective::wmma_mma) t.mma(&s.threads[base]);
  }
  Thread* lanes = &s.threads[base];
  const unsigned warp = t.warp;
  if (t.kind == Collective::ballot) {
    uint64_t ballot = 0;
    for (unsigned l = 0; l < (unsigned)warpSize; ++l)
      if (mask >> l & 1u) ballot |= (uint64_t)(lanes[l].value != 0) << l;
    for (unsigned l = 0; l < (unsigned)warpSize; ++l)
      if (mask >> l & 1u) lanes[l].result = ballot;
  } else {
    for (unsigned l = 0; l < (unsigned)warpSize; ++l) {
      if (!(mask >> l & 1u)) continue;
      Thread& u = lanes[l];
      const unsigned src = source_lane(u);
      if (src != l && !(mask >> src & 1u)) {
        s.failure = format("%s at line %d: lane %u reads lane %u, which is not in the mask 0x%08x", name, u.line, u.lane, src, mask);
        return false;
      }
      u.result = lanes[src].value;
    }
  }
  for (unsigned l = 0; l < (unsigned)warpSize; ++l)
    if (mask >> l & 1u) lanes[l].wait = Wait::running;
  s.at_collective[warp] -= lanes_in(mask);
  return true;
}
// Whether as many of t's warp's lanes wait at a collective as t's mask names (then complete_collective
// may complete it): a count, where complete_collective reads every lane.
inline bool warp_may_meet(const Thread& t) {
  return t.wait == Wait::warp && state().at_collective[t.warp] >= lanes_in(t.mask);
}
// Completes every warp collective whose mask's lanes have all arrived at it. Returns whether one did;
// a finding goes to state().failure.
inline bool complete_collectives() {
  State& s = state();
  bool progress = false;
  for (const Thread& t : s.threads) {
    if (t.wait != Wait::warp) continue;
    if (complete_collective(t)) progress = true;
    else if (!s.failure.empty()) return false;
  }
  return progress;
}

// When every thread is waiting: releases a __syncthreads that all of them reached, or says why none can
// go on. Returns whether the block goes on.
inline bool release_barrier() {
  State& s = state();
  size_t exited = 0, at_barrier = 0;
  int line = -1;
  bool same_line = true;
  for (const Thread& t : s.threads) {
    exited += t.wait == Wait::exited;
    if (t.wait == Wait::barrier) {
      ++at_barrier;
      same_line = same_line && (line < 0 || t.line == line);
      line = t.line;
    }
  }
  const size_t live = s.threads.size() - exited;
  if (at_barrier == live && exited > 0) {
    s.failure = format("__syncthreads at line %d reached by %zu of the block's %zu threads; the other %zu returned", line,
                       at_barrier, s.threads.size(), exited);
    return false;
  }
  if (at_barrier == live && !same_line) {
    std::string lines;
    for (const Thread& t : s.threads)
      if (t.wait == Wait::barrier && lines.find(" " + std::to_string(t.line) + ",") == std::string::npos) lines += " " + std::to_string(t.line) + ",";
    lines.pop_back();
    s.failure = "threads wait at different __syncthreads (lines" + lines + "): a barrier only some threads reach";
    return false;
  }
  if (at_barrier == live) {
    for (Thread& t : s.threads) t.wait = Wait::running;
    return true;
  }
  // Some wait at a collective that cannot complete: a deadlock. Say where each group waits.
  std::map<std::string, size_t> where;
  for (const Thread& t : s.threads) {
    if (t.wait == Wait::barrier) ++where[format("__syncthreads at line %d", t.line)];
    if (t.wait == Wait::warp) ++where[format("%s at line %d (mask 0x%08x)", collective_name(t.kind), t.line, t.mask)];
  }
  std::string what;
  for (const auto& [w, n] : where) what += (what.empty() ? "" : ", ") + std::to_string(n) + " at " + w;
  s.failure = "deadlock: " + what + (exited ? ", " + std::to_string(exited) + " returned" : "");
  return false;
}

// Visits the indices 0..n-1 in the order CUDA_EMULATOR_ORDER asks for.
inline const std::vector<unsigned>& visiting_order(std::vector<unsigned>& order, size_t n) {
  State& s = state();
  order.resize(n);
  for (size_t i = 0; i < n; ++i) order[i] = (unsigned)(s.order == Order::reverse ? n - 1 - i : i);
  if (s.order == Order::shuffle) std::shuffle(order.begin(), order.end(), s.rng);
  return order;
}

// Runs the started threads that may go on, in the visiting order, each until it waits again. A warp whose
// collective completes goes on at once, before the threads after it in the order: between two
// __syncthreads a warp runs ahead of the others, as it may on a GPU, so that shared memory that only a
// __syncwarp orders between two warps shows a race (else every warp would write before any read). The pass
// goes from one thread's fiber straight to the next one's (suspend takes each step), not through the
// scheduler: half the switches (an emulated training step ran in 0.6 of the time).
inline void run_released(std::vector<unsigned>& order) {
  State& s = state();
  visiting_order(order, s.threads.size());
  std::vector<unsigned>& place = s.place_in_order;  // where each thread is in the order
  place.resize(order.size());
  for (size_t k = 0; k < order.size(); ++k) place[order[k]] = (unsigned)k;
  s.pass_order = &order, s.pass_k = 0;
  if (Thread* t = pass_next(s)) {
    s.in_pass = true, s.pass_thread = s.current = t;
    switch_to_fiber(t->fiber);  // back when the pass ends: from fiber to fiber (suspend) until then
    s.in_pass = false;
  }
}
// The pass's next thread that may go on, from pass_k on (waiting, returned, or not started: passed over),
// or null at the pass's end or a finding.
inline Thread* pass_next(State& s) {
  const std::vector<unsigned>& order = *s.pass_order;
  for (; s.pass_k < order.size() && s.failure.empty(); ++s.pass_k) {
    Thread& t = s.threads[order[s.pass_k]];
    if (t.wait == Wait::running && t.fiber != SIZE_MAX) return &t;
  }
  return nullptr;
}
// The pass's step after the thread it went on with (pass_thread) waits again or returns: where that thread's
// warp collective completes, its warp goes on first, from its first lane in the order; else the thread after it.
// Not inlined into suspend(), whose frame must keep no variable in memory (its own comment says why): this
// one's (std::min's operands, complete_collective's messages) are gone before suspend switches. (A template,
// as a header's function must be inline or one, and g++ warns of one both inline and noinline.)
template <int> __attribute__((noinline)) void pass_after_wait(State& s) {
  const Thread& t = *s.pass_thread;
  if (warp_may_meet(t) && complete_collective(t)) {
    const unsigned base = t.warp * warpSize, mask = t.mask;
    s.pass_k = s.pass_order->size();
    for (unsigned l = 0; l < (unsigned)warpSize; ++l)
      if (mask >> l & 1u) s.pass_k = std::min<size_t>(s.pass_k, s.place_in_order[base + l]);
  } else {
    ++s.pass_k;
  }
}

// Runs one block to its end, or to its first finding (state().failure).
inline void run_block() {
  State& s = state();
  const size_t n = (size_t)s.block_dim.x * s.block_dim.y * s.block_dim.z;
  s.threads.assign(n, Thread{});
  s.at_collective.assign((n + warpSize - 1) / warpSize, 0);
  for (size_t i = 0; i < n; ++i) {
    Thread& t = s.threads[i];
    t.idx = {(unsigned)(i % s.block_dim.x), (unsigned)(i / s.block_dim.x % s.block_dim.y),
             (unsigned)(i / ((size_t)s.block_dim.x * s.block_dim.y))};
    t.lane = (unsigned)(i % warpSize), t.warp = (unsigned)(i / warpSize);
    t.fiber = SIZE_MAX;
  }
  visiting_order(s.start_order, n);
  s.started = 0, s.fibers_used = 0;
  std::vector<unsigned> order;
  while (s.started < n) {  // each thread runs until it waits or returns; a warp that meets goes on first
    start_fiber();
    const Thread& last = s.threads[s.start_order[s.started - 1]];  // the one that waits, unless all returned
    if (warp_may_meet(last) && complete_collective(last)) run_released(order);
    if (!s.failure.empty()) return;
  }
  for (;;) {
    bool all_exited = true;
    for (const Thread& t : s.threads) all_exited = all_exited && t.wait == Wait::exited;
    if (all_exited) return;
    if (!complete_collectives()) {
      if (!s.failure.empty() || !release_barrier()) return;
    }
    run_released(order);
    if (!s.failure.empty()) return;
  }
}

// ---- errors as the runtime reports them ------------------------------------------------------------------
inline cudaError_t fail(cudaError_t e, const std::string& detail) {
  State& s = state();
  s.last_error = e, s.detail_of[e] = detail;
  return e;
}
// An error of the device, sticky as on a GPU: every later call returns it.
inline cudaError_t fail_sticky(const std::string& detail) {
  State& s = state();
  if (s.sticky_error == cudaSuccess) {
    s.sticky_error = cudaErrorLaunchFailure, s.sticky_detail = detail;
    std::fprintf(stderr, "cuda_emulator: %s\n", detail.c_str());
  }
  return fail(cudaErrorLaunchFailure, detail);
}

// Whether [p, p + bytes) lies inside one allocation of the map; why not, otherwise.
inline bool inside(const std::map<uintptr_t, size_t>& allocations, const void* p, size_t bytes, std::string* why) {
  const uintptr_t a = (uintptr_t)p;
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin() || a >= std::prev(it)->first + std::max<size_t>(std::prev(it)->second, 1)) {
    *why = format("%p is not device memory", p);
    return false;
  }
  --it;
  if (a + bytes > it->first + it->second) {
    *why = format("%zu bytes at %p run %zu bytes past the end of the device allocation of %zu bytes at %p", bytes, p,
                  (size_t)(a + bytes - it->first - it->second), it->second, (void*)it->first);
    return false;
  }
  return true;
}

inline void on_timeout(int) {
  const char* a = "cuda_emulator: kernel ";
  const char* b = " still runs after CUDA_EMULATOR_TIMEOUT seconds of CPU time (a thread waiting on another block?)\n";
  if (write(2, a, std::strlen(a)) < 0 || write(2, state().kernel, std::strlen(state().kernel)) < 0 || write(2, b, std::strlen(b)) < 0) {}
  _exit(124);
}

// ---- streams and their capture ---------------------------------------------------------------------------
// A stream's work is done when its call returns, unless the stream is being captured: then it is recorded
// as the next node of the graph. As under CUDA's global capture mode, a call that synchronises, allocates
// or frees, or work on the legacy default stream, while a capture is on fails and invalidates the capture
// (cudaStreamEndCapture then fails too): such a call in a captured step is a bug on a GPU too.
inline cudaError_t refuse_in_capture(const char* call, cudaError_t e = cudaErrorStreamCaptureUnsupported) {
  State& s = state();
  const std::string why = std::string(call) + " while a stream is being captured";
  if (s.capture_broken.empty()) s.capture_broken = why;
  return fail(e, why);
}
// Whether work for `stream` may be queued now (false: refused, the error set).
inline bool may_queue(const char* call, cudaStream_t stream) {
  const State& s = state();
  if (!s.capturing || stream == s.capturing || stream) return true;
  refuse_in_capture((std::string(call) + " on the legacy default stream").c_str(), cudaErrorStreamCaptureImplicit);
  return false;
}
inline State::Branch* branch_of(cudaStream_t stream) {
  auto it = state().branches.find(stream);
  return it == state().branches.end() ? nullptr : &it->second;
}
// Whether the stream's work waits: recorded under a capture, or kept by a branch for its join.
inline bool defers(cudaStream_t stream) { return stream && (stream == state().capturing || branch_of(stream)); }
// Whether the stream's work is recorded into the capture that is on (the captured stream, or a branch of it).
inline bool in_capture(cudaStream_t stream) {
  const State::Branch* b = branch_of(stream);
  return stream && (stream == state().capturing || (b && b->captured));
}
// The work issued on the stream so far.
inline unsigned long long issued_on(cudaStream_t stream) {
  const State::Branch* b = branch_of(stream);
  return b ? b->issued : state().issued[stream];
}
// A join: the branch's work issued before `position` runs now, in order, or (the branch in the capture)
// becomes the capture's next nodes.
inline void join_branch(State::Branch& b, unsigned long long position) {
  State& s = state();
  const auto end = std::find_if(b.pending.begin(), b.pending.end(), [&](const State::BranchWork& w) { return w.seq >= position; });
  std::vector<State::BranchWork> ready(std::make_move_iterator(b.pending.begin()), std::make_move_iterator(end));
  b.pending.erase(b.pending.begin(), end);
  for (State::BranchWork& w : ready)
    if (b.captured) s.captured.push_back({std::move(w.run)});
    else w.run();
}
// What a synchronising call, or work on the legacy stream, waits for: every branch's work (outside a capture).
inline void run_branches() {
  for (auto& [stream, b] : state().branches)
    if (!b.captured) join_branch(b, b.issued);
}
// The bytes at p, hashed (FNV-1a, 8 bytes a step), or 0 where they are not all device memory (the call then
// reports it when it runs).
inline uint64_t bytes_hash(const void* p, size_t bytes) {
  std::string why;
  if (bytes == 0 || !inside(state().device_allocations, p, bytes, &why)) return 0;
  uint64_t h = 1469598103934665603ull, word;
  const unsigned char* c = (const unsigned char*)p;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) std::memcpy(&word, c + i, 8), h = (h ^ word) * 1099511628211ull;
  for (; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
  return h;
}
inline bool overlap(const Span& a, const Span& b) {
  return a.bytes && b.bytes && (const char*)a.p < (const char*)b.p + b.bytes && (const char*)b.p < (const char*)a.p + a.bytes;
}
// Runs the work now, records it when its stream is being captured, or keeps it for the branch's join. A
// branch's call that names its operands (a cuBLAS call) checks when it runs that each holds the bytes it held
// at the call's issue, unless earlier work of the branch, not run yet, may write it (work that names no
// operands may write anything). Work of a branch must come after its fork with no work of the stream it was
// forked from in between: on a GPU it may run before that work, which the branch, run late here, would not
// show. counted: whether it counts as work of a branch (a strided-batched call counts once).
inline void queue(cudaStream_t stream, std::function<void()> work, std::vector<Span> operands = {}, const std::string& call = "",
                  bool counted = true) {
  State& s = state();
  if (!stream) run_branches();  // the legacy stream waits for every other stream (created blocking)
  State::Branch* b = branch_of(stream);
  if (!b) {
    ++s.issued[stream];
    if (defers(stream)) s.captured.push_back({std::move(work)});
    else work();
    return;
  }
  if (issued_on(b->origin) != b->forked_at)
    return (void)fail_sticky((call.empty() ? std::string("work") : call) +
                             " on a stream forked from another, issued after more work of that stream than its fork waited "
                             "for: on a GPU it may run before that work (fork it again: cudaEventRecord, cudaStreamWaitEvent)");
  std::vector<Span> compared;
  for (const Span& o : operands) {
    bool may_change = s.dry_run;  // (its results are garbage: nothing to compare)
    for (const State::BranchWork& w : b->pending)
      may_change = may_change || w.writes_unknown || std::any_of(w.writes.begin(), w.writes.end(), [&](const Span& x) { return overlap(x, o); });
    if (!may_change) compared.push_back(o);
  }
  std::vector<Span> writes;
  for (const Span& o : operands)
    if (o.written) writes.push_back(o);
  auto at_issue = std::make_shared<std::vector<uint64_t>>();
  const auto hashes = [compared] {
    std::vector<uint64_t> h;
    for (const Span& o : compared) h.push_back(bytes_hash(o.p, o.bytes));
    return h;
  };
  auto note = [hashes, at_issue] { *at_issue = hashes(); };
  if (b->captured) s.captured.push_back({note, false});  // at the place of its issue in the replay
  else note();
  b->pending.push_back({b->issued++, [work = std::move(work), compared, hashes, at_issue, call, counted] {
                          State& s = state();
                          s.counts.on_branches += counted;
                          const std::vector<uint64_t> now = hashes();
                          for (size_t i = 0; i < now.size() && s.sticky_error == cudaSuccess; ++i)
                            if (now[i] != (*at_issue)[i])
                              return (void)fail_sticky(call + " on a stream forked from another: its " + compared[i].name +
                                                       " changed between the call's issue and its run (work on another stream "
                                                       "wrote it without waiting for the call: a missing join, cudaStreamWaitEvent)");
                          work();
                        },
                        writes, operands.empty()});
}

template <typename Kernel, typename Args> struct Launch {
  Kernel kernel;
  Args args;
  static void run(void* p) {
    Launch& l = *(Launch*)p;
    std::apply(l.kernel, l.args);
  }
};

// Runs a launch's grid: every block, one after another.
template <typename L> void run_grid(L call, const char* name, dim3 grid, dim3 block, size_t shared, const std::string& config) {
  State& s = state();
  if (s.sticky_error != cudaSuccess) return;
  ++s.counts.launches[name];
  s.counts.graph_kernels += s.replaying;
  if (s.dry_run) return;
  s.body = &L::run, s.body_arg = &call;
  s.kernel = name, s.grid_dim = grid, s.block_dim = block;
  // its own allocation, which AddressSanitizer guards at its end, aligned to 32 bytes as transformer.cu declares
  // it (wmma's operands)
  void* dynamic_bytes = nullptr;
  if (posix_memalign(&dynamic_bytes, 32, std::max<size_t>(shared, 1)) != 0) throw std::bad_alloc();
  const std::unique_ptr<unsigned char, decltype(&free)> dynamic((unsigned char*)dynamic_bytes, &free);
  s.dynamic_shared = dynamic.get();
  signal(SIGVTALRM, on_timeout);  // after timeout seconds of the process's CPU time in user mode
  const itimerval limit{{0, 0}, {(time_t)s.timeout, 0}}, off{};
  setitimer(ITIMER_VIRTUAL, &limit, nullptr);
  std::vector<unsigned> order;
  const size_t blocks = (size_t)grid.x * grid.y * grid.z;
  for (unsigned b : visiting_order(order, blocks)) {
    s.block_idx = {(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / ((size_t)grid.x * grid.y))};
    std::fill(dynamic.get(), dynamic.get() + shared, 0xFF);  // NaN in every float nothing wrote
    run_block();
    if (!s.failure.empty()) {
#ifdef CUDA_EMULATOR_ASAN
      // the frames of the threads a finding abandons stay poisoned on the stacks, which later blocks reuse
      // (a thread that returns leaves its stack clean, and fiber_main keeps no variable in memory)
      for (char* stack : s.stacks) __asan_unpoison_memory_region(stack, kStackBytes);
#endif
      fail_sticky(config + format(", block (%u,%u,%u): ", s.block_idx.x, s.block_idx.y, s.block_idx.z) + s.failure);
      s.failure.clear();
      break;
    }
  }
  setitimer(ITIMER_VIRTUAL, &off, nullptr);
  s.threads.clear();
  s.dynamic_shared = nullptr, s.kernel = "";  // (name may not outlive the launch)
}

// kernel<<<grid, block, shared, stream>>>(args...): every block of the grid, one after another; under a
// capture, the arguments as converted now, as a graph's kernel node keeps them. A kernel named in parentheses
// (a template's arguments with a comma, which a macro's argument must enclose) is named without them.
template <typename... P, typename... A>
void launch(const char* kernel_name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream, A&&... args) {
  State& s = state();
  if (s.sticky_error != cudaSuccess) return (void)fail(s.sticky_error, s.sticky_detail);
  std::string name = kernel_name;
  if (name.size() > 1 && name.front() == '(' && name.back() == ')') name = name.substr(1, name.size() - 2);
  const size_t threads = (size_t)block.x * block.y * block.z;
  const std::string config = format("kernel %s<<<(%u,%u,%u), (%u,%u,%u), %zu>>>", name.c_str(), grid.x, grid.y, grid.z, block.x,
                                    block.y, block.z, shared);
  if (threads == 0 || threads > kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64)
    return (void)fail(cudaErrorInvalidConfiguration, config + ": a block has 1 to 1024 threads");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return (void)fail(cudaErrorInvalidConfiguration, config + ": a grid has 1 to 2^31-1 x 65535 x 65535 blocks");
  auto raised = s.shared_limit.find((const void*)kernel);
  const size_t limit = raised == s.shared_limit.end() ? kSharedDefault : raised->second;
  if (shared > limit)
    return (void)fail(cudaErrorInvalidValue, config + format(": %zu bytes of dynamic shared memory, over the %zu allowed", shared, limit));
  if (!may_queue(config.c_str(), stream)) return;
  using Args = std::tuple<std::decay_t<P>...>;
  Launch<void (*)(P...), Args> call{kernel, Args(std::forward<A>(args)...)};  // converted as a launch converts them
  queue(stream, [call, name, grid, block, shared, config] { run_grid(call, name.c_str(), grid, block, shared, config); });
}

}  // namespace emu

// ---- the built-in variables, shared memory, the collectives and atomics as kernels call them --------------
#define threadIdx (static_cast<const uint3&>(::emu::this_thread().idx))
#define blockIdx (static_cast<const uint3&>(::emu::state().block_idx))
#define blockDim (static_cast<const dim3&>(::emu::state().block_dim))
#define gridDim (static_cast<const dim3&>(::emu::state().grid_dim))

template <typename T> T* dynamic_shared() { return (T*)::emu::state().dynamic_shared; }

inline void __syncthreads(int line = __builtin_LINE()) { ::emu::syncthreads(line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
  ::emu::collective(::emu::Collective::syncwarp, mask, 0, 0, warpSize, line);
}
inline unsigned __ballot_sync(unsigned mask, int predicate, int line = __builtin_LINE()) {
  return (unsigned)::emu::collective(::emu::Collective::ballot, mask, predicate != 0, 0, warpSize, line);
}
template <typename T> T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize, int line = __builtin_LINE()) {
  return ::emu::from_bits<T>(::emu::collective(::emu::Collective::shfl, mask, ::emu::to_bits(var), src_lane, width, line));
}
template <typename T> T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize, int line = __builtin_LINE()) {
  return ::emu::from_bits<T>(::emu::collective(::emu::Collective::shfl_xor, mask, ::emu::to_bits(var), lane_mask, width, line));
}
template <typename T> T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize, int line = __builtin_LINE()) {
  return ::emu::from_bits<T>(::emu::collective(::emu::Collective::shfl_down, mask, ::emu::to_bits(var), (int)delta, width, line));
}

// Fibers switch only at meeting points, so a read-modify-write is atomic as written.
template <typename T> T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

// Asynchronous copies into shared memory (cuda_pipeline.h; cp.async, sm_80 on): a copy of 4, 8 or 16 bytes,
// both ends aligned to its size, the last zfill bytes zeros. It is done only when __pipeline_wait_prior(n)
// leaves at most n of the thread's committed groups waiting, its group among the done: until then the
// destination keeps what it held, so a read before the wait sees the old bytes, as it may on a GPU. A thread
// that returns with copies not waited for is an error.
inline void __pipeline_memcpy_async(void* to, const void* from, size_t bytes, size_t zfill = 0) {
  ::emu::State& s = ::emu::state();
  if ((bytes != 4 && bytes != 8 && bytes != 16) || zfill > bytes || (uintptr_t)to % bytes || (uintptr_t)from % bytes) {
    if (s.failure.empty()) s.failure = ::emu::format("__pipeline_memcpy_async of %zu bytes (%zu zero), %p to %p: not 4, 8 or 16 bytes aligned to their size", bytes, zfill, from, to);
    return;
  }
  ::emu::this_thread().uncommitted.push_back({to, from, bytes - zfill});
  if (zfill) ::emu::this_thread().uncommitted.push_back({(char*)to + bytes - zfill, nullptr, zfill});  // (from null: zeros)
}
inline void __pipeline_commit() {
  ::emu::Thread& t = ::emu::this_thread();
  t.copy_groups.push_back(std::move(t.uncommitted));
  t.uncommitted.clear();
}
inline void __pipeline_wait_prior(size_t n) {
  ::emu::Thread& t = ::emu::this_thread();
  while (t.copy_groups.size() > n) {
    for (const auto& c : t.copy_groups.front()) c.from ? (void)std::memcpy(c.to, c.from, c.bytes) : (void)std::memset(c.to, 0, c.bytes);
    t.copy_groups.erase(t.copy_groups.begin());
  }
}

// ---- tensor cores: nvcuda::wmma (mma.h) in TF32, the shape m16n16k8 (sm_80 on) ---------------------------------
// A fragment is spread over the warp's lanes, as on a GPU, in a mapping of the emulator's own (CUDA leaves it
// unspecified): element e of the tile, numbered row by row, is lane e % 32's x[e / 32]. x[] holds a GPU's
// number of elements (4 of a 16 x 8 operand, 8 of the 16 x 16 accumulator), and a kernel that assumes which
// element a lane holds computes something else here. load_matrix_sync, mma_sync and store_matrix_sync are warp
// collectives: every lane of the warp, with the same pointer (32-byte aligned) and ldm (a multiple of 4
// floats); they wait for all lanes, then each lane loads or stores its own elements, so a lane that reads what
// another stored must meet it first. mma_sync computes D = A B + C over the warp's fragments when its last lane
// arrives, reading A and B as the tensor cores read TF32: the mantissa's low 13 bits ignored
// (wmma::__float_to_tf32 rounds them away first), the products exact, the sums in fp32.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
  static_assert(M == 16 && N == 16 && K == 8, "the emulated tensor cores have the TF32 shape m16n16k8");
  static_assert(std::is_same_v<Use, accumulator> ? std::is_same_v<T, float> : std::is_same_v<T, precision::tf32>,
                "TF32 operands, fp32 sums");
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M, cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols / 32;
  float x[num_elements];
};

// cvt.rna.tf32.f32: f rounded to TF32's 10-bit mantissa, to nearest, ties away from zero
inline float __float_to_tf32(float f) {
  uint32_t b = (uint32_t)::emu::to_bits(f);
  if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0x1000u) & ~0x1fffu;
  return ::emu::from_bits<float>(b);
}
template <typename Use, typename T, typename Layout> void fill_fragment(fragment<Use, 16, 16, 8, T, Layout>& f, float v) {
  for (float& e : f.x) e = v;
}
}  // namespace wmma
}  // namespace nvcuda

namespace emu {
// Waits for the warp at a wmma load or store of p with leading dimension ldm; false (a finding) where p or ldm
// break CUDA's rules.
inline bool warp_matrix_access(Collective kind, const void* p, unsigned ldm, int line) {
  State& s = state();
  if ((uintptr_t)p % 32 || ldm % 4) {
    if (s.failure.empty())
      s.failure = format("%s at line %d: %s", collective_name(kind), line,
                         (uintptr_t)p % 32 ? format("%p is not 32-byte aligned", p).c_str() : format("ldm %u is not a multiple of 4 floats", ldm).c_str());
    return false;
  }
  this_thread().mma = nullptr;  // (compared across the lanes with p and ldm)
  collective(kind, 0xffffffffu, to_bits(p), (int)ldm, warpSize, line);
  return true;
}
// Element e of fragment F in memory at p: row-major with leading dimension ldm, or column-major
template <typename F> size_t matrix_offset(int e, unsigned ldm, bool row_major) {
  const int r = e / F::cols, c = e % F::cols;
  return row_major ? (size_t)r * ldm + c : r + (size_t)c * ldm;
}
// The warp's mma_sync, once every lane is there: lanes[l].mma_fragments = l's d, a, b, c (one instance for
// each pair of operand layouts, so that lanes that pass other types are told apart)
template <typename FA, typename FB> void mma_over_warp(Thread* lanes) {
  auto at = [&](int which, int e) { return ((const float*)lanes[e % 32].mma_fragments[which])[e / 32]; };  // element e, from its lane
  auto tf32 = [](float f) {  // as the tensor cores read it
    uint32_t b = (uint32_t)to_bits(f);
    return (b & 0x7f800000u) == 0x7f800000u ? f : from_bits<float>(b & ~0x1fffu);
  };
  float d[16 * 16];
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      float sum = at(3, i * 16 + j);
      for (int k = 0; k < 8; ++k) sum += tf32(at(1, i * 8 + k)) * tf32(at(2, k * 16 + j));
      d[i * 16 + j] = sum;
    }
  for (int e = 0; e < 16 * 16; ++e) ((float*)lanes[e % 32].mma_fragments[0])[e / 32] = d[e];  // after every read: d may be c
}
}  // namespace emu

namespace nvcuda {
namespace wmma {
template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 8, precision::tf32, Layout>& f, const float* p, unsigned ldm, int line = __builtin_LINE()) {
  using F = fragment<Use, 16, 16, 8, precision::tf32, Layout>;
  if (!::emu::warp_matrix_access(::emu::Collective::wmma_load, p, ldm, line)) return;
  const int lane = (int)::emu::this_thread().lane;
  for (int k = 0; k < F::num_elements; ++k) f.x[k] = p[::emu::matrix_offset<F>(lane + 32 * k, ldm, std::is_same_v<Layout, row_major>)];
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 8, float>& f, const float* p, unsigned ldm, layout_t layout,
                             int line = __builtin_LINE()) {
  using F = fragment<accumulator, 16, 16, 8, float>;
  if (!::emu::warp_matrix_access(::emu::Collective::wmma_load, p, ldm, line)) return;
  const int lane = (int)::emu::this_thread().lane;
  for (int k = 0; k < F::num_elements; ++k) f.x[k] = p[::emu::matrix_offset<F>(lane + 32 * k, ldm, layout == mem_row_major)];
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 8, float>& f, unsigned ldm, layout_t layout,
                              int line = __builtin_LINE()) {
  using F = fragment<accumulator, 16, 16, 8, float>;
  if (!::emu::warp_matrix_access(::emu::Collective::wmma_store, p, ldm, line)) return;
  const int lane = (int)::emu::this_thread().lane;
  for (int k = 0; k < F::num_elements; ++k) p[::emu::matrix_offset<F>(lane + 32 * k, ldm, layout == mem_row_major)] = f.x[k];
}
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 8, float>& d, const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
              const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b, const fragment<accumulator, 16, 16, 8, float>& c,
              int line = __builtin_LINE()) {
  ::emu::Thread& t = ::emu::this_thread();
  t.mma_fragments[0] = d.x, t.mma_fragments[1] = (void*)a.x, t.mma_fragments[2] = (void*)b.x, t.mma_fragments[3] = (void*)c.x;
  t.mma = &::emu::mma_over_warp<std::decay_t<decltype(a)>, std::decay_t<decltype(b)>>;
  ::emu::collective(::emu::Collective::wmma_mma, 0xffffffffu, 0, 0, warpSize, line);
}
}  // namespace wmma
}  // namespace nvcuda

// ---- the runtime API ------------------------------------------------------------------------------
inline const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
  }
  return "cudaErrorUnknown";
}
// CUDA's message, followed by what the emulator found where it has a finding for this error.
inline const char* cudaGetErrorString(cudaError_t e) {
  static const std::map<cudaError_t, const char*> text = {
      {cudaSuccess, "no error"},
      {cudaErrorInvalidValue, "invalid argument"},
      {cudaErrorMemoryAllocation, "out of memory"},
      {cudaErrorInvalidConfiguration, "invalid configuration argument"},
      {cudaErrorInvalidDevicePointer, "invalid device pointer"},
      {cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy"},
      {cudaErrorLaunchFailure, "unspecified launch failure"},
      {cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing"},
      {cudaErrorStreamCaptureInvalidated, "operation failed due to a previous error during capture"},
      {cudaErrorStreamCaptureUnjoined, "capture was not joined back into the origin stream"},
      {cudaErrorStreamCaptureIsolation, "dependency created on uncaptured work in another stream"},
      {cudaErrorStreamCaptureImplicit, "operation would make the legacy stream depend on a capturing blocking stream"},
  };
  thread_local std::string message;
  const emu::State& s = emu::state();
  auto it = text.find(e);
  message = it == text.end() ? "unrecognized error code" : it->second;
  const std::string& detail = e == s.sticky_error ? s.sticky_detail : s.detail_of.count(e) ? s.detail_of.at(e) : std::string();
  if (e != cudaSuccess && !detail.empty()) message += " (emulated GPU: " + detail + ")";
  return message.c_str();
}
inline cudaError_t cudaGetLastError() {
  emu::State& s = emu::state();
  const cudaError_t e = s.sticky_error != cudaSuccess ? s.sticky_error : s.last_error;
  if (s.sticky_error == cudaSuccess) s.last_error = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() {
  const emu::State& s = emu::state();
  return s.sticky_error != cudaSuccess ? s.sticky_error : s.last_error;
}
// The result of a call that does nothing on the device: the sticky error if there is one.
inline cudaError_t emu_status() { return emu::state().sticky_error; }

inline cudaError_t cudaGetDeviceCount(int* n) {
  *n = 1;
  return cudaSuccess;
}
inline cudaError_t cudaSetDevice(int d) { return d == 0 ? emu_status() : emu::fail(cudaErrorInvalidValue, "device " + std::to_string(d) + " does not exist"); }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return emu_status();
}
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d != 0) return emu::fail(cudaErrorInvalidValue, "device " + std::to_string(d) + " does not exist");
  *p = cudaDeviceProp{};
  std::snprintf(p->name, sizeof p->name, "emulated GPU (cuda_emulator.h, thread order %s)", emu::order_name());
  p->totalGlobalMem = (size_t)80 << 30, p->sharedMemPerBlock = emu::kSharedDefault, p->sharedMemPerBlockOptin = emu::kSharedOptin;
  p->maxThreadsPerBlock = (int)emu::kMaxThreads, p->warpSize = warpSize, p->major = 9, p->minor = 0, p->multiProcessorCount = 1;
  return cudaSuccess;
}
template <typename... P> cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > emu::kSharedOptin)
    return emu::fail(cudaErrorInvalidValue, emu::format("cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most %zu)", value, emu::kSharedOptin));
  emu::state().shared_limit[(const void*)kernel] = (size_t)value;
  return emu_status();
}

inline cudaError_t cudaMalloc(void** p, size_t bytes) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (s.capturing) return emu::refuse_in_capture("cudaMalloc");
  void* m = std::malloc(std::max<size_t>(bytes, 1));
  if (!m) return emu::fail(cudaErrorMemoryAllocation, emu::format("cudaMalloc of %zu bytes", bytes));
  std::memset(m, 0xFF, bytes);  // NaN in every float until written
  s.device_allocations[(uintptr_t)m] = bytes;
  s.counts.device_bytes += bytes, s.counts.peak_device_bytes = std::max(s.counts.peak_device_bytes, s.counts.device_bytes);
  *p = m;
  return cudaSuccess;
}
template <typename T> cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }
inline cudaError_t cudaFree(void* p) {
  emu::State& s = emu::state();
  if (s.capturing) return emu::refuse_in_capture("cudaFree");
  emu::run_branches();  // cudaFree waits for the device
  if (!p) return emu_status();
  auto it = s.device_allocations.find((uintptr_t)p);
  if (it == s.device_allocations.end()) return emu::fail(cudaErrorInvalidValue, emu::format("cudaFree(%p): not a pointer cudaMalloc returned", p));
  s.counts.device_bytes -= it->second;
  s.device_allocations.erase(it);
  std::free(p);
  return emu_status();
}
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  emu::State& s = emu::state();
  if (s.capturing) return emu::refuse_in_capture("cudaMallocHost");
  void* m = std::malloc(std::max<size_t>(bytes, 1));
  if (!m) return emu::fail(cudaErrorMemoryAllocation, emu::format("cudaMallocHost of %zu bytes", bytes));
  s.pinned_allocations[(uintptr_t)m] = bytes;
  *p = m;
  return emu_status();
}
template <typename T> cudaError_t cudaMallocHost(T** p, size_t bytes) { return cudaMallocHost((void**)p, bytes); }
inline cudaError_t cudaFreeHost(void* p) {
  emu::State& s = emu::state();
  if (s.capturing) return emu::refuse_in_capture("cudaFreeHost");
  if (!p) return emu_status();
  auto it = s.pinned_allocations.find((uintptr_t)p);
  if (it == s.pinned_allocations.end()) return emu::fail(cudaErrorInvalidValue, emu::format("cudaFreeHost(%p): not a pointer cudaMallocHost returned", p));
  s.pinned_allocations.erase(it);
  std::free(p);
  return emu_status();
}

namespace emu {
// A copy's and a memset's checks (a copy's direction; that the device side lies inside one allocation),
// made when called; then the copy or memset, which makes them again when its stream gets to it (an
// allocation may have gone since): a check failing then, after the call was accepted, is a device error.
inline bool to_device(cudaMemcpyKind kind) { return kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice; }
inline bool from_device(cudaMemcpyKind kind) { return kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice; }
inline cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* call) {
  State& s = state();
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, format("%s: kind %d", call, (int)kind));
  std::string why;
  if (bytes && to_device(kind) && !inside(s.device_allocations, dst, bytes, &why)) return fail(cudaErrorInvalidValue, std::string(call) + " destination: " + why);
  if (bytes && from_device(kind) && !inside(s.device_allocations, src, bytes, &why)) return fail(cudaErrorInvalidValue, std::string(call) + " source: " + why);
  return cudaSuccess;
}
inline cudaError_t check_set(void* p, size_t bytes, const char* call) {
  std::string why;
  if (bytes && !inside(state().device_allocations, p, bytes, &why)) return fail(cudaErrorInvalidValue, std::string(call) + ": " + why);
  return cudaSuccess;
}
inline void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* call) {
  State& s = state();
  if (s.sticky_error != cudaSuccess || bytes == 0) return;
  if (check_copy(dst, src, bytes, kind, call) != cudaSuccess) return (void)fail_sticky(s.detail_of[s.last_error]);
  if (to_device(kind) || from_device(kind)) ++(!from_device(kind) ? s.counts.to_device : !to_device(kind) ? s.counts.to_host : s.counts.on_device);
  std::memcpy(dst, src, bytes);
}
inline void set(void* p, int value, size_t bytes, const char* call) {
  State& s = state();
  if (s.sticky_error != cudaSuccess) return;
  if (check_set(p, bytes, call) != cudaSuccess) return (void)fail_sticky(s.detail_of[s.last_error]);
  ++s.counts.memsets;
  std::memset(p, value, bytes);
}
}  // namespace emu

// Copies and memsets on the legacy default stream synchronise with the device: refused under a capture.
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (s.capturing) return emu::refuse_in_capture("cudaMemcpy");
  if (const cudaError_t e = emu::check_copy(dst, src, bytes, kind, "cudaMemcpy")) return e;
  emu::run_branches();
  emu::copy(dst, src, bytes, kind, "cudaMemcpy");  // checks again: cheap, and one path for both kinds of call
  return cudaSuccess;
}
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream = nullptr) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (const cudaError_t e = emu::check_copy(dst, src, bytes, kind, "cudaMemcpyAsync")) return e;
  if (!emu::may_queue("cudaMemcpyAsync", stream)) return s.last_error;
  emu::queue(stream, [=] { emu::copy(dst, src, bytes, kind, "cudaMemcpyAsync"); });
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (s.capturing) return emu::refuse_in_capture("cudaMemset");
  if (const cudaError_t e = emu::check_set(p, bytes, "cudaMemset")) return e;
  emu::run_branches();
  emu::set(p, value, bytes, "cudaMemset");
  return cudaSuccess;
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream = nullptr) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (const cudaError_t e = emu::check_set(p, bytes, "cudaMemsetAsync")) return e;
  if (!emu::may_queue("cudaMemsetAsync", stream)) return s.last_error;
  emu::queue(stream, [=] { emu::set(p, value, bytes, "cudaMemsetAsync"); });
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() {
  if (emu::state().capturing) return emu::refuse_in_capture("cudaDeviceSynchronize");
  emu::run_branches();
  return emu_status();
}
// As on a GPU: every allocation is released and every error, sticky ones too, is cleared.
inline cudaError_t cudaDeviceReset() {
  emu::State& s = emu::state();
  for (auto& a : s.device_allocations) std::free((void*)a.first);
  for (auto& a : s.pinned_allocations) std::free((void*)a.first);
  s.device_allocations.clear(), s.pinned_allocations.clear(), s.shared_limit.clear(), s.counts = emu::Counts{};
  s.capturing = nullptr, s.captured.clear(), s.capture_broken.clear(), s.branches.clear(), s.issued.clear();
  s.last_error = s.sticky_error = cudaSuccess, s.sticky_detail.clear(), s.detail_of.clear();
  return cudaSuccess;
}
inline cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st;
  return emu_status();
}
inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (emu::State::Branch* b = emu::branch_of(stream)) {  // its work still runs, as on a GPU
    emu::join_branch(*b, b->issued);
    emu::state().branches.erase(stream);
  }
  delete stream;
  return emu_status();
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (emu::state().capturing) return emu::refuse_in_capture("cudaStreamSynchronize");
  emu::run_branches();
  return emu_status();
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st;
  return emu_status();
}
inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return emu_status();
}
inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
  if (!event) return emu::fail(cudaErrorInvalidValue, "cudaEventRecord: no event");
  if (!emu::may_queue("cudaEventRecord", stream)) return emu::state().last_error;
  if (!stream) emu::run_branches();
  event->stream = stream, event->position = emu::issued_on(stream), event->recorded = true;
  event->capture = emu::in_capture(stream) ? emu::state().captures : 0;
  return emu_status();
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
  if (emu::state().capturing) return emu::refuse_in_capture("cudaEventSynchronize");
  emu::run_branches();
  return emu_status();
}
// The stream's later work waits for the event's: on a branch's event, a join (its work before the event runs
// first); on another stream's, a fork, where the waiting stream has issued no work of its own or is a branch
// already (it becomes, or stays, a branch of that stream; under a capture it joins it); otherwise its work
// ran at once, and the wait changes nothing. A captured stream may wait only on an event of its capture, and
// no stream on an event of a capture that has ended.
inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (!event || flags != 0) return emu::fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: no event, or flags");
  if (!event->recorded) return cudaSuccess;  // (CUDA's: an event not recorded is complete)
  if (event->capture && !(s.capturing && event->capture == s.captures)) {  // an event of a capture that has ended
    if (emu::in_capture(stream))
      return emu::refuse_in_capture("cudaStreamWaitEvent on an event recorded in an earlier capture", cudaErrorStreamCaptureIsolation);
    return emu::fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent on an event recorded in a capture that has ended");
  }
  if (event->stream == stream) return cudaSuccess;
  if (emu::in_capture(stream) && !event->capture)  // (invalidates the capture, as CUDA's does)
    return emu::refuse_in_capture("cudaStreamWaitEvent on an event recorded outside the capture", cudaErrorStreamCaptureIsolation);
  if (emu::State::Branch* from = emu::branch_of(event->stream)) {
    if (emu::branch_of(stream)) return emu::fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: a branch waiting on another branch is not emulated");
    if (from->captured && stream != s.capturing)
      return emu::fail(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent: a stream outside the capture waits on one in it");
    emu::join_branch(*from, event->position);
    return emu_status();
  }
  if (!stream) return emu_status();  // the legacy stream runs everything at once
  emu::State::Branch* b = emu::branch_of(stream);
  if (!b && s.issued[stream] > 0) return emu_status();
  if (!b) b = &s.branches[stream];
  const bool joins_capture = event->stream && event->stream == s.capturing;
  if (joins_capture && !b->captured) emu::join_branch(*b, b->issued);  // its work from before the capture is not the graph's
  b->origin = event->stream, b->forked_at = event->position, b->captured = b->captured || joins_capture;
  return emu_status();
}

// ---- stream capture and graphs (CUDA's global capture mode; the other modes are not emulated) ------------
inline cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (!stream) return emu::fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture: the legacy default stream cannot be captured");
  if (s.capturing) return emu::fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: a capture is already on");
  if (mode != cudaStreamCaptureModeGlobal) return emu::fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: only the global mode is emulated");
  s.capturing = stream, ++s.captures, s.captured.clear(), s.capture_broken.clear();
  return cudaSuccess;
}
inline cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const emu::State& s = emu::state();
  *status = !s.capturing || s.capturing != stream ? cudaStreamCaptureStatusNone
            : s.capture_broken.empty()           ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusInvalidated;
  return emu_status();
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  emu::State& s = emu::state();
  *graph = nullptr;
  if (!s.capturing || stream != s.capturing) return emu::fail(cudaErrorInvalidValue, "cudaStreamEndCapture: the stream is not being captured");
  const std::string broken = s.capture_broken;
  size_t unjoined = 0;  // work of the branches in the capture that no join placed
  for (auto& [branch, b] : s.branches)
    if (b.captured) unjoined += b.pending.size(), b.pending.clear(), b.captured = false;
  std::vector<EmuNode> nodes = std::move(s.captured);
  s.capturing = nullptr, s.captured.clear(), s.capture_broken.clear();
  if (!broken.empty()) return emu::fail(cudaErrorStreamCaptureInvalidated, "the capture was invalidated: " + broken);
  if (unjoined)
    return emu::fail(cudaErrorStreamCaptureUnjoined,
                     emu::format("the capture ends with %zu calls of a stream forked from it not joined back (cudaStreamWaitEvent)", unjoined));
  *graph = new CUgraph_st{std::move(nodes)};
  return emu_status();
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0) {
  if (!graph) return emu::fail(cudaErrorInvalidValue, "cudaGraphInstantiate: no graph");
  *exec = new CUgraphExec_st{graph->nodes};
  return emu_status();
}
// The graph's nodes in their order, each as its call would have run it.
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  emu::State& s = emu::state();
  if (s.sticky_error != cudaSuccess) return s.sticky_error;
  if (!exec) return emu::fail(cudaErrorInvalidValue, "cudaGraphLaunch: no executable graph");
  if (s.capturing) return emu::refuse_in_capture("cudaGraphLaunch");
  ++s.counts.graph_launches;
  s.replaying = true;
  for (const EmuNode& node : exec->nodes) {
    if (s.sticky_error != cudaSuccess) break;
    s.counts.graph_nodes += node.counted;
    node.run();
  }
  s.replaying = false;
  return emu_status();
}
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return emu_status();
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return emu_status();
}

// ---- cuBLAS: the calls the GPU path makes, as the cuBLAS documentation defines them -------------------
enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_PEDANTIC_MATH = 2, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };  // cublasGemmEx's operand types: these two
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };  // and fp32 arithmetic
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
struct cublasContext {
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
  cudaStream_t stream = nullptr;  // cublasSetStream's; the legacy default stream until set
  void* workspace = nullptr;      // cublasSetWorkspace's; cublasSetStream resets it to cuBLAS's own, as cuBLAS does
};
using cublasHandle_t = cublasContext*;

inline const char* cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}
inline cublasStatus_t cublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t stream) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  h->stream = stream, h->workspace = nullptr;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::string why;
  if (bytes && !emu::inside(emu::state().device_allocations, workspace, bytes, &why)) return CUBLAS_STATUS_INVALID_VALUE;
  h->workspace = workspace;
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH) return CUBLAS_STATUS_INVALID_VALUE;
  h->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

namespace emu {
// A column-major operand of r rows and c columns with leading dimension ld, as a span of device memory.
// Its bytes: from the first element to the last.
inline size_t operand_bytes(size_t element, int r, int c, int ld) { return r == 0 || c == 0 ? 0 : ((size_t)(c - 1) * ld + r) * element; }
inline bool operand_inside(const char* call, const char* name, const void* p, size_t element, int r, int c, int ld) {
  if (r == 0 || c == 0) return true;
  std::string why;
  if (inside(state().device_allocations, p, operand_bytes(element, r, c, ld), &why)) return true;
  fail_sticky(format("%s: %s (%d x %d, ld %d): ", call, name, r, c, ld) + why);
  return false;
}
// An operand as the arithmetic reads it, in floats: a bf16 operand widened (exactly); an fp32 one under
// TF32 math with its mantissa rounded to 10 bits (to nearest, ties to even), as the tensor cores read it;
// otherwise nothing is copied (empty).
inline std::vector<float> operand_floats(const void* p, cudaDataType_t type, bool tf32, int r, int c, int ld) {
  std::vector<float> out;
  if (type == CUDA_R_32F && !tf32) return out;
  out.resize(c == 0 ? 0 : (size_t)(c - 1) * ld + r);
  for (size_t i = 0; i < out.size(); ++i) {
    if (type == CUDA_R_16BF) {
      out[i] = __bfloat162float(((const __nv_bfloat16*)p)[i]);
      continue;
    }
    uint32_t b = to_bits(((const float*)p)[i]) & 0xffffffffu;
    if ((b & 0x7f800000u) != 0x7f800000u) b = (b + 0xfffu + ((b >> 13) & 1u)) & ~0x1fffu;
    out[i] = from_bits<float>(b);
  }
  return out;
}
// The product of a cuBLAS call, when its stream gets to it: false when an operand leaves its allocation. C is
// fp32, or bf16 (c_bf16: each element rounded once, from its fp32 sum, to nearest even, as cuBLAS's epilogue does).
inline bool product(const char* call, bool at, bool bt, int m, int n, int k, float alpha, const void* A, const void* B,
                    cudaDataType_t type, bool tf32, int lda, int ldb, float beta, void* C, bool c_bf16, int ldc, bool count) {
  const size_t element = type == CUDA_R_16BF ? 2 : 4;
  if (m > 0 && n > 0 &&
      (!operand_inside(call, "A", A, element, at ? k : m, at ? m : k, lda) ||
       !operand_inside(call, "B", B, element, bt ? n : k, bt ? k : n, ldb) || !operand_inside(call, "C", C, c_bf16 ? 2 : 4, m, n, ldc)))
    return false;
  if (count) ++state().counts.blas_calls[call];  // a call the GPU runs: refused and failed ones are not
  if (m == 0 || n == 0 || state().dry_run) return true;
  const std::vector<float> a = operand_floats(A, type, tf32, at ? k : m, at ? m : k, lda), b = operand_floats(B, type, tf32, bt ? n : k, bt ? k : n, ldb);
  const float* fa = a.empty() ? (const float*)A : a.data();
  const float* fb = b.empty() ? (const float*)B : b.data();
  if (!c_bf16 && alpha == 1 && (beta == 0 || beta == 1)) {
    cpu::gemm<float>(bt, at, n, m, k, fb, ldb, fa, lda, (float*)C, ldc, beta == 1);
    return true;
  }
  std::vector<float> product((size_t)n * m);
  cpu::gemm<float>(bt, at, n, m, k, fb, ldb, fa, lda, product.data(), m, false);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      const size_t at_c = (size_t)j * ldc + i;
      const float old = beta == 0 ? 0.f : c_bf16 ? __bfloat162float(((__nv_bfloat16*)C)[at_c]) : ((float*)C)[at_c];  // beta 0: C is not read
      const float c = alpha * product[(size_t)j * m + i] + beta * old;
      if (c_bf16) ((__nv_bfloat16*)C)[at_c] = __float2bfloat16(c);
      else ((float*)C)[at_c] = c;
    }
  return true;
}
// C = alpha op(A) op(B) + beta C, column-major (m x n, op(A) m x k), A and B both fp32 or both bf16, the
// arithmetic in fp32, C in fp32 or (c_bf16) bf16. Row-major, C is C^T (n x m, ld ldc) and C^T = op(B)^T op(A)^T, which
// cpu::gemm computes from the same memory with the transposes as given.
inline cublasStatus_t gemm(cublasHandle_t h, const char* call, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const void* A, const void* B, cudaDataType_t type, int lda, int ldb, const float* beta,
                           void* C, int ldc, bool count = true, bool c_bf16 = false) {
  if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
  const bool at = ta != CUBLAS_OP_N, bt = tb != CUBLAS_OP_N;
  if (ta < CUBLAS_OP_N || ta > CUBLAS_OP_C || tb < CUBLAS_OP_N || tb > CUBLAS_OP_C || m < 0 || n < 0 || k < 0 ||
      lda < std::max(1, at ? k : m) || ldb < std::max(1, bt ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (state().sticky_error != cudaSuccess || !may_queue(call, h->stream)) return CUBLAS_STATUS_EXECUTION_FAILED;
  if (unsigned& in = state().blas_failure_in; count && in && --in == 0) {  // fail_blas_call
    if (in_capture(h->stream) && state().capture_broken.empty()) state().capture_broken = "an injected failure of " + std::string(call);
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  // the product runs when the stream gets to it, with alpha and beta as they are now (host pointer mode)
  const bool tf32 = h->math == CUBLAS_TF32_TENSOR_OP_MATH;
  const float al = *alpha, be = *beta;
  auto run = [=] { return state().sticky_error == cudaSuccess && product(call, at, bt, m, n, k, al, A, B, type, tf32, lda, ldb, be, C, c_bf16, ldc, count); };
  if (!defers(h->stream)) {
    if (!h->stream) run_branches();
    ++state().issued[h->stream];
    return run() ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
  }
  // a branch's call checks that its operands did not change before it ran (a missing join)
  const size_t element = type == CUDA_R_16BF ? 2 : 4;
  const size_t a_bytes = operand_bytes(element, at ? k : m, at ? m : k, lda), b_bytes = operand_bytes(element, bt ? n : k, bt ? k : n, ldb),
               c_bytes = operand_bytes(c_bf16 ? 2 : 4, m, n, ldc);
  queue(h->stream, [run] { run(); }, {{"A", A, a_bytes, false}, {"B", B, b_bytes, false}, {"C", C, c_bytes, true}}, call, count);
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace emu

inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                                  const float* A, int lda, const float* B, int ldb, const float* beta, float* C, int ldc) {
  return emu::gemm(h, "cublasSgemm", ta, tb, m, n, k, alpha, A, B, CUDA_R_32F, lda, ldb, beta, C, ldc);
}
namespace emu {
// batches products, operand i of each `stride` elements after operand i - 1 (0: one operand for all); one
// call, counted once
inline cublasStatus_t gemm_strided_batched(cublasHandle_t h, const char* call, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                           int k, const float* alpha, const void* A, long long stride_a, const void* B,
                                           long long stride_b, cudaDataType_t type, int lda, int ldb, const float* beta, void* C,
                                           long long stride_c, int ldc, int batches, bool c_bf16 = false) {
  if (batches < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const size_t element = type == CUDA_R_16BF ? 2 : 4, c_element = c_bf16 ? 2 : 4;
  for (int i = 0; i < batches; ++i) {
    const cublasStatus_t s = gemm(h, call, ta, tb, m, n, k, alpha, (const char*)A + i * stride_a * element,
                                  (const char*)B + i * stride_b * element, type, lda, ldb, beta, (char*)C + i * stride_c * c_element, ldc,
                                  i == 0, c_bf16);
    if (s != CUBLAS_STATUS_SUCCESS) return s;
  }
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace emu
inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                                const float* alpha, const float* A, int lda, long long stride_a, const float* B, int ldb,
                                                long long stride_b, const float* beta, float* C, int ldc, long long stride_c, int batches) {
  return emu::gemm_strided_batched(h, "cublasSgemmStridedBatched", ta, tb, m, n, k, alpha, A, stride_a, B, stride_b, CUDA_R_32F, lda,
                                   ldb, beta, C, stride_c, ldc, batches);
}
// cublasGemmEx for what the GPU path asks of it: A and B both fp32 or both bf16, fp32 arithmetic
// (CUBLAS_COMPUTE_32F), C fp32, or bf16 where A and B are; any other combination is CUBLAS_STATUS_NOT_SUPPORTED here.
inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const void* alpha,
                                   const void* A, cudaDataType_t a_type, int lda, const void* B, cudaDataType_t b_type, int ldb,
                                   const void* beta, void* C, cudaDataType_t c_type, int ldc, cublasComputeType_t compute,
                                   cublasGemmAlgo_t) {
  if (a_type != b_type || (a_type != CUDA_R_32F && a_type != CUDA_R_16BF) || (c_type != CUDA_R_32F && c_type != a_type) ||
      compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return emu::gemm(h, "cublasGemmEx", ta, tb, m, n, k, (const float*)alpha, A, B, a_type, lda, ldb, (const float*)beta, C, ldc, true,
                   c_type == CUDA_R_16BF);
}
// cublasGemmStridedBatchedEx likewise: cublasGemmEx's types (C bf16 too), `batches` products strided as
// cublasSgemmStridedBatched's
inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                                 const void* alpha, const void* A, cudaDataType_t a_type, int lda, long long stride_a,
                                                 const void* B, cudaDataType_t b_type, int ldb, long long stride_b, const void* beta,
                                                 void* C, cudaDataType_t c_type, int ldc, long long stride_c, int batches,
                                                 cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (a_type != b_type || (a_type != CUDA_R_32F && a_type != CUDA_R_16BF) || (c_type != CUDA_R_32F && c_type != a_type) ||
      compute != CUBLAS_COMPUTE_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  return emu::gemm_strided_batched(h, "cublasGemmStridedBatchedEx", ta, tb, m, n, k, (const float*)alpha, A, stride_a, B, stride_b,
                                   a_type, lda, ldb, (const float*)beta, C, stride_c, ldc, batches, c_type == CUDA_R_16BF);
}
