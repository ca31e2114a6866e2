#!/usr/bin/env bash
# One device call: build with all cores, run the whole test suite (GPU tests included), the
# benchmark's default suite, and the side-by-side comparison with the peers; logs under $OUT, a
# short table last. Usage: scripts/gpu_check.sh
# [all|build|test|sanitize|bench|kvrows|quick|hostcost|launchcost|ceiling|serving|peers|fusedpeers|ab|abtree|abshapes|abserving|ncuserving|ncupeers]...
# (default: all; "abserving" is abtree's A/B for benchmarks/serving_speed.py; "quick" is the
# benchmark's quick suite, "hostcost" the Python host cost per call beside SDPA's; "fusedpeers" the
# portable FUSED kernel forced, beside FA2 (which runs its sm80 code on Hopper too); "launchcost"
# the host cost of each launch form (benchmarks/launch_cost.cu); "ceiling" a batch-1 8k decode's
# K/V read by bare kernels beside the library's call (benchmarks/read_ceiling.cu; CEILING_ROUNDS,
# 3); "serving" the serving paths' speed beside the dense path and the peers; "abtree" builds the
# source tree in $AB_OLD too and times both builds on the default suite, alternating, for a
# refactor's before/after; AB_ARGS adds benchmark
# options to both, e.g. "--backend fused"; "abshapes" does the same shape by shape, A B B A per
# shape, on $AB_SHAPES: benchmarks/ab_interleave.py). "ab" times FUSED against FUSED_SM90 at every
# compiled head dim: the measurement behind the AUTO ranges of FA_SM90_CONFIGS. CTEST_TIMEOUT:
# seconds a test may take (900), so that a kernel that hangs costs a device call less than its whole
# limit. PEER_ROUNDS: compare_peers.py's --rounds in the peers steps (2); PEER_ARGS, more of its
# options for the peers step (e.g. "--kinds decode --head-dims 128"). "kvrows": the benchmark's
# decode suite (--suite decode: the default suite's six decode shapes dense and in pages of 1, 16,
# 64 and 256 keys, head dim 128), with each paged row's rate over its dense row's.
# FLASHATTN_HEAD_DIMS restricts this tree's build and $AB_OLD's alike. abserving: AB_ONLY keeps the
# serving_speed.py rows whose labels contain one of its '|'-separated parts (e.g. "prefill 4x4k
# 32/8|decode 128x1"), AB_GROUPS runs that many A B B A groups (1), AB_ITERS replays a function
# (20); its runs' JSON and logs stay under /tmp, and $OUT gets serving_ab.txt (B / A per cell) and
# serving_ab_runs.txt (each run's rows). ncupeers: ours beside cuDNN under ncu
# (benchmarks/ncu_peers.py; NCU_SHAPES, space-separated, replaces its default rows), its table in
# ncu_peers_table.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flashattn_out}
mkdir -p "$OUT"
steps=${*:-all}
want() { [[ " $steps " == *" all "* || " $steps " == *" $1 "* ]]; }
# FLASHATTN_HEAD_DIMS unset: every head dim, even in a build directory an earlier call restricted
# (-U drops the cached list, and CMake's default takes its place).
if [ -n "${FLASHATTN_HEAD_DIMS:-}" ]; then head_dims_opt=("-DFLASHATTN_HEAD_DIMS=$FLASHATTN_HEAD_DIMS")
else head_dims_opt=(-UFLASHATTN_HEAD_DIMS); fi
# A side of an A/B (or the C side of an A/B/C): one target of the source tree in $2 (default
# $AB_OLD), built in its build/.
build_ab_old() {
  local tree=${2:-$AB_OLD}
  cmake -S "$tree" -B "$tree/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_TESTS=OFF \
    "${head_dims_opt[@]}" >/dev/null &&
    cmake --build "$tree/build" -j "$(nproc)" --target "$1" > /tmp/flashattn_ab_build.log 2>&1 ||
    { tail -20 /tmp/flashattn_ab_build.log; exit 1; }
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
start=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${head_dims_opt[@]}" >/dev/null
cmake --build build -j "$(nproc)" > /tmp/flashattn_build.log 2>&1 || { cp /tmp/flashattn_build.log "$OUT/build.log"; tail -40 /tmp/flashattn_build.log; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
summary=()
# Registers, spills, and no serialised wgmma (reported, not fatal: an experiment may want the timing).
# (SKIP_PTXAS=1: skipped, for a second invocation in one device call.)
if [ -z "${SKIP_PTXAS:-}" ]; then
  bash scripts/check_ptxas.sh build > "$OUT/ptxas.log" 2>&1
  summary+=("ptxas: $(grep -v 'regs at launch' "$OUT/ptxas.log" | tail -3 | tr '\n' ' ')")
fi
if want test; then
  ctest --test-dir build -j 4 --output-on-failure --timeout "${CTEST_TIMEOUT:-900}" > "$OUT/tests.log" 2>&1
  grep -E '^\[ (reference|fused|fused_sm90|plan|threads|merge|serving) \]' -h build/Testing/Temporary/LastTest.log | sort -u > "$OUT/correctness.txt" || true
  summary+=("tests: $(grep -E 'tests passed|tests failed' "$OUT/tests.log" | tail -1)")
  not_made=$(grep -c 'calls not made' "$OUT/correctness.txt" || true)
  [ "${not_made:-0}" -gt 0 ] &&
    summary+=("tests: $not_made suite lines name calls not made, for kernels this build lacks (FLASHATTN_HEAD_DIMS=${FLASHATTN_HEAD_DIMS:-all})")
  grep -E 'Failed|\*\*\*' "$OUT/tests.log" | head -20
  # The Python package: installed offline as the README says, its GPU tests, the README example.
  python3 -m pip install -q --no-deps ./python > "$OUT/pytest.log" 2>&1
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so python3 -m pytest -q -rs python/tests >> "$OUT/pytest.log" 2>&1
  summary+=("python: $(tail -1 "$OUT/pytest.log")")
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so python3 python/examples/quickstart.py 2>&1 | tail -2
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so python3 -m flashattn > "$OUT/python_m_flashattn.txt" 2>&1
  cat "$OUT/python_m_flashattn.txt"
  # The C quick start, as the install test built it through find_package and through pkg-config.
  for exe in build/tests/consumer_work/build/quickstart build/tests/consumer_work/quickstart_pc; do
    [ -x "$exe" ] && summary+=("quickstart ($(basename "$(dirname "$exe")")): $("$exe" 2>&1 | tail -1)")
  done
fi
if want hostcost; then
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
    python3 benchmarks/python_host_cost.py --json "$OUT/hostcost.json" > "$OUT/hostcost.log" 2>&1
  summary+=("$(tail -1 "$OUT/hostcost.log")")
fi
if want launchcost; then
  nvcc -O2 -std=c++17 -arch=sm_90a benchmarks/launch_cost.cu -o build/launch_cost && ./build/launch_cost > "$OUT/launchcost.log" 2>&1
  summary+=("launch cost: rc=$? (launchcost.log)")
fi
if want ceiling; then
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iinclude -Ikernels benchmarks/read_ceiling.cu -Lbuild -lflashattn \
    -Xlinker -rpath="$PWD/build" -o build/read_ceiling && ./build/read_ceiling "${CEILING_ROUNDS:-3}" > "$OUT/ceiling.log" 2>&1
  summary+=("read ceiling: rc=$? (ceiling.log)")
fi
if want serving; then
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
    python3 benchmarks/serving_speed.py --flex --json "$OUT/serving.json" > "$OUT/serving.log" 2>&1
  summary+=("serving speed: rc=$? (2: shapes this build lacks, not run; serving.log)")
fi
if [[ " $steps " == *" quick "* ]]; then
  ./build/benchmarks/flashattn_bench --suite quick --json "$OUT/bench_quick.json" > "$OUT/bench.log" 2>&1
  summary+=("bench quick: rc=$? $(tail -1 "$OUT/bench.log")")
fi
if want sanitize; then
  : > "$OUT/sanitizer.log"
  for tool in memcheck racecheck initcheck synccheck; do
    compute-sanitizer --tool $tool --error-exitcode 1 ./build/tests/test_gpu --gtest_filter='Gpu.SanitizerSubset:GpuSm90.SanitizerSubset' \
      >> "$OUT/sanitizer.log" 2>&1
    summary+=("sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)")
  done
  # The serving paths: clamped out-of-range contents, every page size, split decode (packed Q too), under memcheck.
  compute-sanitizer --tool memcheck --error-exitcode 1 ./build/tests/test_serving \
    --gtest_filter='Serving.OutOfRangeContentsStayInsideTheTensors:Serving.PagedKvAnyPageSize:Serving.AppendWithRotary*:Serving.DecodeOverCaches' >> "$OUT/sanitizer.log" 2>&1
  summary+=("sanitizer memcheck (serving): rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)")
  # The persistent serving blocks' tile records, Q buffers and turns passed across tiles.
  for tool in racecheck memcheck; do
    compute-sanitizer --tool $tool --error-exitcode 1 ./build/tests/test_serving --gtest_filter='Serving.PersistentBlocks*' \
      >> "$OUT/sanitizer.log" 2>&1
    summary+=("sanitizer $tool (persistent serving): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)")
  done
  # Pages gathered with cp.async by the whole producer warpgroup (pages of 1 and 19) beside TMA pages;
  # split decode over caches (the last key tile's rows past the keys zeroed by the consumers).
  compute-sanitizer --tool racecheck --error-exitcode 1 ./build/tests/test_serving --gtest_filter='Serving.PagedKvAnyPageSize:Serving.DecodeOverCaches' \
    >> "$OUT/sanitizer.log" 2>&1
  summary+=("sanitizer racecheck (pages of every size, decode over caches): rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/sanitizer.log" | tail -1)")
fi
if want bench; then
  ./build/benchmarks/flashattn_bench --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  summary+=("bench: $(tail -1 "$OUT/bench.log")")
fi
if [[ " $steps " == *" kvrows "* ]]; then
  ./build/benchmarks/flashattn_bench --suite decode --json "$OUT/kvrows.json" > "$OUT/kvrows.log" 2>&1
  summary+=("kv rows: $(tail -1 "$OUT/kvrows.log")")
fi
if want ab; then
  echo "# A/B: FUSED vs FUSED_SM90 per head dim (bf16, 16k tokens, hidden 2048, 4096^2)" >> "$OUT/bench.log"
  for d in 32 64 96 128 160 192 256; do
    for mask in none causal; do
      for be in fused fused_sm90; do
        ./build/benchmarks/flashattn_bench --backend $be --shape prefill:bf16:$((16384 / 4096)):$((2048 / d > 0 ? 2048 / d : 1)):$((2048 / d > 0 ? 2048 / d : 1)):4096:4096:$d:$mask \
          --iters 20 2>&1 | grep -vE '^#|shapes,|^kind' | tail -1 >> "$OUT/bench.log"
      done
    done
  done
  summary+=("ab: see the end of bench.log")
fi
if [[ " $steps " == *" abtree "* ]]; then
  build_ab_old flashattn_bench
  # A B B A: a drift over the run (clocks, temperature) weighs on both sides alike.
  for run in a1 b1 b2 a2; do
    exe=$([ ${run:0:1} = a ] && echo "$AB_OLD/build/benchmarks/flashattn_bench" || echo build/benchmarks/flashattn_bench)
    "$exe" ${AB_ARGS:-} --no-check --iters 15 --warmup 3 --json "$OUT/ab_${run}.json" > /dev/null 2>> "$OUT/ab.log"
  done
  python3 benchmarks/ab_compare.py "$OUT/ab_a1.json" "$OUT/ab_b1.json" "$OUT/ab_a2.json" "$OUT/ab_b2.json" > "$OUT/ab_compare.txt"
  summary+=("abtree (A = $AB_OLD, B = this tree): $(tail -1 "$OUT/ab_compare.txt")")
fi
if [[ " $steps " == *" abshapes "* ]]; then
  # abtree's A/B shape by shape (benchmarks/ab_interleave.py: A B B A per shape, each a fresh
  # process), on the shapes in $AB_SHAPES (space-separated kind:dtype:b:hq:hkv:sq:sk:d:mask; a mask
  # may be a window, e.g. causal,window=512,0); AB_ROUNDS rounds of them per shape (default 3: one round
  # alone moves by several percent with no change at all, docs/performance.md v44).
  build_ab_old flashattn_bench
  c_args=()
  if [ -n "${AB_C:-}" ]; then build_ab_old flashattn_bench "$AB_C"; c_args=(--c "$AB_C/build/benchmarks/flashattn_bench"); fi
  shape_args=(); for s in ${AB_SHAPES:?AB_SHAPES names the shapes}; do shape_args+=(--shape "$s"); done
  python3 benchmarks/ab_interleave.py --a "$AB_OLD/build/benchmarks/flashattn_bench" --b build/benchmarks/flashattn_bench \
    "${c_args[@]}" "${shape_args[@]}" --rounds "${AB_ROUNDS:-3}" --json "$OUT/ab_shapes.json" -- ${AB_ARGS:-} > "$OUT/ab_shapes.txt" 2>&1
  summary+=("abshapes (A = $AB_OLD, B = this tree${AB_C:+, C = $AB_C}): $(tail -1 "$OUT/ab_shapes.txt")")
fi
if [[ " $steps " == *" abserving "* ]]; then
  # The serving paths' A/B: serving_speed.py against $AB_OLD's library and this tree's, A B B A
  # (AB_GROUPS times), on the rows AB_ONLY names (all by default).
  build_ab_old flashattn
  only=(); IFS='|' read -r -a parts <<< "${AB_ONLY:-}"; for part in "${parts[@]}"; do only+=(--only "$part"); done
  ab_dir=/tmp/flashattn_abserving; rm -rf "$ab_dir"; mkdir -p "$ab_dir"
  runs=(); for g in $(seq 1 "${AB_GROUPS:-1}"); do runs+=(a$g b$g c$g d$g); done  # a, d: A; b, c: B
  : > "$OUT/serving_ab_runs.txt"
  declare -A not_run=([A]="" [B]="")
  for run in "${runs[@]}"; do
    side=$([[ $run == [ad]* ]] && echo A || echo B)
    lib=$([ "$side" = A ] && echo "$AB_OLD/build/libflashattn.so" || echo "$PWD/build/libflashattn.so")
    rc=0
    FLASHATTN_LIBRARY=$lib PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 python3 benchmarks/serving_speed.py \
      --iters "${AB_ITERS:-20}" "${only[@]}" --json "$ab_dir/$run.json" > "$ab_dir/$run.log" 2>&1 || rc=$?
    # Status 2: the build lacks some rows' head dims; those rows are reported as not run and the
    # rest are compared. Any other failure stops the A/B.
    if (( rc == 2 )); then
      not_run[$side]="; $side: $(grep -m1 'not run, unsupported' "$ab_dir/$run.log")"
    elif (( rc != 0 )); then
      tail -5 "$ab_dir/$run.log"; exit 1
    fi
    { echo "== $run ($side)"; grep -E '(TFLOP/s|GB/s)\)' "$ab_dir/$run.log"; } >> "$OUT/serving_ab_runs.txt"
  done
  jsons=(); for run in "${runs[@]}"; do jsons+=("$ab_dir/$run.json"); done
  python3 benchmarks/serving_ab_compare.py "${jsons[@]}" > "$OUT/serving_ab.txt"
  summary+=("abserving (A = $AB_OLD, B = this tree): $(tail -1 "$OUT/serving_ab.txt")${not_run[A]}${not_run[B]}")
fi
if [[ " $steps " == *" ncuserving "* ]]; then
  # The dense call beside the ragged one on the same tokens, under ncu (docs/performance.md v21):
  # stall reasons and the source lines they fall on (the build carries -lineinfo).
  for kind in dense varlen; do
    for shape in "--batch 16 --keys 512 --heads 16 16 --head-dim 64" "--batch 8 --keys 2048 --heads 16 16 --head-dim 128"; do
      tag=${kind}_$(echo "$shape" | awk '{print $2 "x" $4 "_d" $9}')
      FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python:$PWD/benchmarks \
        timeout 120 ncu --clock-control none -k regex:fused_sm90 -c 1 --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section SourceCounters --section InstructionStats \
        python3 benchmarks/ncu_serving.py --prefill $kind --causal $shape > "$OUT/ncu_$tag.txt" 2>&1
      summary+=("ncu $tag: rc=$? $(grep -E '^ *Duration' "$OUT/ncu_$tag.txt" | head -1 | tr -s ' ')")
    done
  done
fi
if [[ " $steps " == *" ncupeers "* ]]; then
  # Each library's kernels on the same tensors, cold (ncu flushes the caches before each replay), at
  # the GPU's own clock: duration, clock, tensor pipe, DRAM, instructions (docs/performance.md v64).
  shape_args=(); for s in ${NCU_SHAPES:-}; do shape_args+=(--shape "$s"); done
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python timeout "${NCU_TIMEOUT:-400}" ncu --clock-control none \
    -k regex:'fused_sm90|cudnn|sdpa|fmha' --section SpeedOfLight --section LaunchStats \
    --metrics sm__inst_executed.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
    python3 benchmarks/ncu_peers.py "${shape_args[@]}" > "$OUT/ncu_peers.txt" 2>&1
  rc=$?
  python3 benchmarks/ncu_peers.py --summarize "$OUT/ncu_peers.txt" > "$OUT/ncu_peers_table.txt"
  summary+=("ncu peers: rc=$rc, $(( $(wc -l < "$OUT/ncu_peers_table.txt") - 1 )) kernels (ncu_peers_table.txt)")
fi
if want peers && [ -f benchmarks/compare_peers.py ]; then
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
    python3 benchmarks/compare_peers.py --flush-l2 --rounds "${PEER_ROUNDS:-2}" ${PEER_ARGS:-} --json "$OUT/peers.json" > "$OUT/peers.log" 2>&1
  summary+=("peers: see peers.log")
fi
if [[ " $steps " == *" fusedpeers "* ]]; then
  FLASHATTN_LIBRARY=$PWD/build/libflashattn.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 \
    python3 benchmarks/compare_peers.py --backend fused --flush-l2 --rounds "${PEER_ROUNDS:-2}" --json "$OUT/fused_peers.json" > "$OUT/fused_peers.log" 2>&1
  summary+=("fused peers: $(grep -E '^prefill \(' "$OUT/fused_peers.log" | tr '\n' ' ')")
fi
[ -f "$OUT/correctness.txt" ] && cat "$OUT/correctness.txt"
[ -f "$OUT/pytest.log" ] && grep -E "FAILED|Error|assert" "$OUT/pytest.log" | head -20
[ -f "$OUT/bench.log" ] && grep -vE '^#|^\[' "$OUT/bench.log" | cut -c1-170
[ -f "$OUT/kvrows.log" ] && grep -vE '^#|^\[' "$OUT/kvrows.log" | cut -c1-170
[ -f "$OUT/peers.log" ] && tail -70 "$OUT/peers.log"
[ -f "$OUT/hostcost.log" ] && cat "$OUT/hostcost.log"
[ -f "$OUT/launchcost.log" ] && cat "$OUT/launchcost.log"
[ -f "$OUT/ceiling.log" ] && cat "$OUT/ceiling.log"
[ -f "$OUT/serving.log" ] && cat "$OUT/serving.log"
[ -f "$OUT/ab_compare.txt" ] && cat "$OUT/ab_compare.txt"
[ -f "$OUT/ab_shapes.txt" ] && cat "$OUT/ab_shapes.txt"
[ -f "$OUT/serving_ab.txt" ] && cat "$OUT/serving_ab.txt"
[ -f "$OUT/ncu_peers_table.txt" ] && cat "$OUT/ncu_peers_table.txt"
printf '%s\n' "${summary[@]}"
