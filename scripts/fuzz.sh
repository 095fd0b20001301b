#!/usr/bin/env bash
# Builds the libFuzzer target over check(), select_strategy() and workspace_size()
# (tests/fuzz/fuzz_check.cpp; clang++ with -fsanitize=fuzzer,address,undefined, the library's C++
# sources instrumented the same way, its CUDA sources compiled by nvcc as usual and linked) and
# runs it for a bounded time on the committed corpus tests/fuzz/corpus. No GPU needed: without one
# the CUDA backend answers "no device"; with one its strategies' checks are fuzzed too. Installs
# clang and its libFuzzer runtime with apt-get where they are missing (a clean CI machine).
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

# clang++ with its libFuzzer runtime and FuzzedDataProvider.h: on Debian/Ubuntu the packages clang
# and libclang-rt-<major>-dev (libclang-common-<major>-dev before clang 14), installed with apt-get
# where a probe target does not build, as scripts/deps.sh installs what the tests need.
probe_dir=$(mktemp -d)
trap 'rm -rf "$probe_dir"' EXIT
fuzzer_builds() {
  command -v clang++ >/dev/null || return 1
  printf '%s\n' '#include <fuzzer/FuzzedDataProvider.h>' \
    'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    > "$probe_dir/probe.cpp"
  clang++ -fsanitize=fuzzer "$probe_dir/probe.cpp" -o "$probe_dir/probe" 2>/dev/null
}
if ! fuzzer_builds; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  command -v clang++ >/dev/null || $SUDO apt-get install -y -qq clang
  major=$(clang++ -dumpversion | cut -d. -f1)
  echo "fuzz: installing libFuzzer for clang $major"
  $SUDO apt-get install -y -qq "libclang-rt-$major-dev" ||
    $SUDO apt-get install -y -qq "libclang-common-$major-dev"
  if ! fuzzer_builds; then
    echo "fuzz: clang++ -fsanitize=fuzzer still does not build a target" >&2
    exit 1
  fi
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CUDA_HOST_COMPILER=g++ \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all" \
  -DLATENTKV_BUILD_TESTS=OFF -DLATENTKV_BUILD_BENCH=OFF -DLATENTKV_BUILD_PYTHON=OFF \
  -DLATENTKV_BUILD_FUZZ=ON >/dev/null
cmake --build "$build" --target latentkv_fuzz_check -j "$(nproc)"

fuzzer="$build/tests/fuzz/latentkv_fuzz_check"
found="$build/fuzz-corpus"  # what this run adds; the committed corpus is only read
mkdir -p "$found"
source scripts/sanitizer_env.sh
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$build/" "$found" tests/fuzz/corpus
if [ "${LATENTKV_FUZZ_MERGE:-0}" = 1 ]; then
  "$fuzzer" -merge=1 tests/fuzz/corpus "$found"
fi
