#!/usr/bin/env bash
# Where cuda-decode's time goes: with and without L2 rotation (weights from HBM vs L2), and ncu
# warp-state stalls of each stage at DeepSeek-V3 T=1. Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  > "$OUT/build.log" 2>&1 && ninja -C build-gpu latentkv-bench >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
B=build-gpu/bench/latentkv-bench
for preset in deepseek-v2-lite deepseek-v3; do
  for rot in "" --no-rotate; do
    echo "== $preset $rot"
    $B --preset $preset --tokens 1,16 --dtype bfloat16 --strategy cuda-decode $rot 2>/dev/null | grep -E "^(deepseek|T=1 |T=16 )"
  done
done
ncu --clock-control none -k regex:"kv_proj_decode_(fp32_(down|reduce|up)|tc_sm90)" -c 3 \
  --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
  $B --preset deepseek-v3 --tokens 1 --dtype bfloat16 --strategy cuda-decode --iters 3 --warmup 0 \
  > "$OUT/ncu_v3.txt" 2>&1
grep -E "^  void|Duration|DRAM Throughput|Stall|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth" "$OUT/ncu_v3.txt" | head -60
