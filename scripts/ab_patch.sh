#!/usr/bin/env bash
# One device call for a kernel candidate kept as a patch: A = this tree, B = this tree with PATCH
# applied (patch -p1), and with more patches C = B with each of them applied in turn (candidates
# that build on B's). Builds in parallel, with all cores: the last tree (B, or C) at every head dim
# (tests included), the others' benchmarks at head dim 128, and A and the last tree again with
# benchmarks/block_timeline.patch (each tree's own copy: a candidate that moves the recorded steps
# updates it) under FA_DIAG_TL. Then, in order, so that a call cut short keeps what matters most:
#   1. A/B (A/B/C) cold, shape by shape (benchmarks/ab_interleave.py: L2 flushed, GPU time, A B B A
#      or A B C C B A per shape in fresh processes; SHAPES, ROUNDS (2));
#   2. the last tree's whole suite (scripts/gpu_check.sh test, every head dim; SKIP_SUITE=1 leaves
#      it out): with C, B's code runs in it with the other patches' added;
#   3. the block timelines of the last tree and A (benchmarks/block_timeline.py; CASES) while time
#      is left.
# LIMIT: the seconds the call may take (default 580); each step stops in time for the next.
# FLASHATTN_HEAD_DIMS restricts the last tree's build and suite (a candidate that changes only those
# head dims' kernels and plans; the suite then reports the calls it could not make).
# Trees under $AB_DIR (default /tmp/ab_patch); logs and tables under $OUT.
#   Usage: scripts/ab_patch.sh first.patch [second.patch ...]
set -uo pipefail
cd "$(dirname "$0")/.."
patch_file=$(realpath "${1:?usage: scripts/ab_patch.sh PATCH}")
OUT=${OUT:-/tmp/flashattn_out}; mkdir -p "$OUT"
D=${AB_DIR:-/tmp/ab_patch}; LIMIT=${LIMIT:-580}
S0=$(date +%s); el() { echo $(( $(date +%s) - S0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
rm -rf "$D" && mkdir -p "$D/A" || exit 1
tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$D/A"
cp -r "$D/A" "$D/B" && (cd "$D/B" && patch -s -p1 < "$patch_file") || { echo "ab_patch.sh: $1 does not apply"; exit 1; }
last=B
if [ $# -gt 1 ]; then
  last=C; cp -r "$D/B" "$D/C" || exit 1
  for p2 in "${@:2}"; do
    p2abs=$(realpath "$p2")
    (cd "$D/C" && patch -s -p1 < "$p2abs") || { echo "ab_patch.sh: $p2 does not apply after the patches before it"; exit 1; }
  done
fi
for t in A $last; do
  cp -r "$D/$t" "$D/${t}tl" && (cd "$D/${t}tl" && patch -s -p1 < benchmarks/block_timeline.patch) ||
    { echo "ab_patch.sh: the timeline patch does not apply to $t"; exit 1; }
done
build() { # tree target cmake-options...
  local tree=$1 target=$2; shift 2
  cmake -S "$D/$tree" -B "$D/$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null 2>&1 &&
    cmake --build "$D/$tree/build" -j "$(nproc)" --target "$target" > "/tmp/ab_patch_build_$tree.log" 2>&1
  local rc=$?
  echo "build $tree ($target): rc=$rc, $(el) s"; [ $rc = 0 ] || tail -30 "/tmp/ab_patch_build_$tree.log"
  return $rc
}
tl_opts=(-DFLASHATTN_HEAD_DIMS=128 -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_FLAGS=-DFA_DIAG_TL)
bench_opts=(-DFLASHATTN_HEAD_DIMS=128 -DFLASHATTN_BUILD_TESTS=OFF)
build $last all ${FLASHATTN_HEAD_DIMS:+-DFLASHATTN_HEAD_DIMS=$FLASHATTN_HEAD_DIMS} & pl=$!
build A flashattn_bench "${bench_opts[@]}" & pa=$!
pb=; [ $last = C ] && { build B flashattn_bench "${bench_opts[@]}" & pb=$!; }
build Atl flashattn "${tl_opts[@]}" &
build ${last}tl flashattn "${tl_opts[@]}" &
wait $pa && wait $pl && { [ -z "$pb" ] || wait $pb; } || exit 1
wait
d8k=decode:bf16:1:32:8:1:8192:128:none
shapes=${SHAPES:-"$d8k $d8k:pages=16 $d8k:pages=256 $d8k:cache decode:bf16:1:32:8:1:16384:128:none
  decode:bf16:2:32:8:1:8192:128:none prefill:bf16:1:32:8:2048:2048:128:causal"}
args=(); for s in $shapes; do args+=(--shape "$s"); done
[ $last = C ] && args+=(--c "$D/C/build/benchmarks/flashattn_bench")
PYTHONUNBUFFERED=1 timeout $(( LIMIT * 2 / 5 )) python3 benchmarks/ab_interleave.py --a "$D/A/build/benchmarks/flashattn_bench" \
  --b "$D/B/build/benchmarks/flashattn_bench" "${args[@]}" --rounds "${ROUNDS:-2}" --json "$OUT/ab_patch.json" > "$OUT/ab_patch.txt" 2>&1
echo "A/B$([ $last = C ] && echo /C) (B / A$([ $last = C ] && echo ", C / A"), cold, GPU time), $(el) s:"; cat "$OUT/ab_patch.txt"
suite_s=$(( LIMIT - 40 - $(el) ))
if [ -n "${SKIP_SUITE:-}" ]; then :
elif [ $suite_s -lt 60 ]; then echo "$last's suite: not run, $suite_s s left of LIMIT"
else
  (cd "$D/$last" && CTEST_TIMEOUT=150 SKIP_PTXAS=1 OUT="$OUT" timeout $suite_s bash scripts/gpu_check.sh test 2>&1 | tail -25)
  echo "$last's suite: $(el) s"
fi
for t in ${last}tl Atl; do
  left=$(( LIMIT - 10 - $(el) )); [ $left -gt 30 ] || break
  (cd "$D/$t" && FLASHATTN_LIBRARY="$D/$t/build/libflashattn.so" PYTHONPATH="$D/$t/python" OUT="$OUT" TAG="_$t" \
    CASES=${CASES:-dense_fill,pages256_fill,pages16_fill} REPS=${REPS:-20} timeout $(( left / 2 )) python3 "$D/$t/benchmarks/block_timeline.py" 2>&1 | tail -8)
done
echo "ab_patch.sh: done in $(el) s"
