#!/usr/bin/env bash
# cuda-decode against cuda-gemm (cuBLAS) over T at the DeepSeek decode sizes, after the GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
bash scripts/gpu_check.sh build test > "$OUT/check.txt" 2>&1
grep "^== " "$OUT/check.txt"
B=build-gpu/bench/latentkv-bench
for preset in deepseek-v2-lite deepseek-v3; do
  for s in cuda-decode cuda-gemm; do
    $B --preset $preset --tokens ${TOKENS:-1,2,3,4,8,16} --dtype ${DTYPE:-bfloat16} --strategy $s \
      2>/dev/null | grep -E "^deepseek.* (PASS|FAIL)"
  done
done | tee "$OUT/compare.txt"
