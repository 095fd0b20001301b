#!/usr/bin/env bash
# Where the tensor-core decode kernel's time goes (bf16): ncu's speed-of-light, warp-state and
# launch sections for one call of each case in CASES ("preset:T ..."). The GPU machine has no nsys.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/bench/latentkv-bench ] || bash scripts/gpu_check.sh build > "$OUT/check.txt" 2>&1
B=build-gpu/bench/latentkv-bench
for c in ${CASES:-deepseek-v2-lite:1 deepseek-v2-lite:16 deepseek-v3:1}; do
  preset=${c%:*}; t=${c#*:}
  echo "== $preset T=$t"
  ncu --clock-control none --kernel-name regex:"decode_kernel" --launch-skip 30 --launch-count 1 \
    --section SpeedOfLight --section LaunchStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    $B --preset $preset --tokens $t --dtype bfloat16 --strategy cuda-decode --iters 5 \
    > "$OUT/ncu_${preset}_$t.txt" 2>&1
  grep -E "Duration|Memory Throughput|DRAM Through|Dynamic Shared|Grid Size" "$OUT/ncu_${preset}_$t.txt" | head -8
  grep -E "issue_stalled" "$OUT/ncu_${preset}_$t.txt" | awk '$NF+0 > 0.05' | sed -E "s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//" | sort -k3 -g -r | head -8
done
