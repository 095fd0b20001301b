#!/usr/bin/env bash
# The CPU test suite (latentkv_test_cpu: validation, refusals, zero sizes, the CPU backends against
# float64 references, MLA on the CPU) under AddressSanitizer and UndefinedBehaviorSanitizer: the
# library's and the tests' C++ instrumented (g++), its CUDA sources compiled by nvcc as usual.
# Catches what the plain run cannot: out-of-bounds reads that happen to find mapped memory,
# signed overflow, null references to empty vectors. fuzz.sh covers the front door with random
# problems; this covers every tested path with the tests' own problems. No GPU needed.
# Usage: scripts/sanitize.sh   (LATENTKV_SANITIZE_BUILD=DIR, default build-sanitize)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${LATENTKV_SANITIZE_BUILD:-build-sanitize}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
  -DLATENTKV_BUILD_TESTS=ON -DLATENTKV_BUILD_BENCH=OFF -DLATENTKV_BUILD_PYTHON=OFF >/dev/null
cmake --build "$build" --target latentkv_test_cpu -j "$(nproc)"
# protect_shadow_gap=0: the CUDA runtime maps memory where ASan's shadow gap would be.
export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$build/tests/latentkv_test_cpu" --gtest_brief=1
