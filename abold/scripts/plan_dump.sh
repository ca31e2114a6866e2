#!/usr/bin/env bash
# Builds tests/tools/plan_dump.c against the host sources and prints the planner's answers for its
# fixed grid of calls (about 1.4 million lines): a planner refactor must not change them.
# Usage: scripts/plan_dump.sh [build-dir (for the generated headers; default build)] | sha256sum
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
exe="$build/plan_dump"
cc -O2 -std=c11 -Iinclude -Isrc -Ikernels -I"$build/generated" -I"$cuda_home/include" \
  tests/tools/plan_dump.c src/api.c src/validate.c src/plan.c src/errors.c src/variants.c \
  -L"$cuda_home/lib64" -L"$cuda_home/lib" -Wl,-rpath,"$cuda_home/lib64" -lcudart -lcublas -lpthread -lm -o "$exe"
"$exe"
