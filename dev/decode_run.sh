#!/usr/bin/env bash
# Device run for the decode strategy: build, GPU tests, sanitizers on the decode tests, and the
# decode/gemm comparison at DeepSeek decode sizes plus the --sweep-mla table. Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
bash scripts/gpu_check.sh build test > "$OUT/check.txt" 2>&1
grep "^== " "$OUT/check.txt"
[ -n "${SKIP_SANITIZE:-}" ] || SANITIZE_FILTER="${SANITIZE_FILTER:-*GpuDecode*:*Graphs*}" \
  bash scripts/gpu_check.sh sanitize 2>&1 | grep "^== "
B=build-gpu/bench/latentkv-bench
{
for preset in deepseek-v2-lite deepseek-v3; do
  for s in cuda-decode cuda-gemm; do
    $B --preset $preset --tokens ${TOKENS:-1,4,8,16} --dtype ${DTYPE:-bfloat16} --strategy $s 2>/dev/null | grep -E "^(case|T=)"
  done
done
$B --preset seed --tokens 1,7,16 --strategy cuda-decode 2>/dev/null | grep -E "^(case|T=)"
$B --preset seed --tokens 1,7,16 --strategy cuda-fused 2>/dev/null | grep -E "^(case|T=)"
$B --sweep-mla 2>/dev/null | tail -12
} > "$OUT/decode_bench.txt" 2>&1
cat "$OUT/decode_bench.txt"
