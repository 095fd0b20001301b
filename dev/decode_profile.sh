#!/usr/bin/env bash
# Per-kernel view of cuda-decode: ncu (serialized, isolated kernel durations and DRAM throughput)
# and nsys (the real, PDL-overlapped timeline of graph replays). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLATENTKV_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1 && ninja -C build-gpu latentkv-bench >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
B=build-gpu/bench/latentkv-bench
for preset in deepseek-v2-lite deepseek-v3; do
  ncu --clock-control none -k regex:"kv_proj_decode_(fp32_(down|reduce|up)|tc_sm90)" -c 3 \
    --section SpeedOfLight --section LaunchStats --section Occupancy \
    $B --preset $preset --tokens 1 --dtype bfloat16 --strategy cuda-decode --iters 3 --warmup 0 \
    > "$OUT/ncu_$preset.txt" 2>&1
  grep -E "kv_proj_decode_(fp32_(down|reduce|up)|tc_sm90)|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Waves Per SM" "$OUT/ncu_$preset.txt" | head -40
done
if command -v nsys >/dev/null; then
  nsys profile --cuda-graph-trace=node -o "$OUT/decode" -f true \
    $B --preset deepseek-v2-lite --tokens 1 --dtype bfloat16 --strategy cuda-decode > /dev/null 2>&1
  nsys stats --report cuda_gpu_trace --format csv "$OUT/decode.nsys-rep" 2>/dev/null \
    | grep -E "kv_proj_decode_(fp32_(down|reduce|up)|tc_sm90)" | tail -12 | cut -d, -f1-2,6-9 | sed 's/"//g'
  rm -f "$OUT"/decode.nsys-rep "$OUT"/decode.sqlite
else
  echo "no nsys"
fi
