#!/usr/bin/env bash
# Installs what building and testing libflashattn needs and is missing: CMake, Ninja, GoogleTest,
# pkg-config (Debian/Ubuntu packages), and checks for the CUDA Toolkit (nvcc + cuBLAS), which must
# already be installed. Safe to run repeatedly; does nothing when everything is there.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v c++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || [ -f /usr/local/include/gtest/gtest.h ] || missing+=(libgtest-dev)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: please install: ${missing[*]}" >&2
    exit 1
  fi
fi
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /opt/cuda/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break; done
fi
command -v nvcc >/dev/null || { echo "setup: the CUDA Toolkit (nvcc, cuBLAS) is required and was not found" >&2; exit 1; }
