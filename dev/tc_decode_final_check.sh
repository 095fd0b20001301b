#!/usr/bin/env bash
# Short GPU check of the tensor-core decode after a change: build, decode and graph tests, the
# DeepSeek decode rows, racecheck on the bf16 decode tests. Results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
bash scripts/gpu_check.sh build > $OUT/check.txt 2>&1; grep "^== build" $OUT/check.txt
T=$(find build-gpu -name latentkv_test_gpu -type f | head -1); B=build-gpu/bench/latentkv-bench
timeout 120 $T --gtest_brief=1 --gtest_filter='*GpuDecode*:*GpuGraphs*' > $OUT/test.log 2>&1; echo "tests rc=$? $(grep -E '^\[  (PASSED|FAILED)' $OUT/test.log | tr '\n' ' ')"
grep -m5 -A6 Failure $OUT/test.log | head -30
for c in deepseek-v3:1,2,4,16 deepseek-v2-lite:1,16; do
  $B --preset ${c%:*} --tokens ${c#*:} --dtype bfloat16 --strategy cuda-decode 2>/dev/null | grep -E "^deepseek.* (PASS|FAIL)"
done | tee $OUT/compare.txt
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 17 $T --gtest_brief=1 --gtest_filter='Dtypes/GpuDecode.MatchesFloat64/bfloat16' > $OUT/race.log 2>&1; echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $OUT/race.log)"
