#!/usr/bin/env bash
# Installs the Python package into a virtual environment (with the system's packages visible, so a
# GPU machine's torch/CuPy are used) and runs its tests against the library in the build directory.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "${1:-build}" && pwd)
venv="$build/pyenv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv --system-site-packages "$venv" 2>/dev/null || {
    command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] && apt-get install -y -qq python3-venv >/dev/null
    python3 -m venv --system-site-packages "$venv"; }
fi
"$venv/bin/python" -c "import pytest" 2>/dev/null || "$venv/bin/python" -m pip install -q pytest
"$venv/bin/python" -m pip install -q ./python
export FLASHATTN_LIBRARY="$build/libflashattn.so"
cd python/tests && "$venv/bin/python" -m pytest -q -rs .
