#!/usr/bin/env bash
# Where the tensor-core decode's time goes at DeepSeek-V2-Lite T = 1 (bf16): the graph's kernel
# timeline from nsys (real overlap under PDL) and ncu's warp-state and launch sections per kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
[ -x build-gpu/bench/latentkv-bench ] || bash scripts/gpu_check.sh build > "$OUT/check.txt" 2>&1
B=build-gpu/bench/latentkv-bench
ARGS="--preset ${PRESET:-deepseek-v2-lite} --tokens ${T:-1} --dtype bfloat16 --strategy cuda-decode"
if command -v nsys >/dev/null; then
  nsys profile --cuda-graph-trace=node -o "$OUT/timeline" -f true $B $ARGS --iters 20 >/dev/null 2>&1
  nsys stats --report cuda_gpu_trace --format csv "$OUT/timeline.nsys-rep" 2>/dev/null \
    | grep -E "down_latent|up_project" | tail -12 | cut -d, -f1-3,20- > "$OUT/trace.csv"
  cat "$OUT/trace.csv"
else
  echo "no nsys"
fi
ncu --clock-control none --kernel-name regex:"down_latent|up_project" --launch-skip 20 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
  $B $ARGS --iters 5 > "$OUT/ncu_sections.txt" 2>&1
grep -E "^  [a-z].*(down_latent|up_project)|Duration|Stall|Warp Cycles Per|Achieved Occ|Registers|Memory Throughput|DRAM Through|Block Limit" "$OUT/ncu_sections.txt" | head -60
