#!/usr/bin/env bash
# Installs latentkv into a fresh temporary prefix (component devel: headers, library, CMake package)
# and builds and runs examples/cpp_consumer against it through find_package(latentkv), as a C++
# engine would. Usage: scripts/consumer_check.sh [BUILD_DIR]
#   BUILD_DIR: an existing latentkv build directory to reuse (built first, then installed from);
#   without it the library alone is configured and built in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
work=$(mktemp -d "${TMPDIR:-/tmp}/latentkv-consumer.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

if [ $# -ge 1 ]; then
  build="$1"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    echo "consumer_check: $build is not a configured build directory" >&2
    exit 2
  fi
else
  build="$work/build"
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DLATENTKV_BUILD_TESTS=OFF \
    -DLATENTKV_BUILD_BENCH=OFF -DLATENTKV_BUILD_PYTHON=OFF >/dev/null
fi
cmake --build "$build" --target latentkv -j "$(nproc)"
cmake --install "$build" --component devel --prefix "$prefix" >/dev/null
echo "consumer_check: installed into $prefix:"
(cd "$prefix" && find . -type f | sort | sed 's/^/  /')

# Only the prefix: no path into this source tree may be needed to build the consumer.
cmake -S examples/cpp_consumer -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/consumer" -j "$(nproc)"
"$work/consumer/consumer"
echo "consumer_check: OK"
