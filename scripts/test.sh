#!/usr/bin/env bash
# Quick start 2 (and CI): set up, build everything (CUDA objects included, no GPU needed), run the
# C++ tests through CTest (GPU tests report skipped without a GPU) and the Python tests, the torch
# ones for real: the package is built against the venv's torch (--no-build-isolation; the torch ops
# required, LATENTKV_BUILD_TORCH_OPS=ON), its CMake tree kept in build/pip between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
# Explicit ON: a build directory configured earlier (e.g. by bench.sh) keeps its cached options.
cmake --preset release -DLATENTKV_BUILD_TESTS=ON -DLATENTKV_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j "$(nproc)"
ctest --preset release --no-tests=error
.venv/bin/python -m pip install -q --no-build-isolation -Cbuild-dir=build/pip \
  -Ccmake.define.LATENTKV_BUILD_TORCH_OPS=ON .
.venv/bin/python -m pytest -q python/tests
