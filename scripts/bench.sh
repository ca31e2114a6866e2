#!/usr/bin/env bash
# Builds libflashattn and runs the benchmark binary's default suite on the GPU (the peer table's
# prefill and decode shapes). Extra arguments go to flashattn_bench (e.g. --json out.json; --help).
# Builds in its own directory (build-bench, or $BUILD_DIR), so it never changes what
# scripts/test.sh builds; either may run first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build=${BUILD_DIR:-build-bench}
echo "bench.sh: configuring and building in $build (progress below)"
# The default suite needs every head dim's kernels: a directory once configured with fewer (or
# other architectures) goes back to the project's defaults (-U).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
  -DFLASHATTN_BUILD_BENCHMARKS=ON -UFLASHATTN_HEAD_DIMS -UCMAKE_CUDA_ARCHITECTURES >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target flashattn_bench
exec "$build/benchmarks/flashattn_bench" "$@"
