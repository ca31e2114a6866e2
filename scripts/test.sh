#!/usr/bin/env bash
# Builds libflashattn and runs every test (host-only tests always; GPU tests when a GPU is present,
# otherwise they are reported as skipped), then the Python package's tests. Fails if no test ran.
# Usage: scripts/test.sh [build-dir (default: build)]
#        (env: FLASHATTN_HEAD_DIMS, CMAKE_CUDA_ARCHITECTURES, JOBS)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build=${1:-build}
jobs=${JOBS:-$(nproc)}
# Tests and the benchmark are forced on: a build directory configured without them (by hand, or by
# an older bench.sh) is reconfigured rather than silently testing nothing.
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=ON -DFLASHATTN_BUILD_BENCHMARKS=ON)
# Unset, each goes back to the project's default (-U), so that a build directory configured once
# with fewer head dims or architectures does not go on testing that restricted build in silence.
for v in FLASHATTN_HEAD_DIMS CMAKE_CUDA_ARCHITECTURES; do
  if [ -n "${!v:-}" ]; then args+=("-D$v=${!v}"); else args+=("-U$v"); fi
done
echo "test.sh: configuring and building in $build (progress below)"
cmake -S . -B "$build" "${args[@]}" >/dev/null
start=$(date +%s)
cmake --build "$build" -j "$jobs"
echo "build: $(( $(date +%s) - start )) s"
ctest --test-dir "$build" --output-on-failure --no-tests=error -j "$jobs"
bash python/tests/run.sh "$build"
