#!/usr/bin/env bash
# Builds libflashattn and runs every test (host-only tests always; GPU tests when a GPU is present,
# otherwise they are reported as skipped), then the Python package's tests.
# Usage: scripts/test.sh [build-dir]     (env: FLASHATTN_HEAD_DIMS, CMAKE_CUDA_ARCHITECTURES, JOBS)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build=${1:-build}
jobs=${JOBS:-$(nproc)}
args=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -n "${FLASHATTN_HEAD_DIMS:-}" ] && args+=("-DFLASHATTN_HEAD_DIMS=${FLASHATTN_HEAD_DIMS}")
[ -n "${CMAKE_CUDA_ARCHITECTURES:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}")
cmake -S . -B "$build" "${args[@]}" >/dev/null
start=$(date +%s)
cmake --build "$build" -j "$jobs"
echo "build: $(( $(date +%s) - start )) s"
ctest --test-dir "$build" --output-on-failure -j "$jobs"
if [ -f python/tests/run.sh ]; then bash python/tests/run.sh "$build"; fi
