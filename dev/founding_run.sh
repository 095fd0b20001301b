#!/usr/bin/env bash
# Issue 17 on the GPU machine, from binaries built beforehand in build-founding (carried): the
# cluster-configuration probe (dev/fused_cluster_probe.cu: cluster size x load path), the bench
# (kAuto and cuda-fused forced at the founding dims), the cuda-fused GPU tests, then
# compute-sanitizer memcheck and racecheck on the cluster configuration's small edge cases.
# Logs go to $OUT; a short summary is printed last. Parameterized suites carry a prefix
# (Edge/GpuShapes..., All/GpuPresets...), hence the leading * in the filters.
set -u
T=build-founding/tests/latentkv_test_gpu
B=build-founding/bench/latentkv-bench
nvidia-smi -L
timeout 30 build-founding/fused_cluster_probe > "$OUT/probe.log" 2>&1
echo "probe rc=$?"
{
  $B --preset seed --quiet
  $B --tokens 1,64,733,6144 --quiet
  $B --tokens 1,7,64,384,733,1024,2048,6144 --strategy cuda-fused --quiet
} > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
timeout 45 $T --gtest_filter='*GpuFusedCluster*:*GpuPresets*:*GpuGraphs*:*GpuLayouts*:*GpuSeedCall*' \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
timeout 60 $T --gtest_filter='*GpuShapes*' > "$OUT/shapes.log" 2>&1
echo "shapes rc=$?"
timeout 90 compute-sanitizer --tool memcheck $T --gtest_filter=GpuFusedCluster.SmallEdges \
  > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"
timeout 90 compute-sanitizer --tool racecheck $T --gtest_filter=GpuFusedCluster.SmallEdges \
  > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?"
echo "---- summary"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests ran" "$OUT/tests.log" "$OUT/shapes.log" | head -14
cat "$OUT/probe.log"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/memcheck.log" "$OUT/racecheck.log"
grep -E "^(seed|T=[0-9]+) +cuda|geometric" "$OUT/bench.log"
