#!/usr/bin/env bash
# The CPU test suite (latentkv_test_cpu: validation, refusals, zero sizes, the CPU backends against
# float64 references, MLA on the CPU, concurrent callers) under the sanitizers, in two builds:
#   address,undefined  out-of-bounds reads that happen to find mapped memory, signed overflow,
#                      null references to empty vectors;
#   thread             data races in cpu-blocked's persistent thread pool and the per-device and
#                      per-shape caches that concurrent run() calls share.
# The library's and the tests' C++ are instrumented (g++); its CUDA sources are compiled by nvcc as
# usual. fuzz.sh covers the front door with random problems; this covers every tested path with
# the tests' own problems. No GPU needed.
# Usage: scripts/sanitize.sh [address|thread]   (default both; builds in build-sanitize-<name>)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
source scripts/sanitizer_env.sh
sanitizers=("$@")
[ ${#sanitizers[@]} -eq 0 ] && sanitizers=(address thread)
for sanitizer in "${sanitizers[@]}"; do
  case $sanitizer in
    address) flags=address,undefined ;;
    thread) flags=thread ;;
    *) echo "sanitize.sh: unknown sanitizer '$sanitizer' (address or thread)" >&2; exit 2 ;;
  esac
  build=build-sanitize-$sanitizer
  echo "== -fsanitize=$flags: $build"
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS="-fsanitize=$flags -fno-sanitize-recover=all -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$flags" -DLATENTKV_BUILD_TESTS=ON \
    -DLATENTKV_BUILD_BENCH=OFF -DLATENTKV_BUILD_PYTHON=OFF >/dev/null
  cmake --build "$build" --target latentkv_test_cpu -j "$(nproc)"
  "$build/tests/latentkv_test_cpu" --gtest_brief=1
done
