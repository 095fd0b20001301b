#!/usr/bin/env bash
# cuBLASLt algorithms vs cublasGemmEx's default for the bf16 down/up GEMMs (dev/cublaslt_probe.cu).
# Needs one GPU (written for an H200). Extra arguments go to the probe, e.g.
#   dev/cublaslt_probe.sh --model v2lite --tokens 64,128
# Output: stdout and ${OUT:-.}/cublaslt_probe.txt.
set -euo pipefail
mkdir -p "${OUT:-.}"
OUT=$(cd "${OUT:-.}" && pwd)  # resolved before the cd below
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a dev/cublaslt_probe.cu \
  -lcublasLt -lcublas -o /tmp/cublaslt_probe
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
  /tmp/cublaslt_probe "$@"; } 2>&1 | tee "$OUT/cublaslt_probe.txt"
