#!/usr/bin/env bash
# Quick start 1: set up, build, and run latentkv-bench on the founding case (on the GPU when one is
# present, else on the CPU). Extra arguments go to latentkv-bench, e.g. --sweep or --preset deepseek-v3.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
cmake --preset release -DLATENTKV_BUILD_BENCH=ON >/dev/null
cmake --build --preset release -j "$(nproc)" --target latentkv-bench
./build/bench/latentkv-bench "$@"
