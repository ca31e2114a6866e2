#!/usr/bin/env bash
# Builds the host-side tests with AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer and
# runs them: test_host (validation, planning, the queries, errors, handles, the merge's checks, the
# frozen layouts) and the benchmark's argument errors. The build is a restricted one (head dim 64,
# sm_80 only: the host code is the same in every build, and it builds in about a minute), so it
# also checks that a development build's tests pass, skipping with a reason what its kernels lack.
# No GPU needed (GPU tests are not built here; scripts/test.sh runs them).
# Usage: scripts/sanitize.sh [build-dir (default: build-asan)]   (env: JOBS)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build=${1:-build-asan}
jobs=${JOBS:-$(nproc)}
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
echo "sanitize.sh: configuring and building test_host and flashattn_bench in $build (ASan, UBSan)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLASHATTN_HEAD_DIMS=64 -DCMAKE_CUDA_ARCHITECTURES=80 \
  -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_BENCHMARKS=ON \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_CXX_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  >/dev/null
start=$(date +%s)
cmake --build "$build" -j "$jobs" --target test_host flashattn_bench
echo "build: $(( $(date +%s) - start )) s"
# protect_shadow_gap=0: the CUDA runtime maps device memory where ASan's shadow gap would be.
export ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:${UBSAN_OPTIONS:-}"
"$build/tests/test_host" --gtest_brief=1
cmake -DBENCH="$build/benchmarks/flashattn_bench" -P tests/bench_args.cmake
echo "sanitize.sh: test_host and the benchmark's argument checks passed under ASan and UBSan"
