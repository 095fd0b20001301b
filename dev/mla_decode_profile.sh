#!/usr/bin/env bash
# Per-kernel view of cuda-mla-decode at one token: ncu (kernels serialized, clocks not locked:
# duration, DRAM throughput, occupancy, registers, grid) and nsys (the PDL-overlapped timeline of
# graph replays) for V3 kv first stage, V3 q_a + kv first stage and V2-Lite and V3 whole path.
# Results in $OUT; a short summary on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
gen=""; command -v ninja >/dev/null && gen="-G Ninja"
cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DLATENTKV_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1 &&
  cmake --build build-gpu -j "$(nproc)" --target latentkv-bench >> "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
B=build-gpu/bench/latentkv-bench
cases=("v3kv:--preset deepseek-v3-mla --q-rank=0 --stage first"
       "v3qa:--preset deepseek-v3-mla --stage first"
       "v2whole:--preset deepseek-v2-lite-mla"
       "v3whole:--preset deepseek-v3-mla --q-rank=0")
for c in "${cases[@]}"; do
  name=${c%%:*}; args=${c#*:}
  ncu --clock-control none -k regex:mla_decode -c 6 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
    $B $args --tokens 1 --strategy cuda-mla-decode --iters 2 --warmup 0 --seconds 0.01 \
    > "$OUT/ncu_$name.txt" 2>&1
  echo "== $name ($args) ncu"
  grep -E "^  mla_decode|Duration|DRAM Throughput|Registers Per|Grid Size|Achieved Occupancy|L2 Hit Rate " \
    "$OUT/ncu_$name.txt" | head -30
  if command -v nsys >/dev/null; then
    nsys profile --cuda-graph-trace=node -o "$OUT/t_$name" -f true \
      $B $args --tokens 1 --strategy cuda-mla-decode > /dev/null 2>&1
    nsys stats --report cuda_gpu_trace --format csv "$OUT/t_$name.nsys-rep" 2>/dev/null \
      | grep -E "mla_decode" | tail -6 | cut -d, -f1-2,6-9 | sed 's/"//g'
    rm -f "$OUT"/t_$name.nsys-rep "$OUT"/t_$name.sqlite
  fi
done
