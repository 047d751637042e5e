#!/usr/bin/env bash
# CI's aarch64 stage: the CPU build (CPU=1) and the test programs cross-compiled for AArch64 by Debian's
# cross-compiler into build-aarch64/, warnings refused, then CTest's CPU tests run there under qemu-user
# (test/CTestTestfile.cmake, its programs taken from build-aarch64/qemu/: each starts its build-aarch64/test
# twin under qemu-aarch64). ./train and ./translate are not built: they would land in the tree's root, over
# the native ones.
#   bash test/aarch64.sh                        the tests that are quick under emulation (the default below)
#   CTEST_ARGS='-L quick' bash test/aarch64.sh  any other selection: CTest's arguments, as `make test` takes them
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-aarch64
CTEST_ARGS=${CTEST_ARGS:-"-R '^(gradcheck|gemm|fastexp|model_golden|paper_values|decoding|bpe|bleu_golden|numbers|checkpoint|accumulate)\$'"}

# The cross-compiler (its libstdc++ and libgomp come with it), qemu-aarch64 to run what it builds, and
# utf8proc built for arm64 (Debian's multiarch: arm64 added as a foreign architecture; its C library, the
# dynamic loader qemu-aarch64 starts, comes with it).
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
[ -e /usr/lib/aarch64-linux-gnu/libutf8proc.so ] || need+=(libutf8proc-dev:arm64)
if [ ${#need[@]} -gt 0 ]; then
  dpkg --print-foreign-architectures | grep -qx arm64 || dpkg --add-architecture arm64
  apt-get update >/dev/null && apt-get install -y "${need[@]}" >/dev/null
fi

mkdir -p $BUILD
# the CPU test programs alone: PROGRAMS= leaves ./train and ./translate out (they would land in the tree's
# root), GRADE_QUICK= the emulated GPU's
make -j"$(nproc)" CPU=1 CXX=aarch64-linux-gnu-g++ BUILD=$BUILD PROGRAMS= GRADE_QUICK= tests 2>&1 | tee $BUILD/build.log
if grep -q 'warning:' $BUILD/build.log; then
  echo "test/aarch64.sh: the aarch64 build has warnings (above)" >&2
  exit 1
fi

# -L: the arm64 libraries that came with the cross-compiler (C, libstdc++, libgomp) are under
# /usr/aarch64-linux-gnu; utf8proc's is Debian's multiarch one, found at its own path
mkdir -p $BUILD/qemu
for program in $BUILD/test/*; do
  [ -f "$program" ] && [ -x "$program" ] || continue
  printf '#!/bin/sh\nexec qemu-aarch64 -L /usr/aarch64-linux-gnu %q "$@"\n' "$PWD/$program" > $BUILD/qemu/"$(basename "$program")"
  chmod +x $BUILD/qemu/"$(basename "$program")"
done
# One OpenMP thread: on this machine's qemu-user a second thread hangs (the run never ends).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive TEST_BIN=$PWD/$BUILD/qemu
eval "ctest --test-dir test --output-on-failure -j$(getconf _NPROCESSORS_ONLN) $CTEST_ARGS"
