#!/usr/bin/env bash
# Host cost of latentkv::run() against an empty kernel's launch (dev/launch_cost_probe.cu), on the
# GPU machine. Builds the library (Release) into ${BUILD:-build}, then the probe.
# Output: stdout and ${OUT:-.}/launch_cost_probe.txt.
set -euo pipefail
mkdir -p "${OUT:-.}"
OUT=$(cd "${OUT:-.}" && pwd)
cd "$(dirname "$0")/.."
build=${BUILD:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATENTKV_BUILD_TESTS=OFF \
  -DLATENTKV_BUILD_BENCH=OFF > /dev/null
cmake --build "$build" --target latentkv > /dev/null
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude dev/launch_cost_probe.cu \
  "$build/src/liblatentkv.a" -lcublasLt -lcublas -o /tmp/launch_cost_probe
/tmp/launch_cost_probe 2>&1 | tee "$OUT/launch_cost_probe.txt"
