// Data parallelism for ./train [§5.2: the paper trains on 8 GPUs]: `mpirun -np N ./train ...` runs N ranks;
// each computes the gradient of its share of every step's batches, already divided by the step's target
// tokens (which every rank counts from the data), and the gradients are summed across ranks: MPI_Allreduce
// on host buffers, ncclAllReduce on GPU buffers (one rank per GPU, NCCL's id shared over MPI). On the emulated GPU the "device" buffers are
// host memory, and MPI stands in for NCCL. Without MPI (the Makefile's probe) there is one rank.
//
// Every collective has a deadline (--collective-timeout): a rank that stops answering makes the others
// stop with one line instead of hanging; a rank that dies makes mpirun end the others with SIGTERM (as
// Ctrl-C does), which each reports in one line.
#pragma once
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <unistd.h>

#ifdef TRANSFORMER_MPI
#include <mpi.h>
#endif
#if defined(TRANSFORMER_NCCL) && !defined(TRANSFORMER_EMULATED_GPU)
#include <cuda_runtime.h>
#include <nccl.h>
#endif

// The one line of a rank that cannot go on, and its exit: rank 0's as `train: ...`, another's as
// `train: rank R: ...` (an error may be one rank's alone: a GPU, a file on its machine).
[[noreturn]] inline void fail_on_rank(int rank, const std::string& msg) {
  if (rank == 0) std::fprintf(stderr, "train: %s\n", msg.c_str());
  else std::fprintf(stderr, "train: rank %d: %s\n", rank, msg.c_str());
  std::fflush(nullptr);
  std::exit(1);
}

// The number of processes the launcher started, from its environment (OpenMPI, MPICH, PMIx), before
// MPI is initialised: how a build without MPI knows it was started by mpirun.
inline int launcher_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

class Ranks {
 public:
  int rank = 0, size = 1;
  double timeout_s = 600;  // --collective-timeout

  // MPI_Init when a launcher started several processes and the build has MPI (one process never touches
  // MPI); without MPI, a run under a launcher of several processes is refused.
  Ranks(int* argc, char*** argv) {
#ifdef TRANSFORMER_MPI
    if (launcher_size() == 1) return;
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::signal(SIGTERM, on_terminate);
    terminate_line(rank);
#else
    if (launcher_size() > 1) {
      std::fprintf(stderr, "train: started as one of %d processes (mpirun?), but this build has no MPI: every process "
                           "would train alone. Install libopenmpi-dev and openmpi-bin, then rebuild (make)\n", launcher_size());
      std::exit(1);
    }
#endif
  }
  ~Ranks() {
#if defined(TRANSFORMER_NCCL) && !defined(TRANSFORMER_EMULATED_GPU)
    if (nccl) ncclCommDestroy(nccl);
#endif
#ifdef TRANSFORMER_MPI
    if (launcher_size() > 1) MPI_Finalize();
#endif
  }
  Ranks(const Ranks&) = delete;
  Ranks& operator=(const Ranks&) = delete;

  // Before the model moves to a GPU: one GPU per rank on a node (the rank's index among the node's ranks).
  void choose_gpu() {
#if defined(TRANSFORMER_NCCL) && !defined(TRANSFORMER_EMULATED_GPU)
    if (size == 1) return;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int local = 0, gpus = 0;
    MPI_Comm_rank(node, &local);
    MPI_Comm_free(&node);
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) fail_on_rank(rank, "no GPU is visible to this rank");
    if (gpus > 1 && local >= gpus)  // (one visible GPU: the launcher gave each rank its own)
      fail_on_rank(rank, "this rank is rank " + std::to_string(local) + " of its node, which has " + std::to_string(gpus) +
                             " GPUs: start at most one rank per GPU");
    cudaSetDevice(gpus == 1 ? 0 : local);
#endif
  }

  // Sums across ranks (every rank gets the sum).
  long sum(long x, const char* what, long step) { return reduce(x, kSum, what, step); }
  double sum(double x, const char* what, long step) { return reduce(x, kSum, what, step); }
  // Whether every rank holds the same x (its smallest and largest value across ranks are equal).
  bool same(uint64_t x, const char* what, long step) {
    const uint64_t least = reduce(x, kMin, what, step);
    return least == reduce(x, kMax, what, step);
  }

  // The gradients summed across ranks, in place; `on_device`: data is a GPU buffer.
  void sum_gradients(float* data, size_t n, bool on_device, long step) {
    if (size == 1) return;
#if defined(TRANSFORMER_NCCL) && !defined(TRANSFORMER_EMULATED_GPU)
    if (on_device) {
      if (!nccl) {
        ncclUniqueId id;
        if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) fail_on_rank(rank, "NCCL could not make its unique id");
        MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (ncclCommInitRank(&nccl, size, id, rank) != ncclSuccess) fail_on_rank(rank, "NCCL could not connect the ranks");
      }
      // on the stream the model computes on (the default one): after the backward pass, before Adam
      if (ncclAllReduce(data, data, n, ncclFloat, ncclSum, nccl, 0) != ncclSuccess) fail_on_rank(rank, "ncclAllReduce failed");
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      for (cudaError_t e; (e = cudaStreamQuery(0)) != cudaSuccess;) {
        if (e != cudaErrorNotReady) fail_on_rank(rank, std::string("the GPU failed before the gradient all-reduce ended: ") + cudaGetErrorString(e));
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(nccl, &async);
        if (async != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
          ncclCommAbort(nccl);
          nccl = nullptr;
          timed_out("the gradients", step);
        }
        usleep(100);
      }
      return;
    }
#elif defined(TRANSFORMER_CUDA) && !defined(TRANSFORMER_EMULATED_GPU)
    if (on_device) fail_on_rank(rank, "this build has no NCCL (nccl.h was not found when it was built): data parallelism on GPUs needs it");
#endif
#ifdef TRANSFORMER_MPI
    wait(MPI_IN_PLACE, data, (int)n, MPI_FLOAT, MPI_SUM, "the gradients", step);
#else
    (void)data, (void)n, (void)on_device, (void)step;
#endif
  }

 private:
#if defined(TRANSFORMER_NCCL) && !defined(TRANSFORMER_EMULATED_GPU)
  ncclComm_t nccl = nullptr;
#endif

  enum Op { kSum, kMin, kMax };
  template <typename V> V reduce(V x, Op op, const char* what, long step) {
    if (size == 1) return x;
#ifdef TRANSFORMER_MPI
    V out = x;
    const MPI_Datatype type = std::is_same<V, double>::value ? MPI_DOUBLE : std::is_same<V, long>::value ? MPI_LONG : MPI_UINT64_T;
    wait(&x, &out, 1, type, op == kSum ? MPI_SUM : op == kMin ? MPI_MIN : MPI_MAX, what, step);
    return out;
#else
    (void)op, (void)what, (void)step;
    return x;
#endif
  }

#ifdef TRANSFORMER_MPI
  // A non-blocking all-reduce, waited for until the deadline.
  void wait(const void* in, void* out, int n, MPI_Datatype type, MPI_Op op, const char* what, long step) {
    MPI_Request request;
    MPI_Iallreduce(in, out, n, type, op, MPI_COMM_WORLD, &request);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (int done = 0;;) {
      MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) timed_out(what, step);
      usleep(200);
    }
  }
#endif

  [[noreturn]] void timed_out(const char* what, long step) {
    std::fprintf(stderr, "train: rank %d: another rank did not join the all-reduce of %s at step %ld within "
                         "--collective-timeout %g s (did it die or hang?): stopping\n", rank, what, step, timeout_s);
    std::fflush(nullptr);
    std::_Exit(1);
  }

  // The line a rank prints when the launcher ends it, formatted once by the constructor (rank >= 0).
  static const char* terminate_line(int rank) {
    static char line[160];
    if (rank >= 0)
      std::snprintf(line, sizeof line, "train: rank %d: ended by the launcher (SIGTERM: Ctrl-C, or another rank ended); "
                                       "the checkpoints written before are kept\n", rank);
    return line;
  }
  static void on_terminate(int) {  // async-signal-safe: the line was formatted in advance
    const char* line = terminate_line(-1);
    size_t n = 0;
    while (line[n]) ++n;
    if (write(2, line, n) < 0) {}
    _exit(1);
  }
};
