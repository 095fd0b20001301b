#!/usr/bin/env bash
# The Python side on a GPU machine in one go, offline: build and install latentkv into the current
# Python (no downloads: scikit-build-core, nanobind, numpy, torch and pytest must be installed),
# run every Python test (the CUDA ones too), then the PyTorch benchmarks (the projection's, and the
# MLA KV path's against transformers' code).
#   bash python/run_gpu_checks.sh [results dir]      (default: $OUT, else ./python-gpu-results)
# CMAKE_CUDA_ARCHITECTURES (default 90a) and PIP_ARGS (e.g. --break-system-packages) pass through.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${1:-${OUT:-python-gpu-results}}"
mkdir -p "$results"
python="${PYTHON:-python3}"

"$python" -m pip install --no-build-isolation --no-deps ${PIP_ARGS:-} -v . > "$results/build.log" 2>&1 ||
  { tail -50 "$results/build.log"; exit 1; }
echo "built and installed latentkv ($(tail -1 "$results/build.log"))"
"$python" -c "import latentkv.torch" || exit 1  # says what is missing (torch, the ops library)

status=0
# From the repository root, so "import latentkv" finds the installed package, not python/latentkv.
"$python" -m pytest python/tests -q -rs -p no:cacheprovider --junitxml="$results/pytest.xml" ||
  status=$?
"$python" python/bench/bench_torch.py --json "$results/bench_torch.json" | tee "$results/bench_torch.txt" ||
  status=$?
"$python" python/bench/bench_mla.py --json "$results/bench_mla.json" | tee "$results/bench_mla.txt" ||
  status=$?
exit "$status"
