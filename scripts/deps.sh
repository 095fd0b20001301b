#!/usr/bin/env bash
# Installs what latentkv needs to build and test on a fresh Debian/Ubuntu machine, skipping what is
# already there: a C++ compiler (C++17; C++20 for the torch ops), CMake >= 3.25, GoogleTest, and a
# Python venv (.venv) with what the Python package builds and tests with: numpy, pytest, torch
# (the standard wheel from the package index, which runs on CPU-only machines; it takes minutes),
# transformers, hypothesis, matplotlib, nanobind and scikit-build-core (the package is built with
# --no-build-isolation, so that the torch ops are built against this torch). The CUDA toolkit
# (nvcc, cuBLAS) must already be installed; no GPU is needed to build.
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
  .venv/bin/python -m pip install -q --upgrade pip
fi
# What the venv lacks (by pip name; found by module name, without importing anything).
read -r -a wanted <<< "$(.venv/bin/python - <<'PY'
import importlib.util
packages = {"numpy": "numpy", "pytest": "pytest", "torch": "torch", "transformers": "transformers",
            "hypothesis": "hypothesis", "matplotlib": "matplotlib", "nanobind": "nanobind",
            "scikit-build-core": "scikit_build_core"}
print(" ".join(name for name, module in packages.items() if importlib.util.find_spec(module) is None))
PY
)"
if [ ${#wanted[@]} -gt 0 ]; then
  echo "deps: installing ${wanted[*]} into .venv"
  .venv/bin/python -m pip install -q "${wanted[@]}"
fi
