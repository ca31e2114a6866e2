#!/usr/bin/env bash
# Builds libflashattn and runs the benchmark binary's default suite on the GPU (the peer table's
# prefill and decode shapes). Extra arguments go to flashattn_bench (e.g. --json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
build=${BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "${JOBS:-$(nproc)}" >/dev/null
exec "$build/benchmarks/flashattn_bench" "$@"
