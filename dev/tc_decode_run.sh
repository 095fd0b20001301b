#!/usr/bin/env bash
# Device run for the tensor-core decode kernels: build, the decode/graph GPU tests, cuda-decode
# against cuda-gemm over T at the DeepSeek sizes, and the --sweep-mla table. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bash scripts/gpu_check.sh build > "$OUT/check.txt" 2>&1
grep "^== " "$OUT/check.txt"
TEST_GPU=$(find build-gpu -name latentkv_test_gpu -type f -perm -u+x | head -1)
B=build-gpu/bench/latentkv-bench
timeout 300 $TEST_GPU --gtest_brief=1 --gtest_filter="${TEST_FILTER:-*GpuDecode*:*GpuGraphs*}" > "$OUT/test_decode.log" 2>&1
echo "== decode tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_decode.log" | tr '\n' ' ')"
grep -m 20 -B2 -A12 "Failure" "$OUT/test_decode.log" | head -60
for preset in deepseek-v2-lite deepseek-v3; do
  for s in cuda-decode cuda-gemm; do
    $B --preset $preset --tokens ${TOKENS:-1,2,4,8,16} --dtype ${DTYPE:-bfloat16} --strategy $s \
      2>/dev/null | grep -E "^deepseek.* (PASS|FAIL)"
  done
done | tee "$OUT/compare.txt"
if [ "${SWEEP:-1}" = 1 ]; then
  $B --sweep-mla > "$OUT/sweep.txt" 2>&1
  tail -14 "$OUT/sweep.txt"
fi
if [ -n "${SANITIZE:-}" ]; then
  timeout 300 compute-sanitizer --tool memcheck --error-exitcode 17 $TEST_GPU --gtest_brief=1 \
    --gtest_filter="$SANITIZE" > "$OUT/memcheck.log" 2>&1
  echo "== memcheck rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | head -1)"
  grep -m 3 -A 10 -E "^========= (Error|Invalid)" "$OUT/memcheck.log"
fi
