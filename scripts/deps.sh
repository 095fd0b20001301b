#!/usr/bin/env bash
# Installs what latentkv needs to build and test on a fresh Debian/Ubuntu machine, skipping what is
# already there: a C++17 compiler, CMake >= 3.25, GoogleTest, and a Python venv (.venv) with numpy
# and pytest for the Python package. The CUDA toolkit (nvcc, cuBLAS) must already be installed;
# no GPU is needed to build.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
if ! command -v nvcc >/dev/null; then
  echo "deps: nvcc not found; install the CUDA toolkit (>= 12.4) and put nvcc on PATH" >&2
  exit 1
fi

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "deps: installing ${missing[*]}"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q numpy pytest
