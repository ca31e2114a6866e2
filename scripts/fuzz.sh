#!/usr/bin/env bash
# Builds tests/fuzz/fuzz_plan.c (libFuzzer, AddressSanitizer, UndefinedBehaviorSanitizer) over the
# host-side sources and runs it for a bounded time. Needs clang with libFuzzer (installed through
# apt when missing and running as root); without it, says so and stops.
# The run starts from tests/fuzz/seeds.b64 (one input a line, base64): the minimised corpus of longer
# runs, so that a short run (CI's minute) mutates inputs that already reach every branch they found.
# FUZZ_SAVE_SEEDS=1 rewrites that file from this run's corpus, minimised (libFuzzer's -merge=1).
# Usage: scripts/fuzz.sh [build-dir (for the generated headers; default build)] [seconds (default 60)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
seconds=${2:-60}
[ -f "$build/generated/fa_instances.h" ] || { echo "fuzz: configure $build first (scripts/test.sh $build)" >&2; exit 1; }
# fa_build_info.h is written at build time; a build directory that was only configured lacks it.
cmake --build "$build" --target flashattn_build_info > /dev/null
cc=${CLANG:-clang}
probe() { echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' |
          "$cc" -x c -fsanitize=fuzzer - -o /tmp/fa_fuzz_probe.$$ 2>/dev/null; }
if ! command -v "$cc" >/dev/null || ! probe; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fuzz: installing clang (libFuzzer)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang >/dev/null || true
  fi
  if ! command -v "$cc" >/dev/null || ! probe; then
    echo "fuzz: NOT RUN: no clang with libFuzzer on this machine (install clang)"
    exit 0
  fi
fi
rm -f /tmp/fa_fuzz_probe.$$
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
out="$build/fuzz"
mkdir -p "$out/corpus"
"$cc" -g -O1 -std=c11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Iinclude -Isrc -Ikernels -I"$build/generated" -I"$cuda_home/include" \
  tests/fuzz/fuzz_plan.c src/api.c src/validate.c src/plan.c src/errors.c src/variants.c src/merge.c \
  -L"$cuda_home/lib64" -L"$cuda_home/lib" -Wl,-rpath,"$cuda_home/lib64" -lcudart -lcublas -lpthread -lm \
  -o "$out/fuzz_plan"
# Inputs that once failed (kept in tests/fuzz/regressions) run first, each on its own.
echo "fuzz: replaying $(ls tests/fuzz/regressions | wc -l) saved inputs from tests/fuzz/regressions"
"$out/fuzz_plan" tests/fuzz/regressions/* 2> "$out/regressions.log" || {
  tail -40 "$out/regressions.log"; echo "fuzz: FAILED on a saved input (log: $out/regressions.log)"; exit 1; }
seeds=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  printf '%s' "$line" | base64 -d > "$out/corpus/seed-$seeds"
  seeds=$((seeds + 1))
done < <(cat tests/fuzz/seeds.b64 2>/dev/null || true)
echo "fuzz: running fuzz_plan for ${seconds} s from $seeds seed inputs (tests/fuzz/seeds.b64)"
# A failing input is written under $out (never into the source tree); keep it in tests/fuzz/regressions
# once the failure is fixed.
"$out/fuzz_plan" -artifact_prefix="$out/" -max_total_time="$seconds" -print_final_stats=1 "$out/corpus" \
  2> "$out/fuzz.log" || {
  tail -40 "$out/fuzz.log"; echo "fuzz: FAILED (log: $out/fuzz.log)"; exit 1; }
grep -E "^stat::number_of_executed_units|^statuses:" "$out/fuzz.log" || true
if [ "${FUZZ_SAVE_SEEDS:-0}" = 1 ]; then
  rm -rf "$out/min" && mkdir -p "$out/min"
  "$out/fuzz_plan" -merge=1 "$out/min" "$out/corpus" 2> "$out/merge.log"
  for f in "$out/min"/*; do base64 -w0 "$f"; echo; done | LC_ALL=C sort > tests/fuzz/seeds.b64
  echo "fuzz: tests/fuzz/seeds.b64 rewritten ($(wc -l < tests/fuzz/seeds.b64) inputs)"
fi
echo "fuzz: passed"
