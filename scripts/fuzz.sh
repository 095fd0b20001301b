#!/usr/bin/env bash
# Builds the libFuzzer target over check(), select_strategy() and workspace_size()
# (tests/fuzz/fuzz_check.cpp; clang++ with -fsanitize=fuzzer,address,undefined, the library's C++
# sources instrumented the same way, its CUDA sources compiled by nvcc as usual and linked) and
# runs it for a bounded time on the committed corpus tests/fuzz/corpus. No GPU needed: without one
# the CUDA backend answers "no device"; with one its strategies' checks are fuzzed too.
# Usage: scripts/fuzz.sh [SECONDS] (default 60)
#   LATENTKV_FUZZ_BUILD=DIR   build directory (default build-fuzz)
#   LATENTKV_FUZZ_MERGE=1     afterwards, merge what the run found into tests/fuzz/corpus
#                             (minimized: only inputs that add coverage)
# A crash, sanitizer report or broken property exits non-zero and leaves the input as
# DIR/crash-* (replay: DIR/tests/fuzz/latentkv_fuzz_check DIR/crash-...).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${LATENTKV_FUZZ_BUILD:-build-fuzz}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CUDA_HOST_COMPILER=g++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" \
  -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=OFF -DLATENTKV_BUILD_PYTHON=OFF \
  -DLATENTKV_BUILD_FUZZ=ON >/dev/null
cmake --build "$build" --target latentkv_fuzz_check -j "$(nproc)"

fuzzer="$build/tests/fuzz/latentkv_fuzz_check"
found="$build/fuzz-corpus"  # what this run adds; the committed corpus is only read
mkdir -p "$found"
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$build/" "$found" tests/fuzz/corpus
if [ "${LATENTKV_FUZZ_MERGE:-0}" = 1 ]; then
  "$fuzzer" -merge=1 tests/fuzz/corpus "$found"
fi
