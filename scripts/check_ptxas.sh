#!/usr/bin/env bash
# Compiles every FUSED_SM90 kernel variant with ptxas's resource report and fails when ptxas has
# serialised a kernel's warpgroup MMAs: any "wgmma.mma_async instructions are serialized" message,
# whatever the reason it gives (C7520: a warpgroup.arrive inserted on a divergent path; C7515: an
# accumulator written by ordinary instructions while a wgmma is in flight; C7512: too few
# registers). Such a kernel is correct and up to 25-30% slower (docs/performance.md v14, v15), so no
# test would notice. Also prints each kernel's registers and spills. No GPU needed.
# Usage: scripts/check_ptxas.sh [build-dir (default: build; configured, for its generated instances)]
#        (env: JOBS)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=${JOBS:-$(nproc)}
shopt -s nullglob
sources=("$build"/generated/instances/fused_sm90_*.cu)
# Instance files of variants the tables no longer list may linger in an old build tree: check the
# ones the configured build compiles (named in fa_instances.h).
wanted=()
for f in "${sources[@]}"; do
  # fused_sm90_<dtype>_d<head dim>_n<block_n>_c<consumers>.cu, listed as X(<dtype>, <code>, hd, bn, nc)
  if [[ $(basename "$f") =~ ^fused_sm90_(fp16|bf16)_d([0-9]+)_n([0-9]+)_c([0-9]+)\.cu$ ]]; then
    row="X(${BASH_REMATCH[1]}, $([ "${BASH_REMATCH[1]}" = bf16 ] && echo 1 || echo 0), ${BASH_REMATCH[2]}, ${BASH_REMATCH[3]}, ${BASH_REMATCH[4]})"
    grep -qF "$row" "$build/generated/fa_instances.h" && wanted+=("$f")
  fi
done
if [ ${#wanted[@]} -eq 0 ]; then
  echo "check_ptxas.sh: no FUSED_SM90 instances under $build/generated (configure with 90a first)" >&2
  exit 1
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%s\n' "${wanted[@]}" | xargs -P "$jobs" -I{} sh -c \
  'nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90a -Ikernels -Iinclude -Isrc -I"$1/generated" \
     -Xptxas=-v -c "$2" -o /dev/null > "$3/$(basename "$2" .cu).log" 2>&1 || { cat "$3/$(basename "$2" .cu).log"; exit 255; }' \
  _ "$build" {} "$out"
status=0
for log in "$out"/*.log; do
  name=$(basename "$log" .log)
  if grep -q "C7520\|mma_async instructions are serialized" "$log"; then
    echo "check_ptxas.sh: $name: ptxas serialised wgmma:" >&2
    grep "C7520\|serialized" "$log" >&2
    status=1
  fi
  # One line per kernel: its template arguments (dtype, head dim, key tile, consumers, transform,
  # serving, persistent, and where given resident gather), registers and spill bytes.
  awk -v n="$name" '
    /Compiling entry function/ { match($0, /kernelILi[0-9]+ELi[0-9]+ELi[0-9]+ELi[0-9]+ELb[01]ELb[01]ELb[01](ELb[01])*/);
                                 k = substr($0, RSTART + 7, RLENGTH - 7); gsub(/EL[ib]/, ",", k); sub(/^Li/, "", k) }
    /spill stores/ { spill = $5 "+" $9 }
    /Used [0-9]+ registers/ { printf "  %-34s <%s> %s regs at launch, spills %s bytes\n", n, k, $5, spill }' "$log"
done
[ $status -eq 0 ] && echo "check_ptxas.sh: ${#wanted[@]} instance files, no serialised wgmma"
exit $status
