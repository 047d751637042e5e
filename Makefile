# The front door: `make` builds the programs (./train, ./translate); `make test` builds the test programs and
# runs the quick suite (CTest label quick: every kind of check at a small size, a few minutes); `make check`
# runs the whole suite (every long test: what .ci/run calls); `make bench` prints benchmark figures; `make
# data` fetches Multi30k into data/multi30k.
#
#   make            nvcc found: transformer.cu compiled by nvcc (CPU + CUDA paths: it includes gpu/model.cuh)
#   make CPU=1      transformer.cu compiled by g++ as C++ (CPU path only)
#   make EMU=1      transformer.cu compiled by g++ against test/cuda_emulator.h: the CUDA path (gpu/) runs on the CPU
#   make SANITIZE=1 every object, program and test with AddressSanitizer and UndefinedBehaviorSanitizer
#                   (`make CPU=1 SANITIZE=1 test` runs the whole CPU suite under them)
#   make OPENMP=0   without OpenMP: every CPU loop on one thread
#   make CXX=clang++  clang instead of g++ (OpenMP from libomp-dev); on macOS, Apple clang (utf8proc and libomp
#                   from Homebrew); the Makefile keeps to GNU make 3.81, macOS's
#   make fuzz       builds the libFuzzer targets of test/fuzz with clang in build-fuzz/ and runs each
#                   for SECONDS seconds (default 60; RUNS=N stops each after N inputs) on its seed corpus
#
# Whatever the configuration, the tests run the GPU path on the emulated GPU too: `make test` in build/grade/
# (optimised, as the course grader), `make check` also in build/emu/ with AddressSanitizer and
# UndefinedBehaviorSanitizer (see "The emulated GPU" in NOTES.md); CTEST_ARGS="-LE emulated" leaves them out
# (CI runs them once, not in every configuration).
#
# Objects go to build/; a stamp records the configuration (compiler flags included) so switching CPU=1 or
# SANITIZE=1 on or off rebuilds build/'s objects: sanitized and plain objects never mix. build/grade/ and build/emu/'s
# ./train keep stamps of what they are built with (the former's flags leave out nvcc's, so a CPU=1 and an
# nvcc build share it).

CXX      ?= g++
CXXFLAGS ?= -O3 -g
# -fno-math-errno: sqrt need not set errno (nothing reads it after math), so loops that take one vectorise
CXXFLAGS += -std=c++17 -Wall -Wextra -Wno-unused-parameter -fno-math-errno
# clang (and Apple clang, macOS's g++) warns where it cannot vectorise a loop marked `omp simd`: the float
# max reductions of the softmaxes, which it vectorises only under -ffast-math (g++ does, as asked)
CLANG    := $(findstring clang,$(shell $(CXX) --version 2>/dev/null))
ifneq ($(CLANG),)
  CXXFLAGS += -Wno-pass-failed
endif
LDLIBS   :=
BUILD    := build

# AddressSanitizer + UndefinedBehaviorSanitizer, any undefined behaviour fatal: one variable for every
# build that takes SANITIZE=1.
SANITIZE_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ifeq ($(SANITIZE),1)
  CXXFLAGS += $(SANITIZE_FLAGS)
  LDLIBS   += $(SANITIZE_FLAGS)
  $(info ✓ SANITIZE=1: address and undefined-behaviour sanitizers)
endif

# The GPU path compiled by g++ against test/cuda_emulator.h, the emulated GPU (make EMU=1, the emulated tests,
# the course grader): g++ ignores nvcc's `#pragma unroll`, and need not say so at every build.
EMULATED_GPU := -DTRANSFORMER_CUDA -DTRANSFORMER_EMULATED_GPU -Wno-unknown-pragmas

# ---- probes ------------------------------------------------------------------------------------
UNAME := $(shell uname -s)
ifneq ($(filter 1,$(CPU) $(EMU)),)
  NVCC :=
else
  NVCC := $(shell command -v nvcc 2>/dev/null)
endif
# utf8proc: through pkg-config; on macOS from Homebrew (its pkg-config file, or else `brew --prefix`); on
# Linux, as root, `make` installs Debian's package itself.
UTF8PROC := $(shell pkg-config --exists libutf8proc 2>/dev/null && echo yes)
ifeq ($(UTF8PROC),yes)
  UTF8PROC_CFLAGS := $(shell pkg-config --cflags libutf8proc)
  UTF8PROC_LIBS   := $(shell pkg-config --libs libutf8proc)
else ifeq ($(UNAME),Darwin)
  UTF8PROC_PREFIX := $(shell brew --prefix utf8proc 2>/dev/null)
  ifneq ($(wildcard $(UTF8PROC_PREFIX)/include/utf8proc.h),)
    UTF8PROC        := yes
    UTF8PROC_CFLAGS := -I$(UTF8PROC_PREFIX)/include
    UTF8PROC_LIBS   := -L$(UTF8PROC_PREFIX)/lib -lutf8proc
  else
    $(error utf8proc not found; install it with: brew install utf8proc)
  endif
else
  ifeq ($(shell id -u),0)
    $(info utf8proc missing: installing libutf8proc-dev with apt-get)
    $(shell (apt-get install -y libutf8proc-dev || (apt-get update && apt-get install -y libutf8proc-dev)) >/dev/null 2>&1)
    UTF8PROC := $(shell pkg-config --exists libutf8proc 2>/dev/null && echo yes)
  endif
  ifneq ($(UTF8PROC),yes)
    $(error utf8proc not found; install it with: sudo apt-get install libutf8proc-dev)
  endif
  UTF8PROC_CFLAGS := $(shell pkg-config --cflags libutf8proc)
  UTF8PROC_LIBS   := $(shell pkg-config --libs libutf8proc)
endif
CXXFLAGS += $(UTF8PROC_CFLAGS)
LDLIBS   += $(UTF8PROC_LIBS)

# OpenMP: -fopenmp where the compiler has it (g++; clang++ with libomp-dev); Apple clang has no OpenMP of its
# own, and takes Homebrew's libomp through -Xpreprocessor. OPENMP=0 builds without it.
# (\043 is printf's '#': make 3.81 and 4.3 read a '#' in a function call differently)
omp_probe = $(shell printf '\043include <omp.h>\nint main() { return omp_get_max_threads(); }\n' | \
                    $(CXX) $(1) -x c++ - -o /dev/null $(2) 2>/dev/null && echo yes)
ifeq ($(OPENMP),0)
  OPENMP_WHY := off (OPENMP=0)
else ifeq ($(call omp_probe,-fopenmp,-fopenmp),yes)
  OPENMP_CXXFLAGS := -fopenmp
  OPENMP_LIBS     := -fopenmp
else ifeq ($(UNAME),Darwin)
  LIBOMP_PREFIX := $(shell brew --prefix libomp 2>/dev/null)
  ifeq ($(call omp_probe,-Xpreprocessor -fopenmp -I$(LIBOMP_PREFIX)/include,-L$(LIBOMP_PREFIX)/lib -lomp),yes)
    OPENMP_CXXFLAGS := -Xpreprocessor -fopenmp -I$(LIBOMP_PREFIX)/include
    OPENMP_LIBS     := -L$(LIBOMP_PREFIX)/lib -lomp
  else
    OPENMP_WHY := not found (brew install libomp)
  endif
else
  OPENMP_WHY := not found
endif
ifneq ($(OPENMP_LIBS),)
  CXXFLAGS += $(OPENMP_CXXFLAGS)
  LDLIBS   += $(OPENMP_LIBS)
  $(info ✓ OpenMP)
else
  # the loops' `#pragma omp` lines are then unknown pragmas, on purpose
  CXXFLAGS += -Wno-unknown-pragmas
  $(info ✗ OpenMP $(OPENMP_WHY): CPU loops run on one core)
endif

ifneq ($(NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  NVCCFLAGS ?= -O3 -g
  # the two architectures' device code compiled side by side (--threads 2): 63 s instead of 100 on 2 cores
  NVCCFLAGS += -std=c++17 -x cu -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 --threads 2 \
               -Xcompiler "$(filter -fopenmp -march=% -fno-math-errno,$(CXXFLAGS)) -Wall" $(UTF8PROC_CFLAGS)
  LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart
  CXXFLAGS += -DTRANSFORMER_CUDA
  NVCCFLAGS += -DTRANSFORMER_CUDA
  CONFIG   := cuda
  $(info ✓ nvcc ($(NVCC)): CUDA path compiled)
else ifeq ($(EMU),1)
  CXXFLAGS += $(EMULATED_GPU)
  CONFIG   := emu
  $(info ✓ EMU=1: transformer.cu compiled by $(CXX) against test/cuda_emulator.h (the CUDA path on an emulated GPU))
else
  CONFIG   := cpu
  $(info ✗ nvcc not used$(if $(filter 1,$(CPU)), (CPU=1),): transformer.cu compiled by $(CXX) as C++, CPU path only)
endif

# Data parallelism (./train only, parallel.h): MPI from Debian's libopenmpi-dev and openmpi-bin; NCCL from
# the CUDA toolkit, between real GPUs (on the emulated GPU, MPI stands in for it).
MPI_LIBS := $(shell mpicxx --showme:link 2>/dev/null)
ifneq ($(MPI_LIBS),)
  TRAIN_FLAGS := $(shell mpicxx --showme:compile) -DTRANSFORMER_MPI -DOMPI_SKIP_MPICXX -DMPICH_SKIP_MPICXX
  $(info ✓ MPI: mpirun -np N ./train trains on N ranks)
  NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
  ifeq ($(NVCC),)
    $(info ✗ NCCL not used (no nvcc build): $(if $(filter emu,$(CONFIG)),MPI sums the emulated GPU's gradients,CPU gradients summed with MPI))
  else ifneq ($(NCCL_H),)
    # ./train's alone (build/train.o): build/emu's and build/grade's, on the emulated GPU, have no NCCL
    NCCL_FLAGS := -DTRANSFORMER_NCCL -I$(dir $(NCCL_H)) -I$(CUDA_HOME)/include
    NCCL_LIBS  := -lnccl
    $(info ✓ NCCL ($(NCCL_H)): GPU ranks sum gradients with ncclAllReduce)
  else
    $(info ✗ NCCL not found (nccl.h): ./train under mpirun on GPUs says so and stops)
  endif
else
  $(info ✗ MPI not found (libopenmpi-dev, openmpi-bin): ./train runs on one process, and says so under mpirun)
endif
CONFIG := $(CONFIG)$(if $(MPI_LIBS), mpi)$(if $(NCCL_LIBS), nccl)

# The emulated GPU's tests: the GPU path compiled by g++ against test/cuda_emulator.h, with the sanitizers.
EMU_BUILD    := $(BUILD)/emu
EMU_CXXFLAGS := -O1 -g -std=c++17 -Wall -Wextra -Wno-unused-parameter $(OPENMP_CXXFLAGS) \
                $(UTF8PROC_CFLAGS) $(EMULATED_GPU) $(SANITIZE_FLAGS)
# AddressSanitizer's runtime linked in statically where g++ links it (clang always does): the emulator switches
# stacks at every __syncthreads and warp collective, and each switch tells the runtime, whose thread-local
# state costs a __tls_get_addr call from a shared library (the emulated tests ran 13% longer)
EMU_LDLIBS   := $(UTF8PROC_LIBS) $(filter $(SANITIZE_FLAGS),$(LDLIBS)) $(OPENMP_LIBS) \
                $(if $(CLANG),,-static-libasan)
EMU_TESTS    := $(EMU_BUILD)/test/parity_gpu $(EMU_BUILD)/test/cuda_emulator $(EMU_BUILD)/train

# ---- sources -----------------------------------------------------------------------------------
LIB_SRCS := $(wildcard checkpoint.cpp tokenizer.cpp data/*.cpp)  # the library beside transformer.cu, in every build
LIB_OBJS := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard transformer.cu)) $(patsubst %.cpp,$(BUILD)/%.o,$(LIB_SRCS))
PROGRAMS := $(basename $(wildcard train.cpp translate.cpp))
TESTS    := $(patsubst test/%.cpp,$(BUILD)/test/%,$(filter-out test/cuda_emulator.cpp,$(wildcard test/*.cpp)))
# transformer.cu's translation unit includes decoding.cuh and gpu/*.cuh (the GPU path)
HEADERS  := $(wildcard *.h *.cuh gpu/*.cuh data/*.h test/*.h)
# The course grader is built against the emulated GPU in every configuration (it grades the two CUDA kernel
# tasks there, no GPU needed), with its own objects in build/grade/; so are `bench --count` (make bench's
# counts of what a training step asks of the GPU) and a ./train without MPI, whose GPU path
# test/bf16_numbers.sh trains in bf16 (build/emu's, under the sanitizers, runs 4 times slower).
# Its flags are the configuration's but for the GPU's (so that CPU=1 and nvcc builds share its objects), with a
# stamp of their own.
GRADE_BUILD := $(BUILD)/grade
GRADE_CXXFLAGS := $(filter-out $(EMULATED_GPU),$(CXXFLAGS)) $(EMULATED_GPU)
GRADE_OBJS  := $(GRADE_BUILD)/transformer.o $(patsubst %.cpp,$(GRADE_BUILD)/%.o,$(LIB_SRCS))
COURSE      := $(patsubst course/%.cpp,$(GRADE_BUILD)/course/%,$(wildcard course/*.cpp))
EMU_OBJS := $(EMU_BUILD)/transformer.o $(patsubst %.cpp,$(EMU_BUILD)/%.o,$(LIB_SRCS))
# Under SANITIZE=1 build/grade's programs are the emulated GPU with the sanitizers, which build/emu's objects
# already are: they link those, and compile their own with build/emu's flags (with the configuration's -O3,
# build/grade took 390 s of compiling, 202 of them transformer.cu, for the sanitized suite's course test).
ifeq ($(SANITIZE),1)
  GRADE_CXXFLAGS := $(EMU_CXXFLAGS)
  GRADE_OBJS := $(EMU_OBJS)
endif

.PHONY: all tests emu test check mutants planted bench data fuzz clean grade snapshots handout submission FORCE
.SECONDARY:  # keep the objects: they are intermediate files of pattern rules
all: $(PROGRAMS)

# stamp WORDS: the recipe of a stamp that records WORDS, rewritten (so that what depends on it is built again)
# only when they change
stamp = @mkdir -p $(dir $@); echo '$(1)' | cmp -s - $@ || echo '$(1)' > $@
$(BUILD)/config.stamp: FORCE
	$(call stamp,$(CONFIG) $(CXXFLAGS))
$(GRADE_BUILD)/config.stamp: FORCE
	$(call stamp,$(GRADE_CXXFLAGS))

ifneq ($(NVCC),)
$(BUILD)/transformer.o: transformer.cu $(HEADERS) $(BUILD)/config.stamp
	$(NVCC) $(NVCCFLAGS) -c $< -o $@
else
$(BUILD)/transformer.o: transformer.cu $(HEADERS) $(BUILD)/config.stamp
	$(CXX) $(CXXFLAGS) -x c++ -c $< -o $@
endif

$(EMU_BUILD)/transformer.o: transformer.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(EMU_BUILD)/%.o: %.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_BUILD)/test/%: $(EMU_BUILD)/test/%.o $(EMU_OBJS)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ $(EMU_LDLIBS)

# ./train on the emulated GPU: test/data_parallel.sh runs its GPU path (gradients in "device" buffers) over MPI.
# (Target-specific variables here are not `private`, which GNU make 3.81 lacks: the prerequisites inherit
# them, and none of their recipes reads them.)
$(EMU_BUILD)/train.o: EMU_CXXFLAGS += $(TRAIN_FLAGS)
$(EMU_BUILD)/train.o: $(EMU_BUILD)/mpi.stamp  # MPI found or lost: build again
$(EMU_BUILD)/mpi.stamp: FORCE
	$(call stamp,$(TRAIN_FLAGS) $(MPI_LIBS))
$(EMU_BUILD)/train: $(EMU_BUILD)/train.o $(EMU_OBJS)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ $(EMU_LDLIBS) $(MPI_LIBS)

$(BUILD)/%.o: %.cpp $(HEADERS) $(BUILD)/config.stamp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(OBJECT_FLAGS) -c $< -o $@

$(PROGRAMS): %: $(BUILD)/%.o $(LIB_OBJS)
	$(CXX) $^ -o $@ $(LDLIBS)

# ./train's object alone has MPI's and NCCL's flags: in a variable of their own, which the prerequisite
# $(BUILD)/config.stamp does not record
$(BUILD)/train.o: OBJECT_FLAGS = $(TRAIN_FLAGS) $(NCCL_FLAGS)
train: LDLIBS += $(MPI_LIBS) $(NCCL_LIBS)

$(BUILD)/test/%: $(BUILD)/test/%.o $(LIB_OBJS)
	$(CXX) $^ -o $@ $(LDLIBS)

$(GRADE_BUILD)/transformer.o: transformer.cu $(HEADERS) $(GRADE_BUILD)/config.stamp
	@mkdir -p $(dir $@)
	$(CXX) $(GRADE_CXXFLAGS) -x c++ -c $< -o $@

$(GRADE_BUILD)/course/%.o: course/%.cpp $(HEADERS) $(wildcard course/*.h) $(GRADE_BUILD)/config.stamp
	@mkdir -p $(dir $@)
	$(CXX) $(GRADE_CXXFLAGS) -c $< -o $@

$(GRADE_BUILD)/%.o: %.cpp $(HEADERS) $(GRADE_BUILD)/config.stamp
	@mkdir -p $(dir $@)
	$(CXX) $(GRADE_CXXFLAGS) -c $< -o $@

$(GRADE_BUILD)/course/%: $(GRADE_BUILD)/course/%.o $(GRADE_OBJS)
	$(CXX) $^ -o $@ $(EMU_LDLIBS)

$(GRADE_BUILD)/test/%: $(GRADE_BUILD)/test/%.o $(GRADE_OBJS)
	$(CXX) $^ -o $@ $(EMU_LDLIBS)

$(GRADE_BUILD)/train: $(GRADE_BUILD)/train.o $(GRADE_OBJS)
	$(CXX) $^ -o $@ $(EMU_LDLIBS)

emu: $(EMU_TESTS)

# CTest runs a test a core (TEST_JOBS; getconf, not nproc, which obeys OMP_NUM_THREADS), the longest first
# (their COST in test/CTestTestfile.cmake). Waiting OpenMP threads sleep (OMP_WAIT_POLICY=passive): left
# spinning, two tests' thread teams on the same 2 cores made translate_cli take 196 s instead of 44 s.
TEST_JOBS ?= $(shell getconf _NPROCESSORS_ONLN)
# The quick suite's programs: the CPU tests, and the emulated GPU's parity test and course grader from
# build/grade's objects (one emulated build, optimised; `make check` adds build/emu's sanitized one).
GRADE_QUICK    := $(GRADE_BUILD)/course/grade $(GRADE_BUILD)/test/parity_gpu
QUICK_PROGRAMS := $(PROGRAMS) $(TESTS) $(GRADE_QUICK)
tests: $(QUICK_PROGRAMS)
test: tests
	OMP_WAIT_POLICY=passive ctest --test-dir test --output-on-failure -j$(TEST_JOBS) -L quick $(CTEST_ARGS)
check: tests emu $(COURSE) $(GRADE_BUILD)/test/bench $(GRADE_BUILD)/train
	OMP_WAIT_POLICY=passive ctest --test-dir test --output-on-failure -j$(TEST_JOBS) $(CTEST_ARGS)

# Bugs planted in copies of the GPU path (gpu/*.cuh), each of which the emulated parity_gpu must catch. A mutant's
# transformer.cu (with its planted copy of gpu/) is compiled at -Og, without a sanitizer and with line tables only (-g1) first, and again
# with AddressSanitizer if that build passes (a write past a buffer's end may show only there): compiling is
# most of what the mutants cost, and -Og compiles in 13 s where build/emu's -O1 takes 29 s (without a
# sanitizer; its parity_gpu runs in 20 s instead of 13, and most mutants stop at a check long before the
# end). Every planted bug shows as a wrong result, an access out of bounds or a refused call: none needs
# UndefinedBehaviorSanitizer.
MUTANT_CXXFLAGS := $(filter-out -O1 -g $(SANITIZE_FLAGS),$(EMU_CXXFLAGS)) -Og -g1
mutants: emu
	bash test/mutants_gpu.sh "$(CXX)" "$(MUTANT_CXXFLAGS)" "-fsanitize=address -fno-omit-frame-pointer" \
	  "$(EMU_CXXFLAGS)" "$(EMU_LDLIBS)" \
	  "$(filter-out %/transformer.o,$(EMU_OBJS)) $(EMU_BUILD)/test/parity_gpu.o"

# One error planted in each area of the CPU model, each of which the quick suite must catch (test/planted.sh).
planted:
	bash test/planted.sh $(TEST_JOBS)

# Multi30k into data/multi30k (from $MULTI30K_DIR when set, else downloaded): see data/get_multi30k.sh.
data:
	bash data/get_multi30k.sh data/multi30k

# Benchmarks print figures (they are not tests): see test/bench.sh.
bench: all $(TESTS) $(GRADE_BUILD)/test/bench
	bash test/bench.sh

# ---- fuzzing: libFuzzer targets (clang), each linked with the library sources ---------------------------
FUZZ_CXX     ?= clang++
FUZZ_BUILD   := build-fuzz
FUZZ_FLAGS   := -g -O1 -std=c++17 -march=native -Wall -Wno-unknown-pragmas $(UTF8PROC_CFLAGS) \
                -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_LIB     := $(FUZZ_BUILD)/transformer.o $(patsubst %.cpp,$(FUZZ_BUILD)/%.o,$(LIB_SRCS))
FUZZ_TARGETS := $(patsubst test/fuzz/%.cpp,$(FUZZ_BUILD)/%,$(wildcard test/fuzz/fuzz_*.cpp))
SECONDS      ?= 60
RUNS         ?= -1

$(FUZZ_BUILD)/transformer.o: transformer.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -x c++ -c $< -o $@
$(FUZZ_BUILD)/%.o: %.cpp $(HEADERS)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_BUILD)/fuzz_%: test/fuzz/fuzz_%.cpp test/fuzz/fuzz.h $(FUZZ_LIB) $(HEADERS)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_LIB) -o $@ $(UTF8PROC_LIBS)

# Each target for SECONDS seconds (or RUNS inputs, whichever comes first), one after the other; new inputs go to build-fuzz/corpus, crashes to
# build-fuzz/crash-*. Prints the inputs each ran; fails on the first crash, leak, timeout or excess memory.
fuzz: $(FUZZ_TARGETS)
	@for t in $(notdir $(FUZZ_TARGETS)); do bash test/fuzz/run.sh $(FUZZ_BUILD) $$t $(SECONDS) $(RUNS) || exit 1; done

# Course assignments (README, "Course assignments"): the grader in any tree; the generator and the
# snapshot writer in the solution tree only (course/handout.py and course/snapshots.cpp are not in a handout).
grade: $(GRADE_BUILD)/course/grade
	python3 course/grade.py $(if $(HIDDEN),--hidden $(HIDDEN)) $(if $(REFERENCE),--reference $(REFERENCE))

snapshots: $(filter %/snapshots,$(COURSE))
	@test -f course/snapshots.cpp || { echo "make snapshots: runs in the solution tree (course/snapshots.cpp is not in a handout)"; exit 1; }
	$(GRADE_BUILD)/course/snapshots $(if $(HIDDEN),--hidden $(HIDDEN))

handout:
	@test -f course/handout.py || { echo "make handout: runs in the solution tree (course/handout.py is not in a handout)"; exit 1; }
	python3 course/handout.py --tasks '$(TASKS)' --out '$(OUT)'

submission:
	python3 course/grade.py --submission

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(PROGRAMS)
